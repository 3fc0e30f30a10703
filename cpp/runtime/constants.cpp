// cpp/runtime/constants.cpp: the constants of a package stored apart from its code.
//
// backend/_aoti_constants.py compiles packages without their weights and writes constants.json:
// per constant its FQN, where it is stored (the module's weights or the payload's
// constants.safetensors, under which key), dtype, shape and strides. The package's kernels index
// constants with the strides they were compiled for, and AOTInductor takes user-managed tensors
// as they are, so each is laid out that way here.
#include "constants.h"

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner.h>

#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "honed/artifact.h"
#include "honed/runtime.h"
#include "tensors.h"

namespace honed::detail {
namespace {

using json = nlohmann::json;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// The listed constant, laid out as compiled, on `device`; `source` is its safetensors tensor.
at::Tensor laid_out(const json& c, const RawTensor& source, const c10::Device& device) {
  const std::string fqn = c.at("fqn").get<std::string>();
  const c10::ScalarType dtype = dtype_from_name(c.at("dtype").get<std::string>());
  const auto shape = c.at("shape").get<std::vector<int64_t>>();
  const auto stride = c.at("stride").get<std::vector<int64_t>>();
  // "cast_from": the module's own tensor, stored in that dtype, cast to the package's (bf16
  // weights): the same round-to-nearest-even cast the package was compiled from.
  const c10::ScalarType stored_as =
      c.contains("cast_from") ? dtype_from_name(c.at("cast_from").get<std::string>()) : dtype;
  at::Tensor stored = view_tensor(source);
  if (stored.scalar_type() != stored_as || stored.sizes() != at::IntArrayRef(shape)) {
    throw RuntimeError("honed runtime: package constant '" + fqn + "' should be " +
                       dtype_name(stored_as) + shape_text(shape) + ", the artifact holds " +
                       dtype_name(stored.scalar_type()) + shape_text(stored.sizes().vec()) +
                       "; re-save the artifact");
  }
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  if (stored_as == dtype && stored.strides() == at::IntArrayRef(stride)) {
    return device.is_cpu() ? stored.clone() : stored.to(options, /*non_blocking=*/false, true);
  }
  at::Tensor out = at::empty_strided(shape, stride, options);
  // A copy from the host that also converts converts on one CPU core first (ATen's CPU-to-GPU
  // copy); uploading the stored bytes as they are and converting on the GPU is the fast way.
  out.copy_(device.is_cpu() ? stored : stored.to(device));
  return out;
}

}  // namespace

std::vector<at::Tensor> give_constants(torch::inductor::AOTIModelContainerRunner& runner,
                                       std::string_view listing, std::string_view weights,
                                       std::string_view stored, const c10::Device& device) {
  json doc = json::parse(listing, nullptr, false);
  if (!doc.is_object() || doc.value("format", 0) != 1 || !doc.contains("constants")) {
    throw RuntimeError(std::string("honed runtime: ") + kConstantsJson +
                       " is not one this runtime reads (format 1); re-save with this honed");
  }
  const SafeTensors from_weights = parse_safetensors(weights);
  const SafeTensors from_payload = stored.empty() ? SafeTensors{} : parse_safetensors(stored);
  std::unordered_map<std::string, std::string> name_of;  // FQN -> the package's constant name
  for (const auto& [name, fqn] : runner.getConstantNamesToOriginalFQNs()) name_of[fqn] = name;

  std::unordered_map<std::string, at::Tensor> constants;
  std::vector<at::Tensor> kept;
  for (const json& c : doc.at("constants")) {
    const std::string fqn = c.at("fqn").get<std::string>();
    const std::string source = c.at("source").get<std::string>();
    const std::string key = c.at("key").get<std::string>();
    const SafeTensors& from = source == "weights" ? from_weights : from_payload;
    auto raw = from.tensors.find(key);
    if (raw == from.tensors.end()) {
      throw RuntimeError("honed runtime: package constant '" + fqn + "' is stored as '" + key +
                         "' in the " + source + ", which holds no such tensor; re-save the " +
                         "artifact");
    }
    auto name = name_of.find(fqn);
    if (name == name_of.end()) {
      throw RuntimeError("honed runtime: " + std::string(kConstantsJson) + " lists constant '" +
                         fqn + "', which the package does not have; re-save the artifact");
    }
    at::Tensor t = laid_out(c, raw->second, device);
    constants.emplace(name->second, t);
    kept.push_back(std::move(t));
  }
  // Every constant the package has (it checks), used in place: the package keeps no copy.
  runner.update_constant_buffer(constants, /*use_inactive=*/false, /*validate_full_updates=*/true,
                                /*user_managed=*/true);
  return kept;
}

}  // namespace honed::detail
