"""bench/multi_gpu.py: a cold default tune on a host with several GPUs, measuring spread over
all of them (HONED_SPREAD_GPUS=1, the default) against the target GPU alone (HONED_SPREAD_GPUS=0).

    python bench/multi_gpu.py --model bert --batch 8 --json results/multi_gpu.json

Each tune is bench/cold.py's "honed" job: a fresh process with empty honed, Inductor and Triton
caches, timed by the wall clock. The two modes alternate (--runs pairs, the first mode of each
pair alternating too), so a drift of the machine does not favour one. Per tune it records the
tune's time, the selection and, per candidate, where its figures were measured (the report's
``measured_on``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from cold import Job, run_jobs  # bench/cold.py
from provenance import commit  # bench/provenance.py

MODES = {"spread": "1", "target only": "0"}


def one_tune(model: str, batch: int, mode: str, work: Path, timeout_s: float) -> dict[str, Any]:
    os.environ["HONED_SPREAD_GPUS"] = MODES[mode]
    job = Job("honed", model, batch, work, [], timeout_s)
    record = run_jobs([job], ["--device", "cuda"])[0]
    out: dict[str, Any] = {"mode": mode, "status": record["status"], "wall_s": record["wall_s"]}
    if record["status"] != "ok":
        out["reason"] = record.get("reason", "")
        return out
    report = record["report"]
    out["tune_s"] = record["tune_s"]
    out["selected"] = next((c["name"] for c in report["candidates"] if c["selected"]), None)
    out["candidates"] = [
        {
            "name": c["name"],
            "status": c["status"],
            "build_s": c.get("build_s"),
            "median_ms": c.get("median_ms"),
            "measured_on": c.get("measured_on", ""),
        }
        for c in report["candidates"]
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="bert")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--runs", type=int, default=1, help="pairs of tunes (one per mode)")
    p.add_argument("--timeout-s", type=float, default=280.0, help="per tune")
    p.add_argument("--first", choices=list(MODES), default="spread", help="the first pair's order")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if len(gpus) < 2:
        print(f"multi_gpu: needs two or more GPUs, this host has {len(gpus)}")
        return 2
    record: dict[str, Any] = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "commit": commit(),
        "gpus": gpus,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "model": args.model,
        "batch": args.batch,
        "tunes": [],
    }
    order = [args.first] + [m for m in MODES if m != args.first]
    with tempfile.TemporaryDirectory(prefix="honed-multi-gpu-") as tmp:
        for run in range(args.runs):
            for mode in order if run % 2 == 0 else order[::-1]:
                work = Path(tmp) / f"{run}-{MODES[mode]}"
                tune = one_tune(args.model, args.batch, mode, work, args.timeout_s)
                record["tunes"].append(tune)
                where = {c["measured_on"] for c in tune.get("candidates", [])}
                print(
                    f"multi_gpu: {args.model} b{args.batch} {mode}: {tune['status']} "
                    f"tune {tune.get('tune_s', float('nan')):.1f} s, selected "
                    f"{tune.get('selected')}, measured on {sorted(where)}",
                    flush=True,
                )
                if args.json:
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(record, indent=1))
    for mode in MODES:
        times = [t["tune_s"] for t in record["tunes"] if t["mode"] == mode and "tune_s" in t]
        if times:
            print(f"multi_gpu: {mode}: median tune {statistics.median(times):.1f} s over {times}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
