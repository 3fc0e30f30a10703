// cpp/bindings/bind_closeness.cpp: honed._core.closeness (closeness.h), without the GIL.
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "honed/closeness.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

void bind_closeness(nb::module_& m) {
  nb::class_<Closeness>(m, "Closeness")
      .def_ro("bad", &Closeness::bad)
      .def_ro("bad_nan", &Closeness::bad_nan)
      .def_ro("compared", &Closeness::compared)
      .def_ro("max_abs", &Closeness::max_abs)
      .def_ro("scale", &Closeness::scale)
      .def_ro("max_rel", &Closeness::max_rel)
      .def_ro("cosine", &Closeness::cosine)
      .def_ro("within", &Closeness::within);
  m.def(
      "closeness",
      [](uintptr_t ref, uintptr_t out, size_t n, const std::string& dtype, double atol,
         double rtol) {
        const FloatKind kind = float_kind(dtype);
        nb::gil_scoped_release released;
        return closeness(reinterpret_cast<const void*>(ref), reinterpret_cast<const void*>(out), n,
                         kind, atol, rtol);
      },
      "ref"_a, "out"_a, "n"_a, "dtype"_a, "atol"_a, "rtol"_a,
      "Figures of out against ref: n contiguous elements of dtype ('float64', 'float32', "
      "'float16', 'bfloat16') at host addresses the caller keeps alive");
}

}  // namespace honed::py
