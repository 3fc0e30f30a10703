"""bench/profile/figures_gpu.py: the report's figures on a real model: a BERT-base encoder at batch
8 from one sample, tuned with the default candidates; prints the report and checks what it says.

    python bench/profile/figures_gpu.py [--device cuda] [--runs 1] [--out DIR]

Checks (exit 1 when one fails): the graph is titled by its input shapes and counts 8 samples a
call (the leading axis: one sample gives no batch axis); every measured row's throughput is
batch * 1000 / mean latency and within 25 % of batch * 1000 / median for a stable row; the
machine section names the GPU, its clocks and power limit; the decision quotes its figure. The
same tune runs --runs times and the picks are printed (with the busy verdict of each run).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import honed


def encoder(device: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval().to(device)  # random weights: no download
    ids = torch.randint(0, 30000, (8, 128), device=device)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def check(report: honed.report.TuneReport) -> list[str]:
    problems = []
    g = report.graphs[0]
    if g.batch_size != 8 or not g.input_shapes.startswith("8x128"):
        problems.append(f"graph {g.title!r} batch {g.batch_size} ({g.batch_axis})")
    for row in g.candidates:
        if not row.samples_ms or row.throughput is None or row.median_ms is None:
            continue
        mean = sum(row.samples_ms) / len(row.samples_ms)
        if len(row.samples_ms) < 2000 and abs(row.throughput * mean / 8000 - 1) > 1e-6:
            problems.append(f"{row.name}: throughput {row.throughput:.1f} != 8000 / {mean:.4f}")
        ratio = row.throughput * row.median_ms / 8000
        if row.stable and not 0.75 <= ratio <= 1.25:
            problems.append(f"{row.name}: throughput x median / batch = {ratio:.2f}")
    for key in ("gpu", "gpu_driver", "gpu_max_sm_clock_mhz", "gpu_power_limit_w", "gpu_shared"):
        if report.machine.get(key) is None:
            problems.append(f"machine section lacks {key}")
    if g.ranked_by not in g.decision:
        problems.append(f"decision does not quote {g.ranked_by}: {g.decision}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("gpu-out"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    problems, picks = [], []
    for run in range(args.runs):
        model, sample = encoder(args.device)
        module = honed.Module(model, "hf_bert")
        report = honed.tune(module, [sample], cache_dir=args.out / f"cache-{run}")
        print(report.render(width=160))
        picks.append((report.graphs[0].selected, report.busy or "quiet"))
        problems += check(report)
        report.save_html(args.out / f"figures-{run}.html")
        (args.out / f"figures-{run}.json").write_text(report.to_json())
    print(json.dumps(report.machine, indent=2))
    print("picks:", picks)
    for p in problems:
        print("PROBLEM:", p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
