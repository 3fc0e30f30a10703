"""scripts/precision_candidates.py: the evidence for the default list's precision candidates.

    python scripts/precision_candidates.py [--rows resnet50:64 bert:8] [--set core|autotune]
                                           [--tiny] [--json FILE]

Per model and batch of bench/models.py: one honed.tune (eager is the baseline) over, with
``--set core``, the previous best kinds of candidate (reduce-overhead and CUDA graphs under bf16
autocast) and the new default ones (reduce-overhead and AOTInductor with bf16 weights, both
also in channels_last for image models); with ``--set autotune``, the proposed ones not in the
default list (max-autotune with CUDA graphs in bf16, AOTInductor bf16 with max-autotune,
reduce-overhead in TF32). Each is behind the correctness gate and measured alike, in one process.
Prints each candidate's status, median latency and speed-up over eager, and which one honed
selected; a new candidate belongs in the default list where it is selected, or within noise of
the best. ``--tiny`` runs test-sized models (a check that the script works, on CPU too).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from models import SPECS  # noqa: E402  (bench/models.py)

import honed  # noqa: E402
from honed.backend import (  # noqa: E402
    Backend,
    CudaGraphsBackend,
    CudaGraphsBackendConfig,
    TorchInductorAotBackend,
    TorchInductorAotBackendConfig,
    TorchInductorBackend,
    TorchInductorBackendConfig,
)


def candidates(image: bool, cuda: bool, kind: str) -> list[Backend]:
    """``core``: the old best kinds and the new default candidates; ``autotune``: the candidates
    proposed but not in the default list (max-autotune with CUDA graphs, AOTInductor
    max-autotune, TF32)."""
    if not cuda:  # the script's own check: one cheap candidate per new axis
        layouts = [None, "channels_last"] if image else [None]
        return [
            TorchInductorBackend(TorchInductorBackendConfig(precision="bf16", memory_format=fmt))
            for fmt in layouts
        ]
    bf16 = torch.bfloat16
    inductor = TorchInductorBackendConfig
    aot = TorchInductorAotBackendConfig
    layout = "channels_last" if image else None
    if kind == "autotune":
        plain = [TorchInductorBackend(inductor(mode="max-autotune", precision="bf16"))]
        return (plain if image else []) + [
            TorchInductorBackend(
                inductor(mode="max-autotune", precision="bf16", memory_format=layout)
            ),
            TorchInductorAotBackend(aot(precision="bf16", memory_format=layout, max_autotune=True)),
            TorchInductorBackend(inductor(mode="reduce-overhead", precision="tf32")),
        ]
    rows: list[Backend] = [
        TorchInductorBackend(
            inductor(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=bf16)
        ),
        CudaGraphsBackend(CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=bf16)),
        TorchInductorBackend(inductor(mode="reduce-overhead", precision="bf16")),
        TorchInductorAotBackend(aot(precision="bf16")),
    ]
    if image:
        rows += [
            TorchInductorBackend(
                inductor(mode="reduce-overhead", precision="bf16", memory_format=layout)
            ),
            TorchInductorAotBackend(aot(precision="bf16", memory_format=layout)),
        ]
    return rows


def run_row(name: str, batch: int, device: torch.device, tiny: bool, kind: str) -> dict[str, Any]:
    spec = SPECS[name]
    model = spec.build(tiny=tiny).to(device)
    x = spec.inputs(model, batch, device)
    image = x.dim() == 4
    module = honed.Module(model, f"{name}-b{batch}")
    strategy = honed.MaxThroughputStrategy(candidates(image, device.type == "cuda", kind))
    started = time.perf_counter()
    report = honed.tune(module, [x], strategy=strategy, device=device.type)
    tuning_s = time.perf_counter() - started
    rows = []
    for graph in report.graphs:
        for c in graph.candidates:
            rows.append(
                {
                    "candidate": c.name,
                    "status": c.status,
                    "reason": c.reason,
                    "median_ms": c.median_ms,
                    "speedup": c.speedup,
                    "selected": c.selected,
                }
            )
    return {"model": name, "batch": batch, "tuning_s": tuning_s, "candidates": rows}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", nargs="+", default=["resnet50:64", "bert:8"])
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--set", choices=["core", "autotune"], default="core", dest="kind")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    device = torch.device(args.device)
    results = []
    for row in args.rows:
        name, batch = row.split(":")
        result = run_row(name, int(batch), device, args.tiny, args.kind)
        results.append(result)
        print(f"\n{name} batch {batch} (tuning {result['tuning_s']:.0f} s)")
        for c in result["candidates"]:
            ms = f"{c['median_ms']:.3f} ms" if c["median_ms"] else "-"
            speedup = f"{c['speedup']:.2f}x" if c["speedup"] else ""
            mark = "  <- selected" if c["selected"] else ""
            why = f"  ({c['reason'][:80]})" if c["status"] != "ok" else ""
            print(f"  {c['status']:8} {ms:>12} {speedup:>7}  {c['candidate']}{mark}{why}")
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
