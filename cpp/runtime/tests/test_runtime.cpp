// cpp/runtime/tests/test_runtime.cpp: honed::Model on a real artifact (HONED_TEST_ARTIFACT).
//
// tests/test_runtime_cpp.py (CPU) and scripts/gpu-test.sh (CUDA) save an artifact of a small MLP
// (one graph, batch axis 1..8, 16 features) tuned with TorchInductorAotBackend and run this with
// HONED_TEST_ARTIFACT=<file> and HONED_TEST_DEVICE=cpu|cuda; without them every test skips.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "honed/artifact.h"
#include "honed/runtime.h"

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

}  // namespace
