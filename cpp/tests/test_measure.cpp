// cpp/tests/test_measure.cpp: the measurement protocol with injected timings; interleaving order.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "honed/measure.h"

using honed::InjectedTimer;
using honed::measure;
using honed::MeasureConfig;

namespace {
MeasureConfig small_config() {
  MeasureConfig cfg;
  cfg.warmup_calls = 3;
  cfg.warmup_ms = 0;
  cfg.window_calls = 4;
  cfg.window_ms = 0;
  cfg.stable_windows = 3;
  cfg.tolerance = 0.05;
  cfg.max_windows = 10;
  return cfg;
}
}  // namespace

TEST(Measure, StableAfterThreeWindows) {
  InjectedTimer timer({2.0});
  int calls = 0;
  const auto m = measure([&] { ++calls; }, timer, small_config());
  EXPECT_TRUE(m.stable);
  EXPECT_EQ(m.windows, 3);
  EXPECT_EQ(m.calls, 12);
  EXPECT_EQ(m.warmup_calls, 3);
  EXPECT_EQ(calls, 15);  // warm-up calls happen but are not samples
  EXPECT_EQ(m.samples_ms.size(), 12u);
  EXPECT_DOUBLE_EQ(m.stats.median_ms, 2.0);
  EXPECT_DOUBLE_EQ(m.wall_ms, 24.0);
  EXPECT_DOUBLE_EQ(m.stats.cv, 0);
  EXPECT_FALSE(m.has_host);
}

TEST(Measure, StabilityUsesTheLastWindowsOnly) {
  // Warm-up takes 3 samples; window 1 (4 calls) sees 10 ms, then 1 ms forever: windows 2-4 agree.
  InjectedTimer timer({5, 5, 5, 10, 10, 10, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1});
  const auto m = measure([] {}, timer, small_config());
  EXPECT_TRUE(m.stable);
  EXPECT_EQ(m.windows, 4);
  EXPECT_EQ(m.calls, 3 * 4 + 8);  // all windows, the drifting first one included; the 4th longer
  EXPECT_DOUBLE_EQ(m.stats.max_ms, 10);
  EXPECT_DOUBLE_EQ(m.stats.median_ms, 1);
}

TEST(Measure, NeverStableStopsAtMaxWindowsWithCV) {
  // A window of 4 calls alternates between medians of 1 ms and 2 ms: never within 5 %.
  InjectedTimer timer({1, 1, 1, 1, 2, 2, 2, 2});
  MeasureConfig cfg = small_config();
  cfg.warmup_calls = 4;
  cfg.max_windows = 6;
  cfg.stable_windows = 6;  // no longer windows before max_windows
  const auto m = measure([] {}, timer, cfg);
  EXPECT_FALSE(m.stable);
  EXPECT_EQ(m.windows, 6);
  EXPECT_EQ(m.calls, 24);
  EXPECT_DOUBLE_EQ(m.stats.mean_ms, 1.5);
  // 12 ones and 12 twos: sample variance = 24 * 0.25 / 23.
  EXPECT_NEAR(m.stats.cv, std::sqrt(6.0 / 23.0) / 1.5, 1e-12);
}

TEST(Measure, RetriesWithLongerWindows) {
  // Windows of 4 calls alternate between medians of 2 ms and 1 ms and never agree; after three of
  // them the windows double to 8 calls, each holding four of each, and agree at 1.5 ms.
  InjectedTimer timer({1, 1, 1, 1, 2, 2, 2, 2});
  MeasureConfig cfg = small_config();
  cfg.warmup_calls = 4;
  const auto m = measure([] {}, timer, cfg);
  EXPECT_TRUE(m.stable);
  EXPECT_EQ(m.windows, 6);
  EXPECT_EQ(m.calls, 3 * 4 + 3 * 8);
}

TEST(Measure, WarmupRespectsCountAndTime) {
  MeasureConfig cfg = small_config();
  cfg.warmup_calls = 2;
  cfg.warmup_ms = 50;  // 10 ms a call: time wins, 5 calls
  InjectedTimer slow_start({10});
  auto m = measure([] {}, slow_start, cfg);
  EXPECT_EQ(m.warmup_calls, 5);
  EXPECT_DOUBLE_EQ(m.warmup_ms, 50);

  cfg.warmup_calls = 8;  // count wins: 8 calls, 80 ms
  InjectedTimer again({10});
  m = measure([] {}, again, cfg);
  EXPECT_EQ(m.warmup_calls, 8);
  EXPECT_DOUBLE_EQ(m.warmup_ms, 80);
}

TEST(Measure, WindowRespectsCountAndTime) {
  MeasureConfig cfg = small_config();
  cfg.window_ms = 30;  // 4 calls of 2 ms is too short: 15 calls per window
  InjectedTimer timer({2});
  const auto m = measure([] {}, timer, cfg);
  EXPECT_EQ(m.windows, 3);
  EXPECT_EQ(m.calls, 45);
  EXPECT_DOUBLE_EQ(m.wall_ms, 90);
}

TEST(Measure, ThroughputIsSamplesPerSecondOfTheMeasuredCalls) {
  MeasureConfig cfg = small_config();
  cfg.batch_size = 8;
  InjectedTimer timer({4, 6});
  const auto m = measure([] {}, timer, cfg);
  EXPECT_DOUBLE_EQ(m.throughput, 8.0 * 1000.0 / m.stats.mean_ms);
  EXPECT_DOUBLE_EQ(m.throughput, 1600.0);  // 8 samples per 5 ms
}

namespace {
// A device-like timer: every call reports 1 ms, while its clock also advances by 9 ms of work
// around the call (launch, synchronisation, the harness itself).
class OverheadTimer : public honed::Timer {
 public:
  double time_ms(const std::function<void()>& fn) override {
    fn();
    clock_ += 10;
    return 1.0;
  }
  double now_ms() override { return clock_; }

 private:
  double clock_ = 0;
};
}  // namespace

TEST(Measure, ThroughputAgreesWithTheLatencyFiguresNotTheHarnessClock) {
  MeasureConfig cfg = small_config();
  cfg.batch_size = 8;
  OverheadTimer timer;
  const auto m = measure([] {}, timer, cfg);
  EXPECT_DOUBLE_EQ(m.wall_ms, 10.0 * static_cast<double>(m.calls));  // what the clock saw
  EXPECT_DOUBLE_EQ(m.stats.median_ms, 1.0);
  EXPECT_DOUBLE_EQ(m.throughput, 8.0 * 1000.0 / m.stats.median_ms);  // 8 samples a 1 ms call
  const auto interleaved = honed::interleaved({[] {}, [] {}}, timer, 3, 4, 8);
  for (const auto& x : interleaved) EXPECT_DOUBLE_EQ(x.throughput, 8000.0);
}

TEST(Measure, ExceptionFromFnPropagates) {
  InjectedTimer timer({1});
  int calls = 0;
  EXPECT_THROW(measure(
                   [&] {
                     if (++calls == 5) throw std::runtime_error("boom");
                   },
                   timer, small_config()),
               std::runtime_error);
  EXPECT_EQ(calls, 5);
}

TEST(Measure, RejectsBadConfigAndTimer) {
  InjectedTimer timer({1});
  MeasureConfig cfg = small_config();
  cfg.window_calls = 0;
  EXPECT_THROW(measure([] {}, timer, cfg), std::invalid_argument);
  cfg = small_config();
  cfg.batch_size = 0;
  EXPECT_THROW(measure([] {}, timer, cfg), std::invalid_argument);
  EXPECT_THROW(InjectedTimer({}), std::invalid_argument);
  EXPECT_THROW(InjectedTimer({0, 0}), std::invalid_argument);
  EXPECT_THROW(InjectedTimer({1, -1}), std::invalid_argument);
}

TEST(Measure, HostTimerMeasuresRealCallsAndSyncs) {
  int syncs = 0;
  honed::HostTimer timer([&] { ++syncs; });
  MeasureConfig cfg = small_config();
  cfg.warmup_ms = 1;
  cfg.window_ms = 1;
  cfg.tolerance = 1e9;  // consistency, not timing, is under test
  const auto m = measure([] {}, timer, cfg);
  EXPECT_TRUE(m.stable);
  EXPECT_EQ(syncs, m.calls + m.warmup_calls);
  EXPECT_GE(m.wall_ms, 3.0);  // three windows of at least 1 ms
  EXPECT_LE(m.stats.min_ms, m.stats.median_ms);
  EXPECT_LE(m.stats.median_ms, m.stats.p99_ms);
}

TEST(Measure, FromSamples) {
  const auto m = honed::measurement_from_samples({1, 2, 3}, 4);
  EXPECT_TRUE(m.stable);
  EXPECT_EQ(m.calls, 3);
  EXPECT_DOUBLE_EQ(m.wall_ms, 6);
  EXPECT_DOUBLE_EQ(m.stats.median_ms, 2);
  EXPECT_DOUBLE_EQ(m.throughput, 4.0 * 3 / 0.006);
  // A wall time longer than the calls (a cached run's harness time) does not change throughput.
  EXPECT_DOUBLE_EQ(honed::measurement_from_samples({1, 2, 3}, 4, 60).throughput, 4.0 * 3 / 0.006);
  EXPECT_THROW(honed::measurement_from_samples({}), std::invalid_argument);
}

TEST(Interleaved, RunsBlocksInRoundRobinOrderAfterWarmup) {
  std::string order;
  InjectedTimer timer({1, 2, 3});
  const auto ms = honed::interleaved(
      {[&] { order += 'A'; }, [&] { order += 'B'; }, [&] { order += 'C'; }}, timer, 3, 2, 4);
  // Warm-up AABBCC, then three rounds of AABBCC.
  EXPECT_EQ(order,
            "AABBCC"
            "AABBCC"
            "AABBCC"
            "AABBCC");
  ASSERT_EQ(ms.size(), 3u);
  for (const auto& m : ms) {
    EXPECT_EQ(m.calls, 6);
    EXPECT_EQ(m.windows, 3);
    EXPECT_EQ(m.warmup_calls, 2);
    EXPECT_EQ(m.batch_size, 4);
  }
  // The injected sequence 1 2 3 cycles over 24 calls; A's measured calls are #6,7 / 12,13 / 18,19
  // (0-based): samples 1,2 / 1,2 / 1,2.
  EXPECT_EQ(ms[0].samples_ms, (std::vector<double>{1, 2, 1, 2, 1, 2}));
  EXPECT_DOUBLE_EQ(ms[0].wall_ms, 9);
  EXPECT_TRUE(ms[0].stable);
}

TEST(Interleaved, FlagsDriftAsUnstableAfterItsRetries) {
  // Every call slower than the last: no three rounds agree within 5 %, however long; the rounds
  // go on to 3 + 3, each retry twice as long as the one before (up to 4x).
  std::vector<double> growing;
  for (int i = 1; i <= 400; ++i) growing.push_back(i);
  InjectedTimer timer(growing);
  const auto ms = honed::interleaved({[] {}, [] {}}, timer, 3, 2);
  EXPECT_FALSE(ms[0].stable);
  EXPECT_FALSE(ms[1].stable);
  EXPECT_EQ(ms[0].windows, 6);
  EXPECT_EQ(ms[0].calls, 3 * 2 + 4 + 8 + 8);
  EXPECT_THROW(honed::interleaved({}, timer, 1, 1), std::invalid_argument);
  // The tolerance is the protocol's: at 300 % the same drift is stable.
  InjectedTimer again({1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  EXPECT_TRUE(honed::interleaved({[] {}, [] {}}, again, 3, 2, 1, 3.0)[0].stable);
}

TEST(Interleaved, RetriesUntilTheLastRoundsAgree) {
  // Warm-up 1 ms (4 calls); rounds of 2 calls: 1, 2, 3 ms (drift), then 3 ms from there on. The
  // first retry (4 calls each) still disagrees with round 2; the second (8 calls) settles it.
  std::vector<double> script(4 + 4, 1.0);
  script.insert(script.end(), 4, 2.0);
  script.insert(script.end(), 200, 3.0);
  InjectedTimer timer(script);
  const auto ms = honed::interleaved({[] {}, [] {}}, timer, 3, 2);
  for (const auto& m : ms) {
    EXPECT_TRUE(m.stable);
    EXPECT_EQ(m.windows, 5);
    EXPECT_EQ(m.calls, 3 * 2 + 4 + 8);
    EXPECT_EQ(m.blocks, (std::vector<int64_t>{2, 2, 2, 4, 8}));  // the rounds, retries included
  }
  // Measured side by side: one run id for all, non-zero; another interleaving draws another.
  EXPECT_NE(ms[0].run, 0u);
  EXPECT_EQ(ms[0].run, ms[1].run);
  InjectedTimer again({1});
  EXPECT_NE(honed::interleaved({[] {}, [] {}}, again, 3, 2)[0].run, ms[0].run);
}

TEST(Measure, BlocksAreTheWindowsAndFromSamplesChecksThem) {
  InjectedTimer timer({1});
  const auto m = measure([] {}, timer, small_config());
  int64_t total = 0;
  for (int64_t n : m.blocks) total += n;
  EXPECT_EQ(static_cast<int>(m.blocks.size()), m.windows);
  EXPECT_EQ(total, m.calls);
  EXPECT_EQ(m.run, 0u);  // measured alone
  const auto kept = honed::measurement_from_samples({1, 2, 3}, 1, 0, 2, true, {1, 2}, 9);
  EXPECT_EQ(kept.blocks, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(kept.run, 9u);
  EXPECT_THROW(honed::measurement_from_samples({1, 2, 3}, 1, 0, 2, true, {1, 1}),
               std::invalid_argument);
  EXPECT_THROW(honed::measurement_from_samples({1, 2, 3}, 1, 0, 2, true, {3, 0}),
               std::invalid_argument);
}

TEST(CudaTimer, UnavailableHereGivesAReasonAndThrows) {
  const auto [ok, why] = honed::cuda_timer_available();
  EXPECT_FALSE(why.empty());
  if (ok) GTEST_SKIP() << "CUDA is available here: " << why;
  try {
    honed::CudaEventTimer timer(0);
    FAIL() << "constructing the timer without CUDA must throw";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("CudaEventTimer"), std::string::npos);
  }
}

TEST(Batch, InferredAxisElseTheLeadingAxisOfTheFirstInput) {
  // The batch axis of the second input is inferred (axis 1): its size there.
  auto b = honed::batch_of({-1, 1}, {{3}, {2, 8, 4}});
  EXPECT_EQ(b.size, 8);
  EXPECT_EQ(b.source, "batch axis inferred");
  // None inferred (one sample of shape 8x128): the leading axis of the first input with an axis.
  b = honed::batch_of({-1, -1}, {{}, {8, 128}, {4}});
  EXPECT_EQ(b.size, 8);
  EXPECT_EQ(b.source, "no batch axis inferred: the leading axis of the first input");
  b = honed::batch_of({-1}, {{}});
  EXPECT_EQ(b.size, 1);
  EXPECT_EQ(b.source, "no input with an axis: one sample per call");
}
