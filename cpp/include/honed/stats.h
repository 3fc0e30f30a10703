// cpp/include/honed/stats.h: latency statistics and the bootstrap comparison of two sample sets.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace honed {

// Summary of latency samples, all in milliseconds.
// Percentiles use linear interpolation between order statistics (Hyndman & Fan type 7, the
// default of numpy and R): with the samples sorted x[0..n-1], the p-quantile is read at the
// fractional rank h = (n - 1) * p, i.e. x[floor h] + (h - floor h) * (x[floor h + 1] - x[floor h]).
// stddev is the sample standard deviation (divides by n - 1; 0 for one sample); cv = stddev / mean
// (0 when the mean is 0).
struct Stats {
  int64_t n = 0;
  double median_ms = 0;
  double mean_ms = 0;
  double min_ms = 0;
  double max_ms = 0;
  double p90_ms = 0;
  double p95_ms = 0;
  double p99_ms = 0;
  double stddev_ms = 0;
  double cv = 0;
};

// Statistics of samples_ms; throws std::invalid_argument when it is empty or holds a NaN.
Stats compute_stats(const std::vector<double>& samples_ms);

// The p-quantile (p in [0, 1]) of already sorted, non-empty values, by the type-7 rule above.
double quantile_sorted(const std::vector<double>& sorted, double p);

// The median of values (copied); throws std::invalid_argument when empty.
double median_of(std::vector<double> values);

// The figure of a sample set that a comparison is about: the median, the mean (what throughput
// follows: samples per second = batch * 1000 / mean latency) or the 95th percentile.
enum class Statistic { median, mean, p95 };

// That figure of values (copied); throws std::invalid_argument when empty.
double statistic_of(std::vector<double> values, Statistic stat);

// "median", "mean", "p95"; and back (throws std::invalid_argument on anything else).
const char* statistic_name(Statistic stat);
Statistic parse_statistic(const std::string& name);

// Bootstrap interval of the ratio stat(a) / stat(b) (by default of the medians).
// ratio: the ratio of the sample figures; lo/hi: the percentile interval at `confidence` of the
// ratio over `iterations` resamplings (each set resampled with replacement, std::mt19937_64
// seeded with `seed`, so the result is deterministic); verdict: -1 when hi < 1 (a is faster,
// its latency lower), +1 when lo > 1 (b is faster), 0 when the interval contains 1 (a tie within
// the noise).
struct RatioInterval {
  double ratio = 1;
  double lo = 1;
  double hi = 1;
  int verdict = 0;
};

// Throws std::invalid_argument on an empty set, iterations < 1, confidence outside (0, 1), or a
// non-positive figure of b.
RatioInterval compare(const std::vector<double>& a, const std::vector<double>& b,
                      int iterations = 2000, double confidence = 0.95, uint64_t seed = 42,
                      Statistic stat = Statistic::median);

// compare() for two sets measured side by side in rounds: a's samples are blocks_a[0] calls of
// round 0, then blocks_a[1] of round 1, ...; b's likewise, round i of b beside round i of a.
// A round is the unit of resampling, and the same rounds are drawn for both: calls of one round
// share the machine's state of that moment, so resampling single calls would count one slow or
// fast stretch many times over as independent evidence. Throws std::invalid_argument as
// compare() does, and when the block counts differ, are empty, or do not sum to the samples.
RatioInterval compare_paired(const std::vector<double>& a, const std::vector<int64_t>& blocks_a,
                             const std::vector<double>& b, const std::vector<int64_t>& blocks_b,
                             int iterations = 2000, double confidence = 0.95, uint64_t seed = 42,
                             Statistic stat = Statistic::median);

}  // namespace honed
