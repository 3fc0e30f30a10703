"""bench/timing.py: the suite's own timing, outside honed: variants measured round-robin.

Every call is timed by itself (CUDA events and the host clock around one call, waited for), as
honed times a candidate; the variants take turns in blocks (A B C / B C A / ...), so drift of the
GPU clock or a noisy neighbour hits all of them alike.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch

from honed import _core

KEPT_SAMPLES = 300  # latency samples kept per variant for the distribution plots
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
WARMUP_CALLS = 10  # the measurement protocol's warm-up: at least 10 calls and 200 ms
WARMUP_MS = 200.0


def timer(device: torch.device) -> Callable[[Callable[[], Any]], tuple[float, float]]:
    """(device ms, host wall ms) of one call, waited for: CUDA events around it and the host
    clock around the whole (record, call, record, synchronize); on a CPU both are the host clock.

    One call at a time (as a batch-1 request is served) measures the latency honed ranks by;
    back-to-back calls would hide a variant's host overhead behind the previous call's kernels.
    """
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def cuda_call(fn: Callable[[], Any]) -> tuple[float, float]:
            began = time.perf_counter()
            start.record()
            fn()
            end.record()
            end.synchronize()
            wall = (time.perf_counter() - began) * 1e3
            return float(start.elapsed_time(end)), wall

        return cuda_call

    def host_call(fn: Callable[[], Any]) -> tuple[float, float]:
        started = time.perf_counter()
        fn()
        ms = (time.perf_counter() - started) * 1e3
        return ms, ms

    return host_call


def round_robin(
    fns: dict[str, Callable[[], Any]],
    device: torch.device,
    batch: int,
    rounds: int,
    block_ms: float,
    warmup_calls: int = WARMUP_CALLS,
    warmup_ms: float = WARMUP_MS,
) -> dict[str, dict[str, Any]]:
    """Each fn measured in ``rounds`` blocks of single timed calls, the order rotated each round.

    Warm-up: at least ``warmup_calls`` calls and ``warmup_ms`` per fn; each block aims at
    ``block_ms``; every call is one sample. Throughput is the engine's definition: samples (rows
    of the batch) over the host wall time of the calls, what honed's default strategy maximises.
    """
    timed = timer(device)
    per_call: dict[str, float] = {}
    for name, fn in fns.items():
        warm: list[float] = []
        started = time.perf_counter()
        while len(warm) < warmup_calls or (time.perf_counter() - started) * 1e3 < warmup_ms:
            warm.append(timed(fn)[1])
        per_call[name] = sorted(warm)[len(warm) // 2]
    k = {name: max(1, min(500, math.ceil(block_ms / max(t, 1e-3)))) for name, t in per_call.items()}
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for _ in range(k[name]):
                ms, wall = timed(fns[name])
                samples[name].append(ms)
                walls[name].append(wall)
    return {name: _figures(samples[name], walls[name], batch, k[name]) for name in names}


def _figures(samples: list[float], walls: list[float], batch: int, k: int) -> dict[str, Any]:
    stats = _core.stats(samples)
    total_s = sum(walls) / 1e3
    return {
        "median_ms": stats.median_ms,
        "p99_ms": stats.p99_ms,
        "mean_ms": stats.mean_ms,
        "cv": stats.cv,
        "wall_median_ms": _core.stats(walls).median_ms,
        "throughput": batch * len(walls) / total_s if total_s > 0 else None,
        "calls_per_block": k,
        "calls": len(samples),
        "percentiles_ms": percentiles(samples),
        "samples_ms": kept(samples),
    }


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)
    n = len(ordered)
    return {f"p{p}": ordered[min(n - 1, round(p / 100 * (n - 1)))] for p in PERCENTILES}


def kept(samples: list[float], cap: int = KEPT_SAMPLES) -> list[float]:
    """At most ``cap`` samples, evenly strided, for the plots (the JSON stays small)."""
    stride = -(-len(samples) // cap)
    return [round(s, 6) for s in (samples[::stride] if stride > 1 else samples)]
