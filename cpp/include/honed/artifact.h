// cpp/include/honed/artifact.h: the .honed file: read, verify hashes, environment rules, entries.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "honed/shapes.h"

namespace honed {

inline constexpr const char* kArtifactFormat = "honed";
inline constexpr int kArtifactFormatVersion = 1;
inline constexpr const char* kManifestEntry = "manifest.json";

// A file that is not a (readable, intact) honed artifact. The message names the file, the entry
// and what to do; front ends add their own prefix ("honed.load: ", "honed-run: ").
class ArtifactError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An intact artifact this build or machine cannot use as it is (format version, torch, GPU).
class IncompatibleArtifactError : public ArtifactError {
 public:
  using ArtifactError::ArtifactError;
};

// The environment fingerprint of the manifest (src/honed/environment.py writes it).
struct ArtifactEnvironment {
  std::string torch;               // "2.11.0+cu130"
  std::string torch_cuda;          // "13.0", "" for a CPU build
  std::string device;              // "cpu", "cuda:0"
  std::string gpu;                 // "" unless saved on CUDA
  std::string compute_capability;  // "9.0", "" unless saved on CUDA
};

// One tuned graph of a module.
struct ArtifactGraph {
  GraphProfile profile;
  std::string backend;                         // the recipe's backend name
  bool runnable_from_cpp = false;              // honed::Model can run it
  std::map<std::string, std::string> payload;  // payload file name -> entry
  std::string samples;                         // entry of its sample inputs, "" when none
  std::string outputs;                         // entry of eager's outputs for them, "" when none
};

struct ArtifactModule {
  std::string name;
  std::string weights;  // entry
  std::vector<ArtifactGraph> graphs;
};

struct Artifact {
  std::string path;
  std::string manifest_json;  // the manifest as stored
  std::string honed_version;
  ArtifactEnvironment environment;
  std::vector<ArtifactModule> modules;
  std::map<std::string, std::string> entries;  // verified entries kept in memory: name -> bytes
  bool has_payload() const;                    // any graph with a compiled payload
  const std::string& entry(const std::string& name) const;  // ArtifactError when not kept
};

// Which entries read_artifact keeps in memory (all are verified either way); null keeps all.
using EntryFilter = std::function<bool(const std::string& name)>;

// Opens the zip, parses the manifest, checks format and version, and verifies the SHA-256 of every
// entry the manifest lists (a missing, tampered or truncated entry is refused, naming it).
// Throws ArtifactError (damage, not an artifact) or IncompatibleArtifactError (format version).
Artifact read_artifact(const std::string& path, const EntryFilter& keep = nullptr);

// The parts of a manifest (JSON text) read_artifact fills in; throws ArtifactError when malformed.
Artifact parse_manifest(std::string_view manifest_json, const std::string& path = "");

// What this process offers, for the compatibility rules.
struct HostEnvironment {
  std::string torch;               // the torch this process runs (TORCH_VERSION / __version__)
  bool cuda_available = false;     // torch can use CUDA here
  std::string gpu;                 // name of the GPU it would run on, "" without CUDA
  std::string compute_capability;  // "9.0", "" without CUDA
};

// Why the artifact cannot run here as it is, or "" when it can. The rules (the same for
// honed.load and honed::Model):
//  - compiled payloads are tied to the torch that built them: the torch major.minor must match
//    (local version parts such as +cu130 are ignored);
//  - an artifact saved on CUDA needs CUDA here, on a GPU of the same name and compute capability.
std::string incompatibility(const ArtifactEnvironment& saved, bool has_payload,
                            const HostEnvironment& here);

// "2.11.0+cu130" -> "2.11".
std::string torch_minor(std::string_view version);

// Lower-case hex SHA-256 of data (OpenSSL's EVP interface).
std::string sha256_hex(std::string_view data);

// ---- safetensors (the samples and outputs stored in an artifact) ------------------------------

struct RawTensor {
  std::string dtype;  // safetensors dtype: "F32", "F16", "BF16", "I64", "BOOL", ...
  std::vector<int64_t> shape;
  std::string_view data;  // views the buffer parse_safetensors was given
};

struct SafeTensors {
  std::map<std::string, RawTensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Parses a safetensors buffer; its tensors view `buffer`, which must outlive the result.
// Throws ArtifactError on a malformed buffer (bad header, offsets outside the data).
SafeTensors parse_safetensors(std::string_view buffer);

}  // namespace honed
