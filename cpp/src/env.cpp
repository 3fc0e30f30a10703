// cpp/src/env.cpp: probe_gpus over libcuda and NVML (dlopen, no CUDA headers); driver diagnosis.
// The few driver entry points are declared here: CUresult and nvmlReturn_t are C enums
// (int-sized, 0 = success), CUdevice is an int, CUdevice_attribute an int-sized enum.
#include "honed/env.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "dynlib.h"

namespace honed {

namespace {

using status_t = int;                        // CUresult / nvmlReturn_t
constexpr int kComputeCapabilityMajor = 75;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
constexpr int kComputeCapabilityMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR

struct DriverApi {
  status_t (*init)(unsigned) = nullptr;                            // cuInit
  status_t (*driver_get_version)(int*) = nullptr;                  // cuDriverGetVersion
  status_t (*device_get_count)(int*) = nullptr;                    // cuDeviceGetCount
  status_t (*device_get)(int*, int) = nullptr;                     // cuDeviceGet
  status_t (*device_get_name)(char*, int, int) = nullptr;          // cuDeviceGetName
  status_t (*device_get_attribute)(int*, int, int) = nullptr;      // cuDeviceGetAttribute
  status_t (*device_total_mem)(size_t*, int) = nullptr;            // cuDeviceTotalMem_v2
  status_t (*get_error_string)(status_t, const char**) = nullptr;  // cuGetErrorString (optional)
};

struct NvmlApi {
  status_t (*init)() = nullptr;                                      // nvmlInit_v2
  status_t (*system_get_driver_version)(char*, unsigned) = nullptr;  // nvmlSystemGetDriverVersion
  status_t (*shutdown)() = nullptr;                                  // nvmlShutdown
};

using detail::dl_error;
using detail::resolve;

std::string cuda_error(const DriverApi& api, status_t status) {
  const char* text = nullptr;
  if (api.get_error_string && api.get_error_string(status, &text) == 0 && text) {
    return std::string(text) + " (CUresult " + std::to_string(status) + ")";
  }
  return "CUresult " + std::to_string(status);
}

// Loads libcuda and resolves the entry points; "" on success, else why not.
std::string load_driver(const std::string& lib, DriverApi& api) {
  // Never closed: torch (or a CUDA timer) in this process shares the one loaded driver.
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return lib + " could not be loaded (no NVIDIA driver here?): " + dl_error();
  const bool ok = resolve(h, "cuInit", api.init) &&
                  resolve(h, "cuDriverGetVersion", api.driver_get_version) &&
                  resolve(h, "cuDeviceGetCount", api.device_get_count) &&
                  resolve(h, "cuDeviceGet", api.device_get) &&
                  resolve(h, "cuDeviceGetName", api.device_get_name) &&
                  resolve(h, "cuDeviceGetAttribute", api.device_get_attribute) &&
                  resolve(h, "cuDeviceTotalMem_v2", api.device_total_mem);
  if (!ok)
    return lib + " lacks a CUDA driver entry point (" + dl_error() + "); reinstall the driver";
  resolve(h, "cuGetErrorString", api.get_error_string);
  return "";
}

// Lists the GPUs after cuInit; "" on success, else the failing call and its error.
std::string list_gpus(const DriverApi& api, std::vector<GpuInfo>& gpus) {
  if (const status_t s = api.init(0); s != 0) return "cuInit failed: " + cuda_error(api, s);
  int count = 0;
  if (const status_t s = api.device_get_count(&count); s != 0) {
    return "cuDeviceGetCount failed: " + cuda_error(api, s);
  }
  for (int i = 0; i < count; ++i) {
    GpuInfo g;
    g.index = i;
    int dev = 0;
    char name[256] = {};
    size_t total = 0;
    status_t s = api.device_get(&dev, i);
    if (s == 0) s = api.device_get_name(name, sizeof name, dev);
    if (s == 0) s = api.device_get_attribute(&g.cc_major, kComputeCapabilityMajor, dev);
    if (s == 0) s = api.device_get_attribute(&g.cc_minor, kComputeCapabilityMinor, dev);
    if (s == 0) s = api.device_total_mem(&total, dev);
    if (s != 0) return "querying GPU " + std::to_string(i) + " failed: " + cuda_error(api, s);
    g.name = name;
    g.total_memory_bytes = static_cast<int64_t>(total);
    gpus.push_back(g);
  }
  return "";
}

// The driver's version string from NVML; "" when NVML is not there (it is optional).
std::string nvml_driver_version(const std::string& lib) {
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return "";
  NvmlApi api;
  std::string version;
  if (resolve(h, "nvmlInit_v2", api.init) &&
      resolve(h, "nvmlSystemGetDriverVersion", api.system_get_driver_version) &&
      resolve(h, "nvmlShutdown", api.shutdown) && api.init() == 0) {
    char buf[96] = {};
    if (api.system_get_driver_version(buf, sizeof buf) == 0) version = buf;
    api.shutdown();
  }
  return version;
}

struct TorchBuild {
  int cuda;
  const char* tag;
};

// The CUDA builds torch publishes wheels for (https://download.pytorch.org/whl/<tag>).
constexpr TorchBuild kTorchBuilds[] = {
    {11080, "cu118"}, {12010, "cu121"}, {12040, "cu124"}, {12060, "cu126"},
    {12080, "cu128"}, {12090, "cu129"}, {13000, "cu130"},
};

std::string install_command(const std::string& tag) {
  return "pip install torch --index-url https://download.pytorch.org/whl/" + tag;
}

}  // namespace

GpuProbe probe_gpus(const std::string& libcuda, const std::string& libnvml) {
  GpuProbe probe;
  DriverApi api;
  probe.error = load_driver(libcuda, api);
  if (!probe.error.empty()) return probe;
  probe.driver_loaded = true;
  if (const status_t s = api.driver_get_version(&probe.driver_cuda_version); s != 0) {
    probe.error = "cuDriverGetVersion failed: " + cuda_error(api, s);
    probe.driver_cuda_version = 0;
  }
  const std::string gpu_error = list_gpus(api, probe.gpus);
  if (probe.error.empty()) probe.error = gpu_error;
  probe.driver_version = nvml_driver_version(libnvml);
  return probe;
}

std::string cuda_version_string(int version) {
  if (version <= 0) return "";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

int parse_cuda_version(const std::string& text) {
  int major = 0, minor = 0, patch = 0, used = 0;
  const char* s = text.c_str();
  if (std::sscanf(s, "%d%n", &major, &used) != 1 || used == 0 || major < 0) return -1;
  const bool digits_only = text.find_first_not_of("0123456789.") == std::string::npos;
  if (!digits_only || text.front() == '.' || text.back() == '.') return -1;
  if (s[used] == '.') {
    int more = 0;
    if (std::sscanf(s + used + 1, "%d%n", &minor, &more) != 1) return -1;
    used += 1 + more;
    if (s[used] == '.') {
      if (std::sscanf(s + used + 1, "%d%n", &patch, &more) != 1) return -1;
      used += 1 + more;
    }
  }
  if (s[used] != '\0' || minor > 99) return -1;
  return major * 1000 + minor * 10;
}

std::string best_torch_cuda_build(int driver_cuda_version) {
  std::string best;
  for (const TorchBuild& b : kTorchBuilds) {
    if (b.cuda <= driver_cuda_version) best = b.tag;
  }
  return best;
}

DriverDiagnosis diagnose_driver(int driver_cuda_version, const std::string& torch_version,
                                const std::string& torch_cuda) {
  const std::string torch = "torch " + torch_version;
  const std::string driver_cuda = cuda_version_string(driver_cuda_version);
  const std::string build = best_torch_cuda_build(driver_cuda_version);
  if (torch_cuda.empty()) {
    const std::string tag = build.empty() ? "cu128" : build;
    std::string fix = "install a CUDA build of torch (" + install_command(tag) + ")";
    if (driver_cuda_version <= 0) fix = "install the NVIDIA driver, then " + fix;
    if (driver_cuda_version > 0 && build.empty()) fix = "update the NVIDIA driver, then " + fix;
    return {false, torch + " is a CPU-only build", fix};
  }
  const int needed = parse_cuda_version(torch_cuda);
  if (needed < 0) {
    return {false, torch + " reports CUDA version '" + torch_cuda + "', which is not a version",
            "reinstall torch from https://download.pytorch.org/whl/"};
  }
  if (driver_cuda_version <= 0) {
    return {false,
            "no NVIDIA driver was found; " + torch + " needs one that supports CUDA " + torch_cuda,
            "install an NVIDIA driver that supports CUDA " + torch_cuda +
                " or newer, or run on the CPU"};
  }
  const std::string versions =
      "this driver supports CUDA " + driver_cuda + "; " + torch + " needs " + torch_cuda;
  if (driver_cuda_version >= needed) return {true, versions, ""};
  if (driver_cuda_version / 1000 == needed / 1000) {
    return {true,
            "this driver supports CUDA " + driver_cuda + "; " + torch + " was built for " +
                torch_cuda + ", which runs through CUDA minor-version compatibility",
            "if kernels fail to load (PTX JIT errors), install a +" + build + " build of torch (" +
                install_command(build) + ") or update the NVIDIA driver"};
  }
  if (build.empty()) {
    return {false, versions,
            "update the NVIDIA driver: it supports CUDA " + driver_cuda +
                ", older than every torch CUDA build (cu118 needs 11.8)"};
  }
  return {false, versions,
          "install a +" + build + " build of torch (" + install_command(build) +
              ") or update the NVIDIA driver"};
}

}  // namespace honed
