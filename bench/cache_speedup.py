"""bench/cache_speedup.py: wall time of a first tune vs a second one with a warm tuning cache.

Each tune runs in a fresh Python process (as a second run of a script would), with the tuning
cache and Inductor's compile cache in a fresh directory, so the first tune starts cold.

    python bench/cache_speedup.py [--device cpu|cuda] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import sys, time, torch, honed
from honed.demo import DemoNet, dataset
device = torch.device(sys.argv[1])
torch.manual_seed(0)
model = honed.Module(DemoNet().to(device).eval(), "demo-net")
started = time.perf_counter()
report = honed.tune(model, dataset(device), device=device)
wall = time.perf_counter() - started
cached = sum(c.cached for g in report.graphs for c in g.candidates)
print(f"RESULT {wall:.3f} {cached} {report.selected()[0]}")
"""


def run_once(device: str, env: dict[str, str]) -> tuple[float, int, str]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, device], env=env, capture_output=True, text=True, check=True
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("RESULT "))
    _, wall, cached, selected = line.split(maxsplit=3)
    return float(wall), int(cached), selected


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="honed-cache-bench-") as tmp:
        env = dict(
            os.environ, HONED_CACHE_DIR=f"{tmp}/honed", TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor"
        )
        started = time.perf_counter()
        first = run_once(args.device, env)
        second = run_once(args.device, env)
        total = time.perf_counter() - started
    record = {
        "bench": "cache_speedup",
        "device": args.device,
        "first_tune_s": first[0],
        "second_tune_s": second[0],
        "speedup": first[0] / second[0],
        "second_cached_candidates": second[1],
        "selected": [first[2], second[2]],
        "total_s": total,
    }
    print("| device | first tune s | second tune s (warm cache) | speed-up | selected |")
    print("|---|---:|---:|---:|---|")
    print(
        f"| {args.device} | {first[0]:.2f} | {second[0]:.2f} | {record['speedup']:.1f}x | "
        f"{first[2]} / {second[2]} |"
    )
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
