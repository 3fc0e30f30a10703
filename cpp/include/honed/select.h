// cpp/include/honed/select.h: tune strategies as pure functions over candidate results.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "honed/measure.h"
#include "honed/stats.h"

namespace honed {

// One candidate of a tune, after its build, correctness check and (optional) measurement.
// portability: lower = simpler / more portable (eager 0, inductor 1, aot 2, ...), breaks ties.
// is_baseline marks eager, the reference speed-ups are quoted against.
struct CandidateResult {
  std::string name;      // shown to users, e.g. "TorchInductorBackend(mode=default)"
  std::string backend;   // registry name, e.g. "inductor"
  bool ok = false;       // built and ran
  bool correct = false;  // matched eager within tolerance
  std::string reason;    // why not ok / not correct (empty otherwise)
  bool has_measurement = false;
  Measurement measurement;
  int64_t memory_bytes = 0;
  int portability = 0;
  bool is_baseline = false;
  bool tried = true;  // false: never judged (out of time, too few calls): ``reason`` says why
};

// What a strategy ranks by. Each figure carries the statistic its evidence is bootstrapped on:
//   throughput      samples per second (Measurement::throughput = batch * 1000 / mean latency),
//                   higher is better; the interval is of the ratio of mean latencies
//   median latency  lower is better; the ratio of medians
//   p95 latency     lower is better; the ratio of 95th percentiles
enum class Figure { throughput, median_latency, p95_latency };

// "throughput", "median latency", "p95 latency".
const char* figure_name(Figure figure);

// A candidate beats another only when the interval of the ratio of their figures lies above
// 1 + margin (the configured decision margin; honed.config.decision_margin).
constexpr double kDefaultDecisionMargin = 0.02;

// The confidence of the bootstrap intervals decisions rest on: one-sided, a candidate that does
// the same work as another looks better by chance in about 0.5 % of comparisons.
constexpr double kDecisionConfidence = 0.99;

// Two candidates measured side by side (one interleaved run, Measurement::run) are compared
// over their rounds, paired, when they have at least this many (stats.h: compare_paired);
// otherwise over single calls.
constexpr size_t kMinPairedRounds = 5;

// Stalls: calls over this many times their own measurement's median latency.
constexpr double kStallFactor = 5.0;

// Where the machine's stalls move a comparison to the medians, the two measurements must span
// comparable stretches of the machine's time (calls times median) within this factor.
constexpr double kSpanFactor = 3.0;

// Whether `challenger` beats `incumbent` on `figure` with evidence: both measurements stable and
// the bootstrap interval of the ratio (> 1: the challenger is better; for throughput the
// challenger's throughput over the incumbent's) lying entirely above `threshold`.
// Throughput follows the mean latency, which a few stalls can decide alone: on a loaded CPU a
// 0.02 ms call now and then loses the CPU for 4-30 ms, in bursts. A stall event is a run of
// consecutive stalls. Where either candidate stalled and the incumbent's share of the events is
// what its share of the calls predicts (a two-sided binomial test at kDecisionConfidence), the
// stalls are the machine's and say nothing of the candidates: the comparison rests on the
// median instead, and its text says so. Events that differ in number are the candidates' own
// (a collector pass, a re-capture) and the mean keeps them. Medians taken over spans of the
// machine's time more than kSpanFactor apart (a measurement extended while the other was short)
// come from different states of a busy machine: no candidate beats another on them.
// why: when it does not beat it, what is missing, with the figures, e.g. "onnx 1.010x eager
// throughput (99% CI 0.970–1.050, needs > 1.020x)" or "aot 356x eager throughput (99% CI
// 12.0–900) but its measurement is unstable (CV 383.0%)".
struct Evidence {
  bool beats = false;
  RatioInterval interval;
  std::string why;
};

Evidence weigh(const CandidateResult& incumbent, const CandidateResult& challenger, Figure figure,
               double threshold);

// The pick: index into the candidates (-1: none), one line for users saying why, and the figure
// the candidates were ranked by ("" when the strategy does not rank them).
struct Decision {
  int index = -1;
  std::string reason;
  std::string figure;
};

// Rules shared by the strategies below:
// - Failed (not ok) or incorrect candidates are never picked; all failing gives -1 and a reason
//   listing the failures briefly. Strategies that rank by measurement also skip unmeasured ones.
// - A decision needs evidence (weigh() above): the baseline (else the simplest candidate, the
//   lowest portability) is the incumbent; the others, simplest first, replace it only when they
//   beat it with evidence. So an unstable measurement never wins, and where the evidence is
//   missing the simpler candidate stays and the reason says "not enough evidence: ..." with the
//   figures of every candidate that looked better.

// The one backend under test: the first non-baseline candidate (or the only candidate) when it is
// ok and correct; otherwise none, with its reason.
Decision select_one_backend(const std::vector<CandidateResult>& cands);

// Candidates in the given order; the first ok, correct, measured, non-baseline one that beats the
// baseline's median latency by min_speedup with evidence (threshold min_speedup * (1 + margin)).
// None qualifies: the baseline when it is present and usable, saying so; otherwise none.
Decision select_first_wins(const std::vector<CandidateResult>& cands, double min_speedup,
                           double margin = kDefaultDecisionMargin);

// Highest throughput.
Decision select_max_throughput(const std::vector<CandidateResult>& cands,
                               double margin = kDefaultDecisionMargin);

// Lowest median latency.
Decision select_min_latency(const std::vector<CandidateResult>& cands,
                            double margin = kDefaultDecisionMargin);

// Among candidates whose p95 latency is within budget_ms, the highest throughput. p95 rather than
// p99: a measurement holds tens of samples, where p99 is little more than the maximum and as
// noisy. None fits: the lowest p95, with a reason saying the budget was missed.
Decision select_latency_budget(const std::vector<CandidateResult>& cands, double budget_ms,
                               double margin = kDefaultDecisionMargin);

}  // namespace honed
