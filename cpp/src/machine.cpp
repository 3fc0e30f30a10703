// cpp/src/machine.cpp: CPU description, GPU details over NVML (dlopen), the busy-machine check.
// NVML is declared here, not included: nvmlReturn_t and nvmlClockType_t are int-sized C enums
// (0 = success), nvmlDevice_t an opaque pointer.
#include "honed/machine.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "dynlib.h"

namespace honed {

namespace {

// ---- CPU ------------------------------------------------------------------------------------

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t\r");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

int affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

// ---- NVML -----------------------------------------------------------------------------------

using status_t = int;
using device_t = void*;
constexpr int kClockSm = 1;   // NVML_CLOCK_SM
constexpr int kClockMem = 2;  // NVML_CLOCK_MEM
constexpr int kInsufficientSize = 7;

struct Utilization {  // nvmlUtilization_t
  unsigned gpu;
  unsigned memory;
};

struct ProcessInfoV1 {  // nvmlProcessInfo_v1_t
  unsigned pid;
  unsigned long long used_memory;
};

struct ProcessInfoV2 {  // nvmlProcessInfo_v2_t / _v3_t (the same layout)
  unsigned pid;
  unsigned long long used_memory;
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};

struct NvmlApi {
  status_t (*init)() = nullptr;
  status_t (*shutdown)() = nullptr;
  status_t (*by_index)(unsigned, device_t*) = nullptr;
  status_t (*by_uuid)(const char*, device_t*) = nullptr;
  status_t (*name)(device_t, char*, unsigned) = nullptr;
  status_t (*driver_version)(char*, unsigned) = nullptr;
  status_t (*clock)(device_t, int, unsigned*) = nullptr;
  status_t (*max_clock)(device_t, int, unsigned*) = nullptr;
  status_t (*power_limit)(device_t, unsigned*) = nullptr;
  status_t (*utilization)(device_t, Utilization*) = nullptr;
  status_t (*processes_v2)(device_t, unsigned*, ProcessInfoV2*) = nullptr;
  status_t (*processes_v1)(device_t, unsigned*, ProcessInfoV1*) = nullptr;
};

// Loads NVML; "" on success, else why not. The optional entry points stay null when missing.
std::string load_nvml(const std::string& lib, NvmlApi& api) {
  using detail::resolve;
  void* h = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);  // never closed, like the driver
  if (!h) return lib + " could not be loaded: " + detail::dl_error();
  if (!resolve(h, {"nvmlInit_v2", "nvmlInit"}, api.init) ||
      !resolve(h, "nvmlShutdown", api.shutdown) ||
      !resolve(h, {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"}, api.by_index)) {
    return lib + " lacks the NVML entry points used here";
  }
  resolve(h, "nvmlDeviceGetHandleByUUID", api.by_uuid);
  resolve(h, "nvmlDeviceGetName", api.name);
  resolve(h, "nvmlSystemGetDriverVersion", api.driver_version);
  resolve(h, "nvmlDeviceGetClockInfo", api.clock);
  resolve(h, "nvmlDeviceGetMaxClockInfo", api.max_clock);
  resolve(h, {"nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"},
          api.power_limit);
  resolve(h, "nvmlDeviceGetUtilizationRates", api.utilization);
  resolve(h, {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"},
          api.processes_v2);
  resolve(h, "nvmlDeviceGetComputeRunningProcesses", api.processes_v1);
  return "";
}

int read_clock(status_t (*fn)(device_t, int, unsigned*), device_t dev, int type) {
  unsigned mhz = 0;
  return fn && fn(dev, type, &mhz) == 0 ? static_cast<int>(mhz) : -1;
}

// The compute processes on dev; false when NVML cannot list them.
bool list_processes(const NvmlApi& api, device_t dev, std::vector<uint32_t>& pids) {
  constexpr unsigned kMax = 256;
  unsigned count = kMax;
  if (api.processes_v2) {
    std::vector<ProcessInfoV2> infos(kMax);
    const status_t s = api.processes_v2(dev, &count, infos.data());
    if (s == 0 || s == kInsufficientSize) {
      for (unsigned i = 0; i < std::min(count, kMax); ++i) pids.push_back(infos[i].pid);
      return true;
    }
  }
  if (api.processes_v1) {
    count = kMax;
    std::vector<ProcessInfoV1> infos(kMax);
    const status_t s = api.processes_v1(dev, &count, infos.data());
    if (s == 0 || s == kInsufficientSize) {
      for (unsigned i = 0; i < std::min(count, kMax); ++i) pids.push_back(infos[i].pid);
      return true;
    }
  }
  return false;
}

void read_device(const NvmlApi& api, device_t dev, GpuDetails& d) {
  char buf[128] = {};
  if (api.name && api.name(dev, buf, sizeof buf) == 0) d.name = buf;
  char version[96] = {};
  if (api.driver_version && api.driver_version(version, sizeof version) == 0) {
    d.driver_version = version;
  }
  d.sm_clock_mhz = read_clock(api.clock, dev, kClockSm);
  d.max_sm_clock_mhz = read_clock(api.max_clock, dev, kClockSm);
  d.mem_clock_mhz = read_clock(api.clock, dev, kClockMem);
  unsigned milliwatts = 0;
  if (api.power_limit && api.power_limit(dev, &milliwatts) == 0) d.power_limit_w = milliwatts / 1e3;
  Utilization u{};
  if (api.utilization && api.utilization(dev, &u) == 0) d.utilization_pct = static_cast<int>(u.gpu);
  d.processes_known = list_processes(api, dev, d.process_pids);
}

// ---- calibration ----------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A fixed amount of integer work the compiler cannot drop or shorten.
uint64_t spin(uint64_t iterations) {
  volatile uint64_t sink = 0;
  uint64_t x = 88172645463325252ULL;
  for (uint64_t i = 0; i < iterations; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if ((i & 1023) == 0) sink = sink + x;
  }
  return sink + x;
}

// Iterations that take about chunk_ms here: the fastest of a few timed probes, scaled.
uint64_t size_chunk(double chunk_ms) {
  constexpr uint64_t kProbe = 200000;
  double fastest = 0;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    spin(kProbe);
    const double ms = ms_since(t0);
    if (i == 0 || ms < fastest) fastest = ms;
  }
  if (!(fastest > 0)) return kProbe;
  return std::max<uint64_t>(1000, static_cast<uint64_t>(kProbe * chunk_ms / fastest));
}

}  // namespace

CpuInfo parse_cpuinfo(const std::string& text, int logical_cpus) {
  CpuInfo info;
  info.logical_cpus = logical_cpus;
  std::string fallback_model;
  std::set<std::pair<std::string, std::string>> cores;
  std::string physical;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon));
    const std::string value = trim(line.substr(colon + 1));
    if (key == "model name" && info.model.empty()) info.model = value;
    if ((key == "Hardware" || key == "Processor") && fallback_model.empty()) {
      fallback_model = value;
    }
    if (key == "physical id") physical = value;
    if (key == "core id") cores.emplace(physical, value);
  }
  if (info.model.empty()) info.model = fallback_model;
  info.physical_cores = cores.empty() ? logical_cpus : static_cast<int>(cores.size());
  // A process limited to some CPUs cannot use more cores than it has CPUs.
  if (logical_cpus > 0) info.physical_cores = std::min(info.physical_cores, logical_cpus);
  return info;
}

CpuInfo probe_cpu(const std::string& cpuinfo_path) {
  std::ifstream file(cpuinfo_path);
  std::stringstream text;
  text << file.rdbuf();
  return parse_cpuinfo(text.str(), affinity_cpus());
}

GpuDetails probe_gpu_details(const std::string& device, const std::string& libnvml) {
  GpuDetails d;
  NvmlApi api;
  d.error = load_nvml(libnvml, api);
  if (!d.error.empty()) return d;
  if (const status_t s = api.init(); s != 0) {
    d.error = "nvmlInit failed (nvmlReturn_t " + std::to_string(s) + ")";
    return d;
  }
  device_t dev = nullptr;
  status_t s = -1;
  if (device.rfind("GPU-", 0) == 0 && api.by_uuid) {
    s = api.by_uuid(device.c_str(), &dev);
  } else {
    char* end = nullptr;
    const long index = std::strtol(device.c_str(), &end, 10);
    if (!device.empty() && *end == '\0' && index >= 0) s = api.by_index(index, &dev);
  }
  if (s == 0) {
    d.nvml = true;
    read_device(api, dev, d);
  } else {
    d.error =
        "NVML does not know the device '" + device + "' (nvmlReturn_t " + std::to_string(s) + ")";
  }
  api.shutdown();
  return d;
}

int other_processes(const std::vector<uint32_t>& pids, const std::vector<uint32_t>& own_pids,
                    bool own_context) {
  int others = 0;
  bool self_seen = false;
  for (uint32_t pid : pids) {
    if (std::find(own_pids.begin(), own_pids.end(), pid) != own_pids.end()) {
      self_seen = true;
    } else {
      ++others;
    }
  }
  if (own_context && !self_seen && others > 0) --others;
  return others;
}

std::vector<double> calibrate_cpu(int threads, int chunks, double chunk_ms) {
  threads = std::max(1, threads);
  chunks = std::max(1, chunks);
  const uint64_t iterations = size_chunk(chunk_ms);
  std::vector<std::vector<double>> per_thread(threads);
  auto work = [&](int t) {
    spin(iterations * 4);  // settle the clock frequency before timing
    for (int c = 0; c < chunks; ++c) {
      const auto t0 = Clock::now();
      spin(iterations);
      per_thread[t].push_back(ms_since(t0));
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& th : pool) th.join();
  std::vector<double> out;
  for (const auto& v : per_thread) out.insert(out.end(), v.begin(), v.end());
  return out;
}

double load_average_1m() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

LoadVerdict assess_load(const LoadSignals& s, const LoadLimits& limits) {
  LoadVerdict v;
  char buf[160];
  std::vector<std::string> figures;
  if (!s.calibration_ms.empty()) {
    const double fastest = *std::min_element(s.calibration_ms.begin(), s.calibration_ms.end());
    const double mean = std::accumulate(s.calibration_ms.begin(), s.calibration_ms.end(), 0.0) /
                        static_cast<double>(s.calibration_ms.size());
    v.slowdown = fastest > 0 ? mean / fastest : 1.0;
    std::snprintf(buf, sizeof buf, "CPU calibration %.2fx slower than its fastest chunk",
                  v.slowdown);
    (v.slowdown > limits.max_slowdown ? v.reasons : figures).push_back(buf);
  }
  if (s.load_avg_1m >= 0 && s.logical_cpus > 0) {
    v.load_per_cpu = s.load_avg_1m / s.logical_cpus;
    std::snprintf(buf, sizeof buf, "load average %.1f on %d CPU%s", s.load_avg_1m, s.logical_cpus,
                  s.logical_cpus == 1 ? "" : "s");
    (v.load_per_cpu > limits.max_load_per_cpu ? v.reasons : figures).push_back(buf);
  }
  if (s.gpu_other_processes > 0) {
    std::snprintf(buf, sizeof buf, "%d other process%s on the GPU", s.gpu_other_processes,
                  s.gpu_other_processes == 1 ? "" : "es");
    v.reasons.push_back(buf);
  } else if (s.gpu_other_processes == 0) {
    figures.push_back("no other process on the GPU");
  }
  v.busy = !v.reasons.empty();
  const auto join = [](const std::vector<std::string>& parts) {
    std::string out;
    for (const std::string& p : parts) out += (out.empty() ? "" : "; ") + p;
    return out;
  };
  v.summary = v.busy ? "busy: " + join(v.reasons)
                     : "quiet" + (figures.empty() ? std::string() : " (" + join(figures) + ")");
  return v;
}

}  // namespace honed
