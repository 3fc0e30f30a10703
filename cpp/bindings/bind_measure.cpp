// cpp/bindings/bind_measure.cpp: bindings of the engine's measure part (placeholder until it lands).
#include "bindings.h"

namespace honed::py {
void bind_measure(nanobind::module_& /*m*/) {}
}  // namespace honed::py
