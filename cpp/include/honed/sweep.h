// cpp/include/honed/sweep.h: batch-size sweep by powers of two up to the throughput knee.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace honed {

// knee: the smallest batch whose throughput reaches (1 - min_gain) of the best seen (0 when no
// batch ran); points: (batch, throughput) in the order tried; stop_reason: one line, why it
// stopped.
struct SweepResult {
  int64_t knee = 0;
  std::vector<std::pair<int64_t, double>> points;
  std::string stop_reason;
};

// Tries start, 2*start, 4*start, ... (never past max_batch). Stops when the gain over the best
// throughput so far stays under min_gain for `patience` consecutive steps (a plateau), when
// throughput_at returns nullopt or a non-positive / NaN value (out of memory or failure; that batch
// is not a point), or when the next batch would pass max_batch. An exception from throughput_at
// propagates. Throws std::invalid_argument when start < 1, max_batch < start, min_gain < 0 or
// patience < 1.
SweepResult batch_sweep(const std::function<std::optional<double>(int64_t batch)>& throughput_at,
                        int64_t start = 1, int64_t max_batch = 1024, double min_gain = 0.05,
                        int patience = 2);

}  // namespace honed
