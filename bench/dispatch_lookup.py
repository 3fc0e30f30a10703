"""bench/dispatch_lookup.py: the engine's Dispatcher.lookup cost per call (the signature match that
every call of a tuned honed.Module makes before it runs a variant).

One graph tuned for batches 1-64 of a (B, 3) tensor, looked up with batch 8; the best of a few
timeit repeats, in nanoseconds per call. bench/overhead.py measures the whole call around it.

    python bench/dispatch_lookup.py [--calls 200000] [--repeat 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import timeit
from pathlib import Path

import torch
from provenance import commit  # bench/provenance.py

from honed import _core


def lookup_ns(calls: int, repeat: int) -> float:
    d = _core.Dispatcher()
    d.add(_core.infer_profile([_core.signature((torch.zeros(b, 3),), {}) for b in (1, 64)]), 0)
    args, kwargs = (torch.zeros(8, 3),), {}
    if d.lookup(args, kwargs) != 0:
        raise SystemExit("the dispatcher did not match batch 8 to the graph tuned for 1-64")
    best = min(timeit.repeat(lambda: d.lookup(args, kwargs), number=calls, repeat=repeat))
    return best / calls * 1e9


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    ns = lookup_ns(args.calls, args.repeat)
    print(f"Dispatcher.lookup: {ns:.0f} ns per call (one tensor argument)")
    if args.json:
        record = {
            "bench": "dispatch_lookup",
            "commit": commit(),
            "host": platform.node(),
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "calls": args.calls,
            "ns_per_call": ns,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
