"""bench/profile/cpu_escape.py: does a thread that leaves a CPU once its calls run slow there
run fewer slow calls than one that stays?

On the H200 host each vCPU runs at one of two speeds by itself, the slow one about half the
fast, for seconds at a time (bench/cpu_pairs.py --drift). The kernel does not move a thread off
a CPU for being slow. Two processes run the same fixed piece of pure Python as "calls" side by
side, each on CPUs of its own: one stays where the kernel puts it, the other, after a call over
``--slow`` times its quickest recent calls, narrows itself to the next CPU of its set. Then they
swap sets, so each policy runs on both. Each reports its calls' median and how many ran over
1.5x and 2x the quickest tenth.

    python3 bench/profile/cpu_escape.py --cpus-a 0-3 --cpus-b 4-7 --seconds 60 --out r.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from cpu_pairs import cpu_list  # bench/cpu_pairs.py, one folder up

_LIBC = ctypes.CDLL(None, use_errno=True)  # sched_getcpu: os has it from Python 3.13 only


def _work(n: int) -> int:
    total = 0
    for i in range(n):
        total += i & 7
    return total


def _run(cpus: list[int], move: bool, seconds: float, slow: float, n: int, queue: Any) -> None:
    os.sched_setaffinity(0, set(cpus))
    times: list[float] = []
    moves = 0
    recent: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        _work(n)
        ms = (time.perf_counter() - t) * 1e3
        times.append(ms)
        recent = [*recent, ms][-200:]
        quick = sorted(recent)[len(recent) // 10]
        if move and len(recent) >= 20 and ms > slow * quick:
            here = _LIBC.sched_getcpu()
            nxt = cpus[(cpus.index(here) + 1) % len(cpus)] if here in cpus else cpus[0]
            os.sched_setaffinity(0, {nxt})
            moves += 1
            recent = []  # the new CPU's pace is its own
    queue.put((move, cpus, times, moves))


def _summary(times: list[float], moves: int) -> dict[str, Any]:
    quick = sorted(times)[len(times) // 10]
    return {
        "calls": len(times),
        "median_ms": round(statistics.median(times), 4),
        "quickest_tenth_ms": round(quick, 4),
        "over_1_5x": sum(t > 1.5 * quick for t in times),
        "over_2x": sum(t > 2 * quick for t in times),
        "moves": moves,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus-a", required=True, help="the first set (0-3)")
    ap.add_argument("--cpus-b", required=True, help="the second set (4-7)")
    ap.add_argument("--seconds", type=float, default=60.0, help="each half")
    ap.add_argument("--slow", type=float, default=1.4, help="a call this much over the quickest")
    ap.add_argument("--work", type=int, default=40000, help="loop iterations a call")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ctx = multiprocessing.get_context("fork")
    sets = (sorted(cpu_list(args.cpus_a)), sorted(cpu_list(args.cpus_b)))
    result: dict[str, Any] = {"halves": []}
    for half, (stay_on, move_on) in enumerate((sets, sets[::-1])):
        queue = ctx.Queue()
        procs = [
            ctx.Process(target=_run, args=(c, m, args.seconds, args.slow, args.work, queue))
            for c, m in ((stay_on, False), (move_on, True))
        ]
        for p in procs:
            p.start()
        got = [queue.get() for _ in procs]
        for p in procs:
            p.join()
        row = {}
        for move, cpus, times, moves in got:
            row["moves" if move else "stays"] = {"cpus": cpus, **_summary(times, moves)}
        result["halves"].append(row)
        print(f"half {half}: {json.dumps(row)}", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
