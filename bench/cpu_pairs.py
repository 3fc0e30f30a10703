"""bench/cpu_pairs.py: which of this machine's CPUs slow a thread on another when busy.

The kernel's topology (sysfs) says which logical CPUs share a physical core; a virtual machine
may report every vCPU as a core of its own while the host runs two of them on one core's
hyperthreads. JIT keeps the program's launching thread off its workers' CPUs by that topology
(honed.pipeline.isolation.worker_cpus), so a hidden pairing would put a compile beside the
program's thread anyway.

For each probe CPU, a pure-Python loop pinned there counts its iterations for ``--seconds``:
alone, then with one spinning process pinned to each other CPU in turn, then with every CPU of
a set busy. Each row is the probe's rate over the mean of its rates alone just before and just
after it, so a drift of the host between rows does not read as a neighbour's doing. A hidden
sibling shows as one CPU well below the others.

``--drift S`` first runs the probe alone on every probe CPU at once for S seconds, in slices of
a quarter second: how much a vCPU's speed moves with nothing of this machine's load on it. With
``--load CPUS`` it runs again for S seconds while a process on each of those CPUs alternates a
pure-Python loop with 64 MiB memory copies (a compile's mix of both, roughly): whether JIT's
workers on their own CPUs make the program's CPUs slower in stretches, through the host.

    python3 bench/cpu_pairs.py --probe 0 --probe 7 --drift 20 --out results.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any


def _spin(cpu: int, stop: Any, copies: bool = False) -> None:
    os.sched_setaffinity(0, {cpu})
    block = bytearray(64 << 20) if copies else b""
    while not stop.is_set():
        for _ in range(10000):
            pass
        if copies:
            bytes(block)


def _rate(cpu: int, seconds: float) -> float:
    """Iterations a second of a pure-Python loop on ``cpu`` (this process, pinned there)."""
    os.sched_setaffinity(0, {cpu})
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            pass
        n += 1000
    return n / seconds


def _drift(cpu: int, seconds: float, queue: Any) -> None:
    """Rates of ``cpu``'s probe in quarter-second slices for ``seconds``, onto ``queue``."""
    slices = [_rate(cpu, 0.25) for _ in range(int(seconds * 4))]
    queue.put((cpu, slices))


@contextlib.contextmanager
def _busy(cpus: list[int], copies: bool = False) -> Iterator[None]:
    """A spinning process on each of ``cpus`` while the block runs."""
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    spinners = [ctx.Process(target=_spin, args=(c, stop, copies), daemon=True) for c in cpus]
    for p in spinners:
        p.start()
    time.sleep(0.1)  # the spinners on their CPUs
    try:
        yield
    finally:
        stop.set()
        for p in spinners:
            p.join(2)
            if p.is_alive():
                p.kill()


def _with_busy(probe: int, busy: list[int], seconds: float) -> float:
    with _busy(busy):
        return _rate(probe, seconds)


def neighbours(probe: int, cpus: list[int], seconds: float, sets: list[str]) -> dict[str, Any]:
    """``probe``'s loop rate with each other of ``cpus`` busy, then each of ``sets`` (CPU-set
    strings) busy, each over the mean of its rates alone just before and after it."""
    alone = [_rate(probe, seconds)]
    ratios: dict[str, float] = {}
    busy = {str(cpu): [cpu] for cpu in cpus if cpu != probe}
    busy.update({f"set {s}": sorted(cpu_list(s) - {probe}) for s in sets})
    for name, on in busy.items():
        rate = _with_busy(probe, on, seconds)
        alone.append(_rate(probe, seconds))
        ratios[name] = round(rate / ((alone[-2] + alone[-1]) / 2), 3)
    return {
        "alone_per_s_median": sorted(alone)[len(alone) // 2],
        "alone_spread": round(min(alone) / max(alone), 3),
        "alone": alone,
        "one_busy": {k: v for k, v in ratios.items() if not k.startswith("set ")},
        "sets_busy": {k[4:]: v for k, v in ratios.items() if k.startswith("set ")},
    }


def _drift_all(probes: list[int], seconds: float, what: str = "alone") -> dict[str, Any]:
    """The drift probe on every probe CPU at once."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_drift, args=(cpu, seconds, queue)) for cpu in probes]
    for p in procs:
        p.start()
    series = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    out: dict[str, Any] = {}
    for cpu, slices in sorted(series.items()):
        ordered = sorted(slices)
        median = ordered[len(ordered) // 2]
        top = ordered[int(len(ordered) * 0.9)]  # the CPU at its usual best
        slow = sum(r < 0.7 * top for r in slices) / len(slices)
        out[str(cpu)] = {
            "median_per_s": median,
            "best_per_s": top,
            "min_over_best": round(ordered[0] / top, 3),
            "share_under_70pct_of_best": round(slow, 3),
            "slices_per_s": slices,
        }
        print(
            f"drift, CPU {cpu} {what}: median {median:.3g}/s, 90th percentile {top:.3g}/s, "
            f"slowest {ordered[0] / top:.3f} of it, {slow:.1%} of slices under 70 %",
            flush=True,
        )
    return out


def cpu_list(spec: str) -> set[int]:
    """``0-7,12`` -> {0, ..., 7, 12}; "" -> the empty set (taskset's syntax)."""
    out: set[int] = set()
    for part in filter(None, spec.split(",")):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probe", type=int, action="append", help="probe CPU (repeatable)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=0.5,
        help="each measurement's length (0: the drift probe only)",
    )
    parser.add_argument(
        "--set", action="append", default=[], help="a CPU set to make busy at once (0-7,12)"
    )
    parser.add_argument("--drift", type=float, default=0.0, help="seconds of the drift probe")
    parser.add_argument("--load", default="", help="CPUs loaded in the drift probe's second run")
    parser.add_argument("--out", required=True, help="where the JSON goes")
    args = parser.parse_args()
    allowed = sorted(os.sched_getaffinity(0))
    probes = args.probe or [allowed[0]]
    result: dict[str, Any] = {"cpus": allowed, "seconds": args.seconds, "probes": {}}
    if args.drift > 0:
        result["drift"] = _drift_all(probes, args.drift)
        if args.load:
            with _busy(sorted(cpu_list(args.load)), copies=True):
                result["drift_loaded"] = _drift_all(probes, args.drift, "loaded")
    for probe in probes if args.seconds > 0 else []:
        row = neighbours(probe, allowed, args.seconds, args.set)
        result["probes"][str(probe)] = row
        base, alone, one, sets = (
            row[k] for k in ("alone_per_s_median", "alone", "one_busy", "sets_busy")
        )
        worst = sorted(one.items(), key=lambda kv: kv[1])[:3]
        print(
            f"probe CPU {probe}: alone {base:.3g}/s (spread {min(alone) / max(alone):.3f}); "
            f"slowest with one busy: {worst}; sets: {sets}",
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
