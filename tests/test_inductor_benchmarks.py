"""tests/test_inductor_benchmarks.py: JIT's workers cap Inductor's GPU kernel benchmarks.

Beside a program the GPU shares its time between the program's process and a worker's, so a
compile's back-to-back benchmarks (25 ms per kernel configuration by default) hold the program's
calls up; JIT's workers run each for about ``HONED_JIT_BENCHMARK_MS`` instead."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import honed
from honed.backend import Backend
from honed.backend._inductor_env import cap_gpu_benchmarks


class FakeBenchmarker:
    """Takes settings as torch's benchmarkers do (keywords), and records them."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def benchmark_gpu(self, _callable: Callable[[], Any], **kwargs: Any) -> float:
        self.seen.append(kwargs)
        _callable()
        return 1.0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeBenchmarker]:
    from torch._inductor.runtime import benchmarking

    bench = FakeBenchmarker()
    monkeypatch.setattr(benchmarking, "benchmarker", bench)
    yield bench


def test_each_benchmark_runs_at_most_the_time_given(fake: FakeBenchmarker) -> None:
    cap_gpu_benchmarks(2.0)
    cap_gpu_benchmarks(2.0)  # twice: still one cap over the original, not a cap of a cap
    assert fake.benchmark_gpu(lambda: None, rep=40) == 1.0
    assert fake.seen == [
        {"rep": 2.0, "max_benchmark_duration": 2.0, "memory_warmup_iters": 10, "warmup": 2.0}
    ]
    fake.benchmark_gpu(lambda: None, rep=1, max_benchmark_duration=0.5)
    assert fake.seen[1]["rep"] == 1 and fake.seen[1]["max_benchmark_duration"] == 0.5


def test_zero_leaves_inductors_benchmarks_alone(fake: FakeBenchmarker) -> None:
    cap_gpu_benchmarks(0.0)
    fake.benchmark_gpu(lambda: None, rep=40)
    assert fake.seen == [{"rep": 40}]


def test_jits_workers_get_the_cap_and_a_tunes_do_not() -> None:
    from honed.jit.tuner import _jit_flags

    assert honed.config.worker_benchmark_ms == 0.0  # honed.tune's workers: Inductor's own
    with _jit_flags():
        assert honed.config.worker_benchmark_ms == honed.config.jit_benchmark_ms > 0


@pytest.mark.gpu
def test_torchs_own_benchmarker_runs_a_slow_kernel_fewer_times_when_capped() -> None:
    """Counted, not timed: a callable of about 1 ms runs a fixed few times for estimation,
    then as often as fits in the benchmark's time."""
    from torch._inductor.runtime import benchmarking

    bench = benchmarking.benchmarker
    cycles = 1_000_000  # about 0.5-1 ms at a GPU's clock

    def runs() -> int:
        count = [0]

        def kernel() -> None:
            count[0] += 1
            torch.cuda._sleep(cycles)

        bench.benchmark_gpu(kernel, is_vetted_benchmarking=True)
        return count[0]

    uncapped = runs()
    cap_gpu_benchmarks(2.0)
    try:
        capped = runs()
    finally:
        del bench.benchmark_gpu, bench._honed_uncapped  # the class's method again
    assert capped < uncapped


class SaysIfCapped(Backend):
    """Its build (in a worker) fails unless the worker's GPU benchmarks are capped."""

    def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._inductor.runtime import benchmarking

        if not hasattr(benchmarking.benchmarker, "_honed_uncapped"):
            raise RuntimeError("this worker's GPU benchmarks are not capped")
        return module


@pytest.mark.integration
@pytest.mark.parametrize("ms", [2.0, 0.0])
def test_a_worker_caps_its_benchmarks_as_its_pool_says(ms: float) -> None:
    from honed.pipeline.isolation import GraphJobs, new_pool
    from test_pool import graph_fields

    graph = GraphJobs(graph_fields("cpu"), "cpu")
    with honed.config.patch(worker_benchmark_ms=ms), new_pool(1) as pool:
        result = graph.evaluate(pool, SaysIfCapped(), False).result(timeout=600)
    outcome = result.reply["outcome"]
    if ms:
        assert outcome["status"] == "ok", outcome
    else:
        assert outcome["status"] == "failed" and "not capped" in outcome["reason"], outcome
