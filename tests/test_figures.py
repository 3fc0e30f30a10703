"""tests/test_figures.py: figures that mean what they say: the batch and label of a graph,
throughput from the measured calls, decisions that need evidence, no unstable cache hits."""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

import honed
from honed import _core
from honed.backend import Backend, Sample
from honed.pipeline import candidate, figures
from honed.pipeline.cache import TuneCache
from honed.report import TuneReport

from conftest import TinyMLP, batches


class SameWork(Backend):
    """A candidate that runs exactly the work eager runs."""

    portability = 1

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


def _tune(samples: Any, timings: dict[str, list[float]], **patch: Any) -> TuneReport:
    torch.manual_seed(0)  # the same weights every time (the cache keys on them)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    with honed.config.patch(injected_latencies=timings, **patch):
        return honed.tune(model, samples, strategy=strategy)


def _rows(report: TuneReport) -> dict[str, Any]:
    return {c.name: c for c in report.graphs[0].candidates}


def test_a_single_sample_is_labelled_by_its_shape_and_counts_its_rows() -> None:
    # One 8x16 tensor: no batch axis can be inferred, so the leading axis stands in for it.
    report = _tune(torch.randn(8, 16), {"TorchEagerBackend": [2.0], "SameWork": [2.0]})
    g = report.graphs[0]
    assert (g.batch_size, g.batch_axis, g.input_shapes) == (8, figures.LEADING, "8x16")
    assert g.title == "m / 8x16"
    eager = _rows(report)["TorchEagerBackend"]
    assert eager.throughput == pytest.approx(8 * 1000 / 2.0)  # 8 samples a 2 ms call, not 500/s
    md = report.to_markdown()
    assert "## m / 8x16" in md and "batch 1" not in md
    assert "batch 8 (no batch axis inferred: the leading axis of the first input)" in md
    assert "m / 8x16" in report.render(width=120)
    assert "m / 8x16" in report.to_html()


def test_graphs_with_a_batch_axis_are_labelled_by_their_measured_shapes() -> None:
    report = _tune(batches(2, 8), {"TorchEagerBackend": [2.0], "SameWork": [2.0]})
    g = report.graphs[0]
    assert (g.batch_size, g.batch_axis, g.title) == (8, figures.INFERRED, "m / 8x16")


def test_throughput_comes_from_the_same_calls_as_the_latencies() -> None:
    # A measurement whose harness clock ran ten times longer than its calls (e.g. a GPU timed by
    # events, or cached figures carrying their wall time): throughput follows the calls.
    m = _core.Measurement.from_samples([1.0] * 10, 8, 100.0)
    assert m.throughput == pytest.approx(8 * 1000 / m.median_ms)  # 8,000/s, not 800/s
    # Real host-clock measurements: exactly batch * 1000 / mean latency of the measured calls.
    x = torch.randn(8, 64)
    cfg = _core.MeasureConfig(
        warmup_calls=3, warmup_ms=0, window_calls=5, window_ms=1, batch_size=8
    )
    real = [_core.measure(lambda: x @ x.T, _core.HostTimer(), cfg)]
    real += _core.interleaved([lambda: x @ x.T, lambda: x.sum()], _core.HostTimer(), 3, 5, 8)
    for m in real:
        assert m.throughput == pytest.approx(8 * 1000 / m.mean_ms, rel=1e-9)


def test_the_speedup_is_on_the_figure_ranked_by() -> None:
    timings = {"TorchEagerBackend": [3.0], "SameWork": [1.0, 1.0, 1.0, 5.0]}  # median 1, mean 2
    windows = dict(warmup_calls=4, window_calls=4, window_ms=1e-6)  # whole cycles per window
    assert _rows(_tune(batches(8), timings, **windows))["SameWork"].speedup == pytest.approx(1.5)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MinLatencyStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    with honed.config.patch(injected_latencies=timings, **windows):
        report = honed.tune(model, batches(8), strategy=strategy)
    assert report.graphs[0].ranked_by == "median latency"
    assert _rows(report)["SameWork"].speedup == pytest.approx(3.0)
    assert "ranked by median latency" in report.to_markdown()


def test_an_interval_that_does_not_clear_the_margin_keeps_the_simpler_candidate() -> None:
    # 1.5 % faster with a tight spread: the 99 % interval excludes 1 but not 1 + 2 %.
    timings = {
        "TorchEagerBackend": [1.000, 1.001, 0.999, 1.0005],
        "SameWork": [0.985, 0.986, 0.984, 0.9855],
    }
    report = _tune(batches(8), timings)
    g = report.graphs[0]
    assert g.selected == "TorchEagerBackend", g.decision
    assert "TorchEagerBackend: baseline kept (throughput 8000 samples/s)" in g.decision
    assert (
        "not enough evidence: SameWork 1.015x TorchEagerBackend throughput (99% CI " in g.decision
    )
    assert ", needs > 1.020x)" in g.decision
    # The margin is a flag: at 0.5 % the same figures are evidence enough.
    report = _tune(batches(8), timings, decision_margin=0.005)
    assert report.graphs[0].selected == "SameWork", report.graphs[0].decision
    with pytest.raises(honed.ConfigError, match="HONED_DECISION_MARGIN"):
        _tune(batches(8), timings, decision_margin=-1.0)


def _loaded_run(rng: random.Random, calls: int = 3000) -> list[float]:
    """Latencies of a 14 ms call on a loaded machine: bursts of lost time slices (3-13x)."""
    out, loaded = [], False
    for _ in range(calls):
        loaded = rng.random() < (0.9 if loaded else 0.05)
        factor = rng.uniform(3, 13) if loaded else 1.0
        out.append(14.0 * factor * rng.uniform(0.98, 1.02))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_an_identical_cost_candidate_under_load_is_never_selected(seed: int) -> None:
    """Each candidate measured at its own time on a machine whose load comes and goes: where
    eager drew the heavier load, the copy of eager looks faster, but never with evidence."""
    rng = random.Random(seed)
    timings = {"TorchEagerBackend": _loaded_run(rng), "SameWork": _loaded_run(rng)}
    report = _tune(batches(8), timings, window_calls=10, window_ms=100.0, max_windows=10)
    g = report.graphs[0]
    assert g.selected == "TorchEagerBackend", g.decision


def test_unstable_measurements_are_never_cached_as_decisions(tmp_path: Any) -> None:
    # SameWork's windows alternate between 1 ms and 2 ms medians: unstable after every window.
    timings = {"TorchEagerBackend": [3.0], "SameWork": [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]}
    first = _tune(batches(8), timings, cache_enabled=True, cache_dir=tmp_path)
    assert _rows(first)["SameWork"].stable is False
    assert first.graphs[0].selected == "TorchEagerBackend"  # an unstable measurement never wins
    assert "but its measurement is unstable (CV " in first.graphs[0].decision
    again = _tune(batches(8), timings, cache_enabled=True, cache_dir=tmp_path)
    rows = _rows(again)
    assert rows["TorchEagerBackend"].cached is True  # stable: reused
    assert rows["SameWork"].cached is False  # unstable: measured again
    cache = TuneCache(tmp_path)
    records = [p for p in cache.dir.rglob("*.json")]
    assert records and all(
        cache.get(p.stem) is None or cache.get(p.stem)["measurement"]["stable"] for p in records
    )


def test_an_unstable_record_slower_at_its_fastest_than_the_best_stable_one_is_reused(
    tmp_path: Any,
) -> None:
    """A warm re-tune measures again only what might win: SameWork's windows swing between 5 and
    10 ms (unstable), but even its fastest call is slower than eager's stable 3 ms."""
    timings = {"TorchEagerBackend": [3.0], "SameWork": [5.0, 5.0, 5.0, 10.0, 10.0, 10.0]}
    first = _tune(batches(8), timings, cache_enabled=True, cache_dir=tmp_path)
    assert _rows(first)["SameWork"].stable is False
    again = _tune(batches(8), timings, cache_enabled=True, cache_dir=tmp_path)
    rows = _rows(again)
    assert rows["TorchEagerBackend"].cached is True
    assert rows["SameWork"].cached is True  # decided without measuring again
    assert rows["SameWork"].stable is False  # and still reported as it was measured
    assert again.graphs[0].selected == "TorchEagerBackend"


def test_finalists_from_the_cache_are_not_measured_again_for_a_fresh_slow_candidate() -> None:
    """A warm re-tune that measures an unstable eager again re-measures the finalists only when
    that eager is one of them: cached finalists already carry interleaved figures."""

    def outcome(ms: float, cached: bool) -> candidate.Outcome:
        m = _core.Measurement.from_samples([ms] * 5, 1, 0.0, 1, True)
        return candidate.Outcome(SameWork(), measurement=m, cached=cached)

    cached = [outcome(ms, True) for ms in (0.7, 0.75, 0.9, 2.0)]
    assert not candidate.needs_interleave([outcome(4.4, False), *cached])  # eager, slowest
    assert candidate.needs_interleave([outcome(0.8, False), *cached])  # fresh, and a finalist
    assert candidate.needs_interleave([outcome(0.1, False), *cached])
    assert not candidate.needs_interleave(cached)


def _spin(seconds: float) -> None:
    """Busy for ``seconds`` (a sleep would wake late on a loaded machine, by a time slice)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class Spinning(TinyMLP):
    """TinyMLP that computes for 1 ms more a call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _spin(0.001)
        return super().forward(x)


class SlowsDown(Backend):
    """The same math without eager's extra millisecond, then its own ``delay_s``: what the
    machine's state does to a candidate between two tunes."""

    portability = 1
    delay_s = 0.0

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        def run(x: torch.Tensor) -> torch.Tensor:
            _spin(SlowsDown.delay_s)
            return module.fc2(torch.relu(module.fc1(x)))

        return run


def test_a_cached_finalist_is_measured_again_beside_a_fresh_eager() -> None:
    """A warm re-tune in this process that measures eager again (its cached figures unstable)
    installs the finalist from the cache and measures it beside eager: never judged on its
    figures of another time."""
    torch.manual_seed(0)
    model = honed.Module(Spinning().eval(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SlowsDown()])
    windows = dict(warmup_calls=2, warmup_ms=2.0, window_calls=3, window_ms=5.0, max_windows=4)
    SlowsDown.delay_s = 0.0
    with honed.config.patch(**windows):
        first = honed.tune(model, batches(8), strategy=strategy)
    # Eager's record as a busy moment leaves it: unstable, so the next tune measures it again.
    # Eager's record is the one with the report's median of eager's calls (on a loaded machine
    # the other candidate's calls can be the slower ones).
    eager_ms = _rows(first)["TorchEagerBackend"].median_ms
    cache = TuneCache(honed.config.cache_dir)
    paths = {p: json.loads(p.read_text()) for p in cache.dir.rglob("*.json")}
    eagers = [
        p for p in paths if statistics.median(paths[p]["measurement"]["samples_ms"]) == eager_ms
    ]
    assert len(eagers) == 1, [
        statistics.median(r["measurement"]["samples_ms"]) for r in paths.values()
    ]
    paths[eagers[0]]["measurement"]["stable"] = False
    eagers[0].write_text(json.dumps(paths[eagers[0]]))

    SlowsDown.delay_s = 0.005  # now 5 ms a call against eager's 1 ms
    with honed.config.patch(**windows):
        again = honed.tune(model, batches(8), strategy=strategy)
    rows = _rows(again)
    assert rows["TorchEagerBackend"].cached is False
    assert rows["SlowsDown"].median_ms is not None and rows["SlowsDown"].median_ms >= 5.0
    assert again.graphs[0].selected == "TorchEagerBackend", again.graphs[0].decision


def test_interleaved_finalists_keep_their_rounds_through_the_cache() -> None:
    """The finalists' figures keep their rounds and their run in the cache, so a re-tune that
    reuses them weighs them round for round, as the tune that measured them did."""
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    windows = dict(warmup_calls=2, warmup_ms=1.0, window_calls=5, window_ms=1.0, max_windows=4)
    with honed.config.patch(**windows):
        honed.tune(model, batches(8), strategy=strategy)
    cache = TuneCache(honed.config.cache_dir)
    figures_of = [cache.get(p.stem, unstable_too=True) for p in cache.dir.rglob("*.json")]
    kept = [r["measurement"] for r in figures_of if r and r.get("measurement")]
    assert len(kept) == 2
    assert kept[0]["run"] != 0 and kept[0]["run"] == kept[1]["run"]
    assert kept[0]["blocks"] == kept[1]["blocks"] and len(kept[0]["blocks"]) >= 12
    for record in kept:
        assert sum(record["blocks"]) == len(record["samples_ms"])
        m = candidate.measurement_from_record(record)
        assert (m.blocks, m.run) == (record["blocks"], record["run"])
    assert candidate.record_problem(
        {"status": "ok", "reason": "", "build_s": 0, "measurement": dict(kept[0], blocks=[1])}
    ).startswith("measurement.blocks must be")
    # A record from before blocks were kept still reads (its calls weighed one by one).
    old = {k: v for k, v in kept[0].items() if k not in ("blocks", "run")}
    assert candidate.measurement_from_record(old).blocks == []


def test_reusable_records() -> None:
    assert figures.reusable({"status": "failed", "measurement": None})
    assert figures.reusable({"status": "ok", "measurement": {"stable": True}})
    assert not figures.reusable({"status": "ok", "measurement": {"stable": False}})
    assert not figures.reusable(None)


@pytest.mark.gpu
def test_on_a_gpu_throughput_follows_the_event_timed_calls(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval().cuda(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    # Short windows and short interleaved rounds (3 calls each, even after the re-measure's
    # retries) keep every call's sample in the report: it thins out lists past 2,000, and a thinned
    # list (always longer than 1,000) would no longer give the same mean.
    monkeypatch.setattr(candidate, "_INTERLEAVED_ROUND_MS", 1e-3)
    windows = dict(window_calls=10, window_ms=1.0, max_windows=10, stable_windows=3)
    with honed.config.patch(**windows):
        report = honed.tune(model, torch.randn(8, 16, device="cuda"), strategy=strategy)
    g = report.graphs[0]
    assert (g.batch_size, g.batch_axis, g.title) == (8, figures.LEADING, "m / 8x16")
    for row in g.candidates:
        assert row.samples_ms and len(row.samples_ms) < 1000, row.name  # every sample kept
        mean = sum(row.samples_ms) / len(row.samples_ms)
        assert row.throughput == pytest.approx(8 * 1000 / mean, rel=1e-9), row.name
    print(report.render(width=160))
