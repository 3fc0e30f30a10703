// cpp/bindings/bindings.h: one bind_* function per engine part, called from module.cpp.
#pragma once
#include <nanobind/nanobind.h>

namespace honed::py {
// A binding's guard for engine calls that touch no Python object: the GIL is released during the
// call (after the arguments are converted), so other Python threads run meanwhile.
using release_gil = nanobind::call_guard<nanobind::gil_scoped_release>;

// First: every bind_* below throws C++ exceptions that it translates into honed.errors.
void bind_errors(nanobind::module_& m);
void bind_shapes(nanobind::module_& m);
void bind_measure(nanobind::module_& m);
void bind_select(nanobind::module_& m);
void bind_isolate(nanobind::module_& m);
void bind_env(nanobind::module_& m);
void bind_machine(nanobind::module_& m);
void bind_artifact(nanobind::module_& m);
void bind_aoti(nanobind::module_& m);
void bind_digest(nanobind::module_& m);
void bind_closeness(nanobind::module_& m);
}  // namespace honed::py
