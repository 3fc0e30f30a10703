// cpp/runtime/tensors.cpp: safetensors <-> at::Tensor and dtype names.
#include "tensors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "honed/runtime.h"

namespace honed {
namespace {

struct DtypeNames {
  c10::ScalarType type;
  const char* honed;        // graph keys and calling.json ("float32")
  const char* safetensors;  // safetensors headers ("F32")
};

constexpr DtypeNames kDtypes[] = {
    {c10::kFloat, "float32", "F32"},
    {c10::kDouble, "float64", "F64"},
    {c10::kHalf, "float16", "F16"},
    {c10::kBFloat16, "bfloat16", "BF16"},
    {c10::kLong, "int64", "I64"},
    {c10::kInt, "int32", "I32"},
    {c10::kShort, "int16", "I16"},
    {c10::kChar, "int8", "I8"},
    {c10::kByte, "uint8", "U8"},
    {c10::kBool, "bool", "BOOL"},
    {c10::kComplexFloat, "complex64", "C64"},
};

}  // namespace

std::string dtype_name(c10::ScalarType type) {
  for (const DtypeNames& d : kDtypes) {
    if (d.type == type) return d.honed;
  }
  return std::string(c10::toString(type));
}

namespace detail {

c10::ScalarType dtype_from_name(std::string name) {
  if (name.rfind("torch.", 0) == 0) name = name.substr(6);
  for (const DtypeNames& d : kDtypes) {
    if (name == d.honed) return d.type;
  }
  throw RuntimeError("honed runtime: dtype " + name + " is not supported by the C++ runtime");
}

at::Tensor to_tensor(const RawTensor& raw) {
  for (const DtypeNames& d : kDtypes) {
    if (raw.dtype != d.safetensors) continue;
    at::Tensor t = at::empty(raw.shape, at::TensorOptions().dtype(d.type));
    if (static_cast<size_t>(t.nbytes()) != raw.data.size()) {
      throw ArtifactError("safetensors tensor of shape and dtype " + raw.dtype + " holds " +
                          std::to_string(raw.data.size()) + " bytes, expected " +
                          std::to_string(t.nbytes()));
    }
    std::copy(raw.data.begin(), raw.data.end(), static_cast<char*>(t.data_ptr()));
    return t;
  }
  throw RuntimeError("honed runtime: safetensors dtype " + raw.dtype + " is not supported");
}

at::Tensor view_tensor(const RawTensor& raw) {
  for (const DtypeNames& d : kDtypes) {
    if (raw.dtype != d.safetensors) continue;
    // The mapping is read-only: the view is only ever read (copied from).
    at::Tensor t = at::from_blob(const_cast<char*>(raw.data.data()), raw.shape,
                                 at::TensorOptions().dtype(d.type));
    if (static_cast<size_t>(t.nbytes()) != raw.data.size()) {
      throw ArtifactError("safetensors tensor of shape and dtype " + raw.dtype + " holds " +
                          std::to_string(raw.data.size()) + " bytes, expected " +
                          std::to_string(t.nbytes()));
    }
    return t;
  }
  throw RuntimeError("honed runtime: safetensors dtype " + raw.dtype + " is not supported");
}

std::vector<at::Tensor> tensors_with_prefix(std::string_view buffer, const std::string& prefix) {
  SafeTensors st = parse_safetensors(buffer);
  std::vector<std::pair<long, at::Tensor>> found;
  for (const auto& [name, raw] : st.tensors) {
    if (name.rfind(prefix, 0) != 0) continue;
    found.emplace_back(std::stol(name.substr(prefix.size())), to_tensor(raw));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<at::Tensor> out;
  for (auto& [index, t] : found) out.push_back(std::move(t));
  return out;
}

StoredBatch stored_sample_batch(std::string_view buffer) {
  const SafeTensors st = parse_safetensors(buffer);
  auto spec = st.metadata.find("treespec");
  if (spec == st.metadata.end()) return {};
  const nlohmann::json meta = nlohmann::json::parse(spec->second, nullptr, false);
  if (!meta.is_object() || !meta.contains("batch")) return {};
  const nlohmann::json& batch = meta.at("batch");
  const nlohmann::json axes = meta.value("batch_axes", nlohmann::json());
  const bool axes_ok = axes.is_array() && std::all_of(axes.begin(), axes.end(), [](const auto& a) {
                         return a.is_number_integer();
                       });
  if (!batch.is_number_integer() || batch.get<int64_t>() < 1 || !axes_ok) {
    throw RuntimeError("honed runtime: a stored sample's batch is " + batch.dump() + " along " +
                       axes.dump() +
                       ", not a positive integer along integer axes; re-save the "
                       "artifact");
  }
  return {batch.get<int64_t>(), axes.get<std::vector<int>>()};
}

}  // namespace detail
}  // namespace honed
