"""bench/profile/spawn_stall.py: what starting a worker costs a program that holds much memory.

A program of ``--gib`` GiB of touched memory starts ``--workers`` children through honed's
C++ core (``honed._core.Worker``, as a tune's pool does) while one of its threads ticks every
0.2 ms; it prints each start's time in the starting thread and the ticking thread's longest gap
during the starts, against its longest gap while nothing starts. Run it against two builds of
honed to compare how they start children:

    python bench/profile/spawn_stall.py --gib 4 --workers 8
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from honed import _core


def ticker(stop: threading.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        time.sleep(0.0002)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


def longest_gap(seconds: float, during: object = None) -> float:
    stop, gaps = threading.Event(), []
    t = threading.Thread(target=ticker, args=(stop, gaps))
    t.start()
    if callable(during):
        during()
    else:
        time.sleep(seconds)
    stop.set()
    t.join()
    return max(gaps) if gaps else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--gib", type=float, default=4.0, help="memory the program holds, touched")
    p.add_argument("--workers", type=int, default=8)
    args = p.parse_args()
    held = bytearray(int(args.gib * (1 << 30)))
    for i in range(0, len(held), 4096):  # touch every page: the page tables a fork copies
        held[i] = 1
    starts: list[float] = []
    workers = []

    def start_all() -> None:
        for _ in range(args.workers):
            t0 = time.perf_counter()
            workers.append(_core.Worker(_core.IsolateOptions(["sleep", "5"])))
            starts.append(time.perf_counter() - t0)

    quiet = longest_gap(0.5)
    busy = longest_gap(0.0, start_all)
    for w in workers:
        w.stop()
    print(
        f"spawn_stall: {args.gib:g} GiB held, {args.workers} starts: "
        f"median start {statistics.median(starts) * 1e3:.2f} ms, "
        f"slowest {max(starts) * 1e3:.2f} ms; "
        f"longest tick gap {busy * 1e3:.2f} ms during the starts, {quiet * 1e3:.2f} ms while idle"
    )


if __name__ == "__main__":
    main()
