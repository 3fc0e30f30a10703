"""tests/test_core_measure.py: the honed._core measure, select and sweep bindings, end to end."""

from __future__ import annotations

import pytest

from honed import _core


def small_config(**overrides: float) -> _core.MeasureConfig:
    cfg = _core.MeasureConfig(warmup_calls=3, warmup_ms=0, window_calls=4, window_ms=0)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def around(median: float, spread: float = 0.02, n: int = 40) -> list[float]:
    return [median * (1.0 + spread * (((i * 7) % 9) - 4) / 4.0) for i in range(n)]


def measured(
    name: str, portability: int, samples: list[float], **kw: object
) -> _core.CandidateResult:
    return _core.CandidateResult(
        name,
        name,
        True,
        True,
        measurement=_core.Measurement.from_samples(samples),
        portability=portability,
        is_baseline=name == "eager",
        **kw,
    )


# ---- config, stats, compare -----------------------------------------------------------------


def test_config_defaults_and_fields() -> None:
    cfg = _core.MeasureConfig()
    assert (cfg.warmup_calls, cfg.warmup_ms, cfg.window_calls, cfg.window_ms) == (10, 200, 10, 100)
    assert (cfg.stable_windows, cfg.tolerance, cfg.max_windows, cfg.batch_size) == (3, 0.05, 10, 1)
    cfg.max_windows = 4
    cfg.batch_size = 32
    assert (cfg.max_windows, cfg.batch_size) == (4, 32)
    assert _core.MeasureConfig(tolerance=0.1).tolerance == 0.1


def test_stats_hand_computed() -> None:
    s = _core.stats([4.0, 1.0, 100.0, 3.0, 2.0])
    assert s.n == 5
    assert (s.median_ms, s.mean_ms, s.min_ms, s.max_ms) == (3.0, 22.0, 1.0, 100.0)
    assert s.p90_ms == pytest.approx(4 + 0.6 * 96)
    assert s.stddev_ms == pytest.approx((7610 / 4) ** 0.5)
    assert s.to_dict()["p95_ms"] == pytest.approx(4 + 0.8 * 96)
    with pytest.raises(ValueError):
        _core.stats([])


def test_compare_verdicts_and_seed() -> None:
    faster = _core.compare(around(1.0), around(2.0))
    assert faster.verdict == -1
    assert faster.ratio == pytest.approx(0.5)
    assert faster.lo <= faster.ratio <= faster.hi < 1
    assert _core.compare(around(2.0), around(1.0)).verdict == 1
    tie = _core.compare(around(1.0, 0.3), around(1.01, 0.3))
    assert tie.verdict == 0 and tie.lo < 1 < tie.hi
    a, b = around(1.0, 0.2), around(1.05, 0.2)
    r1 = _core.compare(a, b, iterations=300, confidence=0.9, seed=5)
    r2 = _core.compare(a, b, iterations=300, confidence=0.9, seed=5)
    assert (r1.lo, r1.hi) == (r2.lo, r2.hi)


# ---- measure --------------------------------------------------------------------------------


def test_measure_with_injected_timer_is_deterministic() -> None:
    calls = []
    m = _core.measure(
        lambda: calls.append(1), _core.InjectedTimer([2.0]), small_config(batch_size=8)
    )
    assert m.stable and m.windows == 3 and m.calls == 12
    assert len(calls) == 15  # 3 warm-up calls + 12 measured
    assert m.samples_ms == [2.0] * 12
    assert m.median_ms == 2.0 and m.cv == 0.0
    assert m.wall_ms == 24.0
    assert m.throughput == pytest.approx(8 * 12 / 0.024)
    d = m.to_dict()
    assert d["calls"] == 12 and d["stable"] is True and d["host"] is None
    assert d["samples_ms"] == m.samples_ms


def test_measure_unstable_reports_cv() -> None:
    # Windows of 4 calls alternate between medians of 1 and 2 ms; stable_windows=10 keeps the
    # windows at 4 calls (they double only after that many disagreeing windows).
    cfg = small_config(warmup_calls=4, stable_windows=10)
    m = _core.measure(lambda: None, _core.InjectedTimer([1, 1, 1, 1, 2, 2, 2, 2]), cfg)
    assert not m.stable
    assert m.windows == 10 and m.calls == 40
    assert m.cv == pytest.approx(m.stddev_ms / m.mean_ms) and m.cv > 0.3


def test_measure_with_host_timer_is_consistent() -> None:
    syncs = []
    cfg = small_config(warmup_calls=10, warmup_ms=2, window_ms=1)
    m = _core.measure(lambda: sum(range(50)), _core.HostTimer(sync=lambda: syncs.append(1)), cfg)
    assert m.calls >= 3 * cfg.window_calls and m.warmup_calls >= cfg.warmup_calls
    assert len(syncs) == m.calls + m.warmup_calls
    assert 1 <= m.windows <= cfg.max_windows
    assert m.min_ms <= m.median_ms <= m.p90_ms <= m.p95_ms <= m.p99_ms <= m.max_ms
    assert m.wall_ms >= m.windows * cfg.window_ms
    assert m.throughput == pytest.approx(m.calls / (sum(m.samples_ms) / 1000))  # batch 1
    assert len(m.samples_ms) == m.calls
    assert _core.HostTimer().time_ms(lambda: None) >= 0


class Boom(Exception):
    pass


def test_exception_from_fn_propagates_unchanged() -> None:
    count = [0]

    def fn() -> None:
        count[0] += 1
        if count[0] == 5:
            raise Boom("fifth call")

    timer = _core.InjectedTimer([1.0])
    with pytest.raises(Boom, match="fifth call"):
        _core.measure(fn, timer, small_config())
    # The timer is still usable afterwards.
    assert _core.measure(lambda: None, timer, small_config()).calls == 12

    def failing_sync() -> None:
        raise Boom("sync failed")

    with pytest.raises(Boom, match="sync failed"):
        _core.measure(lambda: None, _core.HostTimer(sync=failing_sync), small_config())
    with pytest.raises(ZeroDivisionError):
        _core.interleaved([lambda: None, lambda: 1 / 0], timer, 2, 2)


def test_bad_arguments_raise_value_error() -> None:
    with pytest.raises(ValueError):
        _core.InjectedTimer([])
    with pytest.raises(ValueError):
        _core.measure(lambda: None, _core.InjectedTimer([1.0]), small_config(window_calls=0))


def test_interleaved_order_and_results() -> None:
    order: list[str] = []
    fns = [lambda c=c: order.append(c) for c in "ABC"]
    ms = _core.interleaved(fns, _core.InjectedTimer([1, 2, 3]), 3, 2, batch_size=4)
    assert "".join(order) == "AABBCC" * 4  # warm-up round, then 3 rounds
    assert [m.calls for m in ms] == [6, 6, 6]
    assert ms[0].samples_ms == [1, 2, 1, 2, 1, 2]
    assert all(m.windows == 3 and m.batch_size == 4 for m in ms)
    # The rounds, kept for the decision (compare_paired): round i of each ran beside the others'.
    assert all(m.blocks == [2, 2, 2] for m in ms)
    assert ms[0].run != 0 and ms[0].run == ms[1].run == ms[2].run
    alone = _core.measure(lambda: None, _core.InjectedTimer([1.0]), small_config())
    assert alone.run == 0 and sum(alone.blocks) == alone.calls
    assert len(alone.blocks) == alone.windows


def test_compare_paired_resamples_rounds() -> None:
    # Round i of a beside round i of b: b is 10 % faster in every round, whatever the round's
    # stretch of the machine (1, 2 or 3 ms); the rounds agree, so the interval is narrow.
    a = [float(1 + r % 3) for r in range(12) for _ in range(4)]
    b = [x / 1.1 for x in a]
    r = _core.compare_paired(a, [4] * 12, b, [4] * 12, confidence=0.99, statistic="mean")
    assert r.ratio == pytest.approx(1.1) and r.lo == pytest.approx(1.1) and r.verdict == 1
    with pytest.raises(ValueError, match="same number of blocks"):
        _core.compare_paired(a, [4] * 12, b, [8] * 6)
    with pytest.raises(ValueError, match="do not sum"):
        _core.compare_paired(a, [4] * 11, b, [4] * 11)


def test_from_samples() -> None:
    m = _core.Measurement.from_samples([1.0, 2.0, 3.0], batch_size=4)
    assert m.stable and m.calls == 3 and m.wall_ms == 6.0 and m.median_ms == 2.0
    assert m.throughput == pytest.approx(4 * 3 / 0.006)
    assert m.blocks == [] and m.run == 0
    kept = _core.Measurement.from_samples([1.0, 2.0, 3.0], blocks=[2, 1], run=7)
    assert kept.blocks == [2, 1] and kept.run == 7
    assert kept.to_dict()["blocks"] == [2, 1] and kept.to_dict()["run"] == 7
    with pytest.raises(ValueError, match="sum to the samples"):
        _core.Measurement.from_samples([1.0, 2.0, 3.0], blocks=[2, 2])


def test_cuda_timer_availability_is_consistent() -> None:
    ok, why = _core.cuda_timer_available()
    assert isinstance(ok, bool) and why
    if ok:
        pytest.skip(f"CUDA available: {why}")
    with pytest.raises(RuntimeError, match="CudaEventTimer"):
        _core.CudaEventTimer(0)


# ---- select ---------------------------------------------------------------------------------


def test_candidate_result_fields() -> None:
    c = _core.CandidateResult("inductor", "inductor", False, False, "compile error")
    assert c.measurement is None and c.reason == "compile error" and c.portability == 0
    c.measurement = _core.Measurement.from_samples([1.0])
    assert c.measurement is not None and c.measurement.median_ms == 1.0
    c.measurement = None
    assert c.measurement is None


def test_select_from_python() -> None:
    cands = [
        measured("eager", 0, around(2.0)),
        measured("inductor", 1, around(1.0, 0.3)),
        measured("aot", 2, around(0.99, 0.3)),
        _core.CandidateResult("trt", "trt", False, False, "TensorRT not installed", portability=3),
    ]
    d = _core.select_max_throughput(cands)
    assert d.index == 1, d.reason  # aot is not better with evidence -> the simpler inductor
    assert d.figure == "throughput"
    assert d.reason.startswith("inductor: 2.004x eager throughput (99% CI ")
    assert "not enough evidence: aot " in d.reason
    assert _core.select_min_latency(cands).index == 1
    assert _core.select_first_wins(cands, 1.5).index == 1
    keep = _core.select_first_wins(cands, 3.0)
    assert keep.index == 0 and "baseline kept" in keep.reason
    assert _core.select_latency_budget(cands, 1.5).index == 1
    missed = _core.select_latency_budget(cands, 0.1)
    assert missed.index == 1 and "missed" in missed.reason
    one = _core.select_one_backend([cands[3]])
    assert one.index == -1 and one.reason == "trt failed: TensorRT not installed"


def test_select_all_failed() -> None:
    cands = [
        _core.CandidateResult("eager", "eager", False, False, "oom"),
        _core.CandidateResult("inductor", "inductor", True, False, "max abs err 3"),
    ]
    d = _core.select_max_throughput(cands)
    assert d.index == -1
    failures = "eager: oom; inductor: incorrect: max abs err 3"
    assert d.reason == f"none of 2 candidates passed ({failures})"


# ---- sweep ----------------------------------------------------------------------------------


def test_batch_sweep_plateau_and_oom() -> None:
    table = {1: 100.0, 2: 200.0, 4: 400.0, 8: 800.0, 16: 1600.0, 32: 1632.0, 64: 1664.0}
    s = _core.batch_sweep(lambda b: table[b])
    assert s.knee == 16
    assert s.points == [(b, table[b]) for b in (1, 2, 4, 8, 16, 32, 64)]
    assert "plateau" in s.stop_reason
    oom = _core.batch_sweep(lambda b: None if b >= 8 else float(b), max_batch=64)
    assert oom.knee == 4 and oom.stop_reason == "failed at batch 8 (out of memory or error)"
    top = _core.batch_sweep(lambda b: float(b), start=2, max_batch=16, min_gain=0.05, patience=2)
    assert [b for b, _ in top.points] == [2, 4, 8, 16]
    assert top.stop_reason == "max batch reached (16)"
    with pytest.raises(KeyError):
        _core.batch_sweep(lambda b: table[b * 1000])
