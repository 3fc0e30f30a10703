// cpp/src/stats.cpp: latency statistics (type-7 percentiles) and the bootstrap ratio comparison.
#include "honed/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

namespace honed {

double quantile_sorted(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) throw std::invalid_argument("quantile_sorted: no values");
  if (!(p >= 0.0 && p <= 1.0)) throw std::invalid_argument("quantile_sorted: p must be in [0, 1]");
  const double h = static_cast<double>(sorted.size() - 1) * p;
  const auto lo = static_cast<size_t>(std::floor(h));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

namespace {

// The median of values, reordering them; values must be non-empty.
double median_in_place(std::vector<double>& values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid), values.end());
  const double upper = values[mid];
  if (values.size() % 2 == 1) return upper;
  const double lower =
      *std::max_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(mid));
  return (lower + upper) / 2.0;
}

}  // namespace

double median_of(std::vector<double> values) {
  if (values.empty()) throw std::invalid_argument("median_of: no values");
  return median_in_place(values);
}

Stats compute_stats(const std::vector<double>& samples_ms) {
  if (samples_ms.empty()) throw std::invalid_argument("stats: no samples");
  std::vector<double> sorted = samples_ms;
  for (double x : sorted) {
    if (std::isnan(x)) throw std::invalid_argument("stats: a sample is NaN");
  }
  std::sort(sorted.begin(), sorted.end());
  Stats s;
  s.n = static_cast<int64_t>(sorted.size());
  s.min_ms = sorted.front();
  s.max_ms = sorted.back();
  s.median_ms = quantile_sorted(sorted, 0.5);
  s.p90_ms = quantile_sorted(sorted, 0.90);
  s.p95_ms = quantile_sorted(sorted, 0.95);
  s.p99_ms = quantile_sorted(sorted, 0.99);
  s.mean_ms = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.n);
  if (s.n > 1) {
    double sq = 0;
    for (double x : sorted) sq += (x - s.mean_ms) * (x - s.mean_ms);
    s.stddev_ms = std::sqrt(sq / static_cast<double>(s.n - 1));
  }
  s.cv = s.mean_ms != 0 ? s.stddev_ms / s.mean_ms : 0.0;
  return s;
}

namespace {

// The figure of values, which it may reorder.
double statistic_in_place(std::vector<double>& values, Statistic stat) {
  switch (stat) {
    case Statistic::mean:
      return std::accumulate(values.begin(), values.end(), 0.0) /
             static_cast<double>(values.size());
    case Statistic::p95:
      std::sort(values.begin(), values.end());
      return quantile_sorted(values, 0.95);
    case Statistic::median:
      break;
  }
  return median_in_place(values);
}

// The figure of a resampling (with replacement) of values, drawn with rng; scratch avoids
// allocation.
double resampled(const std::vector<double>& values, Statistic stat, std::mt19937_64& rng,
                 std::vector<double>& scratch) {
  std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
  scratch.resize(values.size());
  for (double& x : scratch) x = values[pick(rng)];
  return statistic_in_place(scratch, stat);
}

}  // namespace

double statistic_of(std::vector<double> values, Statistic stat) {
  if (values.empty()) throw std::invalid_argument("statistic_of: no values");
  return statistic_in_place(values, stat);
}

const char* statistic_name(Statistic stat) {
  switch (stat) {
    case Statistic::mean:
      return "mean";
    case Statistic::p95:
      return "p95";
    case Statistic::median:
      break;
  }
  return "median";
}

Statistic parse_statistic(const std::string& name) {
  for (Statistic s : {Statistic::median, Statistic::mean, Statistic::p95}) {
    if (name == statistic_name(s)) return s;
  }
  throw std::invalid_argument("unknown statistic '" + name + "'; use median, mean or p95");
}

namespace {

// who: the function named in the message ("compare", "compare_paired").
void check_arguments(const char* who, const std::vector<double>& a, const std::vector<double>& b,
                     int iterations, double confidence) {
  const auto fail = [who](const char* what) {
    throw std::invalid_argument(std::string(who) + ": " + what);
  };
  if (a.empty() || b.empty()) fail("both sample sets must be non-empty");
  if (iterations < 1) fail("iterations must be >= 1");
  if (!(confidence > 0.0 && confidence < 1.0)) fail("confidence must be in (0, 1)");
}

// The percentile interval of the resampled ratios around the samples' own ratio.
RatioInterval interval_of(double ratio, std::vector<double>& ratios, double confidence) {
  RatioInterval r;
  r.ratio = ratio;
  if (ratios.empty()) {
    r.lo = r.hi = r.ratio;
  } else {
    std::sort(ratios.begin(), ratios.end());
    const double tail = (1.0 - confidence) / 2.0;
    r.lo = quantile_sorted(ratios, tail);
    r.hi = quantile_sorted(ratios, 1.0 - tail);
  }
  r.verdict = r.hi < 1.0 ? -1 : (r.lo > 1.0 ? 1 : 0);
  return r;
}

}  // namespace

RatioInterval compare(const std::vector<double>& a, const std::vector<double>& b, int iterations,
                      double confidence, uint64_t seed, Statistic stat) {
  check_arguments("compare", a, b, iterations, confidence);
  const double figure_b = statistic_of(b, stat);
  if (!(figure_b > 0)) {
    throw std::invalid_argument(std::string("compare: the ") + statistic_name(stat) +
                                " of b must be positive");
  }

  std::mt19937_64 rng(seed);
  std::vector<double> ratios;
  ratios.reserve(static_cast<size_t>(iterations));
  std::vector<double> scratch;
  for (int i = 0; i < iterations; ++i) {
    const double ma = resampled(a, stat, rng, scratch);
    const double mb = resampled(b, stat, rng, scratch);
    // A resampled figure of b can be 0 only when b holds zeros; skip such a draw.
    if (mb > 0) ratios.push_back(ma / mb);
  }
  return interval_of(statistic_of(a, stat) / figure_b, ratios, confidence);
}

RatioInterval compare_paired(const std::vector<double>& a, const std::vector<int64_t>& blocks_a,
                             const std::vector<double>& b, const std::vector<int64_t>& blocks_b,
                             int iterations, double confidence, uint64_t seed, Statistic stat) {
  check_arguments("compare_paired", a, b, iterations, confidence);
  if (blocks_a.size() != blocks_b.size() || blocks_a.empty()) {
    throw std::invalid_argument("compare_paired: both need the same number of blocks (>= 1)");
  }
  const auto starts = [](const std::vector<int64_t>& blocks, size_t n, const char* which) {
    std::vector<size_t> out;
    size_t at = 0;
    for (int64_t k : blocks) {
      if (k < 1)
        throw std::invalid_argument(std::string("compare_paired: a block of ") + which +
                                    " is empty");
      out.push_back(at);
      at += static_cast<size_t>(k);
    }
    if (at != n) {
      throw std::invalid_argument(std::string("compare_paired: the blocks of ") + which +
                                  " do not sum to its samples");
    }
    out.push_back(at);
    return out;
  };
  const std::vector<size_t> at_a = starts(blocks_a, a.size(), "a");
  const std::vector<size_t> at_b = starts(blocks_b, b.size(), "b");
  const double figure_b = statistic_of(b, stat);
  if (!(figure_b > 0)) {
    throw std::invalid_argument(std::string("compare_paired: the ") + statistic_name(stat) +
                                " of b must be positive");
  }
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, blocks_a.size() - 1);
  std::vector<double> ratios, sa, sb;
  ratios.reserve(static_cast<size_t>(iterations));
  for (int i = 0; i < iterations; ++i) {
    sa.clear();
    sb.clear();
    for (size_t k = 0; k < blocks_a.size(); ++k) {
      const size_t j = pick(rng);  // the same round of both: they ran beside each other
      sa.insert(sa.end(), a.begin() + static_cast<std::ptrdiff_t>(at_a[j]),
                a.begin() + static_cast<std::ptrdiff_t>(at_a[j + 1]));
      sb.insert(sb.end(), b.begin() + static_cast<std::ptrdiff_t>(at_b[j]),
                b.begin() + static_cast<std::ptrdiff_t>(at_b[j + 1]));
    }
    const double mb = statistic_in_place(sb, stat);
    if (mb > 0) ratios.push_back(statistic_in_place(sa, stat) / mb);
  }
  return interval_of(statistic_of(a, stat) / figure_b, ratios, confidence);
}

}  // namespace honed
