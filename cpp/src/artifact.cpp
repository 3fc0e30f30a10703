// cpp/src/artifact.cpp: the .honed zip (libzip), SHA-256 (OpenSSL EVP), manifest, environment.
#include "honed/artifact.h"

#include <openssl/evp.h>
#include <zip.h>

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

namespace honed {
namespace {

using json = nlohmann::json;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string str_or_empty(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};
using ZipPtr = std::unique_ptr<zip_t, ZipCloser>;

struct FileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

std::string unreadable(const std::string& path, const std::string& why) {
  return path + " is not a readable honed artifact (truncated or not a zip: " + why + ")";
}

ZipPtr open_zip(const std::string& path) {
  int err = 0;
  // ZIP_CHECKCONS: refuse an archive whose central directory disagrees with its entries.
  zip_t* z = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &err);
  if (z == nullptr) {
    if (err == ZIP_ER_NOENT || err == ZIP_ER_OPEN) {
      throw ArtifactError(path + " does not exist (or is not a file)");
    }
    zip_error_t ze;
    zip_error_init_with_code(&ze, err);
    std::string why = zip_error_strerror(&ze);
    zip_error_fini(&ze);
    throw ArtifactError(unreadable(path, why));
  }
  return ZipPtr(z);
}

// Reads one entry whole; libzip also checks its CRC-32 on the way.
std::string read_entry(zip_t* z, const std::string& name, const std::string& path) {
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat(z, name.c_str(), 0, &st) != 0) {
    throw ArtifactError(path + " is missing entry " + quoted(name) +
                        "; the file is incomplete: re-save it from the tuned model");
  }
  std::unique_ptr<zip_file_t, FileCloser> f(zip_fopen_index(z, st.index, 0));
  if (!f) throw ArtifactError(unreadable(path, "cannot open entry " + name));
  std::string data(static_cast<size_t>(st.size), '\0');
  zip_uint64_t done = 0;
  while (done < st.size) {
    zip_int64_t n = zip_fread(f.get(), data.data() + done, st.size - done);
    if (n <= 0) {
      throw ArtifactError(unreadable(path, "entry " + name + ": " + zip_file_strerror(f.get())));
    }
    done += static_cast<zip_uint64_t>(n);
  }
  return data;
}

ArtifactGraph parse_graph(const json& g) {
  ArtifactGraph graph;
  graph.profile = profile_from_json(g.at("profile").dump());
  const json& backend = g.at("backend");
  graph.backend = backend.is_object() ? str_or_empty(backend, "backend") : "";
  graph.runnable_from_cpp = g.value("runnable_from_cpp", false);
  if (auto p = g.find("payload"); p != g.end() && p->is_object()) {
    for (const auto& [file, entry] : p->items()) graph.payload[file] = entry.get<std::string>();
  }
  graph.samples = str_or_empty(g, "samples");
  graph.outputs = str_or_empty(g, "outputs");
  return graph;
}

}  // namespace

bool Artifact::has_payload() const {
  for (const ArtifactModule& m : modules) {
    for (const ArtifactGraph& g : m.graphs) {
      if (!g.payload.empty()) return true;
    }
  }
  return false;
}

const std::string& Artifact::entry(const std::string& name) const {
  auto it = entries.find(name);
  if (it == entries.end()) {
    throw ArtifactError(path + ": entry " + quoted(name) + " was not loaded (or does not exist)");
  }
  return it->second;
}

Artifact parse_manifest(std::string_view manifest_json, const std::string& path) {
  Artifact a;
  a.path = path;
  a.manifest_json = std::string(manifest_json);
  json m;
  try {
    m = json::parse(manifest_json);
  } catch (const json::exception& e) {
    throw ArtifactError(path + " is not a honed artifact (its manifest is not JSON: " + e.what() +
                        ")");
  }
  if (!m.is_object() || m.value("format", "") != kArtifactFormat) {
    throw ArtifactError(path + " is not a honed artifact");
  }
  const json version = m.value("format_version", json());
  if (version != kArtifactFormatVersion) {
    throw IncompatibleArtifactError(path + " has format version " + version.dump() +
                                    ", this honed reads " + std::to_string(kArtifactFormatVersion) +
                                    "; load it with the honed that wrote it");
  }
  try {
    a.honed_version = str_or_empty(m, "honed_version");
    const json& env = m.at("environment");
    a.environment = ArtifactEnvironment{str_or_empty(env, "torch"), str_or_empty(env, "torch_cuda"),
                                        str_or_empty(env, "device"), str_or_empty(env, "gpu"),
                                        str_or_empty(env, "compute_capability")};
    if (a.environment.device.empty()) a.environment.device = "cpu";
    for (const json& mod : m.at("modules")) {
      ArtifactModule module{mod.at("name").get<std::string>(), str_or_empty(mod, "weights"), {}};
      for (const json& g : mod.at("graphs")) module.graphs.push_back(parse_graph(g));
      a.modules.push_back(std::move(module));
    }
  } catch (const ArtifactError&) {
    throw;
  } catch (const std::exception& e) {
    throw ArtifactError(path + " has a malformed manifest (" + e.what() +
                        "); re-save it from the tuned model");
  }
  return a;
}

Artifact read_artifact(const std::string& path, const EntryFilter& keep) {
  ZipPtr z = open_zip(path);
  zip_int64_t listed = zip_get_num_entries(z.get(), 0);
  bool has_manifest = zip_name_locate(z.get(), kManifestEntry, 0) >= 0;
  if (!has_manifest) {
    throw ArtifactError(path + " is not a honed artifact (no " + kManifestEntry + ", " +
                        std::to_string(listed) + " entries)");
  }
  std::string manifest = read_entry(z.get(), kManifestEntry, path);
  Artifact a = parse_manifest(manifest, path);
  json hashes;
  try {
    hashes = json::parse(manifest).at("entries");
  } catch (const json::exception& e) {
    throw ArtifactError(path + " has a malformed manifest (no entry hashes: " + e.what() + ")");
  }
  for (const auto& [name, digest] : hashes.items()) {
    std::string data = read_entry(z.get(), name, path);
    if (!digest.is_string() || sha256_hex(data) != digest.get<std::string>()) {
      throw ArtifactError("entry " + quoted(name) + " of " + path +
                          " does not match its SHA-256: the file was modified or damaged; "
                          "re-save it from the tuned model");
    }
    if (!keep || keep(name)) a.entries.emplace(name, std::move(data));
  }
  return a;
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
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("sha256_hex: OpenSSL EVP_Digest(SHA-256) failed");
  }
  static const char* hex = "0123456789abcdef";
  std::string out(2 * len, '0');
  for (unsigned int i = 0; i < len; ++i) {
    out[2 * i] = hex[digest[i] >> 4];
    out[2 * i + 1] = hex[digest[i] & 0xf];
  }
  return out;
}

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
      t.data = data.substr(offsets[0], offsets[1] - offsets[0]);
      out.tensors.emplace(name, std::move(t));
    }
  } catch (const json::exception& e) {
    throw ArtifactError(std::string("malformed safetensors header: ") + e.what());
  }
  return out;
}

}  // namespace honed
