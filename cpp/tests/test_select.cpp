// cpp/tests/test_select.cpp: every strategy over injected measurements, ties and failures included.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "honed/select.h"

using honed::CandidateResult;
using honed::Decision;

namespace {

// 40 samples around `median` with a +-spread relative spread (deterministic).
std::vector<double> around(double median, double spread = 0.02) {
  std::vector<double> v;
  for (int i = 0; i < 40; ++i) v.push_back(median * (1.0 + spread * ((i * 7) % 9 - 4) / 4.0));
  return v;
}

CandidateResult measured(const std::string& name, int portability, std::vector<double> samples,
                         int64_t batch = 1) {
  CandidateResult c;
  c.name = name;
  c.backend = name;
  c.ok = c.correct = true;
  c.has_measurement = true;
  c.measurement = honed::measurement_from_samples(std::move(samples), batch);
  c.portability = portability;
  c.is_baseline = name == "eager";
  return c;
}

CandidateResult failed(const std::string& name, const std::string& reason, bool ok = false) {
  CandidateResult c;
  c.name = c.backend = name;
  c.ok = ok;
  c.correct = false;
  c.reason = reason;
  c.portability = 1;
  return c;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(Select, AllFailed) {
  const std::vector<CandidateResult> cands = {failed("eager", "oom"),
                                              failed("inductor", "compile error"),
                                              failed("trt", "max abs err 3.1", true)};
  for (const Decision& d :
       {honed::select_max_throughput(cands), honed::select_min_latency(cands),
        honed::select_latency_budget(cands, 5), honed::select_first_wins(cands, 1.1)}) {
    EXPECT_EQ(d.index, -1);
    EXPECT_EQ(d.reason,
              "no candidate passed: 3 failed (eager: oom; inductor: compile error; "
              "trt: incorrect: max abs err 3.1)");
  }
  EXPECT_EQ(honed::select_max_throughput({}).index, -1);
}

TEST(Select, FailedOrIncorrectNeverPicked) {
  auto fast_but_wrong = measured("trt", 3, around(0.1));
  fast_but_wrong.correct = false;
  auto fast_but_failed = measured("aot", 2, around(0.1));
  fast_but_failed.ok = false;
  const std::vector<CandidateResult> cands = {measured("eager", 0, around(2.0)), fast_but_wrong,
                                              fast_but_failed,
                                              measured("inductor", 1, around(1.0))};
  EXPECT_EQ(honed::select_min_latency(cands).index, 3);
  EXPECT_EQ(honed::select_max_throughput(cands).index, 3);
  EXPECT_EQ(honed::select_first_wins(cands, 1.0).index, 3);
}

TEST(Select, MaxThroughputReasonQuotesSpeedupAndInterval) {
  const std::vector<CandidateResult> cands = {measured("eager", 0, around(2.0)),
                                              measured("inductor", 1, around(1.0))};
  const Decision d = honed::select_max_throughput(cands);
  EXPECT_EQ(d.index, 1);
  EXPECT_TRUE(contains(d.reason, "inductor: 2.00x eager median (95% CI ")) << d.reason;
  EXPECT_TRUE(contains(d.reason, "highest throughput")) << d.reason;
}

TEST(Select, TieWithinNoiseGoesToSimplerBackend) {
  // aot's median is 1 % lower than inductor's but both spread +-30 %: indistinguishable.
  const std::vector<CandidateResult> cands = {measured("eager", 0, around(3.0)),
                                              measured("inductor", 1, around(1.00, 0.3)),
                                              measured("aot", 2, around(0.99, 0.3))};
  for (const Decision& d :
       {honed::select_min_latency(cands), honed::select_max_throughput(cands)}) {
    EXPECT_EQ(d.index, 1) << d.reason;
    EXPECT_TRUE(contains(d.reason, "tie within noise with aot")) << d.reason;
  }
  // Told apart (tight spreads, 10 % apart): the faster, less portable one wins.
  const std::vector<CandidateResult> clear = {measured("inductor", 1, around(1.0)),
                                              measured("aot", 2, around(0.9))};
  EXPECT_EQ(honed::select_min_latency(clear).index, 1);
}

TEST(Select, UnstableMeasurementIsFlaggedAndTiesToSimpler) {
  auto noisy = measured("aot", 2, around(0.9, 0.5));
  noisy.measurement.stable = false;
  // Alone with the baseline and clearly faster: picked, flagged unstable.
  Decision d = honed::select_min_latency({measured("eager", 0, around(3.0)), noisy});
  EXPECT_EQ(d.index, 1);
  EXPECT_TRUE(contains(d.reason, "unstable (CV ")) << d.reason;
  // Against a stable, simpler inductor at 1.0 ms its noise makes a tie: inductor wins.
  d = honed::select_min_latency({measured("inductor", 1, around(1.0)), noisy});
  EXPECT_EQ(d.index, 0) << d.reason;
  EXPECT_FALSE(contains(d.reason, "unstable")) << d.reason;
}

TEST(Select, FirstWinsPicksFirstBeyondThreshold) {
  const std::vector<CandidateResult> cands = {
      measured("eager", 0, around(2.0)), measured("inductor", 1, around(1.9)),  // 1.05x: not enough
      measured("aot", 2, around(1.0)), measured("trt", 3, around(0.5))};        // 2x, then 4x
  const Decision d = honed::select_first_wins(cands, 1.2);
  EXPECT_EQ(d.index, 2) << d.reason;
  EXPECT_TRUE(contains(d.reason, "first to beat 1.20x")) << d.reason;
}

TEST(Select, FirstWinsThresholdNotMetFallsBackToBaseline) {
  const std::vector<CandidateResult> cands = {measured("inductor", 1, around(1.9)),
                                              measured("eager", 0, around(2.0))};
  const Decision d = honed::select_first_wins(cands, 1.1);
  EXPECT_EQ(d.index, 1);
  EXPECT_TRUE(contains(d.reason, "eager: baseline kept, no candidate beat it by 1.10x"))
      << d.reason;
  EXPECT_TRUE(contains(d.reason, "best inductor 1.05x")) << d.reason;
  // Without a baseline nothing qualifies and nothing is picked... unless no baseline was measured,
  // where the first passing candidate is the only reading of "first wins".
  EXPECT_EQ(
      honed::select_first_wins({failed("eager", "oom"), measured("aot", 2, around(1))}, 1.1).index,
      1);
}

TEST(Select, LatencyBudgetMet) {
  // trt has the best throughput but its p95 is over budget; aot fits and beats inductor.
  const std::vector<CandidateResult> cands = {
      measured("eager", 0, around(8.0)), measured("inductor", 1, around(4.0), 8),
      measured("aot", 2, around(4.2), 16), measured("trt", 3, around(6.0), 64)};
  const Decision d = honed::select_latency_budget(cands, 5.0);
  EXPECT_EQ(d.index, 2) << d.reason;
  EXPECT_TRUE(contains(d.reason, "within the 5 ms budget")) << d.reason;
}

TEST(Select, LatencyBudgetMissed) {
  const std::vector<CandidateResult> cands = {measured("eager", 0, around(8.0)),
                                              measured("inductor", 1, around(4.0))};
  const Decision d = honed::select_latency_budget(cands, 1.0);
  EXPECT_EQ(d.index, 1);
  EXPECT_TRUE(contains(d.reason, "latency budget 1 ms missed by every candidate")) << d.reason;
}

TEST(Select, OneBackend) {
  EXPECT_EQ(honed::select_one_backend({measured("inductor", 1, around(1.0))}).index, 0);
  // With eager alongside, the one backend is the non-baseline one.
  EXPECT_EQ(
      honed::select_one_backend({measured("eager", 0, around(2)), measured("aot", 2, around(1))})
          .index,
      1);
  const Decision d = honed::select_one_backend({failed("trt", "TensorRT not installed")});
  EXPECT_EQ(d.index, -1);
  EXPECT_EQ(d.reason, "trt failed: TensorRT not installed");
  EXPECT_EQ(honed::select_one_backend({failed("trt", "max abs err 2", true)}).reason,
            "trt incorrect: max abs err 2");
  EXPECT_EQ(honed::select_one_backend({}).index, -1);
}

TEST(Select, UnmeasuredCandidatesAreSkippedByRankingStrategies) {
  CandidateResult unmeasured = measured("aot", 2, around(0.1));
  unmeasured.has_measurement = false;
  const std::vector<CandidateResult> cands = {measured("eager", 0, around(1.0)), unmeasured};
  EXPECT_EQ(honed::select_min_latency(cands).index, 0);
  EXPECT_EQ(honed::select_min_latency({unmeasured}).reason,
            "no candidate passed: 1 failed (aot: not measured)");
}
