// cpp/runtime/tests/test_cuda_graphs.cpp: CudaGraphs on plain ATen work (needs CUDA; else skips).
//
// The runtime's CUDA graphs take any "plain run" of a graph; these tests give them small ATen
// programs whose results are known, one of which synchronizes with the host and so cannot be
// captured. RuntimeModel (test_runtime.cpp) covers them under honed::Model on a real artifact.
#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "cuda_graphs.h"

namespace {

using honed::detail::CudaGraphs;

class CudaGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
    const std::string why = honed::detail::cuda_graphs_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  c10::Device device_{c10::kCUDA, 0};
  at::Tensor randn(int64_t rows) { return at::randn({rows, 16}, at::device(device_)); }
};

// x -> (x * 2 + 1, x.sum(1)): two outputs, one of a different shape, plus a count of calls.
struct Affine {
  int* calls;
  std::vector<at::Tensor> operator()(const std::vector<at::Tensor>& in, void*) const {
    ++*calls;
    return {in[0] * 2 + 1, in[0].sum(1)};
  }
};

TEST_F(CudaGraphsTest, ReplaysGiveTheRightValuesAndFreshOutputs) {
  int calls = 0;
  CudaGraphs graphs(device_, 8);
  at::Tensor a = randn(4), b = randn(4);
  std::vector<at::Tensor> out_a = graphs.run(0, {a}, nullptr, Affine{&calls});
  const int after_capture = calls;  // warm-up calls and the capture
  EXPECT_GE(after_capture, 2);
  std::vector<at::Tensor> out_b = graphs.run(0, {b}, nullptr, Affine{&calls});
  EXPECT_EQ(calls, after_capture);  // a replay: the plain run was not called again
  // The second call did not overwrite what the first returned.
  EXPECT_TRUE(at::equal(out_a[0], a * 2 + 1));
  EXPECT_TRUE(at::allclose(out_a[1], a.sum(1)));
  EXPECT_TRUE(at::equal(out_b[0], b * 2 + 1));
  EXPECT_TRUE(at::allclose(out_b[1], b.sum(1)));
  EXPECT_NE(out_a[0].data_ptr(), out_b[0].data_ptr());
  std::vector<honed::CudaGraphShape> captured = graphs.captured();
  ASSERT_EQ(captured.size(), 1u);
  EXPECT_EQ(captured[0].graph, 0);
  EXPECT_EQ(captured[0].shapes, (std::vector<std::vector<int64_t>>{{4, 16}}));
}

TEST_F(CudaGraphsTest, EachShapeAndGraphGetsItsOwnCapture) {
  int calls = 0;
  CudaGraphs graphs(device_, 8);
  for (int round = 0; round < 2; ++round) {
    for (int64_t rows : {1, 3, 8}) {
      for (int graph : {0, 1}) {
        at::Tensor x = randn(rows);
        std::vector<at::Tensor> out = graphs.run(graph, {x}, nullptr, Affine{&calls});
        ASSERT_EQ(out[0].sizes(), x.sizes());
        EXPECT_TRUE(at::equal(out[0], x * 2 + 1)) << "rows " << rows << " graph " << graph;
      }
    }
  }
  EXPECT_EQ(graphs.captured().size(), 6u);
}

TEST_F(CudaGraphsTest, BeyondMaxGraphsCallsRunPlainWithOneMessage) {
  int calls = 0;
  CudaGraphs graphs(device_, 1);
  graphs.run(0, {randn(2)}, nullptr, Affine{&calls});
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    at::Tensor x = randn(5);
    EXPECT_TRUE(at::equal(graphs.run(0, {x}, nullptr, Affine{&calls})[0], x * 2 + 1));
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(graphs.captured().size(), 1u);
  EXPECT_NE(err.find("max_cuda_graphs"), std::string::npos) << err;
  EXPECT_EQ(err.find("max_cuda_graphs"), err.rfind("max_cuda_graphs")) << err;  // once
}

TEST_F(CudaGraphsTest, AGraphThatSynchronizesRunsPlainWithOneMessage) {
  int calls = 0;
  // .item() copies to the host and waits: not allowed while capturing.
  auto syncing = [&calls](const std::vector<at::Tensor>& in, void*) {
    ++calls;
    const double top = in[0].max().item<double>();
    return std::vector<at::Tensor>{in[0] - top};
  };
  CudaGraphs graphs(device_, 8);
  ::testing::internal::CaptureStderr();
  std::vector<at::Tensor> xs = {randn(4), randn(4), randn(4)};
  for (const at::Tensor& x : xs) {
    std::vector<at::Tensor> out = graphs.run(0, {x}, nullptr, syncing);
    EXPECT_TRUE(at::allclose(out[0], x - x.max())) << "a plain run after the failed capture";
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(graphs.captured().empty());
  EXPECT_NE(err.find("graph 0 cannot be captured in a CUDA graph"), std::string::npos) << err;
  EXPECT_EQ(err.find("cannot be captured"), err.rfind("cannot be captured")) << err;  // once
  // Other graphs still get theirs, and CUDA is usable after the failed capture.
  at::Tensor y = randn(4);
  EXPECT_TRUE(at::equal(graphs.run(1, {y}, nullptr, Affine{&calls})[0], y * 2 + 1));
  EXPECT_EQ(graphs.captured().size(), 1u);
}

TEST_F(CudaGraphsTest, CallsOnAlternatingStreamsKeepTheirOrder) {
  int calls = 0;
  CudaGraphs graphs(device_, 8);
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  const c10::Stream streams[2] = {impl.getStreamFromGlobalPool(device_),
                                  impl.getStreamFromGlobalPool(device_, true)};
  ASSERT_NE(streams[0], streams[1]);
  // Large inputs, so that a replay still runs when the next call copies its inputs in.
  std::vector<at::Tensor> xs, outs;
  for (int i = 0; i < 24; ++i) {
    c10::StreamGuard on(streams[i % 2]);
    xs.push_back(at::randn({1 << 16, 64}, at::device(device_)));
    outs.push_back(graphs.run(0, {xs.back()}, nullptr, Affine{&calls})[0]);
  }
  impl.synchronizeDevice(device_.index());
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_TRUE(at::equal(outs[i], xs[i] * 2 + 1)) << "call " << i;
  }
}

}  // namespace
