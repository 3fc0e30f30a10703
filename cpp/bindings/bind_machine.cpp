// cpp/bindings/bind_machine.cpp: honed._core bindings of machine (CPU, GPU details, busy check).
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "honed/machine.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

void bind_machine(nb::module_& m) {
  nb::class_<CpuInfo>(m, "CpuInfo")
      .def_ro("model", &CpuInfo::model)
      .def_ro("logical_cpus", &CpuInfo::logical_cpus)
      .def_ro("physical_cores", &CpuInfo::physical_cores);
  nb::class_<GpuDetails>(m, "GpuDetails")
      .def_ro("nvml", &GpuDetails::nvml)
      .def_ro("error", &GpuDetails::error)
      .def_ro("name", &GpuDetails::name)
      .def_ro("driver_version", &GpuDetails::driver_version)
      .def_ro("sm_clock_mhz", &GpuDetails::sm_clock_mhz)
      .def_ro("max_sm_clock_mhz", &GpuDetails::max_sm_clock_mhz)
      .def_ro("mem_clock_mhz", &GpuDetails::mem_clock_mhz)
      .def_ro("power_limit_w", &GpuDetails::power_limit_w)
      .def_ro("utilization_pct", &GpuDetails::utilization_pct)
      .def_ro("processes_known", &GpuDetails::processes_known)
      .def_ro("process_pids", &GpuDetails::process_pids);
  nb::class_<LoadSignals>(m, "LoadSignals")
      .def(
          "__init__",
          [](LoadSignals* self, std::vector<double> calibration_ms, double load_avg_1m,
             int logical_cpus, int gpu_other_processes) {
            new (self) LoadSignals{std::move(calibration_ms), load_avg_1m, logical_cpus,
                                   gpu_other_processes};
          },
          "calibration_ms"_a = std::vector<double>{}, "load_avg_1m"_a = -1.0, "logical_cpus"_a = 0,
          "gpu_other_processes"_a = -1)
      .def_rw("calibration_ms", &LoadSignals::calibration_ms)
      .def_rw("load_avg_1m", &LoadSignals::load_avg_1m)
      .def_rw("logical_cpus", &LoadSignals::logical_cpus)
      .def_rw("gpu_other_processes", &LoadSignals::gpu_other_processes);
  nb::class_<LoadVerdict>(m, "LoadVerdict")
      .def_ro("busy", &LoadVerdict::busy)
      .def_ro("slowdown", &LoadVerdict::slowdown)
      .def_ro("load_per_cpu", &LoadVerdict::load_per_cpu)
      .def_ro("reasons", &LoadVerdict::reasons)
      .def_ro("summary", &LoadVerdict::summary);
  // Probes read files and query NVML (slow, docs/jit.md): a JIT tune makes them beside the
  // program's calls, so they run without the GIL.
  m.def("probe_cpu", &probe_cpu, "cpuinfo_path"_a = "/proc/cpuinfo", release_gil());
  m.def("parse_cpuinfo", &parse_cpuinfo, "text"_a, "logical_cpus"_a);
  m.def("probe_gpu_details", &probe_gpu_details, "device"_a, "libnvml"_a = "libnvidia-ml.so.1",
        release_gil());
  m.def("other_processes", &other_processes, "pids"_a, "own_pids"_a, "own_context"_a);
  m.def("calibrate_cpu", &calibrate_cpu, "threads"_a, "chunks"_a = 60, "chunk_ms"_a = 0.5,
        release_gil());
  m.def(
      "assess_load",
      [](const LoadSignals& s, double max_slowdown, double max_load_per_cpu) {
        return assess_load(s, LoadLimits{max_slowdown, max_load_per_cpu});
      },
      "signals"_a, "max_slowdown"_a = LoadLimits{}.max_slowdown,
      "max_load_per_cpu"_a = LoadLimits{}.max_load_per_cpu);
  m.def("load_average_1m", &load_average_1m);
}

}  // namespace honed::py
