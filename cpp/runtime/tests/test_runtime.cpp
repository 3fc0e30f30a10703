// cpp/runtime/tests/test_runtime.cpp: honed::Model on a real artifact (HONED_TEST_ARTIFACT).
//
// tests/test_runtime_cpp.py (CPU) and scripts/gpu-test.sh (CUDA) save an artifact of a small MLP
// (one graph, batch axis 1..8, 16 features) tuned with TorchInductorAotBackend and run this with
// HONED_TEST_ARTIFACT=<file> and HONED_TEST_DEVICE=cpu|cuda; without them every test skips.
#include <ATen/ATen.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_graphs.h"
#include "honed/artifact.h"
#include "honed/runtime.h"
#include "package.h"

namespace {

std::string env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

class RuntimeModel : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = env("HONED_TEST_ARTIFACT");
    if (path_.empty()) GTEST_SKIP() << "HONED_TEST_ARTIFACT is not set";
    device_ = c10::Device(env("HONED_TEST_DEVICE", "cpu"));
  }
  std::string path_;
  c10::Device device_{c10::kCPU};
};

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST_F(RuntimeModel, RunsTheStoredSampleLikeEager) {
  honed::Model model(path_, device_);
  ASSERT_GE(model.num_graphs(), 1);
  EXPECT_GT(model.load_seconds(), 0);
  std::vector<honed::Sample> samples = model.samples();
  ASSERT_FALSE(samples.empty());
  for (const honed::Sample& s : samples) {
    ASSERT_FALSE(s.expected.empty());
    std::vector<at::Tensor> out = model.run(s.inputs);
    ASSERT_EQ(out.size(), s.expected.size());
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].device(), model.device());  // "cuda" is held as "cuda:0"
      EXPECT_EQ(out[i].device().type(), device_.type());
      EXPECT_TRUE(at::allclose(out[i].cpu(), s.expected[i].cpu(), 1e-3, 1e-4));
    }
  }
}

TEST_F(RuntimeModel, EveryBatchSizeOfTheProfileRuns) {
  honed::Model model(path_, device_);
  honed::Sample s = model.samples().at(0);
  for (int64_t batch : {1, 3, 8}) {
    at::Tensor x = at::randn({batch, s.inputs[0].size(1)}, s.inputs[0].options());
    std::vector<at::Tensor> out = model.run({x});
    ASSERT_EQ(out[0].size(0), batch);
  }
}

TEST_F(RuntimeModel, InputOutsideEveryProfileNamesTheProfiles) {
  honed::Model model(path_, device_);
  honed::Sample s = model.samples().at(0);
  at::Tensor big = at::randn({64, s.inputs[0].size(1)}, s.inputs[0].options());
  std::string msg = error_of([&] { model.run({big}); });
  EXPECT_NE(msg.find("no tuned graph takes inputs (float32[64, "), std::string::npos) << msg;
  EXPECT_NE(msg.find("Stored profiles: graph 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("1..8"), std::string::npos) << msg;
  at::Tensor wrong_dtype = s.inputs[0].to(at::kDouble);
  msg = error_of([&] { model.run({wrong_dtype}); });
  EXPECT_NE(msg.find("float64"), std::string::npos) << msg;
  msg = error_of([&] { model.run({s.inputs[0], s.inputs[0]}); });
  EXPECT_NE(msg.find("wrong number of tensor inputs"), std::string::npos) << msg;
}

TEST_F(RuntimeModel, ConcurrentCallsFromSeveralThreadsAgree) {
  constexpr int kThreads = 4;
  honed::ModelOptions options;
  options.runners = kThreads;
  honed::Model model(path_, device_, options);
  honed::Sample s = model.samples().at(0);
  std::vector<at::Tensor> inputs, expected;
  for (int i = 0; i < kThreads; ++i) {
    inputs.push_back(at::randn({i + 1, s.inputs[0].size(1)}, s.inputs[0].options()));
    expected.push_back(model.run({inputs.back()})[0].cpu());
  }
  std::vector<int> mismatches(kThreads, 0);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int k = 0; k < 50; ++k) {
          at::Tensor out = model.run({inputs[t]})[0].cpu();
          if (!at::allclose(out, expected[t], 1e-5, 1e-6)) ++mismatches[t];
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_EQ(errors[t], "") << "thread " << t;
    EXPECT_EQ(mismatches[t], 0) << "thread " << t;
  }
}

TEST_F(RuntimeModel, WrongDeviceAndMissingFileAreClearErrors) {
  honed::Model model(path_, device_);
  honed::Sample s = model.samples().at(0);
  if (device_.is_cuda()) {
    std::string msg = error_of([&] { model.run({s.inputs[0].cpu()}); });
    EXPECT_NE(msg.find("is on cpu but the model runs on cuda"), std::string::npos) << msg;
  }
  EXPECT_THROW(honed::Model("/nonexistent/model.honed", device_), honed::ArtifactError);
  c10::Device other = device_.is_cuda() ? c10::Device(c10::kCPU) : c10::Device("cuda:0");
  std::string msg = error_of([&] { honed::Model m(path_, other); });
  EXPECT_NE(msg.find("was compiled for"), std::string::npos) << msg;
}

// The names in a folder (without "." and "..").
std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") names.insert(name);
    }
    closedir(d);
  }
  return names;
}

TEST_F(RuntimeModel, PackageFilesAreWrittenOnceAndRemoved) {
  std::string tmp = ::testing::TempDir() + "honed-tmpdir-XXXXXX";
  ASSERT_NE(mkdtemp(tmp.data()), nullptr);
  const char* old = std::getenv("TMPDIR");
  const std::string saved = old != nullptr ? old : "";
  setenv("TMPDIR", tmp.c_str(), 1);
  {
    honed::Model model(path_, device_);
    std::set<std::string> made = listing(tmp);
    ASSERT_EQ(made.size(), 1u);
    EXPECT_EQ(made.begin()->rfind("honed-runtime-", 0), 0u) << *made.begin();
    // The library is loaded and its name gone; no package (.pt2) or source was written.
    for (const std::string& f : listing(tmp + "/" + *made.begin())) {
      EXPECT_EQ(f.find(".so"), std::string::npos) << f;
      EXPECT_EQ(f.find(".pt2"), std::string::npos) << f;
      EXPECT_EQ(f.find(".cpp"), std::string::npos) << f;
    }
    honed::Sample s = model.samples().at(0);
    EXPECT_EQ(model.run(s.inputs).size(), s.expected.size());
  }
  EXPECT_TRUE(listing(tmp).empty());
  if (old != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  rmdir(tmp.c_str());
}

TEST_F(RuntimeModel, BytesThatAreNoPackageAreAClearError) {
  std::string msg =
      error_of([&] { honed::detail::Package("not a zip archive", device_, 1, false); });
  EXPECT_NE(msg.find("the AOTInductor package is not readable"), std::string::npos) << msg;
}

TEST_F(RuntimeModel, LoadPhasesSayWhereTheTimeWent) {
  honed::Model model(path_, device_);
  const std::vector<honed::LoadPhase>& phases = model.load_phases();
  std::vector<std::string> names;
  double total = 0;
  for (const honed::LoadPhase& p : phases) {
    names.push_back(p.name);
    EXPECT_GE(p.seconds, 0) << p.name;
    total += p.seconds;
  }
  ASSERT_GE(names.size(), 5u);
  EXPECT_EQ(names.front(), "read and verify the artifact");
  EXPECT_NE(std::find(names.begin(), names.end(), "write the packages' library and kernel files"),
            names.end());
  EXPECT_EQ(names.back().rfind("warm up", 0), 0u) << names.back();
  EXPECT_LE(total, model.load_seconds());  // parts of the constructor's time
}

TEST_F(RuntimeModel, CudaGraphsAreCapturedForEveryWarmedBatchSize) {
  honed::Model model(path_, device_);
  const std::string why = honed::detail::cuda_graphs_unavailable();
  if (!device_.is_cuda()) {
    EXPECT_EQ(model.cuda_graphs_status(), "off: the model runs on the CPU");
    EXPECT_TRUE(model.cuda_graphs().empty());
    return;
  }
  if (!why.empty()) {
    EXPECT_EQ(model.cuda_graphs_status(), "off: " + why);
    return;
  }
  EXPECT_EQ(model.cuda_graphs_status(), "on");
  std::set<int64_t> warmed, captured;
  for (const auto& [graph, batch] : model.warmed()) warmed.insert(batch);
  for (const honed::CudaGraphShape& c : model.cuda_graphs()) captured.insert(c.shapes.at(0).at(0));
  EXPECT_EQ(captured, warmed);
  // A batch size the profile holds but loading did not warm is captured on its first call.
  honed::Sample s = model.samples().at(0);
  model.run({at::randn({3, s.inputs[0].size(1)}, s.inputs[0].options())});
  EXPECT_EQ(model.cuda_graphs().size(), warmed.size() + 1);
}

TEST_F(RuntimeModel, LaterCallsNeverOverwriteEarlierOutputs) {
  honed::ModelOptions plain_options;
  plain_options.cuda_graphs = false;
  honed::Model model(path_, device_);
  honed::Model plain(path_, device_, plain_options);
  EXPECT_TRUE(plain.cuda_graphs().empty());
  if (device_.is_cuda()) {
    EXPECT_EQ(plain.cuda_graphs_status(), "off: ModelOptions::cuda_graphs is false");
  }
  honed::Sample s = model.samples().at(0);
  for (int64_t batch : {1, 3, 8}) {
    at::Tensor a = at::randn({batch, s.inputs[0].size(1)}, s.inputs[0].options());
    at::Tensor b = at::randn({batch, s.inputs[0].size(1)}, s.inputs[0].options());
    at::Tensor out_a = model.run({a})[0];
    at::Tensor out_b = model.run({b})[0];
    EXPECT_TRUE(at::allclose(out_a.cpu(), plain.run({a})[0].cpu(), 1e-4, 1e-5)) << batch;
    EXPECT_TRUE(at::allclose(out_b.cpu(), plain.run({b})[0].cpu(), 1e-4, 1e-5)) << batch;
  }
}

}  // namespace
