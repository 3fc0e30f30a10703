// cpp/src/select.cpp: the tune strategies: eligibility, ties within noise, one-line reasons.
#include "honed/select.h"

#include <cstdio>
#include <functional>
#include <optional>

#include "honed/stats.h"

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
  if (!c.correct) return c.reason.empty() ? "incorrect" : "incorrect: " + brief(c.reason);
  if (!rankable(c)) return "not measured";
  return "";
}

// "no candidate passed: 3 failed (a: x; b: y; c: z)" (or "no candidates").
std::string none_reason(const Cands& cands) {
  if (cands.empty()) return "no candidates";
  std::string list;
  for (const CandidateResult& c : cands) {
    const std::string why = why_not(c);
    if (why.empty()) continue;
    list += (list.empty() ? "" : "; ") + c.name + ": " + why;
  }
  return "no candidate passed: " + std::to_string(cands.size()) + " failed (" + list + ")";
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

const std::vector<double>& samples(const CandidateResult& c) { return c.measurement.samples_ms; }

// The index among `among` with the best score (higher is better); equal scores: lower portability,
// then the earlier candidate.
int best_by(const Cands& cands, const std::vector<int>& among,
            const std::function<double(const CandidateResult&)>& score) {
  int best = among.front();
  for (int i : among) {
    const double si = score(cands[i]), sb = score(cands[best]);
    if (si > sb || (si == sb && cands[i].portability < cands[best].portability)) best = i;
  }
  return best;
}

// Tie within noise -> simpler backend: among `among`, the simplest candidate (lowest portability,
// then best score) that compare() cannot tell apart from `best`; `best` itself when there is none.
int simplest_tied(const Cands& cands, const std::vector<int>& among, int best,
                  const std::function<double(const CandidateResult&)>& score) {
  int pick = best;
  for (int i : among) {
    const CandidateResult& c = cands[i];
    if (c.portability >= cands[best].portability) continue;
    if (compare(samples(c), samples(cands[best])).verdict != 0) continue;
    const CandidateResult& p = cands[pick];
    if (c.portability < p.portability || (c.portability == p.portability && score(c) > score(p))) {
      pick = i;
    }
  }
  return pick;
}

// "TorchInductorBackend(mode=default): 1.84x eager median (95% CI 1.80–1.88), <why>", or for the
// baseline / without one, the median latency instead of the speed-up; then the tie and stability
// notes.
std::string describe(const Cands& cands, int pick, int best, const std::string& why) {
  const CandidateResult& c = cands[pick];
  const int base = baseline_index(cands);
  std::string line = c.name + ": ";
  if (base >= 0 && base != pick) {
    const RatioInterval r = compare(samples(cands[base]), samples(c));
    const std::string& base_name =
        cands[base].backend.empty() ? cands[base].name : cands[base].backend;
    line += fmt("%.2fx ", r.ratio) + base_name + fmt(" median (95%% CI %.2f–%.2f)", r.lo, r.hi);
  } else if (base == pick) {
    line += fmt("baseline, median %.3g ms", c.measurement.stats.median_ms);
  } else {
    line += fmt("median %.3g ms", c.measurement.stats.median_ms);
  }
  line += ", " + why;
  if (pick != best) line += ", tie within noise with " + cands[best].name + " → simpler backend";
  if (!c.measurement.stable) line += fmt(", unstable (CV %.0f%%)", c.measurement.stats.cv * 100);
  return line;
}

double throughput(const CandidateResult& c) { return c.measurement.throughput; }
double minus_median(const CandidateResult& c) { return -c.measurement.stats.median_ms; }
double minus_p95(const CandidateResult& c) { return -c.measurement.stats.p95_ms; }

// Best by score among the rankable candidates, ties within noise going to the simpler backend.
Decision select_ranked(const Cands& cands, const std::vector<int>& among,
                       const std::function<double(const CandidateResult&)>& score,
                       const std::string& why) {
  if (among.empty()) return {-1, none_reason(cands)};
  const int best = best_by(cands, among, score);
  const int pick = simplest_tied(cands, among, best, score);
  return {pick, describe(cands, pick, best, why)};
}

}  // namespace

Decision select_one_backend(const Cands& cands) {
  if (cands.empty()) return {-1, "no candidates"};
  int target = 0;
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    if (!cands[i].is_baseline) {
      target = i;
      break;
    }
  }
  const CandidateResult& c = cands[target];
  if (!c.ok)
    return {-1, c.name + " failed: " + (c.reason.empty() ? "no reason given" : brief(c.reason))};
  if (!c.correct) {
    return {-1, c.name + " incorrect: " + (c.reason.empty() ? "no reason given" : brief(c.reason))};
  }
  std::string line = c.name + ": the one backend requested, passed the correctness check";
  if (rankable(c)) line += fmt(", median %.3g ms", c.measurement.stats.median_ms);
  return {target, line};
}

Decision select_first_wins(const Cands& cands, double min_speedup) {
  const int base = baseline_index(cands);
  std::string best_seen;
  double best_ratio = 0;
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    const CandidateResult& c = cands[i];
    if (i == base || c.is_baseline || !rankable(c)) continue;
    if (base < 0) {
      return {i, c.name + ": first passing candidate (no measured baseline to compare with)"};
    }
    const RatioInterval r = compare(samples(cands[base]), samples(c));
    if (r.lo > min_speedup) {
      return {i, describe(cands, i, i, fmt("first to beat %.2fx beyond noise", min_speedup))};
    }
    if (r.ratio > best_ratio) {
      best_ratio = r.ratio;
      best_seen = fmt("; best %s %.2fx (95%% CI %.2f–%.2f)", c.name.c_str(), r.ratio, r.lo, r.hi);
    }
  }
  if (base >= 0) {
    return {base,
            cands[base].name +
                fmt(": baseline kept, no candidate beat it by %.2fx beyond noise", min_speedup) +
                best_seen};
  }
  return {-1, none_reason(cands)};
}

Decision select_max_throughput(const Cands& cands) {
  const auto among = indices_where(cands, [&](int i) { return rankable(cands[i]); });
  return select_ranked(cands, among, throughput, "highest throughput");
}

Decision select_min_latency(const Cands& cands) {
  const auto among = indices_where(cands, [&](int i) { return rankable(cands[i]); });
  return select_ranked(cands, among, minus_median, "lowest median latency");
}

Decision select_latency_budget(const Cands& cands, double budget_ms) {
  const auto fits = indices_where(cands, [&](int i) {
    return rankable(cands[i]) && cands[i].measurement.stats.p95_ms <= budget_ms;
  });
  if (!fits.empty()) {
    return select_ranked(cands, fits, throughput,
                         fmt("highest throughput with p95 within the %.3g ms budget", budget_ms));
  }
  const auto among = indices_where(cands, [&](int i) { return rankable(cands[i]); });
  if (among.empty()) return {-1, none_reason(cands)};
  const int best = best_by(cands, among, minus_p95);
  const int pick = simplest_tied(cands, among, best, minus_p95);
  return {pick, describe(cands, pick, best,
                         fmt("latency budget %.3g ms missed by every candidate (p95 %.3g ms, the "
                             "lowest within noise)",
                             budget_ms, cands[pick].measurement.stats.p95_ms))};
}

}  // namespace honed
