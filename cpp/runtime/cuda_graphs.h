// cpp/runtime/cuda_graphs.h: calls replayed from CUDA graphs captured per input shape (private).
//
// cuda_graphs.cpp implements it where the runtime was built against a CUDA torch with the CUDA
// runtime headers at hand; cuda_graphs_off.cpp says why not everywhere else.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "honed/runtime.h"

namespace honed::detail {

// A plain call of graph `graph` on a CUDA stream (a cudaStream_t): the package's own run.
using PlainRun = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs,
                                                       void* cuda_stream)>;

// Creates cuBLAS's handles on `device` (from any thread: they return to torch's pool when it
// ends), so that the first call does not; nothing where this build has no CUDA runtime.
void start_cuda_libraries(const c10::Device& device);

// "" when this build captures CUDA graphs, else why it does not.
std::string cuda_graphs_unavailable();

// The CUDA graphs of one honed::Model: one per (graph, exact input shapes), all drawing on one
// private memory pool. Calls run one at a time (the mutex), in order across streams.
class CudaGraphs {
 public:
  CudaGraphs(const c10::Device& device, int max_graphs);
  ~CudaGraphs();
  CudaGraphs(const CudaGraphs&) = delete;
  CudaGraphs& operator=(const CudaGraphs&) = delete;

  // Runs graph `graph` on contiguous `inputs` on `cuda_stream` (nullptr: the current stream):
  // replays the CUDA graph of these shapes, capturing it first when they are new, or runs
  // `plain` when the graph cannot be captured or max_graphs are held (one message each).
  // The outputs are fresh tensors.
  std::vector<at::Tensor> run(int graph, const std::vector<at::Tensor>& inputs, void* cuda_stream,
                              const PlainRun& plain);

  std::vector<CudaGraphShape> captured() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace honed::detail
