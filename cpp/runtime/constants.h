// cpp/runtime/constants.h: the constants of a package stored apart from its code (private).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string_view>
#include <vector>

namespace torch::inductor {
class AOTIModelContainerRunner;
}

namespace honed::detail {

// The file names of backend/_aoti_constants.py.
inline constexpr const char* kConstantsJson = "constants.json";
inline constexpr const char* kConstantsFile = "constants.safetensors";

// Gives `runner` every constant constants.json (`listing`) names, each taken from the module's
// weights (`weights`, a safetensors buffer) or the payload's constants.safetensors (`stored`;
// empty when there is none), with the dtype, shape and strides the package was compiled for, on
// `device`: one copy from the artifact's mapping (to the GPU, or into owned CPU memory). The
// runner uses the returned tensors in place, so they must outlive it. Throws honed::RuntimeError
// naming a constant that is missing or does not match.
std::vector<at::Tensor> give_constants(torch::inductor::AOTIModelContainerRunner& runner,
                                       std::string_view listing, std::string_view weights,
                                       std::string_view stored, const c10::Device& device);

}  // namespace honed::detail
