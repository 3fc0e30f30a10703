// cpp/src/measure.cpp: host and injected timers, the adaptive measurement protocol, interleaving.
#include "honed/measure.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

namespace honed {

// ---- timers ---------------------------------------------------------------------------------

namespace {
double steady_now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}
}  // namespace

HostTimer::HostTimer(std::function<void()> sync) : sync_(std::move(sync)) {}

double HostTimer::time_ms(const std::function<void()>& fn) {
  const double t0 = steady_now_ms();
  fn();
  if (sync_) sync_();
  return steady_now_ms() - t0;
}

double HostTimer::now_ms() { return steady_now_ms(); }

InjectedTimer::InjectedTimer(std::vector<double> samples_ms) : samples_(std::move(samples_ms)) {
  if (samples_.empty()) throw std::invalid_argument("InjectedTimer: no samples given");
  double total = 0;
  for (double x : samples_) {
    if (std::isnan(x) || x < 0) {
      throw std::invalid_argument("InjectedTimer: samples must be non-negative numbers");
    }
    total += x;
  }
  if (total <= 0) {
    throw std::invalid_argument(
        "InjectedTimer: samples are all 0, so the clock would never advance");
  }
}

double InjectedTimer::time_ms(const std::function<void()>& fn) {
  fn();  // an exception leaves the sequence where it was
  const double ms = samples_[next_];
  next_ = (next_ + 1) % samples_.size();
  clock_ms_ += ms;
  return ms;
}

double InjectedTimer::now_ms() { return clock_ms_; }

// ---- the protocol ---------------------------------------------------------------------------

namespace {

void validate(const MeasureConfig& cfg) {
  const auto fail = [](const char* what) {
    throw std::invalid_argument(std::string("MeasureConfig: ") + what);
  };
  if (cfg.warmup_calls < 0) fail("warmup_calls must be >= 0");
  if (!(cfg.warmup_ms >= 0)) fail("warmup_ms must be >= 0");
  if (cfg.window_calls < 1) fail("window_calls must be >= 1");
  if (!(cfg.window_ms >= 0)) fail("window_ms must be >= 0");
  if (cfg.stable_windows < 1) fail("stable_windows must be >= 1");
  if (!(cfg.tolerance >= 0)) fail("tolerance must be >= 0");
  if (cfg.max_windows < 1) fail("max_windows must be >= 1");
  if (cfg.batch_size < 1) fail("batch_size must be >= 1");
}

// Samples of a run of calls: device (or host) latencies, host latencies when the timer has them,
// and the wall time of the run on the timer's clock.
struct Block {
  std::vector<double> samples;
  std::vector<double> host;
  double wall_ms = 0;
};

// Calls fn until at least min_calls calls were made and at least min_ms passed on timer's clock.
Block run_block(const std::function<void()>& fn, Timer& timer, int64_t min_calls, double min_ms) {
  Block b;
  const double start = timer.now_ms();
  double elapsed = 0;
  while (static_cast<int64_t>(b.samples.size()) < min_calls || elapsed < min_ms) {
    b.samples.push_back(timer.time_ms(fn));
    if (const auto host = timer.last_host_ms()) b.host.push_back(*host);
    elapsed = timer.now_ms() - start;
  }
  b.wall_ms = elapsed;
  return b;
}

void append(Block& into, const Block& from) {
  into.samples.insert(into.samples.end(), from.samples.begin(), from.samples.end());
  into.host.insert(into.host.end(), from.host.begin(), from.host.end());
  into.wall_ms += from.wall_ms;
}

// Whether the last `count` medians agree within tolerance (max / min - 1 <= tolerance).
bool last_medians_agree(const std::vector<double>& medians, int count, double tolerance) {
  if (count < 1 || static_cast<int>(medians.size()) < count) return false;
  const auto first = medians.end() - count;
  const double lo = *std::min_element(first, medians.end());
  const double hi = *std::max_element(first, medians.end());
  if (hi == lo) return true;
  return lo > 0 && hi / lo - 1.0 <= tolerance;
}

Measurement assemble(const Block& measured, int windows, bool stable, int64_t batch_size) {
  Measurement m;
  m.stats = compute_stats(measured.samples);
  m.samples_ms = measured.samples;
  m.wall_ms = measured.wall_ms;
  m.calls = static_cast<int64_t>(measured.samples.size());
  m.windows = windows;
  m.stable = stable;
  m.batch_size = batch_size;
  // Samples per second of the measured calls themselves, so throughput and the latency figures
  // describe the same calls: throughput = batch_size * 1000 / mean latency. The wall time also
  // holds the harness's own work between calls, which is not the model's.
  const double busy_ms = std::accumulate(m.samples_ms.begin(), m.samples_ms.end(), 0.0);
  m.throughput = busy_ms > 0 ? static_cast<double>(batch_size * m.calls) / (busy_ms / 1000.0) : 0;
  if (!measured.host.empty() && measured.host.size() == measured.samples.size()) {
    m.has_host = true;
    m.host_stats = compute_stats(measured.host);
  }
  return m;
}

}  // namespace

Measurement measure(const std::function<void()>& fn, Timer& timer, const MeasureConfig& cfg) {
  validate(cfg);
  const Block warm = run_block(fn, timer, cfg.warmup_calls, cfg.warmup_ms);

  Block measured;
  std::vector<double> medians;
  std::vector<int64_t> sizes;
  bool stable = false;
  int64_t window_calls = cfg.window_calls;
  double window_ms = cfg.window_ms;
  while (!stable && static_cast<int>(medians.size()) < cfg.max_windows) {
    const int done = static_cast<int>(medians.size());
    if (done > 0 && done % cfg.stable_windows == 0) {  // no agreement yet: longer windows
      window_calls *= 2;
      window_ms *= 2;
    }
    const Block window = run_block(fn, timer, window_calls, window_ms);
    medians.push_back(median_of(window.samples));
    sizes.push_back(static_cast<int64_t>(window.samples.size()));
    append(measured, window);
    stable = last_medians_agree(medians, cfg.stable_windows, cfg.tolerance);
  }
  Measurement m = assemble(measured, static_cast<int>(medians.size()), stable, cfg.batch_size);
  m.blocks = std::move(sizes);
  m.warmup_calls = static_cast<int64_t>(warm.samples.size());
  m.warmup_ms = warm.wall_ms;
  return m;
}

std::vector<Measurement> interleaved(const std::vector<std::function<void()>>& fns, Timer& timer,
                                     int rounds, int calls_per_round, int64_t batch_size,
                                     double tolerance) {
  if (fns.empty()) throw std::invalid_argument("interleaved: no functions given");
  if (rounds < 1) throw std::invalid_argument("interleaved: rounds must be >= 1");
  if (calls_per_round < 1) throw std::invalid_argument("interleaved: calls_per_round must be >= 1");
  if (batch_size < 1) throw std::invalid_argument("interleaved: batch_size must be >= 1");
  if (!(tolerance >= 0)) throw std::invalid_argument("interleaved: tolerance must be >= 0");
  constexpr int kStableRounds = 3;

  std::vector<Block> warm(fns.size());
  for (size_t i = 0; i < fns.size(); ++i) warm[i] = run_block(fns[i], timer, calls_per_round, 0);

  std::vector<Block> measured(fns.size());
  std::vector<std::vector<double>> medians(fns.size());
  std::vector<std::vector<int64_t>> sizes(fns.size());
  auto run_round = [&](int calls) {
    for (size_t i = 0; i < fns.size(); ++i) {
      const Block block = run_block(fns[i], timer, calls, 0);
      medians[i].push_back(median_of(block.samples));
      sizes[i].push_back(static_cast<int64_t>(block.samples.size()));
      append(measured[i], block);
    }
  };
  auto all_stable = [&] {
    for (const auto& m : medians) {
      const int last = std::min(static_cast<int>(m.size()), kStableRounds);
      if (!last_medians_agree(m, last, tolerance)) return false;
    }
    return true;
  };
  for (int r = 0; r < rounds; ++r) run_round(calls_per_round);
  // The protocol's retries: while a finalist's last rounds disagree, more rounds, each longer
  // (longer blocks average out short disturbances), up to the planned rounds again.
  int done = rounds;
  for (int extra = 0, calls = calls_per_round; extra < rounds && !all_stable(); ++extra) {
    calls = std::min(calls * 2, calls_per_round * 4);
    run_round(calls);
    ++done;
  }
  // Non-zero and unlikely to repeat across processes (the tuning cache keeps it with figures
  // that other processes read); 53 bits, exact in any JSON reader.
  std::random_device entropy;
  const uint64_t drawn = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  const uint64_t run = (drawn >> 11) | 1u;
  std::vector<Measurement> out;
  out.reserve(fns.size());
  for (size_t i = 0; i < fns.size(); ++i) {
    const int last = std::min(static_cast<int>(medians[i].size()), kStableRounds);
    const bool stable = last_medians_agree(medians[i], last, tolerance);
    out.push_back(assemble(measured[i], done, stable, batch_size));
    out.back().warmup_calls = static_cast<int64_t>(warm[i].samples.size());
    out.back().warmup_ms = warm[i].wall_ms;
    out.back().blocks = std::move(sizes[i]);
    out.back().run = run;
  }
  return out;
}

CallBatch batch_of(const std::vector<int>& batch_axes,
                   const std::vector<std::vector<int64_t>>& shapes) {
  for (size_t i = 0; i < batch_axes.size() && i < shapes.size(); ++i) {
    const int axis = batch_axes[i];
    if (axis >= 0 && axis < static_cast<int>(shapes[i].size())) {
      return {shapes[i][axis], "batch axis inferred"};
    }
  }
  for (const auto& shape : shapes) {
    if (!shape.empty()) {
      return {shape.front(), "no batch axis inferred: the leading axis of the first input"};
    }
  }
  return {1, "no input with an axis: one sample per call"};
}

Measurement measurement_from_samples(std::vector<double> samples_ms, int64_t batch_size,
                                     double wall_ms, int windows, bool stable,
                                     std::vector<int64_t> blocks, uint64_t run) {
  if (batch_size < 1)
    throw std::invalid_argument("measurement_from_samples: batch_size must be >= 1");
  if (windows < 1) throw std::invalid_argument("measurement_from_samples: windows must be >= 1");
  int64_t total = 0;
  for (int64_t n : blocks) {
    if (n < 1) throw std::invalid_argument("measurement_from_samples: blocks must be >= 1");
    total += n;
  }
  if (!blocks.empty() && total != static_cast<int64_t>(samples_ms.size())) {
    throw std::invalid_argument("measurement_from_samples: blocks must sum to the samples");
  }
  Block b;
  b.samples = std::move(samples_ms);
  for (double x : b.samples) b.wall_ms += x;
  if (wall_ms > 0) b.wall_ms = wall_ms;
  Measurement m = assemble(b, windows, stable, batch_size);
  m.blocks = std::move(blocks);
  m.run = run;
  return m;
}

}  // namespace honed
