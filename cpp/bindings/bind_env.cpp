// cpp/bindings/bind_env.cpp: honed._core bindings of env (probe_gpus, diagnose_driver).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "honed/env.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

void bind_env(nb::module_& m) {
  nb::class_<GpuInfo>(m, "GpuInfo")
      .def_ro("index", &GpuInfo::index)
      .def_ro("name", &GpuInfo::name)
      .def_ro("cc_major", &GpuInfo::cc_major)
      .def_ro("cc_minor", &GpuInfo::cc_minor)
      .def_ro("total_memory_bytes", &GpuInfo::total_memory_bytes)
      .def("__repr__", [](const GpuInfo& g) {
        return "GpuInfo(" + std::to_string(g.index) + ", '" + g.name + "', sm_" +
               std::to_string(g.cc_major) + std::to_string(g.cc_minor) + ")";
      });
  nb::class_<GpuProbe>(m, "GpuProbe")
      .def_ro("driver_loaded", &GpuProbe::driver_loaded)
      .def_ro("error", &GpuProbe::error)
      .def_ro("driver_cuda_version", &GpuProbe::driver_cuda_version)
      .def_ro("driver_version", &GpuProbe::driver_version)
      .def_ro("gpus", &GpuProbe::gpus);
  nb::class_<DriverDiagnosis>(m, "DriverDiagnosis")
      .def_ro("ok", &DriverDiagnosis::ok)
      .def_ro("message", &DriverDiagnosis::message)
      .def_ro("fix", &DriverDiagnosis::fix);
  m.def("probe_gpus", &probe_gpus, "libcuda"_a = "libcuda.so.1", "libnvml"_a = "libnvidia-ml.so.1");
  m.def("cuda_version_string", &cuda_version_string, "version"_a);
  m.def("parse_cuda_version", &parse_cuda_version, "text"_a);
  m.def("best_torch_cuda_build", &best_torch_cuda_build, "driver_cuda_version"_a);
  m.def("diagnose_driver", &diagnose_driver, "driver_cuda_version"_a, "torch_version"_a,
        "torch_cuda"_a);
}

}  // namespace honed::py
