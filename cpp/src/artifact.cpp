// cpp/src/artifact.cpp: the typed manifest and its JSON, environment rules, SHA-256, safetensors.
#include "honed/artifact.h"

#include <stdexcept>

#include "honed/digest.h"

namespace honed {
namespace {

using json = nlohmann::json;

// A manifest field of the wrong type or missing: names the field and the file.
[[noreturn]] void bad_field(const std::string& where, const std::string& field,
                            const std::string& what) {
  throw ArtifactError(where + " has a malformed manifest: " + field + " " + what +
                      "; re-save it from the tuned model");
}

const char* type_of(const json& v) { return v.type_name(); }

const json& field(const json& obj, const char* key, const std::string& at,
                  const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) bad_field(where, at + key, "is missing");
  return *it;
}

// A string field; null (or absent, when optional) reads as "".
std::string text(const json& obj, const char* key, const std::string& at, const std::string& where,
                 bool required = false) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (required) bad_field(where, at + key, "is missing");
    return "";
  }
  if (it->is_null() && !required) return "";
  if (!it->is_string()) {
    bad_field(where, at + key, std::string("must be a string, not ") + type_of(*it));
  }
  return it->get<std::string>();
}

const json& array(const json& obj, const char* key, const std::string& at,
                  const std::string& where) {
  const json& v = field(obj, key, at, where);
  if (!v.is_array()) bad_field(where, at + key, std::string("must be a list, not ") + type_of(v));
  return v;
}

const json& object(const json& v, const std::string& at, const std::string& where) {
  if (!v.is_object()) bad_field(where, at, std::string("must be an object, not ") + type_of(v));
  return v;
}

std::map<std::string, std::string> string_map(const json& obj, const char* key,
                                              const std::string& at, const std::string& where) {
  std::map<std::string, std::string> out;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return out;
  for (const auto& [k, v] : object(*it, at + key, where).items()) {
    if (!v.is_string()) {
      bad_field(where, at + key + "['" + k + "']",
                std::string("must be a string, not ") + type_of(v));
    }
    out[k] = v.get<std::string>();
  }
  return out;
}

ManifestGraph graph_from_json(const json& g, const std::string& at, const std::string& where) {
  object(g, at, where);
  ManifestGraph graph;
  const json& profile = object(field(g, "profile", at + ".", where), at + ".profile", where);
  try {
    graph.profile = profile_from_json(profile.dump());
  } catch (const std::invalid_argument& e) {
    bad_field(where, at + ".profile", std::string("is not a shape profile (") + e.what() + ")");
  }
  try {
    parse_graph_key(graph.profile.graph_key);
  } catch (const std::invalid_argument& e) {
    bad_field(where, at + ".profile.graph_key", std::string("is malformed (") + e.what() + ")");
  }
  graph.backend = object(field(g, "backend", at + ".", where), at + ".backend", where);
  if (auto it = graph.backend.find("backend"); it != graph.backend.end() && !it->is_string()) {
    bad_field(where, at + ".backend.backend", "must be a string");
  }
  graph.figures = g.value("figures", json::object());
  if (graph.figures.is_null()) graph.figures = json::object();
  if (auto it = g.find("runnable_from_cpp"); it != g.end()) {
    if (!it->is_boolean()) bad_field(where, at + ".runnable_from_cpp", "must be true or false");
    graph.runnable_from_cpp = it->get<bool>();
  }
  graph.payload = string_map(g, "payload", at + ".", where);
  graph.samples = text(g, "samples", at + ".", where);
  graph.outputs = text(g, "outputs", at + ".", where);
  return graph;
}

json graph_to_json(const ManifestGraph& g) {
  json payload = json(nullptr);
  if (!g.payload.empty()) payload = g.payload;
  auto entry = [](const std::string& name) { return name.empty() ? json(nullptr) : json(name); };
  return {{"graph_key", g.profile.graph_key},
          {"profile", json::parse(to_json(g.profile))},
          {"backend", g.backend},
          {"figures", g.figures},
          {"runnable_from_cpp", g.runnable_from_cpp},
          {"payload", payload},
          {"samples", entry(g.samples)},
          {"outputs", entry(g.outputs)}};
}

}  // namespace

std::string ManifestGraph::backend_name() const {
  auto it = backend.find("backend");
  return it != backend.end() && it->is_string() ? it->get<std::string>() : "";
}

ArtifactEnvironment Manifest::env() const {
  auto get = [&](const char* key) {
    auto it = environment.find(key);
    if (it == environment.end() || it->is_null()) return std::string();
    return it->is_string() ? it->get<std::string>() : it->dump();
  };
  ArtifactEnvironment e{get("torch"), get("torch_cuda"), get("device"), get("gpu"),
                        get("compute_capability")};
  if (e.device.empty()) e.device = "cpu";
  return e;
}

bool Manifest::has_payload() const {
  for (const ManifestModule& m : modules) {
    for (const ManifestGraph& g : m.graphs) {
      if (!g.payload.empty()) return true;
    }
  }
  return false;
}

std::string manifest_to_json(const Manifest& m) {
  json modules = json::array();
  for (const ManifestModule& mod : m.modules) {
    json graphs = json::array();
    for (const ManifestGraph& g : mod.graphs) graphs.push_back(graph_to_json(g));
    modules.push_back({{"name", mod.name},
                       {"class", mod.class_name},
                       {"weights", mod.weights},
                       {"num_parameters", mod.num_parameters},
                       {"graphs", graphs},
                       {"report", mod.report}});
  }
  json out = {{"format", kArtifactFormat},
              {"format_version", kArtifactFormatVersion},
              {"honed_version", m.honed_version},
              {"created", m.created},
              {"environment", m.environment},
              {"machine", m.machine},
              {"modules", modules},
              {"entries", m.entries}};
  if (!m.entry_chunks.empty()) {
    out["entry_chunk_bytes"] = kEntryChunkBytes;
    out["entry_chunks"] = m.entry_chunks;
  }
  return out.dump(2);
}

Manifest manifest_from_json(std::string_view text_in, const std::string& where) {
  json m;
  try {
    m = json::parse(text_in);
  } catch (const json::exception& e) {
    throw ArtifactError(where + " is not a honed artifact (its " + kManifestEntry +
                        " is not JSON: " + e.what() + ")");
  }
  if (!m.is_object() || m.value("format", json()) != kArtifactFormat) {
    throw ArtifactError(where + " is not a honed artifact (" + kManifestEntry +
                        " has no \"format\": \"honed\")");
  }
  const json version = m.value("format_version", json());
  if (version != kArtifactFormatVersion) {
    throw IncompatibleArtifactError(where + " has format version " + version.dump() +
                                    ", this honed reads " + std::to_string(kArtifactFormatVersion) +
                                    "; load it with the honed that wrote it");
  }
  Manifest out;
  out.honed_version = text(m, "honed_version", "", where);
  out.created = text(m, "created", "", where);
  out.environment = object(field(m, "environment", "", where), "environment", where);
  if (auto it = m.find("machine"); it != m.end() && !it->is_null()) {
    out.machine = object(*it, "machine", where);  // absent in artifacts written before it was
  }
  const json& modules = array(m, "modules", "", where);
  for (size_t i = 0; i < modules.size(); ++i) {
    const std::string at = "modules[" + std::to_string(i) + "]";
    const json& mod = object(modules[i], at, where);
    ManifestModule module;
    module.name = text(mod, "name", at + ".", where, true);
    module.class_name = text(mod, "class", at + ".", where);
    module.weights = text(mod, "weights", at + ".", where);
    if (auto it = mod.find("num_parameters"); it != mod.end() && !it->is_null()) {
      if (!it->is_number_integer()) bad_field(where, at + ".num_parameters", "must be an integer");
      module.num_parameters = it->get<int64_t>();
    }
    module.report = mod.value("report", json());
    if (!module.report.is_null()) object(module.report, at + ".report", where);
    const json& graphs = array(mod, "graphs", at + ".", where);
    for (size_t j = 0; j < graphs.size(); ++j) {
      module.graphs.push_back(
          graph_from_json(graphs[j], at + ".graphs[" + std::to_string(j) + "]", where));
    }
    out.modules.push_back(std::move(module));
  }
  out.entries = string_map(m, "entries", "", where);
  if (auto it = m.find("entry_chunks"); it != m.end() && !it->is_null()) {
    const json size = m.value("entry_chunk_bytes", json());
    if (!size.is_number_unsigned() || size.get<uint64_t>() != kEntryChunkBytes) {
      bad_field(where, "entry_chunk_bytes",
                "must be " + std::to_string(kEntryChunkBytes) + ", not " + size.dump());
    }
    for (const auto& [name, pieces] : object(*it, "entry_chunks", where).items()) {
      const std::string at = "entry_chunks." + name;
      if (!out.entries.count(name))
        bad_field(where, at, "names an entry the manifest does not list");
      if (!pieces.is_array()) bad_field(where, at, "must be a list of SHA-256 digests");
      std::vector<std::string>& digests = out.entry_chunks[name];
      for (const json& d : pieces) {
        if (!d.is_string() || d.get_ref<const std::string&>().size() != 64) {
          bad_field(where, at, "must be a list of SHA-256 digests");
        }
        digests.push_back(d.get<std::string>());
      }
    }
  }
  return out;
}

std::string torch_minor(std::string_view version) {
  version = version.substr(0, version.find('+'));
  size_t first = version.find('.');
  if (first == std::string_view::npos) return std::string(version);
  size_t second = version.find('.', first + 1);
  return std::string(version.substr(0, second));
}

std::string incompatibility(const ArtifactEnvironment& saved, bool has_payload,
                            const HostEnvironment& here) {
  if (has_payload && torch_minor(saved.torch) != torch_minor(here.torch)) {
    return "torch " + saved.torch +
           " (compiled payloads are tied to the torch that built them; this is torch " +
           here.torch + ")";
  }
  if (saved.device.rfind("cuda", 0) == 0) {
    if (!here.cuda_available) {
      return "GPU " + saved.gpu + " (CUDA), and torch cannot use CUDA here";
    }
    if (saved.gpu != here.gpu || saved.compute_capability != here.compute_capability) {
      return "GPU " + saved.gpu + " (sm " + saved.compute_capability + "), this is " + here.gpu +
             " (sm " + here.compute_capability + ")";
    }
  }
  return "";
}

std::string sha256_hex(std::string_view data) {
  Sha256 hash;
  hash.update(data.data(), data.size());
  return hash.hexdigest();
}

namespace {
// Bytes per element of a safetensors dtype, 0 when unknown.
size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},   {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2},
      {"U16", 2},  {"F16", 2}, {"BF16", 2}, {"I32", 4},     {"U32", 4},     {"F32", 4},
      {"I64", 8},  {"U64", 8}, {"F64", 8},  {"C64", 8}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}
}  // namespace

SafeTensors parse_safetensors(std::string_view buffer) {
  if (buffer.size() < 8) throw ArtifactError("safetensors buffer shorter than its header size");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<unsigned char>(buffer[static_cast<size_t>(i)]);
  }
  if (header_len > buffer.size() - 8) throw ArtifactError("safetensors header runs past the data");
  std::string_view data = buffer.substr(8 + header_len);
  SafeTensors out;
  try {
    json header = json::parse(buffer.substr(8, header_len));
    if (!header.is_object()) throw ArtifactError("safetensors header is not a JSON object");
    for (const auto& [name, info] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, v] : info.items()) out.metadata[k] = v.get<std::string>();
        continue;
      }
      RawTensor t;
      t.dtype = info.at("dtype").get<std::string>();
      t.shape = info.at("shape").get<std::vector<int64_t>>();
      auto offsets = info.at("data_offsets").get<std::vector<uint64_t>>();
      if (offsets.size() != 2 || offsets[0] > offsets[1] || offsets[1] > data.size()) {
        throw ArtifactError("safetensors tensor " + name + " has offsets outside the data");
      }
      uint64_t count = 1;
      for (int64_t d : t.shape) {
        if (d < 0) throw ArtifactError("safetensors tensor " + name + " has a negative size");
        count *= static_cast<uint64_t>(d);
      }
      if (count * dtype_bytes(t.dtype) != offsets[1] - offsets[0]) {
        throw ArtifactError("safetensors tensor " + name + " (" + t.dtype +
                            ") holds a byte count that does not match its shape");
      }
      t.data = data.substr(offsets[0], offsets[1] - offsets[0]);
      out.tensors.emplace(name, std::move(t));
    }
  } catch (const json::exception& e) {
    throw ArtifactError(std::string("malformed safetensors header: ") + e.what());
  }
  return out;
}

}  // namespace honed
