// cpp/runtime/bench.cpp: fixed-length and multi-threaded runs; statistics from the engine.
#include "bench.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

namespace honed::run {
namespace {

using Clock = std::chrono::steady_clock;

struct ThreadRun {
  std::vector<double> samples_ms;
  Clock::time_point start, end;  // of the measured calls (after the warm-up)
  std::exception_ptr error;
};

void run_thread(const std::function<void()>& call, Timer& timer, const BenchConfig& cfg,
                ThreadRun& out) {
  try {
    const double warm_start = timer.now_ms();
    for (int i = 0; i < 10 || timer.now_ms() - warm_start < cfg.warmup_ms; ++i) {
      timer.time_ms(call);
    }
    const double start = timer.now_ms();
    out.start = Clock::now();
    const double duration_ms = cfg.duration_s * 1000;
    for (int64_t i = 0;; ++i) {
      if (cfg.iterations > 0 ? i >= cfg.iterations
                             : (i >= 10 && timer.now_ms() - start >= duration_ms)) {
        break;
      }
      out.samples_ms.push_back(timer.time_ms(call));
    }
    out.end = Clock::now();
  } catch (...) {
    out.error = std::current_exception();
  }
}

}  // namespace

BenchResult bench(const std::function<void()>& call,
                  const std::function<std::unique_ptr<Timer>()>& make_timer,
                  const BenchConfig& cfg) {
  BenchResult result;
  result.threads = cfg.threads;
  if (cfg.threads <= 1 && cfg.duration_s <= 0 && cfg.iterations <= 0) {
    MeasureConfig mc;
    mc.warmup_ms = cfg.warmup_ms;
    mc.batch_size = cfg.batch_size;
    std::unique_ptr<Timer> timer = make_timer();
    result.measurement = measure(call, *timer, mc);
    result.adaptive = true;
    return result;
  }
  BenchConfig fixed = cfg;
  if (fixed.duration_s <= 0 && fixed.iterations <= 0) fixed.duration_s = 5;
  std::vector<std::unique_ptr<Timer>> timers;
  for (int i = 0; i < cfg.threads; ++i) timers.push_back(make_timer());
  std::vector<ThreadRun> runs(static_cast<size_t>(cfg.threads));
  std::vector<std::thread> threads;
  for (int i = 0; i < cfg.threads; ++i) {
    threads.emplace_back(run_thread, std::cref(call), std::ref(*timers[static_cast<size_t>(i)]),
                         std::cref(fixed), std::ref(runs[static_cast<size_t>(i)]));
  }
  for (std::thread& t : threads) t.join();
  std::vector<double> samples;
  Clock::time_point first = Clock::time_point::max(), last = Clock::time_point::min();
  for (ThreadRun& r : runs) {
    if (r.error) std::rethrow_exception(r.error);
    samples.insert(samples.end(), r.samples_ms.begin(), r.samples_ms.end());
    first = std::min(first, r.start);
    last = std::max(last, r.end);
  }
  // Wall time: from the first thread's first measured call to the last thread's last one.
  double wall_ms = std::chrono::duration<double, std::milli>(last - first).count();
  result.measurement = measurement_from_samples(samples, cfg.batch_size, wall_ms, 1, true);
  return result;
}

}  // namespace honed::run
