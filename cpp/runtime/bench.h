// cpp/runtime/bench.h: honed-run's benchmark loop over the engine's timers and statistics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "honed/measure.h"

namespace honed::run {

struct BenchConfig {
  double warmup_ms = 200;
  double duration_s = 0;   // > 0: measure for this long (per thread)
  int64_t iterations = 0;  // > 0: measure exactly this many calls (per thread)
  int threads = 1;
  int64_t batch_size = 1;
};

// Latency samples of every thread, and the wall time and throughput of all together.
struct BenchResult {
  Measurement measurement;  // stats over all threads' samples; throughput over the wall time
  int threads = 1;
  bool adaptive = false;  // the engine's adaptive protocol (no --duration-s / --iterations)
};

// make_timer builds one Timer per thread (CudaEventTimer or HostTimer); call runs one inference.
// With one thread and neither duration nor iterations, this is honed::measure (the protocol of
// DESIGN.md, warm-up from cfg.warmup_ms); otherwise each thread warms up for warmup_ms, then
// calls until the iteration count or the duration is reached.
BenchResult bench(const std::function<void()>& call,
                  const std::function<std::unique_ptr<Timer>()>& make_timer,
                  const BenchConfig& cfg);

}  // namespace honed::run
