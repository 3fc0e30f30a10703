// cpp/include/honed/select.h: tune strategies as pure functions over candidate results.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "honed/measure.h"

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
};

// The pick: index into the candidates (-1: none) and one line for users saying why.
struct Decision {
  int index = -1;
  std::string reason;
};

// Rules shared by the strategies below:
// - Failed (not ok) or incorrect candidates are never picked; all failing gives -1 and a reason
//   listing the failures briefly. Strategies that rank by measurement also skip unmeasured ones.
// - "Faster" means beyond the noise: when the best candidate and a simpler one (lower portability)
//   are not distinguishable by compare() on their latency samples, the simpler one wins.
// - An unstable measurement is still eligible (its wide spread makes ties with it likely); the
//   reason says "unstable" when the pick is.

// The one backend under test: the first non-baseline candidate (or the only candidate) when it is
// ok and correct; otherwise none, with its reason.
Decision select_one_backend(const std::vector<CandidateResult>& cands);

// Candidates in the given order; the first ok, correct, measured, non-baseline one whose speed-up
// over the baseline exceeds min_speedup beyond the noise (the bootstrap interval of
// baseline / candidate lies entirely above min_speedup). None qualifies: the baseline when it is
// present and usable, saying so; otherwise none.
Decision select_first_wins(const std::vector<CandidateResult>& cands, double min_speedup);

// Highest throughput (tie within noise -> simpler backend).
Decision select_max_throughput(const std::vector<CandidateResult>& cands);

// Lowest median latency (tie within noise -> simpler backend).
Decision select_min_latency(const std::vector<CandidateResult>& cands);

// Among candidates whose p95 latency is within budget_ms, the highest throughput (tie within
// noise -> simpler). p95 rather than p99: a measurement holds tens of samples, where p99 is little
// more than the maximum and as noisy. None fits: the lowest-p95 candidate, with a reason saying the
// budget was missed.
Decision select_latency_budget(const std::vector<CandidateResult>& cands, double budget_ms);

}  // namespace honed
