// cpp/bindings/bind_aoti.cpp: honed._core.AotiContainer; every call into the library without the
// GIL (the point of it: a program's other threads keep running while a package loads and runs).
// Tensor handles cross as the capsules torch._C._aoti makes and takes
// (unsafe_alloc_void_ptrs_from_tensors, alloc_tensors_by_stealing_from_void_ptrs).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <utility>

#include "bindings.h"
#include "honed/aoti.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {
namespace {

std::uintptr_t address(const nb::handle& capsule) {
  if (!PyCapsule_CheckExact(capsule.ptr())) {
    throw nb::type_error("AotiContainer takes tensor handles as capsules (torch._C._aoti)");
  }
  return reinterpret_cast<std::uintptr_t>(nb::borrow<nb::capsule>(capsule).data());
}

}  // namespace

void bind_aoti(nb::module_& m) {
  nb::class_<AotiContainer>(m, "AotiContainer")
      .def_static("open", &AotiContainer::open, "library"_a, "device"_a, "cubin_dir"_a,
                  "torch_cxx11_abi"_a, "pairs"_a = true, release_gil())
      .def_prop_ro("uses_pairs", &AotiContainer::uses_pairs)
      .def_prop_ro("num_inputs", &AotiContainer::num_inputs)
      .def_prop_ro("num_outputs", &AotiContainer::num_outputs)
      .def("call_spec", &AotiContainer::call_spec)
      .def("constants", &AotiContainer::constants)
      .def(
          "update_constants",
          [](AotiContainer& c, const nb::list& pairs, bool validate_full_update) {
            std::vector<std::pair<std::string, std::uintptr_t>> handles;
            handles.reserve(pairs.size());
            for (nb::handle pair : pairs) {
              nb::tuple t = nb::borrow<nb::tuple>(pair);
              handles.emplace_back(nb::cast<std::string>(t[0]), address(t[1]));
            }
            nb::gil_scoped_release unlocked;
            c.update_constants(handles, validate_full_update);
          },
          nb::sig("def update_constants(self, pairs: list[tuple[str, object]], "
                  "validate_full_update: bool) -> None"),
          "pairs"_a, "validate_full_update"_a)
      .def(
          "run",
          [](AotiContainer& c, const nb::list& inputs, std::uintptr_t stream, bool single_threaded,
             bool keep_gil) {
            std::vector<std::uintptr_t> in;
            in.reserve(inputs.size());
            for (nb::handle h : inputs) in.push_back(address(h));
            std::vector<std::uintptr_t> out;
            if (keep_gil) {
              out = c.run(in, stream, single_threaded);
            } else {
              nb::gil_scoped_release unlocked;
              out = c.run(in, stream, single_threaded);
            }
            nb::list result;
            for (std::uintptr_t p : out) result.append(nb::capsule(reinterpret_cast<void*>(p)));
            return result;
          },
          nb::sig("def run(self, inputs: list[object], stream: int, single_threaded: bool, "
                  "keep_gil: bool = False) -> list[object]"),
          "inputs"_a, "stream"_a, "single_threaded"_a, "keep_gil"_a = false);
}

}  // namespace honed::py
