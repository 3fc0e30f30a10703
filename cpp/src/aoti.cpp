// cpp/src/aoti.cpp: AotiContainer over the C interface of an AOTInductor model library (dlopen).
// No torch headers: the entry points are declared here with the interface's C types. An
// AOTIRuntimeError is an int32 (0: success); the container, handles and streams are opaque
// pointers; AOTInductorConstantMapEntry is {const char* name; AtenTensorHandle handle;}.
#include "honed/aoti.h"

#include <dlfcn.h>

#include <stdexcept>
#include <unordered_map>

#include "dynlib.h"

// torch's C shim names its tensor handle type so (torch/csrc/inductor/aoti_torch/c/shim.h); the
// map handed to older libraries must be of exactly this type.
struct AtenTensorOpaque;
using AtenTensorHandle = AtenTensorOpaque*;

namespace honed {

namespace {
using status_t = int32_t;
using handle_t = void*;  // AtenTensorHandle, AOTInductorModelContainerHandle, streams

struct ConstantEntry {  // AOTInductorConstantMapEntry
  const char* name;
  handle_t handle;
};
}  // namespace

struct AotiContainer::Api {
  status_t (*create)(handle_t*, size_t, const char*, const char*) = nullptr;
  status_t (*destroy)(handle_t) = nullptr;
  status_t (*run)(handle_t, handle_t*, size_t, handle_t*, size_t, handle_t, handle_t) = nullptr;
  status_t (*run_single)(handle_t, handle_t*, size_t, handle_t*, size_t, handle_t,
                         handle_t) = nullptr;
  status_t (*num_inputs)(handle_t, size_t*) = nullptr;
  status_t (*num_outputs)(handle_t, size_t*) = nullptr;
  status_t (*num_constants)(handle_t, size_t*) = nullptr;
  status_t (*constant_name)(handle_t, size_t, const char**) = nullptr;
  status_t (*constant_fqn)(handle_t, size_t, const char**) = nullptr;
  status_t (*call_spec)(handle_t, const char**, const char**) = nullptr;
  status_t (*update_pairs)(handle_t, const ConstantEntry*, size_t, bool, bool) = nullptr;
  // AOTInductorModelContainerUpdateConstantBuffer: the map's address as the map handle.
  status_t (*update_map)(handle_t, void*, bool, bool) = nullptr;
};

namespace {
constexpr bool kHonedCxx11Abi = _GLIBCXX_USE_CXX11_ABI != 0;
}  // namespace

std::unique_ptr<AotiContainer> AotiContainer::open(const std::string& library,
                                                   const std::string& device,
                                                   const std::string& cubin_dir,
                                                   bool torch_cxx11_abi, bool pairs) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    throw std::runtime_error("cannot open the AOTInductor library " + library + ": " +
                             detail::dl_error());
  }
  auto api = std::make_unique<Api>();
  const char* missing = nullptr;
  auto need = [&](const char* name, auto& fn) {
    if (!detail::resolve(lib, name, fn) && missing == nullptr) missing = name;
  };
  need("AOTInductorModelContainerCreateWithDevice", api->create);
  need("AOTInductorModelContainerDelete", api->destroy);
  need("AOTInductorModelContainerRun", api->run);
  need("AOTInductorModelContainerRunSingleThreaded", api->run_single);
  need("AOTInductorModelContainerGetNumInputs", api->num_inputs);
  need("AOTInductorModelContainerGetNumOutputs", api->num_outputs);
  need("AOTInductorModelContainerGetNumConstants", api->num_constants);
  need("AOTInductorModelContainerGetConstantName", api->constant_name);
  need("AOTInductorModelContainerGetConstantOriginalFQN", api->constant_fqn);
  need("AOTInductorModelContainerGetCallSpec", api->call_spec);
  if (pairs)
    detail::resolve(lib, "AOTInductorModelContainerUpdateConstantBufferPairs", api->update_pairs);
  if (api->update_pairs == nullptr) {
    need("AOTInductorModelContainerUpdateConstantBuffer", api->update_map);
    if (missing == nullptr && torch_cxx11_abi != kHonedCxx11Abi) {
      dlclose(lib);
      throw std::runtime_error(
          "the AOTInductor library " + library +
          " takes its constants as a C++ map only, and torch and honed were built with different "
          "C++ library ABIs (_GLIBCXX_USE_CXX11_ABI)");
    }
  }
  if (missing != nullptr) {
    dlclose(lib);
    throw std::runtime_error(std::string("the AOTInductor library ") + library + " has no " +
                             missing + " (an AOTInductor older than honed's loader needs)");
  }
  handle_t container = nullptr;
  status_t status =
      api->create(&container, 1, device.c_str(), cubin_dir.empty() ? nullptr : cubin_dir.c_str());
  if (status != 0 || container == nullptr) {
    dlclose(lib);
    throw std::runtime_error("AOTInductor could not create the model container of " + library +
                             " on " + device + " (its error is printed above)");
  }
  std::unique_ptr<AotiContainer> out(new AotiContainer(lib, std::move(api), container));
  out->check(out->api_->num_inputs(container, &out->num_inputs_), "count the inputs");
  out->check(out->api_->num_outputs(container, &out->num_outputs_), "count the outputs");
  return out;
}

AotiContainer::AotiContainer(void* library, std::unique_ptr<Api> api, void* container)
    : library_(library), api_(std::move(api)), container_(container) {}

AotiContainer::~AotiContainer() {
  if (container_ != nullptr) api_->destroy(container_);
  dlclose(library_);  // as torch's loader does once its container is gone
}

void AotiContainer::check(int status, const char* what) const {
  if (status != 0) {
    throw std::runtime_error(std::string("AOTInductor container could not ") + what +
                             " (its error is printed above)");
  }
}

std::pair<std::string, std::string> AotiContainer::call_spec() const {
  const char* in = nullptr;
  const char* out = nullptr;
  check(api_->call_spec(container_, &in, &out), "give its call spec");
  return {in ? in : "", out ? out : ""};
}

std::vector<std::pair<std::string, std::string>> AotiContainer::constants() const {
  size_t n = 0;
  check(api_->num_constants(container_, &n), "count its constants");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const char* name = nullptr;
    const char* fqn = nullptr;
    check(api_->constant_name(container_, i, &name), "name a constant");
    check(api_->constant_fqn(container_, i, &fqn), "give a constant's FQN");
    out.emplace_back(name ? name : "", fqn ? fqn : "");
  }
  return out;
}

bool AotiContainer::uses_pairs() const { return api_->update_pairs != nullptr; }

void AotiContainer::update_constants(
    const std::vector<std::pair<std::string, std::uintptr_t>>& handles, bool validate_full_update) {
  if (api_->update_pairs == nullptr) {
    std::unordered_map<std::string, AtenTensorHandle> map;
    map.reserve(handles.size());
    for (const auto& [name, handle] : handles) {
      map.emplace(name, reinterpret_cast<AtenTensorHandle>(handle));
    }
    check(api_->update_map(container_, &map, /*use_inactive=*/false, validate_full_update),
          "take its constants");
    return;
  }
  std::vector<ConstantEntry> pairs;
  pairs.reserve(handles.size());
  for (const auto& [name, handle] : handles) {
    pairs.push_back({name.c_str(), reinterpret_cast<handle_t>(handle)});
  }
  check(api_->update_pairs(container_, pairs.data(), pairs.size(), /*use_inactive=*/false,
                           validate_full_update),
        "take its constants");
}

std::vector<std::uintptr_t> AotiContainer::run(const std::vector<std::uintptr_t>& inputs,
                                               std::uintptr_t stream, bool single_threaded) {
  if (inputs.size() != num_inputs_) {
    throw std::invalid_argument("the AOTInductor model takes " + std::to_string(num_inputs_) +
                                " tensors, got " + std::to_string(inputs.size()));
  }
  std::vector<handle_t> in(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) in[i] = reinterpret_cast<handle_t>(inputs[i]);
  std::vector<handle_t> out(num_outputs_, nullptr);
  auto fn = single_threaded ? api_->run_single : api_->run;
  check(fn(container_, in.data(), in.size(), out.data(), out.size(),
           reinterpret_cast<handle_t>(stream), /*proxy_executor=*/nullptr),
        "run");
  std::vector<std::uintptr_t> result(out.size());
  for (size_t i = 0; i < out.size(); ++i) result[i] = reinterpret_cast<std::uintptr_t>(out[i]);
  return result;
}

}  // namespace honed
