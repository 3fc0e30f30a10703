"""bench/identical_under_load.py: does a loaded machine make identical work look faster?

Tunes a small MLP on the CPU with two candidates that run exactly the same work (eager and a
copy of it), ``--tunes`` times, while ``--hogs-per-cpu`` busy processes per logical CPU take the
cores; each tune in the tune's own process (as the load test, tests/test_machine.py) on an empty
tuning cache. For each tune it records what was selected and why, and, on the finalists'
interleaved figures the tuning cache kept (their rounds and run id included), the 99 % interval
of the ratio of the two, for the mean (what throughput follows) and the median, two ways: a
bootstrap over single calls (``_core.compare``) and one over paired rounds
(``_core.compare_paired``, what the decision uses for figures measured side by side). A claim is
an interval that lies beyond the 2 % decision margin either way: for identical work, noise
produced it.

    python bench/identical_under_load.py --tunes 200 --out load.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from provenance import commit  # bench/provenance.py

import honed
from honed import _core
from honed.backend import Backend, Sample
from honed.pipeline import machine

MARGIN = 1.02
WAYS = ("by_call", "paired")


class SameWork(Backend):
    """A candidate that runs exactly the work eager runs."""

    portability = 1

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Any:
        return module


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).eval()


def _interval(c: Any) -> dict[str, float]:
    return {"ratio": c.ratio, "lo": c.lo, "hi": c.hi}


def _claims(c: Any) -> bool:
    return bool(c.lo > MARGIN or c.hi < 1 / MARGIN)


def one_tune() -> dict[str, Any]:
    """One tune on an empty cache: its pick, its decision, and both bootstraps' intervals."""
    folder = Path(tempfile.mkdtemp(prefix="honed-load-"))
    model = honed.Module(_model(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    g = torch.Generator().manual_seed(0)
    samples = [torch.randn(b, 16, generator=g) for b in (4, 8)]
    with honed.config.patch(isolation="none", cache_dir=folder):
        report = honed.tune(model, samples, strategy=strategy)
    graph = report.graphs[0]
    row: dict[str, Any] = {"selected": graph.selected, "decision": graph.decision}
    kept = [json.loads(p.read_text()).get("measurement") for p in folder.rglob("*.json")]
    kept = [m for m in kept if m and m.get("run")]
    if len(kept) == 2 and kept[0]["run"] == kept[1]["run"]:
        a, b = kept
        row["rounds"] = len(a["blocks"])
        for stat in ("mean", "median"):
            by_call = _core.compare(
                a["samples_ms"], b["samples_ms"], confidence=0.99, statistic=stat
            )
            paired = _core.compare_paired(
                a["samples_ms"], a["blocks"], b["samples_ms"], b["blocks"],
                confidence=0.99, statistic=stat,
            )  # fmt: skip
            row[stat] = {"by_call": _interval(by_call), "paired": _interval(paired)}
            row[stat]["claims"] = {"by_call": _claims(by_call), "paired": _claims(paired)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tunes", type=int, default=100)
    parser.add_argument("--hogs-per-cpu", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    cpus = int(machine.cpu().logical_cpus)
    hog = [sys.executable, "-c", "while True: pass"]
    hogs = [subprocess.Popen(hog) for _ in range(args.hogs_per_cpu * cpus)]
    rows = []
    try:
        time.sleep(2)
        for i in range(args.tunes):
            row = one_tune()
            rows.append(row)
            flag = "" if row["selected"] == "TorchEagerBackend" else f"  <- {row['decision']}"
            print(f"{i}: {row['selected']}{flag}", flush=True)
    finally:
        for h in hogs:
            h.kill()
    judged = [r for r in rows if "mean" in r]
    summary = {
        "tunes": len(rows),
        "not_eager": sum(r["selected"] != "TorchEagerBackend" for r in rows),
        "with_interleaved_figures": len(judged),
        "claims": {
            stat: {way: sum(r[stat]["claims"][way] for r in judged) for way in WAYS}
            for stat in ("mean", "median")
        },
    }
    print(json.dumps(summary, indent=2))
    if args.out is not None:
        payload = {"commit": commit(), "summary": summary, "hogs": len(hogs), "tunes": rows}
        args.out.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
