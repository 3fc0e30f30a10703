// cpp/runtime/cuda_graphs_off.cpp: CudaGraphs where the runtime cannot capture CUDA graphs.
#include <stdexcept>

#include "cuda_graphs.h"

namespace honed::detail {

std::string cuda_graphs_unavailable() {
#ifdef HONED_TORCH_CUDA_BUILD
  return "this runtime was built without the CUDA runtime headers (cuda_runtime_api.h), which "
         "capturing needs; rebuild where CMake finds them";
#else
  return "this runtime was built against a torch without CUDA";
#endif
}

void start_cuda_libraries(const c10::Device&) {}

struct CudaGraphs::Impl {};

CudaGraphs::CudaGraphs(const c10::Device&, int) {
  throw std::logic_error("honed runtime: CudaGraphs used although " + cuda_graphs_unavailable());
}

CudaGraphs::~CudaGraphs() = default;

std::vector<at::Tensor> CudaGraphs::run(int, const std::vector<at::Tensor>&, void*,
                                        const PlainRun&) {
  throw std::logic_error("honed runtime: CudaGraphs used although " + cuda_graphs_unavailable());
}

std::vector<CudaGraphShape> CudaGraphs::captured() const { return {}; }

}  // namespace honed::detail
