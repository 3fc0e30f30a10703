// cpp/src/select.cpp: the tune strategies: eligibility, the evidence rule, one-line reasons.
#include "honed/select.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>

namespace honed {

namespace {

using Cands = std::vector<CandidateResult>;

bool usable(const CandidateResult& c) { return c.ok && c.correct; }

bool rankable(const CandidateResult& c) {
  return usable(c) && c.has_measurement && !c.measurement.samples_ms.empty();
}

template <typename... Args>
std::string fmt(const char* format, Args... args) {
  char buf[512];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

// The first line of a reason, at most 60 characters.
std::string brief(const std::string& reason) {
  std::string line = reason.substr(0, reason.find('\n'));
  if (line.size() > 60) line = line.substr(0, 57) + "...";
  return line;
}

// Why a candidate cannot be picked by a strategy that needs measurements ("" when it can).
std::string why_not(const CandidateResult& c) {
  if (!c.ok) return c.reason.empty() ? "failed" : brief(c.reason);
  if (!c.tried) return c.reason.empty() ? "not tried" : "not tried: " + brief(c.reason);
  if (!c.correct) return c.reason.empty() ? "incorrect" : "incorrect: " + brief(c.reason);
  if (!rankable(c)) return "not measured";
  return "";
}

// "none of 3 candidates passed (a: x; b: y; c: z)" (or "no candidates").
std::string none_reason(const Cands& cands) {
  if (cands.empty()) return "no candidates";
  std::string list;
  for (const CandidateResult& c : cands) {
    const std::string why = why_not(c);
    if (why.empty()) continue;
    list += (list.empty() ? "" : "; ") + c.name + ": " + why;
  }
  if (cands.size() == 1) return "the one candidate did not pass (" + list + ")";
  return "none of " + std::to_string(cands.size()) + " candidates passed (" + list + ")";
}

std::vector<int> indices_where(const Cands& cands, const std::function<bool(int)>& keep) {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    if (keep(i)) out.push_back(i);
  }
  return out;
}

// The first measured, usable baseline, or -1.
int baseline_index(const Cands& cands) {
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    if (cands[i].is_baseline && rankable(cands[i])) return i;
  }
  return -1;
}

Statistic statistic_for(Figure figure) {
  switch (figure) {
    case Figure::throughput:
      return Statistic::mean;
    case Figure::p95_latency:
      return Statistic::p95;
    case Figure::median_latency:
      break;
  }
  return Statistic::median;
}

// The figure as a score, higher is better.
double score(const CandidateResult& c, Figure figure) {
  switch (figure) {
    case Figure::throughput:
      return c.measurement.throughput;
    case Figure::p95_latency:
      return -c.measurement.stats.p95_ms;
    case Figure::median_latency:
      break;
  }
  return -c.measurement.stats.median_ms;
}

// "throughput 1,234/s" / "median latency 0.334 ms" / "p95 latency 0.5 ms".
std::string figure_value(const CandidateResult& c, Figure figure) {
  if (figure == Figure::throughput) {
    return fmt("throughput %.4g samples/s", c.measurement.throughput);
  }
  const double ms =
      figure == Figure::p95_latency ? c.measurement.stats.p95_ms : c.measurement.stats.median_ms;
  return std::string(figure_name(figure)) + fmt(" %.3g ms", ms);
}

std::string unstable_note(const CandidateResult& c) {
  return fmt("unstable (CV %.1f%%)", c.measurement.stats.cv * 100);
}

// A ratio with the digits that tell it from the margin: "1.015", "12.3", "356".
std::string ratio_digits(double r) {
  if (r >= 100) return fmt("%.0f", r);
  if (r >= 10) return fmt("%.1f", r);
  return fmt("%.3f", r);
}

// Stall events of a set: runs of consecutive calls over kStallFactor times its median (the
// machine takes the CPU in bursts, so a run counts once).
int64_t stall_events(const std::vector<double>& samples) {
  const double cut = kStallFactor * median_of(samples);
  int64_t events = 0;
  bool in_stall = false;
  for (double x : samples) {
    const bool stalled = x > cut;
    events += stalled && !in_stall;
    in_stall = stalled;
  }
  return events;
}

// P(X <= k) for X ~ Binomial(n, p), summed in logs (n reaches thousands).
double binomial_cdf(int64_t k, int64_t n, double p) {
  if (k < 0) return 0.0;
  if (k >= n || p <= 0) return 1.0;
  if (p >= 1) return 0.0;
  const double dn = static_cast<double>(n);
  const double log_n = std::lgamma(dn + 1);
  double total = 0;
  for (int64_t i = 0; i <= k; ++i) {
    const double di = static_cast<double>(i);
    total += std::exp(log_n - std::lgamma(di + 1) - std::lgamma(dn - di + 1) + di * std::log(p) +
                      (dn - di) * std::log1p(-p));
  }
  return std::min(total, 1.0);
}

// The stall events of two candidates measured side by side, and whether they are the machine's:
// some stalled, and the incumbent's share of the events is what its share of the calls predicts
// (a two-sided binomial test at the decision's confidence).
// span: how many times longer one measurement ran than the other (its calls times its median
// latency: the machine's time it covered, its stalls left out).
struct Stalls {
  int64_t incumbent = 0;
  int64_t challenger = 0;
  bool machines = false;
  double span = 1.0;
};

Stalls stalls_of(const CandidateResult& incumbent, const CandidateResult& challenger) {
  const auto& a = incumbent.measurement.samples_ms;
  const auto& b = challenger.measurement.samples_ms;
  Stalls s{stall_events(a), stall_events(b), false, 1.0};
  const int64_t total = s.incumbent + s.challenger;
  if (total == 0) return s;
  const double share = static_cast<double>(a.size()) / static_cast<double>(a.size() + b.size());
  const double lower = binomial_cdf(s.incumbent, total, share);
  const double upper = 1.0 - binomial_cdf(s.incumbent - 1, total, share);
  s.machines = std::min(1.0, 2.0 * std::min(lower, upper)) >= 1.0 - kDecisionConfidence;
  const double span_a = static_cast<double>(a.size()) * median_of(a);
  const double span_b = static_cast<double>(b.size()) * median_of(b);
  if (span_a > 0 && span_b > 0) s.span = std::max(span_a, span_b) / std::min(span_a, span_b);
  return s;
}

// What a comparison of `figure` rests on: its statistic (throughput follows the mean latency,
// except where both candidates' stalls are the machine's: select.h) and, for throughput, the
// stalls that decided it. Worked out once per pair of candidates.
struct Basis {
  Statistic stat = Statistic::median;
  Stalls stalls;
};

Basis basis_of(const CandidateResult& incumbent, const CandidateResult& challenger, Figure figure) {
  Basis basis{statistic_for(figure), {}};
  if (figure == Figure::throughput) {
    basis.stalls = stalls_of(incumbent, challenger);
    if (basis.stalls.machines) basis.stat = Statistic::median;
  }
  return basis;
}

// "2.000x eager throughput (99% CI 1.960–2.040)", with the basis when the machine's stalls moved
// a throughput comparison to the median: "..., on the median: stalls alike, 3 and 4 runs of calls
// over 5x the median, the machine's)".
std::string ratio_text(const RatioInterval& r, const CandidateResult& incumbent, Figure figure,
                       const Basis& basis) {
  std::string text = ratio_digits(r.ratio) + "x " + incumbent.name + " " + figure_name(figure) +
                     fmt(" (%.0f%% CI ", kDecisionConfidence * 100) + ratio_digits(r.lo) + "–" +
                     ratio_digits(r.hi);
  if (basis.stalls.machines) {
    text +=
        fmt(", on the median: stalls alike, %lld and %lld runs of calls over %.0fx the "
            "median, the machine's",
            static_cast<long long>(basis.stalls.challenger),
            static_cast<long long>(basis.stalls.incumbent), kStallFactor);
  }
  return text + ")";
}

// Whether two measurements come from one interleaved run, round for round.
bool side_by_side(const Measurement& a, const Measurement& b) {
  return a.run != 0 && a.run == b.run && a.blocks.size() == b.blocks.size() &&
         a.blocks.size() >= kMinPairedRounds;
}

// The ratio of `figure` (by `stat`) of challenger over incumbent, > 1 when the challenger is
// better; over paired rounds where they were measured side by side (compare_paired).
RatioInterval ratio_of(const CandidateResult& incumbent, const CandidateResult& challenger,
                       Figure figure, Statistic stat) {
  const Measurement& a = incumbent.measurement;
  const Measurement& b = challenger.measurement;
  RatioInterval r = side_by_side(a, b)
                        ? compare_paired(a.samples_ms, a.blocks, b.samples_ms, b.blocks, 2000,
                                         kDecisionConfidence, 42, stat)
                        : compare(a.samples_ms, b.samples_ms, 2000, kDecisionConfidence, 42, stat);
  if (figure == Figure::throughput) {  // samples per call may differ: throughput is per sample
    const double per_sample = static_cast<double>(challenger.measurement.batch_size) /
                              static_cast<double>(incumbent.measurement.batch_size);
    r.ratio *= per_sample;
    r.lo *= per_sample;
    r.hi *= per_sample;
  }
  return r;
}

// Whether a stable challenger beats an incumbent measured unstable all the same: noise only adds
// time to a call, so the incumbent's true figure is no better than its fastest call, and a
// challenger whose own figure (per sample, with the margin) beats even that call is better.
// The CPU-bound eager baseline measured beside parallel builds is the common case.
bool beats_fastest_call(const CandidateResult& incumbent, const CandidateResult& challenger,
                        Statistic stat, Figure figure, double threshold) {
  const auto& theirs = incumbent.measurement.samples_ms;
  const double fastest = *std::min_element(theirs.begin(), theirs.end());
  double mine = statistic_of(challenger.measurement.samples_ms, stat);
  if (figure == Figure::throughput) {  // per sample, as ratio_of compares them
    mine *= static_cast<double>(incumbent.measurement.batch_size) /
            static_cast<double>(challenger.measurement.batch_size);
  }
  return mine > 0 && fastest / mine > threshold;
}

// The candidate `among` that stays: the baseline (else the simplest, best-scoring one) unless a
// candidate beats it with evidence; challengers come simplest first, so where two cannot be told
// apart the simpler one stays. `notes` gets why each better-looking candidate did not win.
int pick_with_evidence(const Cands& cands, const std::vector<int>& among, Figure figure,
                       double threshold, std::vector<std::string>& notes) {
  std::vector<int> order = among;
  std::stable_sort(order.begin(), order.end(), [&](int i, int j) {
    if (cands[i].is_baseline != cands[j].is_baseline) return cands[i].is_baseline;
    if (cands[i].portability != cands[j].portability) {
      return cands[i].portability < cands[j].portability;
    }
    return score(cands[i], figure) > score(cands[j], figure);
  });
  int pick = order.front();
  for (size_t k = 1; k < order.size(); ++k) {
    if (weigh(cands[pick], cands[order[k]], figure, threshold).beats) pick = order[k];
  }
  for (int i : among) {
    if (i == pick || score(cands[i], figure) <= score(cands[pick], figure)) continue;
    notes.push_back(weigh(cands[pick], cands[i], figure, threshold).why);
  }
  return pick;
}

// "<pick>: 2.000x eager throughput (99% CI 1.960–2.040), <why>", or for the baseline / without one
// its own figure; then "not enough evidence: ..." for the better-looking candidates that lost,
// and the pick's own instability.
std::string describe(const Cands& cands, int pick, Figure figure, const std::string& why,
                     const std::vector<std::string>& notes) {
  const CandidateResult& c = cands[pick];
  const int base = baseline_index(cands);
  std::string line = c.name + ": ";
  if (base >= 0 && base != pick) {
    const Basis basis = basis_of(cands[base], c, figure);
    line += ratio_text(ratio_of(cands[base], c, figure, basis.stat), cands[base], figure, basis) +
            ", " + why;
    if (!cands[base].measurement.stable) {
      line += "; " + cands[base].name + " " + unstable_note(cands[base]) +
              ", slower even at its fastest call";
    }
  } else if (base == pick && !notes.empty()) {
    line += "baseline kept (" + figure_value(c, figure) + ")";
  } else {
    line += (base == pick ? "baseline, " : "") + figure_value(c, figure) + ", " + why;
  }
  if (!notes.empty()) {
    line += "; not enough evidence: ";
    for (size_t i = 0; i < notes.size(); ++i) line += (i ? "; " : "") + notes[i];
  }
  if (!c.measurement.stable) line += "; " + c.name + " " + unstable_note(c);
  return line;
}

// The best by `figure` among the rankable candidates `among`, by the evidence rule.
Decision select_ranked(const Cands& cands, const std::vector<int>& among, Figure figure,
                       double margin, const std::string& why) {
  if (among.empty()) return {-1, none_reason(cands), figure_name(figure)};
  std::vector<std::string> notes;
  const int pick = pick_with_evidence(cands, among, figure, 1.0 + margin, notes);
  const std::string beyond = fmt(" beyond the %.3g%% margin", margin * 100);
  return {pick, describe(cands, pick, figure, why + beyond, notes), figure_name(figure)};
}

void check_margin(double margin) {
  if (!(margin >= 0)) throw std::invalid_argument("decision margin must be >= 0");
}

}  // namespace

const char* figure_name(Figure figure) {
  switch (figure) {
    case Figure::throughput:
      return "throughput";
    case Figure::p95_latency:
      return "p95 latency";
    case Figure::median_latency:
      break;
  }
  return "median latency";
}

Evidence weigh(const CandidateResult& incumbent, const CandidateResult& challenger, Figure figure,
               double threshold) {
  Evidence e;
  const Basis basis = basis_of(incumbent, challenger, figure);
  const Statistic stat = basis.stat;
  if (!(statistic_of(challenger.measurement.samples_ms, stat) > 0) ||
      !(statistic_of(incumbent.measurement.samples_ms, stat) > 0)) {
    e.why = challenger.name + " cannot be compared with " + incumbent.name + " (a zero " +
            statistic_name(stat) + " latency)";
    return e;
  }
  e.interval = ratio_of(incumbent, challenger, figure, stat);
  const std::string figures =
      challenger.name + " " + ratio_text(e.interval, incumbent, figure, basis);
  if (!challenger.measurement.stable) {
    e.why = figures + " but its measurement is " + unstable_note(challenger);
  } else if (!incumbent.measurement.stable) {
    if (beats_fastest_call(incumbent, challenger, stat, figure, threshold)) {
      e.beats = true;
    } else {
      e.why = figures + " but " + incumbent.name + "'s measurement is " + unstable_note(incumbent) +
              " and " + challenger.name + " is not faster than its fastest call";
    }
  } else if (!(e.interval.lo > threshold)) {
    e.why = figures.substr(0, figures.size() - 1) + ", needs > " + ratio_digits(threshold) + "x)";
  } else if (basis.stalls.machines && basis.stalls.span > kSpanFactor) {
    // Each median stands for the stretch of the machine's time it was taken in; a busy machine
    // changes its speed between stretches (a 0.018 ms call ran 0.028 ms for seconds at a time).
    e.why = figures + " but " + ratio_digits(basis.stalls.span) +
            "x apart in the machine's time they were measured over: medians of a busy " +
            "machine's different stretches, not comparable";
  } else {
    e.beats = true;
  }
  return e;
}

Decision select_one_backend(const Cands& cands) {
  if (cands.empty()) return {-1, "no candidates", ""};
  int target = 0;
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    if (!cands[i].is_baseline) {
      target = i;
      break;
    }
  }
  const CandidateResult& c = cands[target];
  const char* out = !c.ok ? "failed" : !c.tried ? "not tried" : !c.correct ? "incorrect" : nullptr;
  if (out != nullptr) {
    return {-1,
            c.name + " " + out + ": " + (c.reason.empty() ? "no reason given" : brief(c.reason)),
            ""};
  }
  std::string line = c.name + ": the one backend requested, passed the correctness check";
  if (rankable(c)) line += fmt(", median %.3g ms", c.measurement.stats.median_ms);
  return {target, line, ""};
}

Decision select_first_wins(const Cands& cands, double min_speedup, double margin) {
  check_margin(margin);
  const Figure figure = Figure::median_latency;
  const int base = baseline_index(cands);
  const double threshold = min_speedup * (1.0 + margin);
  std::vector<std::string> notes;
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    const CandidateResult& c = cands[i];
    if (i == base || c.is_baseline || !rankable(c)) continue;
    if (base < 0) {
      return {i, c.name + ": first passing candidate (no measured baseline to compare with)",
              figure_name(figure)};
    }
    const Evidence e = weigh(cands[base], c, figure, threshold);
    if (e.beats) {
      return {i,
              describe(cands, i, figure,
                       "first to beat " + ratio_digits(threshold) + "x with evidence", {}),
              figure_name(figure)};
    }
    notes.push_back(e.why);
  }
  if (base < 0) return {-1, none_reason(cands), figure_name(figure)};
  std::string line = cands[base].name + ": baseline kept, no candidate beat it by " +
                     ratio_digits(threshold) + "x";
  if (!notes.empty()) {
    line += "; not enough evidence: ";
    for (size_t i = 0; i < notes.size(); ++i) line += (i ? "; " : "") + notes[i];
  }
  return {base, line, figure_name(figure)};
}

Decision select_max_throughput(const Cands& cands, double margin) {
  check_margin(margin);
  const auto among = indices_where(cands, [&](int i) { return rankable(cands[i]); });
  return select_ranked(cands, among, Figure::throughput, margin, "highest throughput");
}

Decision select_min_latency(const Cands& cands, double margin) {
  check_margin(margin);
  const auto among = indices_where(cands, [&](int i) { return rankable(cands[i]); });
  return select_ranked(cands, among, Figure::median_latency, margin, "lowest median latency");
}

Decision select_latency_budget(const Cands& cands, double budget_ms, double margin) {
  check_margin(margin);
  const auto fits = indices_where(cands, [&](int i) {
    return rankable(cands[i]) && cands[i].measurement.stats.p95_ms <= budget_ms;
  });
  if (!fits.empty()) {
    return select_ranked(cands, fits, Figure::throughput, margin,
                         fmt("highest throughput with p95 within the %.3g ms budget", budget_ms));
  }
  const auto among = indices_where(cands, [&](int i) { return rankable(cands[i]); });
  return select_ranked(
      cands, among, Figure::p95_latency, margin,
      fmt("latency budget %.3g ms missed by every candidate, the lowest p95", budget_ms));
}

}  // namespace honed
