"""bench/profile/worker_start.py: what starting JIT's workers costs a GPU program's calls.

The program is a loop of BERT-base b8 eager calls on the main thread, each synchronized and timed
(its start, its time, its time until it returned before the sync, its thread's CPU time). Beside
it, ``--workers`` processes start at once, at JIT's worker niceness and on the CPUs JIT's workers
may use, and do one of:

- ``imports``: what a worker does before it says it is ready (``import torch``, ``torch._dynamo``,
  ``torch._inductor.compile_fx``; honed.pipeline._worker);
- ``cuda``: the same, then a CUDA context (``torch.zeros(1, device="cuda")``), as its first job
  makes one;
- contrasts: ``spin`` (a Python loop for 4 s: a busy core, its caches its own) and ``stream``
  (256 MiB copied over and over for 4 s: memory and the shared cache).

Printed per mode: the program's calls from the start until every process ended plus a second,
against the loop alone: median, slowest, how many over twice the loop's median, and the median
over-2x call's time until it returned and its CPU time (a call that returned late was slow on the
host; one that returned on time waited for the GPU).

    python bench/profile/worker_start.py [--workers 5] [--modes imports cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import torch

# the program's model and the profile's ending, shared with that profile
from beside_stall import _model, end_program, write_json

from honed import config
from honed.pipeline import isolation

_IMPORTS = "import torch, torch._dynamo, torch._inductor.compile_fx\n"
_SNIPPETS = {
    "imports": _IMPORTS,
    "cuda": _IMPORTS + "torch.zeros(1, device='cuda'); torch.cuda.synchronize()\n",
    # contrasts: a core kept busy in its caches, and memory streamed for about as long
    "spin": "import time\nend = time.time() + 4\nwhile time.time() < end: pass\n",
    "stream": "import time, numpy as np\na = np.ones(32 << 20); b = np.empty_like(a)\n"
    "end = time.time() + 4\nwhile time.time() < end: np.copyto(b, a)\n",
}


def _loop(
    model: Any, inputs: dict[str, Any], stop: threading.Event, out: list[tuple[float, ...]]
) -> None:
    with torch.no_grad():
        while not stop.is_set():
            cpu, start = time.thread_time(), time.perf_counter()
            model(**inputs)
            returned = time.perf_counter()
            torch.cuda.synchronize()
            end = time.perf_counter()
            out.append(
                (
                    start,
                    (end - start) * 1e3,
                    (returned - start) * 1e3,
                    (time.thread_time() - cpu) * 1e3,
                )
            )


def _summary(calls: list[tuple[float, ...]], alone_ms: float) -> dict[str, Any]:
    over = [c for c in calls if c[1] > 2 * alone_ms]
    return {
        "calls": len(calls),
        "median_ms": round(statistics.median(c[1] for c in calls), 3),
        "slowest_ms": round(max(c[1] for c in calls), 3),
        "over_2x": len(over),
        "over_2x_returned_ms": round(statistics.median(c[2] for c in over), 3) if over else None,
        "over_2x_cpu_ms": round(statistics.median(c[3] for c in over), 3) if over else None,
    }


def _start_workers(mode: str, n: int) -> float:
    """Start ``n`` processes doing ``mode`` at once; seconds until all ended."""
    with config.patch(worker_spare_cores=config.jit_spare_cores):
        cpus = isolation.worker_cpus()
    prelude = f"import os\nos.nice({config.jit_worker_nice})\n"
    if cpus:
        prelude += f"os.sched_setaffinity(0, {set(cpus)!r})\n"
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", prelude + _SNIPPETS[mode]]) for _ in range(n)]
    for p in procs:
        p.wait()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=5)
    ap.add_argument(
        "--modes", nargs="+", default=["imports", "spin", "stream", "cuda"], choices=list(_SNIPPETS)
    )
    ap.add_argument("--seconds-alone", type=float, default=5.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model, inputs = _model("cuda", small=False)
    calls: list[tuple[float, ...]] = []
    stop = threading.Event()
    program = threading.Thread(target=_loop, args=(model, inputs, stop, calls))
    program.start()
    time.sleep(2.0)  # warm-up
    mark = len(calls)
    time.sleep(args.seconds_alone)
    alone = calls[mark:]
    alone_ms = statistics.median(c[1] for c in alone)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "workers": args.workers,
        "alone": _summary(alone, alone_ms),
    }
    print(f"alone: {json.dumps(result['alone'])}", flush=True)
    try:
        for mode in args.modes:
            mark = len(calls)
            took = _start_workers(mode, args.workers)
            time.sleep(1.0)
            result[mode] = {"processes_s": round(took, 2), **_summary(calls[mark:], alone_ms)}
            print(f"{mode}: {json.dumps(result[mode])}", flush=True)
            time.sleep(1.0)
    finally:
        end_program(stop, program)
    write_json(result, args.json)


if __name__ == "__main__":
    main()
