// cpp/bindings/bind_select.cpp: bindings of the engine's select part (placeholder until it lands).
#include "bindings.h"

namespace honed::py {
void bind_select(nanobind::module_& /*m*/) {}
}  // namespace honed::py
