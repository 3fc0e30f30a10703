// cpp/runtime/tensors.h: safetensors <-> at::Tensor, dtype names, stored samples (runtime-private).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "honed/artifact.h"

namespace honed::detail {

// A copy of a safetensors tensor as an owning CPU at::Tensor.
at::Tensor to_tensor(const RawTensor& raw);

// A CPU at::Tensor over the safetensors tensor's bytes (no copy): valid while they are, and
// never to be written (they are the artifact's read-only mapping).
at::Tensor view_tensor(const RawTensor& raw);

// The tensor leaves of a sample written by honed.save ("leaf<i>", in flatten order of
// (args, kwargs)), or of an outputs entry ("out<i>", in flatten order of the outputs).
std::vector<at::Tensor> tensors_with_prefix(std::string_view buffer, const std::string& prefix);

// The batch a sample written by honed.save is to be restored to, and along which axis of each
// tensor, when only its first items were stored (its "treespec" metadata's "batch" and
// "batch_axes"); batch 0 when it was stored whole.
struct StoredBatch {
  int64_t batch = 0;
  std::vector<int> axes;
};
StoredBatch stored_sample_batch(std::string_view buffer);

// "torch.float32" or "float32" -> c10::ScalarType; throws honed::RuntimeError when unknown.
c10::ScalarType dtype_from_name(std::string name);

}  // namespace honed::detail
