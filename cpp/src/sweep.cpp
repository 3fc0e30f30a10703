// cpp/src/sweep.cpp: batch-size sweep: grow by powers of two, stop at plateau, failure or maximum.
#include "honed/sweep.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace honed {

namespace {

// The smallest batch reaching (1 - min_gain) of the best throughput among points.
int64_t knee_of(const std::vector<std::pair<int64_t, double>>& points, double min_gain) {
  if (points.empty()) return 0;
  double best = 0;
  for (const auto& p : points) best = std::max(best, p.second);
  int64_t knee = 0;
  for (const auto& [batch, tp] : points) {
    if (tp >= (1.0 - min_gain) * best && (knee == 0 || batch < knee)) knee = batch;
  }
  return knee;
}

}  // namespace

SweepResult batch_sweep(const std::function<std::optional<double>(int64_t batch)>& throughput_at,
                        int64_t start, int64_t max_batch, double min_gain, int patience) {
  if (start < 1) throw std::invalid_argument("batch_sweep: start must be >= 1");
  if (max_batch < start) throw std::invalid_argument("batch_sweep: max_batch must be >= start");
  if (!(min_gain >= 0)) throw std::invalid_argument("batch_sweep: min_gain must be >= 0");
  if (patience < 1) throw std::invalid_argument("batch_sweep: patience must be >= 1");

  SweepResult r;
  double best = 0;
  int flat_steps = 0;
  for (int64_t batch = start;; batch *= 2) {
    const std::optional<double> tp = throughput_at(batch);
    if (!tp || std::isnan(*tp) || *tp <= 0) {
      r.stop_reason = "failed at batch " + std::to_string(batch) + " (out of memory or error)";
      break;
    }
    r.points.emplace_back(batch, *tp);
    if (r.points.size() > 1) flat_steps = (*tp < best * (1.0 + min_gain)) ? flat_steps + 1 : 0;
    best = std::max(best, *tp);
    if (flat_steps >= patience) {
      r.stop_reason = "plateau: gain under " +
                      std::to_string(static_cast<int>(min_gain * 100 + 0.5)) + "% for " +
                      std::to_string(patience) + " consecutive steps";
      break;
    }
    if (batch > max_batch / 2) {
      r.stop_reason = batch == max_batch
                          ? "max batch reached (" + std::to_string(max_batch) + ")"
                          : "max batch reached (the next, " + std::to_string(batch * 2) +
                                ", would pass " + std::to_string(max_batch) + ")";
      break;
    }
  }
  r.knee = knee_of(r.points, min_gain);
  return r;
}

}  // namespace honed
