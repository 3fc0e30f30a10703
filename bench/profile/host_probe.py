"""bench/profile/host_probe.py: what the machine does to a program's calls with nothing of honed's.

Three measurements, none of them running honed's tuning:

1. ``alone``: a BERT-base b8 eager loop (each call synchronized and timed, as in
   bench/jit_bert.py) for ``--seconds``: median, calls over twice the median, the slowest, and the
   gaps between the stalls (runs of calls over 2x): a stall the host makes on a clock shows as one
   gap repeated.
2. ``pairs``: this process pinned to one CPU, the rate of a Python spin loop there while a busy
   process spins on each other CPU in turn (bench/cpu_pairs.py, which also measures how a CPU's
   speed drifts by itself). A CPU whose busy process slows the loop shares its core (a
   hyperthread the virtual machine's topology does not show) or its clock.
3. ``busy``: the BERT loop, unpinned, with a busy process at JIT's worker niceness on every CPU
   JIT's workers may use (``honed.pipeline.isolation.worker_cpus``): its median and its thread's
   CPU time per call against the loop alone. A build's compilers keep those CPUs busy.
4. ``others``: the loop beside processes on those CPUs that stream memory copies (one, and half
   as many as the CPUs), and beside one process keeping the GPU busy with short kernels: what
   sharing the memory bus or the GPU, not a CPU, does to the program's calls.

    python bench/profile/host_probe.py [--device cuda] [--small] [--seconds 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
from beside_stall import _model  # the program's model, shared with that profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import cpu_pairs  # bench/cpu_pairs.py, one folder up

from honed import config
from honed.pipeline import isolation

_SPIN = (
    "import os, sys\n"
    "os.nice(int(sys.argv[2]))\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "while True: pass\n"
)

# A busy process of another kind: "memory" streams 64 MiB copies (the memory bus and the shared
# cache, as a compiler's or a package's large writes); "gpu" keeps the GPU busy with short
# kernels from a CUDA context of its own (as a worker's compile-time benchmarks or its check).
_OTHER = (
    "import os, sys, torch\n"
    "os.nice(int(sys.argv[2]))\n"
    "os.sched_setaffinity(0, {int(sys.argv[1])})\n"
    "torch.set_num_threads(1)\n"
    "if sys.argv[3] == 'memory':\n"
    "    a, b = torch.ones(16 << 20), torch.empty(16 << 20)\n"
    "    while True: b.copy_(a)\n"
    "x = torch.ones(2048, 2048, device='cuda')\n"
    "while True:\n"
    "    for _ in range(20): x @ x\n"
    "    torch.cuda.synchronize()\n"
)


def _loop(model: Any, inputs: dict[str, Any], device: str, seconds: float) -> dict[str, Any]:
    """Calls for ``seconds``: each call's (start s, wall ms, thread CPU ms)."""
    calls: list[tuple[float, float, float]] = []
    origin = time.perf_counter()
    end = origin + seconds
    with torch.no_grad():
        while (start := time.perf_counter()) < end:
            cpu = time.thread_time()
            model(**inputs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            calls.append(
                (
                    start - origin,
                    (time.perf_counter() - start) * 1e3,
                    (time.thread_time() - cpu) * 1e3,
                )
            )
    return {"calls": calls}


def _summary(calls: list[tuple[float, float, float]], reference_ms: float | None) -> dict[str, Any]:
    walls = [c[1] for c in calls]
    median = statistics.median(walls)
    bound = 2 * (reference_ms or median)
    stalls: list[float] = []  # start of each run of calls over 2x
    previous = False
    for at, wall, _ in calls:
        over = wall > bound
        if over and not previous:
            stalls.append(at)
        previous = over
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(stalls)]
    return {
        "calls": len(walls),
        "median_ms": round(median, 3),
        "cpu_median_ms": round(statistics.median(c[2] for c in calls), 3),
        "slowest_ms": round(max(walls), 3),
        "over_2x": sum(w > bound for w in walls),
        "stalls": len(stalls),
        "stall_gap_median_s": round(statistics.median(gaps), 3) if gaps else None,
        "stall_gaps_s": gaps[:40],
    }


def _spinners(cpus: list[int], nice: int) -> list[subprocess.Popen[bytes]]:
    procs = [subprocess.Popen([sys.executable, "-c", _SPIN, str(c), str(nice)]) for c in cpus]
    time.sleep(0.4)  # their interpreters started and spinning
    return procs


def _others(cpus: list[int], nice: int, kind: str) -> list[subprocess.Popen[bytes]]:
    procs = [
        subprocess.Popen([sys.executable, "-c", _OTHER, str(c), str(nice), kind]) for c in cpus
    ]
    time.sleep(8.0)  # torch imported, CUDA initialised, the loops running
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def _pairs(seconds: float) -> dict[str, Any]:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return {"skipped": "one CPU"}
    here = cpus[0]
    before = os.sched_getaffinity(0)
    try:
        row = cpu_pairs.neighbours(here, cpus, seconds, [])
    finally:
        os.sched_setaffinity(0, before)
    beside = row["one_busy"]
    return {
        "cpu": here,
        "rate_alone": round(row["alone_per_s_median"]),
        "rate_beside": beside,  # over the rate alone just before and after each
        "slowest_beside": min(beside, key=beside.__getitem__),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="a small BERT (the CPU machine)")
    ap.add_argument(
        "--seconds", type=float, default=15.0, help="the loop alone, and beside busy CPUs"
    )
    ap.add_argument("--pair-seconds", type=float, default=0.4, help="each spin-rate measurement")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model, inputs = _model(args.device, args.small)
    _loop(model, inputs, args.device, 2.0)  # warm-up: kernels loaded, allocator filled
    alone = _summary(_loop(model, inputs, args.device, args.seconds)["calls"], None)
    print(f"alone: {json.dumps(alone)}", flush=True)
    pairs = _pairs(args.pair_seconds)
    print(f"pairs: {json.dumps(pairs)}", flush=True)
    with config.patch(worker_spare_cores=config.jit_spare_cores):
        cpus = isolation.worker_cpus() or []
    procs = _spinners(cpus, config.jit_worker_nice)
    try:
        busy = _summary(
            _loop(model, inputs, args.device, args.seconds)["calls"], alone["median_ms"]
        )
    finally:
        _stop(procs)
    busy["busy_cpus"] = cpus
    print(f"busy: {json.dumps(busy)}", flush=True)
    others: dict[str, Any] = {}
    kinds = ["memory"] + (["gpu"] if args.device.startswith("cuda") else [])
    for kind, n in [(k, n) for k in kinds for n in (1, len(cpus) // 2)]:
        if n < 1 or (kind == "gpu" and n > 1):
            continue  # one process of GPU work is a worker's share
        procs = _others(cpus[:n], config.jit_worker_nice, kind)
        try:
            others[f"{kind} x{n}"] = _summary(
                _loop(model, inputs, args.device, args.seconds / 2)["calls"], alone["median_ms"]
            )
        finally:
            _stop(procs)
        print(f"{kind} x{n}: {json.dumps(others[f'{kind} x{n}'])}", flush=True)
    again = _summary(
        _loop(model, inputs, args.device, args.seconds / 2)["calls"], alone["median_ms"]
    )
    print(f"alone again: {json.dumps(again)}", flush=True)
    result = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "logical_cpus": len(os.sched_getaffinity(0)),
        "alone": alone,
        "pairs": pairs,
        "busy": busy,
        "others": others,
        "alone_again": again,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
