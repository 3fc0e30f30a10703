// cpp/tests/test_stats.cpp: statistics against hand-computed values; bootstrap verdicts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "honed/stats.h"

using honed::compare;
using honed::compute_stats;

TEST(Stats, OddCount) {
  // Sorted: 1 2 3 4 100. h(p) = 4p.
  const auto s = compute_stats({4, 1, 100, 3, 2});
  EXPECT_EQ(s.n, 5);
  EXPECT_DOUBLE_EQ(s.median_ms, 3);
  EXPECT_DOUBLE_EQ(s.mean_ms, 22);
  EXPECT_DOUBLE_EQ(s.min_ms, 1);
  EXPECT_DOUBLE_EQ(s.max_ms, 100);
  EXPECT_DOUBLE_EQ(s.p90_ms, 4 + 0.6 * 96);    // h = 3.6
  EXPECT_DOUBLE_EQ(s.p95_ms, 4 + 0.8 * 96);    // h = 3.8
  EXPECT_NEAR(s.p99_ms, 4 + 0.96 * 96, 1e-9);  // h = 3.96
  // Sum of squared deviations: 441 + 400 + 361 + 324 + 6084 = 7610; / 4.
  EXPECT_NEAR(s.stddev_ms, std::sqrt(7610.0 / 4), 1e-12);
  EXPECT_NEAR(s.cv, std::sqrt(7610.0 / 4) / 22, 1e-12);
}

TEST(Stats, EvenCountMedianInterpolates) {
  const auto s = compute_stats({2, 8, 4, 6});  // sorted 2 4 6 8, h(p) = 3p
  EXPECT_DOUBLE_EQ(s.median_ms, 5);            // h = 1.5
  EXPECT_DOUBLE_EQ(s.mean_ms, 5);
  EXPECT_NEAR(s.p90_ms, 6 + 0.7 * 2, 1e-12);  // h = 2.7
  EXPECT_NEAR(s.stddev_ms, std::sqrt(20.0 / 3), 1e-12);
}

TEST(Stats, OneSample) {
  const auto s = compute_stats({7.5});
  EXPECT_EQ(s.n, 1);
  EXPECT_DOUBLE_EQ(s.median_ms, 7.5);
  EXPECT_DOUBLE_EQ(s.p99_ms, 7.5);
  EXPECT_DOUBLE_EQ(s.min_ms, 7.5);
  EXPECT_DOUBLE_EQ(s.stddev_ms, 0);
  EXPECT_DOUBLE_EQ(s.cv, 0);
}

TEST(Stats, PercentilesOfOneToHundredOne) {
  std::vector<double> v;
  for (int i = 1; i <= 101; ++i) v.push_back(i);  // h(p) = 100p lands on integers
  const auto s = compute_stats(v);
  EXPECT_DOUBLE_EQ(s.median_ms, 51);
  EXPECT_DOUBLE_EQ(s.p90_ms, 91);
  EXPECT_DOUBLE_EQ(s.p95_ms, 96);
  EXPECT_DOUBLE_EQ(s.p99_ms, 100);
}

TEST(Stats, RejectsEmptyAndNaN) {
  EXPECT_THROW(compute_stats({}), std::invalid_argument);
  EXPECT_THROW(compute_stats({1, NAN}), std::invalid_argument);
  EXPECT_THROW(honed::median_of({}), std::invalid_argument);
}

TEST(Stats, MedianOf) {
  EXPECT_DOUBLE_EQ(honed::median_of({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(honed::median_of({4, 1, 3, 2}), 2.5);
}

namespace {
// n samples around `center` with a small deterministic spread of +-2 %.
std::vector<double> near(double center, int n = 40) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(center * (1.0 + 0.02 * ((i % 5) - 2) / 2.0));
  return v;
}
}  // namespace

TEST(Compare, ClearlyFaster) {
  const auto r = compare(near(1.0), near(2.0));
  EXPECT_NEAR(r.ratio, 0.5, 1e-12);
  EXPECT_LT(r.hi, 1.0);
  EXPECT_LE(r.lo, r.ratio);
  EXPECT_GE(r.hi, r.ratio);
  EXPECT_EQ(r.verdict, -1);
}

TEST(Compare, ClearlySlower) {
  const auto r = compare(near(3.0), near(2.0));
  EXPECT_NEAR(r.ratio, 1.5, 1e-12);
  EXPECT_GT(r.lo, 1.0);
  EXPECT_EQ(r.verdict, 1);
}

TEST(Compare, TieWithinNoise) {
  // Two noisy sets, medians 1 % apart, spread +-30 %: the interval must contain 1.
  std::vector<double> a, b;
  for (int i = 0; i < 30; ++i) {
    a.push_back(1.00 + 0.3 * ((i * 7) % 11 - 5) / 5.0);
    b.push_back(1.01 + 0.3 * ((i * 5) % 11 - 5) / 5.0);
  }
  const auto r = compare(a, b);
  EXPECT_LT(r.lo, 1.0);
  EXPECT_GT(r.hi, 1.0);
  EXPECT_EQ(r.verdict, 0);
}

TEST(Compare, DeterministicForASeed) {
  std::vector<double> a, b;
  for (int i = 0; i < 25; ++i) {
    a.push_back(1.0 + 0.01 * ((i * 13) % 17));
    b.push_back(1.05 + 0.01 * ((i * 7) % 19));
  }
  const auto r1 = compare(a, b, 500, 0.9, 7);
  const auto r2 = compare(a, b, 500, 0.9, 7);
  EXPECT_EQ(r1.lo, r2.lo);
  EXPECT_EQ(r1.hi, r2.hi);
  const auto r3 = compare(a, b, 500, 0.9, 8);
  EXPECT_TRUE(r3.lo != r1.lo || r3.hi != r1.hi);
}

TEST(Compare, RejectsBadArguments) {
  EXPECT_THROW(compare({}, {1}), std::invalid_argument);
  EXPECT_THROW(compare({1}, {1}, 0), std::invalid_argument);
  EXPECT_THROW(compare({1}, {1}, 10, 1.0), std::invalid_argument);
  EXPECT_THROW(compare({1}, {0, 0}), std::invalid_argument);
}

TEST(Compare, TheStatisticNamedIsCompared) {
  // Same medians (1 ms), but b has one slow call in four: its mean is 1.75 ms, its p95 4 ms.
  const std::vector<double> a = {1, 1, 1, 1, 1, 1, 1, 1};
  const std::vector<double> b = {1, 1, 1, 4, 1, 1, 1, 4};
  EXPECT_DOUBLE_EQ(compare(a, b).ratio, 1.0);
  EXPECT_DOUBLE_EQ(compare(a, b, 200, 0.95, 42, honed::Statistic::mean).ratio, 1.0 / 1.75);
  EXPECT_DOUBLE_EQ(compare(a, b, 200, 0.95, 42, honed::Statistic::p95).ratio, 1.0 / 4.0);
  EXPECT_DOUBLE_EQ(honed::statistic_of(b, honed::Statistic::mean), 1.75);
  EXPECT_EQ(honed::parse_statistic("p95"), honed::Statistic::p95);
  EXPECT_STREQ(honed::statistic_name(honed::Statistic::mean), "mean");
  EXPECT_THROW(honed::parse_statistic("p42"), std::invalid_argument);
}

namespace {
// Twelve rounds of 20 calls of a and of b, measured side by side: 1 ms, or 1.3 ms where that
// block ran in one of the machine's slow stretches (a's in 4 rounds, b's in 2); each call +-1 %.
struct Rounds {
  std::vector<double> a, b;
  std::vector<int64_t> blocks;
};
Rounds stretches(const std::vector<int>& slow_a, const std::vector<int>& slow_b, double b_ms) {
  Rounds r;
  const auto in = [](const std::vector<int>& v, int x) {
    return std::find(v.begin(), v.end(), x) != v.end();
  };
  for (int round = 0; round < 12; ++round) {
    for (int i = 0; i < 20; ++i) {
      const double jitter = 1.0 + 0.01 * ((i * 7) % 5 - 2) / 2.0;
      r.a.push_back((in(slow_a, round) ? 1.3 : 1.0) * jitter);
      r.b.push_back(b_ms * (in(slow_b, round) ? 1.3 : 1.0) * jitter);
    }
    r.blocks.push_back(20);
  }
  return r;
}
}  // namespace

TEST(ComparePaired, SlowStretchesAreRoundsNotIndependentCalls) {
  // The same work; a's blocks drew more slow stretches. Per call, 240 calls look like firm
  // evidence (the mean 4.8 % apart); per round, 12 rounds are not.
  const Rounds r = stretches({0, 3, 7, 9}, {5, 10}, 1.0);
  const auto mean = honed::Statistic::mean;
  EXPECT_EQ(compare(r.a, r.b, 2000, 0.99, 42, mean).verdict, 1);
  const auto paired = honed::compare_paired(r.a, r.blocks, r.b, r.blocks, 2000, 0.99, 42, mean);
  EXPECT_NEAR(paired.ratio, compare(r.a, r.b, 2000, 0.99, 42, mean).ratio, 1e-12);
  EXPECT_EQ(paired.verdict, 0);
  EXPECT_LT(paired.lo, 1.0);
  EXPECT_GT(paired.hi, 1.0);
}

TEST(ComparePaired, AFasterCandidateInEveryRoundIsEvidence) {
  // b is 20 % faster in every round, whatever stretch the round ran in.
  const Rounds r = stretches({0, 3, 7, 9}, {0, 3, 7, 9}, 1.0 / 1.2);
  for (auto stat : {honed::Statistic::median, honed::Statistic::mean}) {
    const auto p = honed::compare_paired(r.a, r.blocks, r.b, r.blocks, 2000, 0.99, 42, stat);
    EXPECT_NEAR(p.ratio, 1.2, 1e-9);
    EXPECT_GT(p.lo, 1.15);
    EXPECT_EQ(p.verdict, 1);
  }
}

TEST(ComparePaired, RejectsBlocksThatDoNotDescribeTheSamples) {
  const std::vector<double> s = {1, 1, 1, 1};
  EXPECT_THROW(honed::compare_paired(s, {2, 2}, s, {4}), std::invalid_argument);
  EXPECT_THROW(honed::compare_paired(s, {2, 1}, s, {2, 1}), std::invalid_argument);
  EXPECT_THROW(honed::compare_paired(s, {}, s, {}), std::invalid_argument);
  EXPECT_THROW(honed::compare_paired(s, {4, 0}, s, {4, 0}), std::invalid_argument);
  EXPECT_THROW(honed::compare_paired({}, {}, s, {4}), std::invalid_argument);
}
