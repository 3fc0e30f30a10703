// cpp/include/honed/artifact.h: the .honed file: its typed manifest, writer, verifying reader,
// signatures.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "honed/shapes.h"

namespace honed {

inline constexpr const char* kArtifactFormat = "honed";
inline constexpr int kArtifactFormatVersion = 1;
// The piece size of Manifest::entry_chunks, stored beside them as "entry_chunk_bytes".
inline constexpr size_t kEntryChunkBytes = size_t{16} << 20;
inline constexpr const char* kManifestEntry = "manifest.json";
// The Ed25519 signature of manifest.json's bytes (which hold every other entry's SHA-256).
inline constexpr const char* kSignatureEntry = "manifest.sig";
// manifest.json and manifest.sig are parsed in memory: larger ones are refused before reading.
inline constexpr uint64_t kMaxManifestBytes = 64ull << 20;

// A file that is not a (readable, intact, trusted) honed artifact. The message names the file,
// the entry and what to do; front ends add their own prefix ("honed.load: ", "honed-run: ").
class ArtifactError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An intact artifact this build or machine cannot use as it is (format version, torch, GPU).
class IncompatibleArtifactError : public ArtifactError {
 public:
  using ArtifactError::ArtifactError;
};

// An intact artifact with native code that no trusted key signed (see docs/trust.md).
class UntrustedArtifactError : public ArtifactError {
 public:
  using ArtifactError::ArtifactError;
};

// ---- the manifest ------------------------------------------------------------------------------

// The environment fingerprint's fields the compatibility rules read (src/honed/environment.py
// writes the whole fingerprint; Manifest::environment keeps all of it).
struct ArtifactEnvironment {
  std::string torch;               // "2.11.0+cu130"
  std::string torch_cuda;          // "13.0", "" for a CPU build
  std::string device;              // "cpu", "cuda:0"
  std::string gpu;                 // "" unless saved on CUDA
  std::string compute_capability;  // "9.0", "" unless saved on CUDA
};

// One tuned graph of a module.
struct ManifestGraph {
  GraphProfile profile;                               // its graph_key is the graph's key
  nlohmann::json backend = nlohmann::json::object();  // the backend's recipe (Backend.recipe())
  nlohmann::json figures = nlohmann::json::object();  // measured figures of the variant
  bool runnable_from_cpp = false;                     // honed::Model can run it
  std::map<std::string, std::string> payload;         // payload file name -> entry
  std::string samples;                                // entry of its sample inputs, "" for none
  std::string outputs;                                // entry of eager's outputs, "" for none
  std::string backend_name() const;                   // backend["backend"], "" when absent
};

struct ManifestModule {
  std::string name;
  std::string class_name;  // "package.module.Class" of the tuned torch module
  std::string weights;     // entry
  int64_t num_parameters = 0;
  std::vector<ManifestGraph> graphs;
  nlohmann::json report;  // the module's TuneReport.to_dict(), null when none
};

struct Manifest {
  std::string honed_version;
  std::string created;                                    // ISO 8601, UTC
  nlohmann::json environment = nlohmann::json::object();  // the environment fingerprint
  nlohmann::json machine = nlohmann::json::object();      // where it was measured; no rule reads it
  std::vector<ManifestModule> modules;
  std::map<std::string, std::string> entries;  // entry -> SHA-256 (write_artifact fills it)
  // entry -> the SHA-256 of each kEntryChunkBytes piece, for entries longer than one piece
  // (write_artifact fills it): a reader verifies those pieces side by side instead of hashing a
  // large entry on one core. Readers that predate it check `entries` alone.
  std::map<std::string, std::vector<std::string>> entry_chunks;

  ArtifactEnvironment env() const;  // the fields of `environment` the rules read
  bool has_payload() const;         // any graph with a compiled payload
};

// The manifest as stored (format and format_version included), and back. The reader refuses a
// foreign format, another format version (IncompatibleArtifactError) and fields of the wrong
// type, naming the field. `where` names the file in messages.
std::string manifest_to_json(const Manifest& manifest);
Manifest manifest_from_json(std::string_view text, const std::string& where = "the artifact");

// ---- writing -----------------------------------------------------------------------------------

struct EntryData {
  std::string name;       // "weights/m.safetensors"; no "..", no leading '/'
  std::string_view data;  // must stay valid until write_artifact returns
};

// Writes `manifest` and `entries` to path: fills manifest.entries with each entry's SHA-256,
// stores the manifest, signs its bytes with the Ed25519 private key `signing_key_pem` unless it is
// empty, and stores every entry uncompressed. The zip is written beside path under a temporary
// name created with mode 0666 & ~umask, then renamed over path, so a failure leaves nothing
// partial. Returns the manifest as written. Throws ArtifactError.
Manifest write_artifact(const std::string& path, Manifest manifest,
                        const std::vector<EntryData>& entries,
                        const std::string& signing_key_pem = "");

// ---- reading -----------------------------------------------------------------------------------

class MappedFile;  // the file mapped read-only (artifact.cpp)

struct ArtifactSignature {
  std::string public_key_pem;
  std::string signature;  // raw Ed25519 signature of manifest_json
  std::string key_id() const;
};

// A verified artifact. The file is mapped read-only once; entries are views into the mapping
// (stored entries are never copied), valid while any copy of this Artifact lives.
struct Artifact {
  std::string path;
  Manifest manifest;
  std::string manifest_json;  // the manifest's bytes as stored (what the signature covers)
  std::optional<ArtifactSignature> signature;
  std::shared_ptr<const MappedFile> file;
  std::map<std::string, std::string_view> views;  // every listed entry -> its bytes in `file`

  // The bytes of a listed entry; ArtifactError naming the entry when the manifest lists none.
  std::string_view entry(const std::string& name) const;
  // The whole file as mapped: an entry's offset in the file is entry(name).data() - bytes().data().
  std::string_view bytes() const;
};

// Opens path and verifies it before anything else reads it: a zip whose central directory and
// local headers agree; no duplicate, absolute or ".." entry names; every entry stored
// uncompressed, within the file and no larger than it; exactly the entries the manifest lists
// (plus manifest.sig); each entry's CRC-32 and the manifest's SHA-256 of it (computed in one
// streaming pass over the mapping). Throws ArtifactError naming the entry and what is wrong, or
// IncompatibleArtifactError (format version).
Artifact read_artifact(const std::string& path);

// ---- signatures and trust ----------------------------------------------------------------------

struct SigningKey {
  std::string private_pem;  // PKCS#8 PEM
  std::string public_pem;   // SubjectPublicKeyInfo PEM
};
SigningKey generate_signing_key();                          // a fresh Ed25519 key pair
std::string public_key_of(const std::string& private_pem);  // throws ArtifactError when not Ed25519
// The first 16 hex digits of the SHA-256 of the raw public key: how keys are named to people.
std::string key_id(const std::string& public_pem);
std::string sign(const std::string& private_pem, std::string_view data);  // raw signature
bool verify(const std::string& public_pem, std::string_view data, std::string_view signature);

enum class Trust { kUnsigned, kTrusted, kUnknownKey, kBadSignature };
struct TrustCheck {
  Trust trust = Trust::kUnsigned;
  std::string key_id;  // the signer's key id, "" when unsigned
};
// Whether the artifact's signature verifies and its key is one of `trusted_public_pems`.
TrustCheck check_trust(const Artifact& artifact,
                       const std::vector<std::string>& trusted_public_pems);

// The user's honed config folder: $XDG_CONFIG_HOME/honed, else $HOME/.config/honed.
std::string config_dir();
// The public keys in <dir>/trusted/*.pub (what `honed trust` adds); unreadable files are skipped.
std::vector<std::string> trusted_keys(const std::string& dir);

// The one-line refusal of an artifact with native code that is not trusted; `opt_in` names the
// front end's way to load it anyway ("honed.load(..., trust_native_code=True)").
std::string untrusted_message(const std::string& path, const TrustCheck& check,
                              const std::string& native_entry, const std::string& opt_in);

// ---- compatibility -----------------------------------------------------------------------------

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
// Throws ArtifactError on a malformed buffer (bad header, offsets outside the data, a byte size
// that does not match dtype and shape).
SafeTensors parse_safetensors(std::string_view buffer);

}  // namespace honed
