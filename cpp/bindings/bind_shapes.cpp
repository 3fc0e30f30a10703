// cpp/bindings/bind_shapes.cpp: bindings of the engine's shapes part (placeholder until it lands).
#include "bindings.h"

namespace honed::py {
void bind_shapes(nanobind::module_& /*m*/) {}
}  // namespace honed::py
