// cpp/include/honed/env.h: GPU / driver probing (libcuda, NVML loaded at run time) and diagnosis.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace honed {

struct GpuInfo {
  int index = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  int64_t total_memory_bytes = 0;
};

// What the NVIDIA driver says about this machine, without torch or the CUDA runtime.
//   driver_loaded        libcuda.so.1 could be loaded and has the entry points used here
//   error                why driver_loaded is false, or why there are no GPUs (cuInit's error),
//                        or "" when all went well
//   driver_cuda_version  the highest CUDA the driver supports, as cuDriverGetVersion gives it
//                        (12080 = 12.8; 0 when the driver did not load)
//   driver_version       the driver's own version ("580.159.04") from NVML, "" when NVML did not
//                        load (it is optional: the rest does not need it)
struct GpuProbe {
  bool driver_loaded = false;
  std::string error;
  int driver_cuda_version = 0;
  std::string driver_version;
  std::vector<GpuInfo> gpus;
};

// Loads libcuda (dlopen; no CUDA headers), calls cuInit(0) in this process and lists the GPUs;
// then NVML for the driver version. No driver is a normal outcome (driver_loaded = false with
// the reason), never an exception. The library names are parameters so tests can point them at
// something that does not exist.
GpuProbe probe_gpus(const std::string& libcuda = "libcuda.so.1",
                    const std::string& libnvml = "libnvidia-ml.so.1");

// 12080 -> "12.8", 13000 -> "13.0"; 0 or less -> "".
std::string cuda_version_string(int version);

// "13.0" -> 13000, "12.8" -> 12080, "12" -> 12000; -1 when it is not MAJOR[.MINOR[.PATCH]].
int parse_cuda_version(const std::string& text);

// The torch CUDA build (cu118 ... cu130) a driver supporting `driver_cuda_version` can run: the
// highest of the usual builds not above it; "" when the driver is older than all of them.
std::string best_torch_cuda_build(int driver_cuda_version);

// Whether this torch build can use this driver, and when not, why and what to do.
//   driver_cuda_version  from probe_gpus (0 = no driver)
//   torch_version        torch.__version__, e.g. "2.11.0+cu130"
//   torch_cuda           torch.version.cuda, e.g. "13.0", or "" for a CPU-only build
// A driver for an older CUDA major version than torch's cannot run it (torch reports "driver too
// old"). Within one major version CUDA's minor-version compatibility applies: ok, with a note.
struct DriverDiagnosis {
  bool ok = false;
  std::string message;
  std::string fix;
};

DriverDiagnosis diagnose_driver(int driver_cuda_version, const std::string& torch_version,
                                const std::string& torch_cuda);

}  // namespace honed
