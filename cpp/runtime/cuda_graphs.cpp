// cpp/runtime/cuda_graphs.cpp: calls replayed from CUDA graphs captured per input shape.
//
// What the capture must get right, as src/honed/backend/cuda_graphs.py does in Python:
//  * warm-up calls at the exact shapes first, on the caller's stream: AOTInductor loads each
//    kernel binary on its first launch, and cuBLAS/cuDNN create handles and plans on first use;
//    none of that may happen while capturing;
//  * the capture runs on a private stream that runs nothing else, so the cuBLAS workspace of that
//    stream is allocated during the capture, inside the graphs' pool, which lives as long as the
//    graphs (a workspace from the ordinary allocator can be freed by anyone who clears the
//    workspaces, while every replay still writes to it);
//  * thread-local capture mode: other threads of the process keep working while one captures;
//  * the package runs single-threaded (Package(single_threaded)): the pooled runner records a
//    CUDA event per call, and an event recorded during a capture can no longer be queried, which
//    would fail the next plain call;
//  * inputs are copied into the graph's own buffers, outputs are cloned out of its pool, so a
//    caller never sees a later replay overwrite what an earlier call returned.
#include "cuda_graphs.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>
#include <optional>
#include <set>

namespace honed::detail {
namespace {

// Plain calls at the shapes before capturing them.
constexpr int kWarmupCalls = 2;

struct Captured {
  int graph = 0;
  std::vector<std::vector<int64_t>> shapes;
  std::unique_ptr<at::cuda::CUDAGraph> cuda_graph;
  std::vector<at::Tensor> inputs;   // the graph reads its inputs here
  std::vector<at::Tensor> outputs;  // and writes its outputs here, in its pool

  bool takes(int g, const std::vector<at::Tensor>& in) const {
    if (g != graph || in.size() != shapes.size()) return false;
    for (size_t i = 0; i < in.size(); ++i) {
      if (in[i].sizes() != at::IntArrayRef(shapes[i])) return false;
    }
    return true;
  }
};

std::string first_line(const char* what) {
  std::string s(what);
  const size_t end = s.find('\n');
  return end == std::string::npos ? s : s.substr(0, end);
}

}  // namespace

std::string cuda_graphs_unavailable() { return ""; }

void start_cuda_libraries(const c10::Device& device) {
  c10::cuda::CUDAGuard on(device.index());
  at::cuda::getCurrentCUDABlasHandle();
  at::cuda::getCurrentCUDABlasLtHandle();
}

struct CudaGraphs::Impl {
  Impl(const c10::Device& d, int max) : device(d), max_graphs(max) {}

  c10::Device device;
  int max_graphs;
  mutable std::mutex mutex;
  std::optional<c10::cuda::CUDAStream> capture_stream;
  decltype(at::cuda::graph_pool_handle()) pool{};
  std::vector<std::unique_ptr<Captured>> captured;
  std::vector<std::unique_ptr<at::cuda::CUDAGraph>> failed;  // captures that did not end well
  std::set<int> uncapturable;
  bool said_full = false;
  std::optional<c10::Stream> last_stream;  // where the previous call ran
  c10::Event order{c10::DeviceType::CUDA};

  Captured* find(int graph, const std::vector<at::Tensor>& inputs) const {
    for (const auto& c : captured) {
      if (c->takes(graph, inputs)) return c.get();
    }
    return nullptr;
  }

  // The previous call may have run on another stream, with the same buffers: this one waits.
  void follow(const c10::Stream& stream) {
    if (last_stream && *last_stream != stream) {
      order.record(*last_stream);
      order.block(stream);
    }
    last_stream = stream;
  }

  void abandon_capture();
  Captured* capture(int graph, const std::vector<at::Tensor>& inputs,
                    const c10::cuda::CUDAStream& stream, const PlainRun& plain);
};

// After a capture that failed (the run synchronized, or copied to the host): the stream may still
// be capturing when capture_end threw, the allocator may still route allocations to the graphs'
// pool, and CUDA keeps the capture's error for the next call that checks it (another tensor's
// allocation or kernel launch). Each is undone, so the plain run and other graphs work as before.
void CudaGraphs::Impl::abandon_capture() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(capture_stream->stream(), &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t partial = nullptr;
    if (cudaStreamEndCapture(capture_stream->stream(), &partial) == cudaSuccess && partial) {
      cudaGraphDestroy(partial);
    }
  }
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device.index(), pool);
  } catch (const std::exception&) {  // capture_end already ended it
  }
  (void)cudaGetLastError();  // the capture's error is the one already reported
  // capture_begin marked the default generator as capturing, and only a capture_end that
  // succeeds unmarks it; left marked, every later random op on the device fails ("Offset
  // increment outside graph capture"). A clone of its state has the same seed and offset and is
  // not capturing. Graphs captured before keep the state object they registered with.
  at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.graphsafe_set_state(gen.clone());
}

Captured* CudaGraphs::Impl::capture(int graph, const std::vector<at::Tensor>& inputs,
                                    const c10::cuda::CUDAStream& stream, const PlainRun& plain) {
  if (uncapturable.count(graph)) return nullptr;
  if (captured.size() >= static_cast<size_t>(std::max(max_graphs, 0))) {
    if (!said_full) {
      said_full = true;
      std::fprintf(stderr,
                   "honed runtime: %zu CUDA graphs captured (ModelOptions::max_cuda_graphs); "
                   "calls of further input shapes run without one\n",
                   captured.size());
    }
    return nullptr;
  }
  if (!capture_stream) {
    capture_stream = c10::cuda::getStreamFromPool(false, device.index());
    pool = at::cuda::graph_pool_handle();
  }
  auto c = std::make_unique<Captured>();
  c->graph = graph;
  for (const at::Tensor& x : inputs) {
    c->shapes.push_back(x.sizes().vec());
    c->inputs.push_back(x.clone(at::MemoryFormat::Contiguous));
  }
  for (int i = 0; i < kWarmupCalls; ++i) plain(c->inputs, stream.stream());
  c10::cuda::device_synchronize();  // the buffers are filled, the warm-up is done
  auto cuda_graph = std::make_unique<at::cuda::CUDAGraph>();
  try {
    c10::StreamGuard on_capture_stream(capture_stream->unwrap());
    cuda_graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    try {
      c->outputs = plain(c->inputs, capture_stream->stream());
    } catch (...) {
      try {
        cuda_graph->capture_end();  // leaves capture mode; the run's error is the one to report
      } catch (const std::exception&) {
      }
      throw;
    }
    cuda_graph->capture_end();
  } catch (const std::exception& e) {
    abandon_capture();
    // The allocator may still route the failed capture's pool (some torch versions leave it
    // registered when capture_end throws), and its routing rule refers to the graph object: the
    // object stays alive, and later captures get a pool of their own.
    failed.push_back(std::move(cuda_graph));
    pool = at::cuda::graph_pool_handle();
    uncapturable.insert(graph);
    std::fprintf(stderr,
                 "honed runtime: graph %d cannot be captured in a CUDA graph (%s); it runs "
                 "without one (it may synchronize with the host while running)\n",
                 graph, first_line(e.what()).c_str());
    return nullptr;
  }
  c->cuda_graph = std::move(cuda_graph);
  captured.push_back(std::move(c));
  return captured.back().get();
}

CudaGraphs::CudaGraphs(const c10::Device& device, int max_graphs)
    : impl_(std::make_unique<Impl>(device, max_graphs)) {}

CudaGraphs::~CudaGraphs() = default;

std::vector<at::Tensor> CudaGraphs::run(int graph, const std::vector<at::Tensor>& inputs,
                                        void* cuda_stream, const PlainRun& plain) {
  Impl& im = *impl_;
  std::lock_guard<std::mutex> lock(im.mutex);
  const c10::cuda::CUDAStream stream =
      cuda_stream != nullptr ? c10::cuda::getStreamFromExternal(
                                   static_cast<cudaStream_t>(cuda_stream), im.device.index())
                             : c10::cuda::getCurrentCUDAStream(im.device.index());
  c10::StreamGuard on_stream(stream.unwrap());
  im.follow(stream.unwrap());
  Captured* c = im.find(graph, inputs);
  if (c == nullptr) c = im.capture(graph, inputs, stream, plain);
  if (c == nullptr) return plain(inputs, stream.stream());
  for (size_t i = 0; i < inputs.size(); ++i) c->inputs[i].copy_(inputs[i], true);
  c->cuda_graph->replay();
  std::vector<at::Tensor> out;
  out.reserve(c->outputs.size());
  for (const at::Tensor& t : c->outputs) out.push_back(t.clone());
  return out;
}

std::vector<CudaGraphShape> CudaGraphs::captured() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<CudaGraphShape> out;
  for (const auto& c : impl_->captured) out.push_back(CudaGraphShape{c->graph, c->shapes});
  return out;
}

}  // namespace honed::detail
