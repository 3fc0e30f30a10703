// cpp/include/honed/aoti.h: an AOTInductor model library opened through its C interface.
//
// The library inside an AOTInductor package (data/aotinductor/<model>/<hash>.so) exports a C
// interface (torch/csrc/inductor/aoti_runtime/interface.h) that creates a model container, hands
// it its constants and runs it. torch's Python binding of its package loader holds the GIL while
// it opens the library, copies the constants and runs the first call (which loads every kernel);
// in a program that keeps calling its model meanwhile (JIT mode installing a winner) those
// hundreds of milliseconds stop the program. This class does the same through the C interface
// alone, with no libtorch and no Python, so the binding can release the GIL around each step.
//
// Tensors cross as AtenTensorHandle values (a heap at::Tensor*, opaque here): the caller makes
// them (torch._C._aoti.unsafe_alloc_void_ptrs_from_tensors) and takes the outputs back
// (alloc_tensors_by_stealing_from_void_ptrs). run() steals its input handles, as the interface
// says; update_constants() only borrows them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace honed {

class AotiContainer {
 public:
  // Opens library (dlopen) and creates its container for device ("cpu", "cuda:0"); cubin_dir is
  // where the package's kernel binaries were extracted ("" on the CPU).
  //
  // Constants go through the C-ABI entry point (a list of name/handle pairs) where the library
  // has it and pairs is true; older AOTInductor libraries (torch 2.11) take only a
  // std::unordered_map<std::string, AtenTensorHandle>, which this class builds itself: sound only
  // where honed and the library agree on the C++ library's layout, which torch_cxx11_abi (torch's
  // _GLIBCXX_USE_CXX11_ABI) vouches for: the library is compiled with torch's setting, on this
  // machine. Throws std::runtime_error naming what failed: the library does not open, lacks an
  // entry point, constants could not be handed over soundly, or the container cannot be made.
  static std::unique_ptr<AotiContainer> open(const std::string& library, const std::string& device,
                                             const std::string& cubin_dir, bool torch_cxx11_abi,
                                             bool pairs = true);
  // Whether constants go through the pairs entry point (else the map).
  bool uses_pairs() const;
  ~AotiContainer();
  AotiContainer(const AotiContainer&) = delete;
  AotiContainer& operator=(const AotiContainer&) = delete;

  size_t num_inputs() const { return num_inputs_; }
  size_t num_outputs() const { return num_outputs_; }
  // The pytree specs of the flat inputs and outputs (torch.utils._pytree.treespec_loads).
  std::pair<std::string, std::string> call_spec() const;
  // Every constant the library names: (its name in the library, its FQN in the exported module).
  std::vector<std::pair<std::string, std::string>> constants() const;
  // Hands the container its constants by library name (borrowed handles; the container copies
  // them), all of them when validate_full_update.
  void update_constants(const std::vector<std::pair<std::string, std::uintptr_t>>& handles,
                        bool validate_full_update);
  // Runs one call on stream (0: the default stream; nothing on the CPU); single_threaded records
  // no CUDA event (a call captured into a CUDA graph). Steals the inputs; the outputs are new
  // handles the caller owns.
  std::vector<std::uintptr_t> run(const std::vector<std::uintptr_t>& inputs, std::uintptr_t stream,
                                  bool single_threaded);

 private:
  struct Api;
  AotiContainer(void* library, std::unique_ptr<Api> api, void* container);
  void check(int status, const char* what) const;

  void* library_;
  std::unique_ptr<Api> api_;
  void* container_;
  size_t num_inputs_ = 0;
  size_t num_outputs_ = 0;
};

}  // namespace honed
