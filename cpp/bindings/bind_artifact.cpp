// cpp/bindings/bind_artifact.cpp: honed._core bindings of the artifact: manifest, reader, writer,
// keys.
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "honed/artifact.h"
#include "json_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

nb::object json_to_python(const nlohmann::json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return nb::none();
    case nlohmann::json::value_t::boolean:
      return nb::bool_(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return nb::int_(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return nb::int_(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float:
      return nb::float_(j.get<double>());
    case nlohmann::json::value_t::string: {
      const std::string& text = j.get_ref<const std::string&>();
      return nb::str(text.data(), text.size());
    }
    case nlohmann::json::value_t::array: {
      nb::list out;
      for (const nlohmann::json& v : j) out.append(json_to_python(v));
      return out;
    }
    case nlohmann::json::value_t::object: {
      nb::dict out;
      for (const auto& [k, v] : j.items()) out[k.c_str()] = json_to_python(v);
      return out;
    }
    default:
      throw nb::type_error("a JSON value honed does not store (binary)");
  }
}

nlohmann::json json_from_python(nb::handle obj) {
  if (obj.is_none()) return nullptr;
  if (nb::isinstance<nb::bool_>(obj)) return nb::cast<bool>(obj);
  if (nb::isinstance<nb::int_>(obj)) return nb::cast<int64_t>(obj);
  if (nb::isinstance<nb::float_>(obj)) return nb::cast<double>(obj);
  if (nb::isinstance<nb::str>(obj)) return nb::cast<std::string>(obj);
  if (nb::isinstance<nb::dict>(obj)) {
    nlohmann::json out = nlohmann::json::object();
    for (auto [k, v] : nb::borrow<nb::dict>(obj)) {
      out[nb::cast<std::string>(nb::str(k))] = json_from_python(v);
    }
    return out;
  }
  if (nb::isinstance<nb::list>(obj) || nb::isinstance<nb::tuple>(obj)) {
    nlohmann::json out = nlohmann::json::array();
    for (nb::handle v : obj) out.push_back(json_from_python(v));
    return out;
  }
  throw nb::type_error(("cannot store a " + nb::cast<std::string>(nb::str(obj.type())) +
                        " in a manifest (JSON values only)")
                           .c_str());
}

namespace {

const char* trust_name(Trust t) {
  switch (t) {
    case Trust::kTrusted:
      return "trusted";
    case Trust::kUnknownKey:
      return "unknown-key";
    case Trust::kBadSignature:
      return "bad-signature";
    case Trust::kUnsigned:
      break;
  }
  return "unsigned";
}

// A JSON-valued field as a read-write property (def_rw would refuse None).
template <typename C>
auto json_getter(nlohmann::json C::* field) {
  // typed: the stub says Any (a JSON value of any shape), not object
  return [field](const C& self) -> nb::typed<nb::object, nb::any> {
    return json_to_python(self.*field);
  };
}
template <typename C>
auto json_setter(nlohmann::json C::* field) {
  return [field](C& self, std::optional<nlohmann::json> value) {
    self.*field = value ? std::move(*value) : nlohmann::json(nullptr);
  };
}

void bind_manifest(nb::module_& m) {
  nb::class_<ManifestGraph>(m, "ManifestGraph")
      .def(nb::init<>())
      .def_rw("profile", &ManifestGraph::profile)
      .def_prop_rw("backend", json_getter(&ManifestGraph::backend),
                   json_setter(&ManifestGraph::backend), "the backend's recipe (a dict)")
      .def_prop_rw("figures", json_getter(&ManifestGraph::figures),
                   json_setter(&ManifestGraph::figures))
      .def_rw("runnable_from_cpp", &ManifestGraph::runnable_from_cpp)
      .def_rw("payload", &ManifestGraph::payload, "payload file name -> entry")
      .def_rw("samples", &ManifestGraph::samples, "entry of the sample inputs, '' for none")
      .def_rw("outputs", &ManifestGraph::outputs, "entry of eager's outputs, '' for none")
      .def_prop_ro("backend_name", &ManifestGraph::backend_name);
  nb::class_<ManifestModule>(m, "ManifestModule")
      .def(nb::init<>())
      .def_rw("name", &ManifestModule::name)
      .def_rw("class_name", &ManifestModule::class_name)
      .def_rw("weights", &ManifestModule::weights)
      .def_rw("num_parameters", &ManifestModule::num_parameters)
      .def_rw("graphs", &ManifestModule::graphs)
      .def_prop_rw("report", json_getter(&ManifestModule::report),
                   json_setter(&ManifestModule::report), "TuneReport.to_dict(), or None");
  nb::class_<Manifest>(m, "Manifest")
      .def(nb::init<>())
      .def_rw("honed_version", &Manifest::honed_version)
      .def_rw("created", &Manifest::created)
      .def_prop_rw("environment", json_getter(&Manifest::environment),
                   json_setter(&Manifest::environment), "the environment fingerprint (a dict)")
      .def_prop_rw("machine", json_getter(&Manifest::machine), json_setter(&Manifest::machine),
                   "where the figures were measured (TuneReport.machine; a dict)")
      .def_rw("modules", &Manifest::modules)
      .def_rw("entries", &Manifest::entries, "entry -> SHA-256 (filled by write_artifact)")
      .def_prop_ro("has_payload", &Manifest::has_payload)
      .def(
          "to_dict",
          [](const Manifest& man) { return nlohmann::json::parse(manifest_to_json(man)); },
          "the manifest as stored in manifest.json");
}

void bind_reader(nb::module_& m) {
  nb::class_<Artifact>(m, "Artifact", "A verified .honed file, mapped read-only")
      .def_ro("path", &Artifact::path)
      .def_ro("manifest", &Artifact::manifest)
      .def_prop_ro("signer",
                   [](const Artifact& a) -> std::optional<std::string> {
                     if (!a.signature) return std::nullopt;
                     return a.signature->key_id();
                   })
      .def_prop_ro("entries",
                   [](const Artifact& a) {
                     std::vector<std::string> names;
                     for (const auto& [name, view] : a.views) names.push_back(name);
                     return names;
                   })
      .def(
          "read",
          [](const Artifact& a, const std::string& name) {
            std::string_view v = a.entry(name);
            return nb::bytes(v.data(), v.size());
          },
          "name"_a, "the bytes of a verified entry")
      .def(
          "trust",
          [](const Artifact& a, const std::vector<std::string>& trusted) {
            TrustCheck c = check_trust(a, trusted);
            return std::make_pair(std::string(trust_name(c.trust)), c.key_id);
          },
          "trusted_public_keys"_a,
          "(state, signer key id): state is trusted, unsigned, unknown-key or bad-signature")
      .def(
          "untrusted_message",
          [](const Artifact& a, const std::vector<std::string>& trusted,
             const std::string& native_entry, const std::string& opt_in) {
            return untrusted_message(a.path, check_trust(a, trusted), native_entry, opt_in);
          },
          "trusted_public_keys"_a, "native_entry"_a, "opt_in"_a,
          "the one-line refusal of native code from this artifact ('' when trusted)");
  m.def(
      "read_artifact",
      [](const std::string& path) {
        nb::gil_scoped_release unlocked;
        return read_artifact(path);
      },
      "path"_a,
      "Open and verify a .honed file (CRC, sizes, names, SHA-256 of every entry); raises "
      "ArtifactError or IncompatibleArtifactError");
  m.def(
      "write_artifact",
      [](const std::string& path, Manifest manifest,
         const nb::typed<nb::dict, nb::str, nb::bytes>& entries,
         const std::string& signing_key_pem) {
        std::vector<nb::bytes> held;  // references kept while the GIL is released
        std::vector<EntryData> data;
        for (auto [name, value] : entries) {
          held.push_back(nb::cast<nb::bytes>(value));
          data.push_back(EntryData{nb::cast<std::string>(name),
                                   std::string_view(held.back().c_str(), held.back().size())});
        }
        nb::gil_scoped_release unlocked;
        return write_artifact(path, std::move(manifest), data, signing_key_pem);
      },
      "path"_a, "manifest"_a, "entries"_a, "signing_key_pem"_a = "",
      "Write a .honed file atomically (mode 0666 & ~umask); signs it when a key is given");
}

// The key functions run without the GIL: OpenSSL's decoders and its first initialisation take
// milliseconds, and a JIT tune verifies its cache payloads beside the program's calls. The
// bytes arguments stay alive (the caller holds them) and immutable while the GIL is released.
void bind_keys(nb::module_& m) {
  m.def(
      "generate_signing_key",
      [] {
        SigningKey k = generate_signing_key();
        return std::make_pair(k.private_pem, k.public_pem);
      },
      release_gil(), "(private PEM, public PEM) of a fresh Ed25519 key");
  m.def("public_key_of", &public_key_of, release_gil(), "private_pem"_a);
  m.def("key_id", &key_id, release_gil(), "public_pem"_a, "16 hex digits naming the key");
  m.def(
      "sign",
      [](const std::string& private_pem, const nb::bytes& data) {
        std::string s;
        {
          nb::gil_scoped_release released;
          s = sign(private_pem, std::string_view(data.c_str(), data.size()));
        }
        return nb::bytes(s.data(), s.size());
      },
      "private_pem"_a, "data"_a);
  m.def(
      "verify",
      [](const std::string& public_pem, const nb::bytes& data, const nb::bytes& signature) {
        nb::gil_scoped_release released;
        return verify(public_pem, std::string_view(data.c_str(), data.size()),
                      std::string_view(signature.c_str(), signature.size()));
      },
      "public_pem"_a, "data"_a, "signature"_a);
  m.def("trusted_keys", &trusted_keys, release_gil(), "config_dir"_a,
        "the public keys in <config_dir>/trusted");
}

}  // namespace

void bind_artifact(nb::module_& m) {
  // ArtifactError and its subclasses become honed.errors' classes (bind_errors.cpp).
  m.attr("ARTIFACT_FORMAT_VERSION") = kArtifactFormatVersion;
  m.attr("MANIFEST_ENTRY") = kManifestEntry;
  m.attr("SIGNATURE_ENTRY") = kSignatureEntry;
  bind_manifest(m);
  bind_reader(m);
  bind_keys(m);
  m.def(
      "artifact_incompatibility",
      [](const Manifest& manifest, const std::string& torch, bool cuda_available,
         const std::string& gpu, const std::string& compute_capability) {
        return incompatibility(manifest.env(), manifest.has_payload(),
                               HostEnvironment{torch, cuda_available, gpu, compute_capability});
      },
      "manifest"_a, "torch"_a, "cuda_available"_a, "gpu"_a = "", "compute_capability"_a = "",
      "Why the artifact cannot run here as it is ('' when it can)");
}

}  // namespace honed::py
