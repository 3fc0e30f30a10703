// cpp/bindings/module.cpp: the nanobind module honed._core; converts types, holds no logic.
#include "bindings.h"
#include "honed/version.h"

NB_MODULE(_core, m) {
  m.doc() = "honed engine: shapes, dispatch, measurement, selection and the artifact format (C++)";
  m.attr("__version__") = honed::version();
  // Objects still referenced at interpreter exit (e.g. by torch's caches) are not leaks of ours.
  nanobind::set_leak_warnings(false);
  honed::py::bind_errors(m);
  honed::py::bind_shapes(m);
  honed::py::bind_measure(m);
  honed::py::bind_select(m);
  honed::py::bind_isolate(m);
  honed::py::bind_env(m);
  honed::py::bind_machine(m);
  honed::py::bind_artifact(m);
  honed::py::bind_aoti(m);
  honed::py::bind_digest(m);
  honed::py::bind_closeness(m);
}
