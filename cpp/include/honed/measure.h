// cpp/include/honed/measure.h: timers, the adaptive measurement protocol and interleaved rounds.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "honed/stats.h"

namespace honed {

// The measurement protocol of DESIGN.md. Warm-up: at least warmup_calls calls AND warmup_ms.
// Then windows of at least window_calls calls lasting at least window_ms each; after each window
// the run is stable when the medians of the last stable_windows windows agree within tolerance
// (max / min - 1 <= tolerance). Each time stable_windows more windows passed without agreement,
// the windows double in length (calls and ms), so a noisy run is retried with longer windows. It
// stops when stable or after max_windows windows (then stable = false). batch_size is the number
// of samples one call processes: the size of the batch axis (for throughput).
struct MeasureConfig {
  int warmup_calls = 10;
  double warmup_ms = 200;
  int window_calls = 10;
  double window_ms = 100;
  int stable_windows = 3;
  double tolerance = 0.05;
  int max_windows = 10;
  int64_t batch_size = 1;
};

// Times one call. time_ms calls fn once and returns its latency in ms; now_ms is a clock in ms
// (arbitrary epoch) used for wall time and the time rules of warm-up and windows.
class Timer {
 public:
  virtual ~Timer() = default;
  virtual double time_ms(const std::function<void()>& fn) = 0;
  virtual double now_ms() = 0;
  // Host latency of the last timed call, for timers that measure on a device; nullopt otherwise.
  virtual std::optional<double> last_host_ms() const { return std::nullopt; }
};

// std::chrono::steady_clock around the call; sync (when set) runs after the call, before the
// clock is read (torch.cuda.synchronize for GPU work timed on the host).
class HostTimer : public Timer {
 public:
  explicit HostTimer(std::function<void()> sync = nullptr);
  double time_ms(const std::function<void()>& fn) override;
  double now_ms() override;

 private:
  std::function<void()> sync_;
};

// Calls fn (so its side effects happen) but returns the injected samples in order, cycling.
// now_ms advances by each returned sample, so the time rules of warm-up and windows work
// deterministically. Throws std::invalid_argument when samples are empty, negative, NaN or all 0.
class InjectedTimer : public Timer {
 public:
  explicit InjectedTimer(std::vector<double> samples_ms);
  double time_ms(const std::function<void()>& fn) override;
  double now_ms() override;

 private:
  std::vector<double> samples_;
  size_t next_ = 0;
  double clock_ms_ = 0;
};

// CUDA events recorded on `stream` (a cudaStream_t / CUstream handle; 0 = the legacy default
// stream) around the call; the latency is cudaEventElapsedTime after cudaEventSynchronize of the
// end event. Host latency of the same call (to the end of the synchronize) is kept as well.
// The CUDA library is loaded at run time (dlopen): the runtime already in the process
// (libcudart.so.13/.12/.11), else a fresh load of one of those, else the driver libcuda.so.1 (which
// needs a current context). Without CUDA the constructor throws std::runtime_error with the reason.
class CudaEventTimer : public Timer {
 public:
  explicit CudaEventTimer(uintptr_t stream);
  ~CudaEventTimer() override;
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  double time_ms(const std::function<void()>& fn) override;
  double now_ms() override;
  std::optional<double> last_host_ms() const override { return last_host_ms_; }
  // Which library the events come from, e.g. "libcudart.so.12 (already loaded)".
  std::string backend() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::optional<double> last_host_ms_;
};

// Whether CudaEventTimer can be constructed here, and if not why (first: available; second: the
// library it would use, or the reason it cannot).
std::pair<bool, std::string> cuda_timer_available();

// The result of a measurement. samples_ms: the per-call latencies the statistics are computed
// from; calls == samples_ms.size(); wall_ms: the wall time (timer clock) those calls took,
// the harness's own work between calls included; throughput = batch_size * calls / (sum of
// samples_ms / 1000) = batch_size * 1000 / mean latency, in samples per second: the same calls
// as the latency figures, so for a steady run throughput ~ batch_size * 1000 / median. windows: the
// number of windows measured (rounds for interleaved()); stable: see MeasureConfig. warmup_calls /
// warmup_ms: what the warm-up took. has_host / host_stats: per-call host latency when the timer is
// a device timer (then stats are device latencies).
struct Measurement {
  Stats stats;
  std::vector<double> samples_ms;
  double wall_ms = 0;
  int64_t calls = 0;
  int windows = 0;
  bool stable = false;
  double throughput = 0;
  int64_t batch_size = 1;
  int64_t warmup_calls = 0;
  double warmup_ms = 0;
  bool has_host = false;
  Stats host_stats;
  // How many of samples_ms each window (each round, for interleaved()) holds, in order; empty
  // when unknown (a measurement made from bare samples).
  std::vector<int64_t> blocks;
  // Measurements taken side by side by one interleaved() call share this non-zero id (random):
  // round i of each ran beside round i of the others. 0: measured alone.
  uint64_t run = 0;
};

// Runs the protocol of MeasureConfig on fn. The statistics use ALL samples of the measured windows
// (warm-up excluded): the median is robust to a drifting first window, and when the run is
// unstable the CV over all windows is the honest figure of its noise.
// Throws std::invalid_argument on a bad config; an exception from fn propagates unchanged.
Measurement measure(const std::function<void()>& fn, Timer& timer, const MeasureConfig& cfg);

// Interleaved rounds for finalists: warm-up of calls_per_round calls of each fn (in order), then
// `rounds` rounds, each running calls_per_round calls of fns[0], then of fns[1], ... (A B C A B C),
// so drift hits all alike. One Measurement per fn, in order; its wall_ms is the sum of its blocks,
// windows = rounds run, stable = the medians of its last 3 rounds (all rounds when fewer) agree
// within `tolerance` (the protocol's, MeasureConfig::tolerance). While some finalist is unstable
// after `rounds`, further rounds follow (each twice as long, up to 4x calls_per_round), at most
// `rounds` more: the protocol's retries with longer windows.
std::vector<Measurement> interleaved(const std::vector<std::function<void()>>& fns, Timer& timer,
                                     int rounds, int calls_per_round, int64_t batch_size = 1,
                                     double tolerance = 0.05);

// The samples one call processes (the batch that throughput counts) and where that number comes
// from: the first input with an inferred batch axis (batch_axes[i] >= 0: its size on that axis);
// else the leading axis of the first input that has an axis; else 1 (no input with an axis).
// source is the phrase reports show: "batch axis inferred", "no batch axis inferred: the leading
// axis of the first input", "no input with an axis: one sample per call".
struct CallBatch {
  int64_t size = 1;
  std::string source;
};

CallBatch batch_of(const std::vector<int>& batch_axes,
                   const std::vector<std::vector<int64_t>>& shapes);

// A Measurement from given samples (e.g. a cached one): wall_ms <= 0 means the samples' sum;
// by default stable, in one window. blocks / run: as in Measurement (blocks, when given, must
// be positive and sum to the number of samples; throws std::invalid_argument otherwise).
Measurement measurement_from_samples(std::vector<double> samples_ms, int64_t batch_size = 1,
                                     double wall_ms = 0, int windows = 1, bool stable = true,
                                     std::vector<int64_t> blocks = {}, uint64_t run = 0);

}  // namespace honed
