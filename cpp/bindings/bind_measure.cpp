// cpp/bindings/bind_measure.cpp: honed._core bindings of measure, stats, compare and batch_sweep.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>

#include "bindings.h"
#include "honed/measure.h"
#include "honed/stats.h"
#include "honed/sweep.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

namespace {

using StrDict = nb::typed<nb::dict, nb::str, nb::any>;  // dict[str, Any] in the stub

StrDict stats_dict(const Stats& s) {
  nb::dict d;
  d["n"] = s.n;
  d["median_ms"] = s.median_ms;
  d["mean_ms"] = s.mean_ms;
  d["min_ms"] = s.min_ms;
  d["max_ms"] = s.max_ms;
  d["p90_ms"] = s.p90_ms;
  d["p95_ms"] = s.p95_ms;
  d["p99_ms"] = s.p99_ms;
  d["stddev_ms"] = s.stddev_ms;
  d["cv"] = s.cv;
  return d;
}

StrDict measurement_dict(const Measurement& m) {
  nb::dict d = stats_dict(m.stats);
  d["throughput"] = m.throughput;
  d["stable"] = m.stable;
  d["windows"] = m.windows;
  d["calls"] = m.calls;
  d["wall_ms"] = m.wall_ms;
  d["batch_size"] = m.batch_size;
  d["warmup_calls"] = m.warmup_calls;
  d["warmup_ms"] = m.warmup_ms;
  d["samples_ms"] = nb::cast(m.samples_ms);
  d["blocks"] = nb::cast(m.blocks);
  d["run"] = m.run;
  d["host"] = m.has_host ? nb::object(stats_dict(m.host_stats)) : nb::none();
  return d;
}

void bind_config(nb::module_& m) {
  const MeasureConfig d;
  nb::class_<MeasureConfig>(m, "MeasureConfig")
      .def(
          "__init__",
          [](MeasureConfig* self, int warmup_calls, double warmup_ms, int window_calls,
             double window_ms, int stable_windows, double tolerance, int max_windows,
             int64_t batch_size) {
            new (self) MeasureConfig{warmup_calls,   warmup_ms, window_calls, window_ms,
                                     stable_windows, tolerance, max_windows,  batch_size};
          },
          nb::kw_only(), "warmup_calls"_a = d.warmup_calls, "warmup_ms"_a = d.warmup_ms,
          "window_calls"_a = d.window_calls, "window_ms"_a = d.window_ms,
          "stable_windows"_a = d.stable_windows, "tolerance"_a = d.tolerance,
          "max_windows"_a = d.max_windows, "batch_size"_a = d.batch_size)
      .def_rw("warmup_calls", &MeasureConfig::warmup_calls)
      .def_rw("warmup_ms", &MeasureConfig::warmup_ms)
      .def_rw("window_calls", &MeasureConfig::window_calls)
      .def_rw("window_ms", &MeasureConfig::window_ms)
      .def_rw("stable_windows", &MeasureConfig::stable_windows)
      .def_rw("tolerance", &MeasureConfig::tolerance)
      .def_rw("max_windows", &MeasureConfig::max_windows)
      .def_rw("batch_size", &MeasureConfig::batch_size);
}

void bind_results(nb::module_& m) {
  nb::class_<Stats>(m, "Stats")
      .def_ro("n", &Stats::n)
      .def_ro("median_ms", &Stats::median_ms)
      .def_ro("mean_ms", &Stats::mean_ms)
      .def_ro("min_ms", &Stats::min_ms)
      .def_ro("max_ms", &Stats::max_ms)
      .def_ro("p90_ms", &Stats::p90_ms)
      .def_ro("p95_ms", &Stats::p95_ms)
      .def_ro("p99_ms", &Stats::p99_ms)
      .def_ro("stddev_ms", &Stats::stddev_ms)
      .def_ro("cv", &Stats::cv)
      .def("to_dict", &stats_dict);

  using M = Measurement;
  nb::class_<M>(m, "Measurement")
      .def_ro("stats", &M::stats)
      .def_prop_ro("median_ms", [](const M& x) { return x.stats.median_ms; })
      .def_prop_ro("mean_ms", [](const M& x) { return x.stats.mean_ms; })
      .def_prop_ro("min_ms", [](const M& x) { return x.stats.min_ms; })
      .def_prop_ro("max_ms", [](const M& x) { return x.stats.max_ms; })
      .def_prop_ro("p90_ms", [](const M& x) { return x.stats.p90_ms; })
      .def_prop_ro("p95_ms", [](const M& x) { return x.stats.p95_ms; })
      .def_prop_ro("p99_ms", [](const M& x) { return x.stats.p99_ms; })
      .def_prop_ro("stddev_ms", [](const M& x) { return x.stats.stddev_ms; })
      .def_prop_ro("cv", [](const M& x) { return x.stats.cv; })
      .def_ro("samples_ms", &M::samples_ms)
      .def_ro("wall_ms", &M::wall_ms)
      .def_ro("calls", &M::calls)
      .def_ro("windows", &M::windows)
      .def_ro("stable", &M::stable)
      .def_ro("throughput", &M::throughput)
      .def_ro("batch_size", &M::batch_size)
      .def_ro("warmup_calls", &M::warmup_calls)
      .def_ro("warmup_ms", &M::warmup_ms)
      .def_ro("blocks", &M::blocks)
      .def_ro("run", &M::run)
      .def_prop_ro(
          "host",
          [](const M& x) { return x.has_host ? std::optional<Stats>(x.host_stats) : std::nullopt; })
      .def("to_dict", &measurement_dict)
      .def_static("from_samples", &measurement_from_samples, "samples_ms"_a, "batch_size"_a = 1,
                  "wall_ms"_a = 0.0, "windows"_a = 1, "stable"_a = true,
                  "blocks"_a = std::vector<int64_t>{}, "run"_a = 0)
      .def("__repr__", [](const M& x) {
        char buf[200];
        std::snprintf(buf, sizeof buf,
                      "Measurement(median_ms=%.4g, p99_ms=%.4g, cv=%.3g, calls=%lld, windows=%d, "
                      "stable=%s, throughput=%.4g)",
                      x.stats.median_ms, x.stats.p99_ms, x.stats.cv,
                      static_cast<long long>(x.calls), x.windows, x.stable ? "True" : "False",
                      x.throughput);
        return std::string(buf);
      });

  nb::class_<RatioInterval>(m, "RatioInterval")
      .def_ro("ratio", &RatioInterval::ratio)
      .def_ro("lo", &RatioInterval::lo)
      .def_ro("hi", &RatioInterval::hi)
      .def_ro("verdict", &RatioInterval::verdict);

  nb::class_<SweepResult>(m, "SweepResult")
      .def_ro("knee", &SweepResult::knee)
      .def_ro("points", &SweepResult::points)
      .def_ro("stop_reason", &SweepResult::stop_reason);
}

void bind_timers(nb::module_& m) {
  nb::class_<Timer>(m, "Timer")
      .def("time_ms", &Timer::time_ms, "fn"_a)
      .def("now_ms", &Timer::now_ms);
  nb::class_<HostTimer, Timer>(m, "HostTimer")
      .def(nb::init<std::function<void()>>(), "sync"_a.none() = nb::none());
  nb::class_<InjectedTimer, Timer>(m, "InjectedTimer")
      .def(nb::init<std::vector<double>>(), "samples_ms"_a);
  nb::class_<CudaEventTimer, Timer>(m, "CudaEventTimer")
      .def(nb::init<uintptr_t>(), "stream"_a)
      .def_prop_ro("backend", &CudaEventTimer::backend);
  m.def("cuda_timer_available", &cuda_timer_available);
}

}  // namespace

void bind_measure(nb::module_& m) {
  bind_config(m);
  bind_results(m);
  bind_timers(m);
  m.def("measure", &measure, "fn"_a, "timer"_a, "cfg"_a = MeasureConfig{});
  // Pure computation on copied samples: without the GIL (a bootstrap takes milliseconds).
  m.def("stats", &compute_stats, "samples_ms"_a, release_gil());
  m.def(
      "compare",
      [](const std::vector<double>& a, const std::vector<double>& b, int iterations,
         double confidence, uint64_t seed, const std::string& statistic) {
        return compare(a, b, iterations, confidence, seed, parse_statistic(statistic));
      },
      "a"_a, "b"_a, "iterations"_a = 2000, "confidence"_a = 0.95, "seed"_a = 42,
      "statistic"_a = "median", release_gil());
  m.def(
      "compare_paired",
      [](const std::vector<double>& a, const std::vector<int64_t>& blocks_a,
         const std::vector<double>& b, const std::vector<int64_t>& blocks_b, int iterations,
         double confidence, uint64_t seed, const std::string& statistic) {
        return compare_paired(a, blocks_a, b, blocks_b, iterations, confidence, seed,
                              parse_statistic(statistic));
      },
      "a"_a, "blocks_a"_a, "b"_a, "blocks_b"_a, "iterations"_a = 2000, "confidence"_a = 0.95,
      "seed"_a = 42, "statistic"_a = "median", release_gil());
  m.def(
      "batch_of",
      [](const std::vector<int>& batch_axes, const std::vector<std::vector<int64_t>>& shapes) {
        const CallBatch b = batch_of(batch_axes, shapes);
        return std::make_pair(b.size, b.source);
      },
      "batch_axes"_a, "shapes"_a);
  m.def("interleaved", &interleaved, "fns"_a, "timer"_a, "rounds"_a, "calls_per_round"_a,
        "batch_size"_a = 1, "tolerance"_a = 0.05);
  m.def("batch_sweep", &batch_sweep, "throughput_at"_a, "start"_a = 1, "max_batch"_a = 1024,
        "min_gain"_a = 0.05, "patience"_a = 2);
}

}  // namespace honed::py
