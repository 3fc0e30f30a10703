// cpp/tests/test_artifact.cpp: writing, reading and verifying .honed files; signatures; rules.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "honed/artifact.h"

namespace honed {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path temp_dir() {
  fs::path dir = fs::temp_directory_path() / ("honed-artifact-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir;
}

GraphProfile small_profile() {
  GraphProfile p;
  p.graph_key = "((*,),{})|float32,cpu,2";
  p.axes = {{Axis{AxisKind::kBatch, "batch", 1, 4, 8}, Axis{AxisKind::kStatic, "", 3, 3, 3}}};
  p.batch_axes = {0};
  p.min_batch = 1;
  p.opt_batch = 4;
  p.max_batch = 8;
  return p;
}

Manifest small_manifest() {
  ManifestGraph graph;
  graph.profile = small_profile();
  graph.backend = {{"backend", "TorchInductorAotBackend"}};
  graph.runnable_from_cpp = true;
  graph.payload = {{"model.pt2", "payloads/m/0/model.pt2"}};
  graph.samples = "samples/m/0.safetensors";
  ManifestModule module;
  module.name = "m";
  module.weights = "weights/m.safetensors";
  module.graphs = {graph};
  Manifest m;
  m.honed_version = "0.1.0";
  m.environment = {{"torch", "2.13.0+cpu"}, {"device", "cpu"}, {"gpu", nullptr}};
  m.modules = {module};
  return m;
}

std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void spill(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// Replaces every occurrence of `from` by `to` (same length) in the file's bytes: names in the
// local headers and the central directory, or bytes inside an entry.
void patch(const fs::path& path, const std::string& from, const std::string& to) {
  ASSERT_EQ(from.size(), to.size());
  std::string bytes = slurp(path);
  size_t found = 0;
  for (size_t at = bytes.find(from); at != std::string::npos; at = bytes.find(from, at + 1)) {
    bytes.replace(at, to.size(), to);
    ++found;
  }
  ASSERT_GT(found, 0u) << from;
  spill(path, bytes);
}

// A zip honed's writer would never make (for crafted-file tests only): entries in order, stored
// unless `deflate` names them.
void write_raw_zip(const fs::path& path, const std::vector<std::pair<std::string, std::string>>& e,
                   const std::string& deflate = "") {
  fs::remove(path);
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(z, nullptr);
  for (const auto& [name, data] : e) {
    zip_source_t* src = zip_source_buffer(z, data.data(), data.size(), 0);
    zip_int64_t index = zip_file_add(z, name.c_str(), src, 0);
    ASSERT_GE(index, 0);
    zip_set_file_compression(z, static_cast<zip_uint64_t>(index),
                             name == deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
  }
  ASSERT_EQ(zip_close(z), 0);
}

template <typename E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

class ArtifactFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    data_ = {{"weights/m.safetensors", std::string(1000, 'w')},
             {"payloads/m/0/model.pt2", "package bytes"},
             {"samples/m/0.safetensors", "sample bytes"}};
    path_ = dir_ / "good.honed";
    write(path_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Manifest write(const fs::path& path, const std::string& key = "") {
    std::vector<EntryData> entries;
    for (const auto& [name, data] : data_) entries.push_back({name, data});
    return write_artifact(path.string(), small_manifest(), entries, key);
  }

  fs::path dir_;
  fs::path path_;
  std::map<std::string, std::string> data_;
};

TEST_F(ArtifactFile, WritesAndReadsBackTypedManifestAndEntryViews) {
  Artifact a = read_artifact(path_);
  EXPECT_EQ(a.manifest.honed_version, "0.1.0");
  ArtifactEnvironment env = a.manifest.env();
  EXPECT_EQ(env.torch, "2.13.0+cpu");
  EXPECT_EQ(env.device, "cpu");
  EXPECT_EQ(env.gpu, "");
  ASSERT_EQ(a.manifest.modules.size(), 1u);
  ASSERT_EQ(a.manifest.modules[0].graphs.size(), 1u);
  const ManifestGraph& g = a.manifest.modules[0].graphs[0];
  EXPECT_EQ(g.profile, small_profile());
  EXPECT_EQ(g.backend_name(), "TorchInductorAotBackend");
  EXPECT_TRUE(g.runnable_from_cpp);
  EXPECT_EQ(g.payload.at("model.pt2"), "payloads/m/0/model.pt2");
  EXPECT_EQ(g.samples, "samples/m/0.safetensors");
  EXPECT_EQ(g.outputs, "");
  EXPECT_TRUE(a.manifest.has_payload());
  EXPECT_FALSE(a.signature.has_value());
  ASSERT_EQ(a.views.size(), data_.size());
  for (const auto& [name, data] : data_) {
    EXPECT_EQ(a.entry(name), data);
    EXPECT_EQ(a.manifest.entries.at(name), sha256_hex(data));
    // A view into the mapping, not a copy.
    const char* base = a.bytes().data();
    EXPECT_GE(a.entry(name).data(), base);
    EXPECT_LE(a.entry(name).data() + data.size(), base + a.bytes().size());
  }
  EXPECT_THROW(a.entry("weights/other.safetensors"), ArtifactError);
  // The manifest survives a round trip through its JSON unchanged.
  EXPECT_EQ(manifest_to_json(manifest_from_json(a.manifest_json)), a.manifest_json);
}

TEST_F(ArtifactFile, FileModeFollowsTheUmask) {
  mode_t old = umask(027);
  write(path_);
  umask(old);
  struct stat st{};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().filename(), "good.honed") << "left behind: " << e.path();
  }
}

TEST_F(ArtifactFile, WriterRefusesUnsafeAndDuplicateNames) {
  std::string data = "x";
  for (std::string bad : {"../x", "/abs", "a/../../b", "manifest.json", ""}) {
    EXPECT_THROW(write_artifact((dir_ / "bad.honed").string(), small_manifest(), {{bad, data}}),
                 ArtifactError)
        << bad;
  }
  EXPECT_THROW(
      write_artifact((dir_ / "bad.honed").string(), small_manifest(), {{"a", data}, {"a", data}}),
      ArtifactError);
  EXPECT_FALSE(fs::exists(dir_ / "bad.honed"));
}

TEST_F(ArtifactFile, FlippedByteInsideAnEntryIsRefusedNamingIt) {
  patch(path_, "package bytes", "package bytEs");
  std::string msg = error_of<ArtifactError>([&] { read_artifact(path_.string()); });
  EXPECT_HAS(msg, "'payloads/m/0/model.pt2'");
  EXPECT_HAS(msg, "CRC");
}

TEST_F(ArtifactFile, FlippedByteInsideTheManifestIsRefusedByItsCrc) {
  patch(path_, "\"honed_version\": \"0.1.0\"", "\"honed_version\": \"0.1.1\"");
  std::string msg = error_of<ArtifactError>([&] { read_artifact(path_.string()); });
  EXPECT_HAS(msg, "'manifest.json'");
  EXPECT_HAS(msg, "CRC");
}

TEST_F(ArtifactFile, ChangedEntryWithValidCrcFailsItsSha256) {
  data_["weights/m.safetensors"][500] = 'X';
  Manifest stale = small_manifest();
  stale.entries = read_artifact(path_.string()).manifest.entries;  // the old hashes
  std::vector<std::pair<std::string, std::string>> raw = {
      {kManifestEntry, manifest_to_json(stale)}};
  for (const auto& [name, data] : data_) raw.emplace_back(name, data);
  write_raw_zip(path_, raw);
  std::string msg = error_of<ArtifactError>([&] { read_artifact(path_.string()); });
  EXPECT_HAS(msg, "'weights/m.safetensors'");
  EXPECT_HAS(msg, "SHA-256");
}

// An entry over kEntryChunkBytes is verified piece by piece (side by side), every byte of it.
TEST_F(ArtifactFile, LargeEntryIsVerifiedByItsPieces) {
  std::string& weights = data_["weights/m.safetensors"];
  weights = std::string(2 * kEntryChunkBytes + 1000, 'w');
  for (size_t i = 0; i < weights.size(); i += 4099) weights[i] = static_cast<char>(i % 251);
  const Manifest written = write(path_);
  ASSERT_EQ(written.entry_chunks.size(), 1u);  // the small entries are hashed whole only
  const auto& pieces = written.entry_chunks.at("weights/m.safetensors");
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[2], sha256_hex(std::string_view(weights).substr(2 * kEntryChunkBytes)));
  EXPECT_EQ(written.entries.at("weights/m.safetensors"), sha256_hex(weights));
  Artifact a = read_artifact(path_.string());
  EXPECT_EQ(a.manifest.entry_chunks, written.entry_chunks);
  EXPECT_EQ(a.entry("weights/m.safetensors"), weights);

  // One byte changed in the last piece, the CRC rewritten to match: its SHA-256 refuses it.
  const std::string manifest = a.manifest_json;
  auto with = [&](const std::string& manifest_json) {
    std::vector<std::pair<std::string, std::string>> raw = {{kManifestEntry, manifest_json}};
    for (const auto& [name, data] : data_) raw.emplace_back(name, data);
    write_raw_zip(path_, raw);
  };
  weights[weights.size() - 10] ^= 1;
  with(manifest);
  std::string msg = error_of<ArtifactError>([&] { read_artifact(path_.string()); });
  EXPECT_HAS(msg, "'weights/m.safetensors'");
  EXPECT_HAS(msg, "SHA-256");
  weights[weights.size() - 10] ^= 1;

  // Pieces that do not cover the entry (one dropped), or a piece size this reader does not use.
  json fewer = json::parse(manifest);
  fewer["entry_chunks"]["weights/m.safetensors"].erase(2);
  with(fewer.dump());
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "piece digests do not cover");
  json other = json::parse(manifest);
  other["entry_chunk_bytes"] = 1 << 20;
  with(other.dump());
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "entry_chunk_bytes must be");
  with(manifest);
  EXPECT_EQ(read_artifact(path_.string()).entry("weights/m.safetensors"), weights);
}

TEST_F(ArtifactFile, DeclaredSizeBeyondTheFileIsRefusedBeforeReading) {
  // 3 GiB declared for a 13-byte entry, in the local header and the central directory.
  std::string bytes = slurp(path_);
  const std::string size13("\x0d\x00\x00\x00\x0d\x00\x00\x00", 8);
  const std::string size3g("\x00\x00\x00\xc0\x00\x00\x00\xc0", 8);
  size_t at = bytes.find(size13);
  ASSERT_NE(at, std::string::npos);
  for (; at != std::string::npos; at = bytes.find(size13, at + 1)) bytes.replace(at, 8, size3g);
  spill(path_, bytes);
  std::string msg = error_of<ArtifactError>([&] { read_artifact(path_.string()); });
  EXPECT_HAS(msg, "entry 'payloads/m/0/model.pt2' declares 3221225472 bytes");
}

TEST_F(ArtifactFile, TruncatedZipIsRefused) {
  std::string bytes = slurp(path_);
  fs::path cut = dir_ / "cut.honed";
  spill(cut, bytes.substr(0, bytes.size() / 2));
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(cut.string()); }),
             "not a readable honed artifact");
  fs::path text = dir_ / "notes.honed";
  spill(text, "hello");
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(text.string()); }),
             "not a readable honed artifact");
}

TEST_F(ArtifactFile, MissingAndUnreadableFiles) {
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact((dir_ / "nope.honed").string()); }),
             "does not exist");
  if (geteuid() != 0) {  // root reads any file
    fs::permissions(path_, fs::perms::none);
    std::string msg = error_of<ArtifactError>([&] { read_artifact(path_.string()); });
    EXPECT_HAS(msg, "cannot be read");
    EXPECT_EQ(msg.find("does not exist"), std::string::npos) << msg;
  }
}

TEST_F(ArtifactFile, CraftedArchivesAreRefusedNamingTheEntry) {
  const std::string manifest = read_artifact(path_.string()).manifest_json;
  std::vector<std::pair<std::string, std::string>> raw = {{kManifestEntry, manifest}};
  for (const auto& [name, data] : data_) raw.emplace_back(name, data);

  write_raw_zip(path_, {{"weights/m.safetensors", "w"}});
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }), "no manifest.json");

  auto fewer = raw;
  fewer.pop_back();  // "weights/m.safetensors" (the map's last name)
  write_raw_zip(path_, fewer);
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "missing entry 'weights/m.safetensors'");

  auto more = raw;
  more.emplace_back("extra.bin", "?");
  write_raw_zip(path_, more);
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "'extra.bin', which its manifest does not list");

  write_raw_zip(path_, raw, "weights/m.safetensors");
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "'weights/m.safetensors' is compressed");

  // Same-length renames in the local header and the central directory.
  auto twice = raw;
  twice.emplace_back("payloads/m/0/model.pt3", "package bytes");
  write_raw_zip(path_, twice);
  patch(path_, "payloads/m/0/model.pt3", "payloads/m/0/model.pt2");
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "'payloads/m/0/model.pt2' twice");

  auto slip = raw;
  slip.emplace_back("xx/evil", "x");
  write_raw_zip(path_, slip);
  patch(path_, "xx/evil", "../evil");
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }), "'../evil'");
}

TEST_F(ArtifactFile, ManifestOfTheWrongFormatVersionOrTypes) {
  json m = json::parse(read_artifact(path_.string()).manifest_json);
  auto with = [&](const json& manifest) {
    std::vector<std::pair<std::string, std::string>> raw = {{kManifestEntry, manifest.dump()}};
    for (const auto& [name, data] : data_) raw.emplace_back(name, data);
    write_raw_zip(path_, raw);
  };
  json newer = m;
  newer["format_version"] = 2;
  with(newer);
  EXPECT_HAS(error_of<IncompatibleArtifactError>([&] { read_artifact(path_.string()); }),
             "format version 2");
  json other = m;
  other["format"] = "other";
  with(other);
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "is not a honed artifact");
  json wrong = m;
  wrong["modules"][0]["graphs"][0]["samples"] = 5;
  with(wrong);
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "modules[0].graphs[0].samples must be a string, not number");
  wrong = m;
  wrong["modules"] = json::object();
  with(wrong);
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "modules must be a list");
  wrong = m;
  wrong["modules"][0]["graphs"][0]["profile"]["graph_key"] = "((*,),{})|float32";
  with(wrong);
  EXPECT_HAS(error_of<ArtifactError>([&] { read_artifact(path_.string()); }),
             "modules[0].graphs[0].profile.graph_key is malformed");
}

TEST_F(ArtifactFile, SignatureVerifiesAgainstTrustedKeysOnly) {
  SigningKey mine = generate_signing_key(), other = generate_signing_key();
  EXPECT_EQ(check_trust(read_artifact(path_.string()), {mine.public_pem}).trust, Trust::kUnsigned);
  write(path_, mine.private_pem);
  Artifact a = read_artifact(path_.string());
  ASSERT_TRUE(a.signature.has_value());
  EXPECT_EQ(a.signature->key_id(), key_id(mine.public_pem));
  EXPECT_EQ(check_trust(a, {other.public_pem, mine.public_pem}).trust, Trust::kTrusted);
  TrustCheck unknown = check_trust(a, {other.public_pem});
  EXPECT_EQ(unknown.trust, Trust::kUnknownKey);
  std::string msg = untrusted_message("a.honed", unknown, "model.pt2", "--trust-native-code");
  EXPECT_HAS(msg, "signed by key " + key_id(mine.public_pem));
  EXPECT_HAS(msg, "honed trust PUBKEY");
  EXPECT_HAS(msg, "--trust-native-code");
  EXPECT_EQ(untrusted_message("a.honed", {Trust::kTrusted, "x"}, "m", "o"), "");

  // A replaced payload with recomputed hashes keeps the old signature, which no longer matches.
  data_["payloads/m/0/model.pt2"] = "evil package!";
  json m = json::parse(a.manifest_json);
  m["entries"]["payloads/m/0/model.pt2"] = sha256_hex(data_["payloads/m/0/model.pt2"]);
  std::string hex;
  for (unsigned char c : a.signature->signature) {
    hex += "0123456789abcdef"[c >> 4];
    hex += "0123456789abcdef"[c & 0xf];
  }
  json sig = {
      {"algorithm", "ed25519"}, {"public_key", a.signature->public_key_pem}, {"signature", hex}};
  std::vector<std::pair<std::string, std::string>> raw = {{kManifestEntry, m.dump(2)},
                                                          {kSignatureEntry, sig.dump()}};
  for (const auto& [name, data] : data_) raw.emplace_back(name, data);
  write_raw_zip(path_, raw);
  EXPECT_EQ(check_trust(read_artifact(path_.string()), {mine.public_pem}).trust,
            Trust::kBadSignature);
}

TEST(Keys, SignVerifyAndIds) {
  SigningKey k = generate_signing_key();
  EXPECT_EQ(public_key_of(k.private_pem), k.public_pem);
  std::string id = key_id(k.public_pem);
  EXPECT_EQ(id.size(), 16u);
  std::string sig = sign(k.private_pem, "manifest bytes");
  EXPECT_EQ(sig.size(), 64u);
  EXPECT_TRUE(verify(k.public_pem, "manifest bytes", sig));
  EXPECT_FALSE(verify(k.public_pem, "manifest bytez", sig));
  EXPECT_FALSE(verify(generate_signing_key().public_pem, "manifest bytes", sig));
  EXPECT_THROW(public_key_of("not a key"), ArtifactError);
  EXPECT_THROW(key_id(k.private_pem), ArtifactError);  // a private key is not a public one
}

TEST(Keys, TrustedFolderHoldsPublicKeysOnly) {
  fs::path dir = temp_dir() / "config";
  fs::create_directories(dir / "trusted");
  SigningKey k = generate_signing_key();
  spill(dir / "trusted" / "a.pub", k.public_pem);
  spill(dir / "trusted" / "b.pub", "garbage");
  spill(dir / "trusted" / "c.txt", generate_signing_key().public_pem);
  EXPECT_EQ(trusted_keys(dir.string()), std::vector<std::string>{k.public_pem});
  EXPECT_TRUE(trusted_keys((dir / "none").string()).empty());
  fs::remove_all(dir);
}

TEST(ArtifactEnvironmentRules, TorchMinorMustMatchForPayloads) {
  ArtifactEnvironment saved{"2.11.0+cu130", "13.0", "cpu", "", ""};
  HostEnvironment here{"2.11.1", false, "", ""};
  EXPECT_EQ(incompatibility(saved, true, here), "");
  here.torch = "2.13.0+cpu";
  std::string why = incompatibility(saved, true, here);
  EXPECT_HAS(why, "torch 2.11.0+cu130");
  EXPECT_HAS(why, "this is torch 2.13.0+cpu");
  EXPECT_EQ(incompatibility(saved, false, here), "");  // weights only: any torch
  EXPECT_EQ(torch_minor("2.11.0+cu130"), "2.11");
  EXPECT_EQ(torch_minor("2"), "2");
}

TEST(ArtifactEnvironmentRules, CudaArtifactNeedsTheSameGpu) {
  ArtifactEnvironment saved{"2.11.0", "13.0", "cuda:0", "NVIDIA H100 80GB HBM3", "9.0"};
  HostEnvironment here{"2.11.0", false, "", ""};
  EXPECT_HAS(incompatibility(saved, true, here), "cannot use CUDA here");
  here = {"2.11.0", true, "NVIDIA A100-SXM4-40GB", "8.0"};
  EXPECT_HAS(incompatibility(saved, true, here),
             "NVIDIA H100 80GB HBM3 (sm 9.0), this is NVIDIA A100-SXM4-40GB (sm 8.0)");
  here = {"2.11.0", true, "NVIDIA H100 80GB HBM3", "9.0"};
  EXPECT_EQ(incompatibility(saved, true, here), "");
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(SafeTensors, ParsesHeaderAndViewsData) {
  std::string data(16, '\0');
  data[0] = 1;
  std::string header =
      R"({"__metadata__":{"k":"v"},"leaf0":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})";
  std::string buffer(8, '\0');
  buffer[0] = static_cast<char>(header.size());
  buffer += header + data;
  SafeTensors st = parse_safetensors(buffer);
  EXPECT_EQ(st.metadata.at("k"), "v");
  const RawTensor& t = st.tensors.at("leaf0");
  EXPECT_EQ(t.dtype, "F32");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(t.data.size(), 16u);
  EXPECT_EQ(t.data[0], 1);
  EXPECT_THROW(parse_safetensors(buffer.substr(0, 20)), ArtifactError);
  EXPECT_THROW(parse_safetensors("abc"), ArtifactError);
  std::string wrong = buffer;  // 2x3 float32 is 24 bytes, not the 16 it points at
  wrong.replace(wrong.find("[2,2]"), 5, "[2,3]");
  EXPECT_THROW(parse_safetensors(wrong), ArtifactError);
}

}  // namespace
}  // namespace honed
