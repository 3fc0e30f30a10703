// cpp/tests/test_sweep.cpp: batch sweep: knee at a plateau, stop on failure, stop at the maximum.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <stdexcept>
#include <vector>

#include "honed/sweep.h"

using honed::batch_sweep;

TEST(Sweep, KneeAtPlateau) {
  // Throughput doubles up to 16, then creeps up by 2 % a step.
  const std::map<int64_t, double> tp = {{1, 100},   {2, 200},   {4, 400},   {8, 800},
                                        {16, 1600}, {32, 1632}, {64, 1664}, {128, 1700}};
  std::vector<int64_t> tried;
  const auto r = batch_sweep([&](int64_t b) -> std::optional<double> {
    tried.push_back(b);
    return tp.at(b);
  });
  EXPECT_EQ(tried, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));  // patience 2: stops after 64
  EXPECT_EQ(r.points.size(), 7u);
  EXPECT_EQ(r.points[4], (std::pair<int64_t, double>{16, 1600}));
  EXPECT_EQ(r.knee, 16);  // 1600 >= 0.95 * 1664
  EXPECT_NE(r.stop_reason.find("plateau"), std::string::npos);
}

TEST(Sweep, PatienceResetsWhenGainReturns) {
  // 4 -> 8 flat, 8 -> 16 big gain again, then flat twice.
  const std::map<int64_t, double> tp = {{1, 10},  {2, 20},  {4, 40}, {8, 41},
                                        {16, 80}, {32, 81}, {64, 82}};
  const auto r = batch_sweep([&](int64_t b) -> std::optional<double> { return tp.at(b); });
  EXPECT_EQ(r.points.back().first, 64);
  EXPECT_EQ(r.knee, 16);
}

TEST(Sweep, StopsOnOutOfMemory) {
  const auto r = batch_sweep([](int64_t b) -> std::optional<double> {
    if (b >= 32) return std::nullopt;
    return 100.0 * static_cast<double>(b);
  });
  ASSERT_EQ(r.points.size(), 5u);  // 1 .. 16
  EXPECT_EQ(r.points.back().first, 16);
  EXPECT_EQ(r.knee, 16);
  EXPECT_EQ(r.stop_reason, "failed at batch 32 (out of memory or error)");
}

TEST(Sweep, FirstBatchFails) {
  const auto r = batch_sweep([](int64_t) -> std::optional<double> { return std::nullopt; });
  EXPECT_TRUE(r.points.empty());
  EXPECT_EQ(r.knee, 0);
}

TEST(Sweep, StopsAtMaxBatch) {
  std::vector<int64_t> tried;
  const auto r = batch_sweep(
      [&](int64_t b) -> std::optional<double> {
        tried.push_back(b);
        return static_cast<double>(b);
      },
      2, 64);
  EXPECT_EQ(tried, (std::vector<int64_t>{2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(r.knee, 64);
  EXPECT_EQ(r.stop_reason, "max batch reached (64)");

  tried.clear();
  const auto r2 = batch_sweep(
      [&](int64_t b) -> std::optional<double> {
        tried.push_back(b);
        return static_cast<double>(b);
      },
      1, 100);
  EXPECT_EQ(tried.back(), 64);  // 128 would pass 100
  EXPECT_NE(r2.stop_reason.find("would pass 100"), std::string::npos);
}

TEST(Sweep, RejectsBadArguments) {
  const auto f = [](int64_t) -> std::optional<double> { return 1.0; };
  EXPECT_THROW(batch_sweep(f, 0), std::invalid_argument);
  EXPECT_THROW(batch_sweep(f, 8, 4), std::invalid_argument);
  EXPECT_THROW(batch_sweep(f, 1, 8, 0.05, 0), std::invalid_argument);
}
