// cpp/include/honed/machine.h: what the measuring machine is (CPU, GPU via NVML) and how busy.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace honed {

// The CPU. model: /proc/cpuinfo's "model name" (else "Hardware"/"Processor"; "" when unknown);
// logical_cpus: the CPUs this process may run on (its affinity); physical_cores: distinct
// (physical id, core id) pairs in /proc/cpuinfo, else logical_cpus.
struct CpuInfo {
  std::string model;
  int logical_cpus = 0;
  int physical_cores = 0;
};

CpuInfo probe_cpu(const std::string& cpuinfo_path = "/proc/cpuinfo");

// The same from the text of a /proc/cpuinfo (for tests); logical_cpus is given.
CpuInfo parse_cpuinfo(const std::string& text, int logical_cpus);

// One GPU as NVML sees it; each figure is -1 (or "") when NVML cannot read it.
//   nvml            NVML loaded, initialised and found the device; error says why not
//   clocks          current and maximum SM clock, current memory clock, in MHz
//   power_limit_w   the enforced power limit
//   utilization_pct the share of the last sample period in which a kernel ran
//   process_pids    processes with a compute context on it (as NVML numbers them: in a container
//                   these are the host's process ids)
struct GpuDetails {
  bool nvml = false;
  std::string error;
  std::string name;
  std::string driver_version;
  int sm_clock_mhz = -1;
  int max_sm_clock_mhz = -1;
  int mem_clock_mhz = -1;
  double power_limit_w = -1;
  int utilization_pct = -1;
  bool processes_known = false;
  std::vector<uint32_t> process_pids;
};

// device: "GPU-<uuid>" (torch's device uuid, which survives CUDA_VISIBLE_DEVICES) or an NVML
// index ("0"). Never throws: a missing NVML is a normal outcome (nvml = false, with the reason).
GpuDetails probe_gpu_details(const std::string& device,
                             const std::string& libnvml = "libnvidia-ml.so.1");

// How many of pids belong to other programs: those not in own_pids, less one when this process
// holds a context on the GPU but its id is not among them (a container numbers it differently).
int other_processes(const std::vector<uint32_t>& pids, const std::vector<uint32_t>& own_pids,
                    bool own_context);

// Times a fixed CPU workload: `threads` threads at once, each running `chunks` chunks of about
// chunk_ms (sized on this machine first) and timing each. On a quiet machine every chunk takes
// about the same time; time slices lost to other programs make some take several times longer.
std::vector<double> calibrate_cpu(int threads, int chunks = 60, double chunk_ms = 0.5);

// What a busy-machine check looks at. Unknown figures are -1.
//   calibration_ms     calibrate_cpu's chunk times (empty: not run)
//   load_avg_1m        the 1-minute load average; logical_cpus its scale
//   gpu_other_processes other programs with a context on the GPU measured on
struct LoadSignals {
  std::vector<double> calibration_ms;
  double load_avg_1m = -1;
  int logical_cpus = 0;
  int gpu_other_processes = -1;
};

// The thresholds: the calibration's mean chunk over its fastest one, and runnable tasks per CPU.
struct LoadLimits {
  double max_slowdown = 1.5;
  double max_load_per_cpu = 1.0;
};

// busy: any threshold crossed, or another program on the GPU. reasons: one phrase per crossing,
// with its figures ("load average 18.6 on 2 CPUs", "CPU calibration 2.8x slower than its fastest
// chunk", "2 other processes on the GPU"); summary: "busy: <reasons>" or "quiet (<figures>)".
struct LoadVerdict {
  bool busy = false;
  double slowdown = -1;
  double load_per_cpu = -1;
  std::vector<std::string> reasons;
  std::string summary;
};

LoadVerdict assess_load(const LoadSignals& signals, const LoadLimits& limits = {});

// The 1-minute load average (getloadavg), -1 when unreadable.
double load_average_1m();

}  // namespace honed
