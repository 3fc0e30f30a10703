// cpp/tests/test_artifact.cpp: reading and verifying .honed files; environment rules; safetensors.
#include <gtest/gtest.h>
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

json manifest_for(const std::map<std::string, std::string>& entries) {
  json hashes = json::object();
  for (const auto& [name, data] : entries) hashes[name] = sha256_hex(data);
  json graph = {{"graph_key", small_profile().graph_key},
                {"profile", json::parse(to_json(small_profile()))},
                {"backend", {{"backend", "TorchInductorAotBackend"}}},
                {"runnable_from_cpp", true},
                {"payload", {{"model.pt2", "payloads/m/0/model.pt2"}}},
                {"samples", "samples/m/0.safetensors"},
                {"outputs", nullptr}};
  return {{"format", "honed"},
          {"format_version", 1},
          {"honed_version", "0.1.0"},
          {"environment",
           {{"torch", "2.13.0+cpu"}, {"device", "cpu"}, {"gpu", nullptr}, {"torch_cuda", nullptr}}},
          {"modules", {{{"name", "m"}, {"weights", "weights/m.safetensors"}, {"graphs", {graph}}}}},
          {"entries", hashes}};
}

// Writes a zip of stored entries; manifest (when given) first, as honed.save does.
void write_zip(const fs::path& path, const std::map<std::string, std::string>& entries,
               const std::string* manifest) {
  fs::remove(path);
  int err = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &err);
  ASSERT_NE(z, nullptr);
  auto add = [&](const std::string& name, const std::string& data) {
    zip_source_t* src = zip_source_buffer(z, data.data(), data.size(), 0);
    ASSERT_NE(src, nullptr);
    zip_int64_t index = zip_file_add(z, name.c_str(), src, ZIP_FL_OVERWRITE);
    ASSERT_GE(index, 0);
    zip_set_file_compression(z, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
  };
  if (manifest != nullptr) add(kManifestEntry, *manifest);
  for (const auto& [name, data] : entries) add(name, data);
  ASSERT_EQ(zip_close(z), 0);
}

class ArtifactFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = temp_dir();
    entries_ = {{"weights/m.safetensors", std::string(1000, 'w')},
                {"payloads/m/0/model.pt2", "package bytes"},
                {"samples/m/0.safetensors", "sample bytes"}};
    manifest_ = manifest_for(entries_).dump();
    path_ = dir_ / "good.honed";
    write_zip(path_, entries_, &manifest_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  fs::path path_;
  std::map<std::string, std::string> entries_;
  std::string manifest_;
};

template <typename E>
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST_F(ArtifactFile, ReadsAndVerifiesEveryEntry) {
  Artifact a = read_artifact(path_);
  EXPECT_EQ(a.honed_version, "0.1.0");
  EXPECT_EQ(a.environment.torch, "2.13.0+cpu");
  EXPECT_EQ(a.environment.device, "cpu");
  EXPECT_EQ(a.environment.gpu, "");
  ASSERT_EQ(a.modules.size(), 1u);
  ASSERT_EQ(a.modules[0].graphs.size(), 1u);
  const ArtifactGraph& g = a.modules[0].graphs[0];
  EXPECT_EQ(g.profile, small_profile());
  EXPECT_EQ(g.backend, "TorchInductorAotBackend");
  EXPECT_TRUE(g.runnable_from_cpp);
  EXPECT_EQ(g.payload.at("model.pt2"), "payloads/m/0/model.pt2");
  EXPECT_EQ(g.samples, "samples/m/0.safetensors");
  EXPECT_EQ(g.outputs, "");
  EXPECT_TRUE(a.has_payload());
  EXPECT_EQ(a.entries, entries_);
  EXPECT_EQ(a.entry("payloads/m/0/model.pt2"), "package bytes");
}

TEST_F(ArtifactFile, FilterKeepsOnlyChosenEntriesButVerifiesAll) {
  Artifact a =
      read_artifact(path_, [](const std::string& n) { return n.starts_with("payloads/"); });
  ASSERT_EQ(a.entries.size(), 1u);
  EXPECT_THROW(a.entry("weights/m.safetensors"), ArtifactError);
  entries_["weights/m.safetensors"][10] = 'X';  // tampered, but not kept: still refused
  write_zip(path_, entries_, &manifest_);
  EXPECT_THROW(read_artifact(path_, [](const std::string&) { return false; }), ArtifactError);
}

TEST_F(ArtifactFile, TamperedEntryIsRefusedNamingIt) {
  entries_["weights/m.safetensors"][500] = 'X';
  write_zip(path_, entries_, &manifest_);
  std::string msg = error_of<ArtifactError>([&] { read_artifact(path_); });
  EXPECT_NE(msg.find("'weights/m.safetensors'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("SHA-256"), std::string::npos) << msg;
}

TEST_F(ArtifactFile, TruncatedZipIsRefused) {
  std::ifstream in(path_, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  fs::path cut = dir_ / "cut.honed";
  std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  std::string msg = error_of<ArtifactError>([&] { read_artifact(cut.string()); });
  EXPECT_NE(msg.find("not a readable honed artifact"), std::string::npos) << msg;
  fs::path text = dir_ / "notes.honed";
  std::ofstream(text) << "hello";
  msg = error_of<ArtifactError>([&] { read_artifact(text.string()); });
  EXPECT_NE(msg.find("not a readable honed artifact"), std::string::npos) << msg;
}

TEST_F(ArtifactFile, MissingFileManifestOrEntry) {
  std::string msg = error_of<ArtifactError>([&] { read_artifact((dir_ / "nope.honed").string()); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  write_zip(path_, entries_, nullptr);
  msg = error_of<ArtifactError>([&] { read_artifact(path_); });
  EXPECT_NE(msg.find("no manifest.json"), std::string::npos) << msg;

  auto fewer = entries_;
  fewer.erase("samples/m/0.safetensors");
  write_zip(path_, fewer, &manifest_);
  msg = error_of<ArtifactError>([&] { read_artifact(path_); });
  EXPECT_NE(msg.find("missing entry 'samples/m/0.safetensors'"), std::string::npos) << msg;
}

TEST_F(ArtifactFile, ForeignFormatAndNewerVersion) {
  json m = json::parse(manifest_);
  m["format_version"] = 2;
  std::string text = m.dump();
  write_zip(path_, entries_, &text);
  std::string msg = error_of<IncompatibleArtifactError>([&] { read_artifact(path_); });
  EXPECT_NE(msg.find("format version 2"), std::string::npos) << msg;

  m["format"] = "other";
  text = m.dump();
  write_zip(path_, entries_, &text);
  msg = error_of<ArtifactError>([&] { read_artifact(path_); });
  EXPECT_NE(msg.find("is not a honed artifact"), std::string::npos) << msg;

  text = "{not json";
  write_zip(path_, entries_, &text);
  EXPECT_THROW(read_artifact(path_), ArtifactError);
}

TEST(ArtifactEnvironmentRules, TorchMinorMustMatchForPayloads) {
  ArtifactEnvironment saved{"2.11.0+cu130", "13.0", "cpu", "", ""};
  HostEnvironment here{"2.11.1", false, "", ""};
  EXPECT_EQ(incompatibility(saved, true, here), "");
  here.torch = "2.13.0+cpu";
  std::string why = incompatibility(saved, true, here);
  EXPECT_NE(why.find("torch 2.11.0+cu130"), std::string::npos) << why;
  EXPECT_NE(why.find("this is torch 2.13.0+cpu"), std::string::npos) << why;
  EXPECT_EQ(incompatibility(saved, false, here), "");  // weights only: any torch
  EXPECT_EQ(torch_minor("2.11.0+cu130"), "2.11");
  EXPECT_EQ(torch_minor("2"), "2");
}

TEST(ArtifactEnvironmentRules, CudaArtifactNeedsTheSameGpu) {
  ArtifactEnvironment saved{"2.11.0", "13.0", "cuda:0", "NVIDIA H100 80GB HBM3", "9.0"};
  HostEnvironment here{"2.11.0", false, "", ""};
  std::string why = incompatibility(saved, true, here);
  EXPECT_NE(why.find("cannot use CUDA here"), std::string::npos) << why;
  here = {"2.11.0", true, "NVIDIA A100-SXM4-40GB", "8.0"};
  why = incompatibility(saved, true, here);
  EXPECT_NE(why.find("NVIDIA H100 80GB HBM3 (sm 9.0), this is NVIDIA A100-SXM4-40GB (sm 8.0)"),
            std::string::npos)
      << why;
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
}

}  // namespace
}  // namespace honed
