// cpp/bindings/bind_select.cpp: honed._core bindings of candidates, decisions and strategies.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "honed/select.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace honed::py {

void bind_select(nb::module_& m) {
  using C = CandidateResult;
  nb::class_<C>(m, "CandidateResult")
      .def(
          "__init__",
          [](C* self, std::string name, std::string backend, bool ok, bool correct,
             std::string reason, std::optional<Measurement> measurement, int64_t memory_bytes,
             int portability, bool is_baseline, bool tried) {
            new (self) C{std::move(name),
                         std::move(backend),
                         ok,
                         correct,
                         std::move(reason),
                         measurement.has_value(),
                         measurement.value_or(Measurement{}),
                         memory_bytes,
                         portability,
                         is_baseline,
                         tried};
          },
          "name"_a, "backend"_a, "ok"_a, "correct"_a, "reason"_a = "",
          "measurement"_a.none() = nb::none(), "memory_bytes"_a = 0, "portability"_a = 0,
          "is_baseline"_a = false, "tried"_a = true)
      .def_rw("name", &C::name)
      .def_rw("backend", &C::backend)
      .def_rw("ok", &C::ok)
      .def_rw("correct", &C::correct)
      .def_rw("reason", &C::reason)
      .def_rw("tried", &C::tried)
      .def_prop_rw(
          "measurement",
          [](const C& c) {
            return c.has_measurement ? std::optional<Measurement>(c.measurement) : std::nullopt;
          },
          [](C& c, std::optional<Measurement> value) {
            c.has_measurement = value.has_value();
            c.measurement = value.value_or(Measurement{});
          },
          nb::arg("value").none())
      .def_rw("memory_bytes", &C::memory_bytes)
      .def_rw("portability", &C::portability)
      .def_rw("is_baseline", &C::is_baseline);

  nb::class_<Decision>(m, "Decision")
      .def_ro("index", &Decision::index)
      .def_ro("reason", &Decision::reason)
      .def_ro("figure", &Decision::figure)
      .def("__repr__", [](const Decision& d) {
        return "Decision(index=" + std::to_string(d.index) +
               ", reason=" + nb::repr(nb::cast(d.reason)).c_str() + ")";
      });

  // Selections bootstrap thousands of resamples: without the GIL, so a program's calls beside a
  // tune (JIT mode) go on meanwhile. The candidates are copied into C++ first.
  m.def("select_one_backend", &select_one_backend, "cands"_a, release_gil());
  const double margin = kDefaultDecisionMargin;
  m.attr("DEFAULT_DECISION_MARGIN") = margin;
  m.attr("MIN_PAIRED_ROUNDS") = kMinPairedRounds;
  m.def("select_first_wins", &select_first_wins, "cands"_a, "min_speedup"_a, "margin"_a = margin,
        release_gil());
  m.def("select_max_throughput", &select_max_throughput, "cands"_a, "margin"_a = margin,
        release_gil());
  m.def("select_min_latency", &select_min_latency, "cands"_a, "margin"_a = margin, release_gil());
  m.def("select_latency_budget", &select_latency_budget, "cands"_a, "budget_ms"_a,
        "margin"_a = margin, release_gil());
}

}  // namespace honed::py
