"""bench/tune_model.py: tune one of the suite's models (bench/models.py) and print honed's table.

    python bench/tune_model.py [--model bert] [--device cuda] [--batches 8 16]
                               [--candidates quick|default] [--json FILE]

"quick" tries eager, Inductor default and reduce-overhead (fp32 and bf16 autocast), CUDA graphs
(fp32 and bf16) and AOTInductor; "default" is honed's full default list (adds max-autotune).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from models import SPECS

import honed
from honed.backend import (
    Backend,
    CudaGraphsBackend,
    CudaGraphsBackendConfig,
    TorchInductorAotBackend,
    TorchInductorBackend,
    TorchInductorBackendConfig,
)


def quick_candidates(device: torch.device) -> list[Backend]:
    bf16 = {"autocast_enabled": True, "autocast_dtype": torch.bfloat16}
    out: list[Backend] = [TorchInductorBackend()]
    if device.type == "cuda":
        out += [
            TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead")),
            TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead", **bf16)),
            CudaGraphsBackend(),
            CudaGraphsBackend(CudaGraphsBackendConfig(**bf16)),
        ]
    out.append(TorchInductorAotBackend())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="bert", choices=list(SPECS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--candidates", default="quick", choices=["quick", "default"])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    spec = SPECS[args.model]
    model = spec.build().to(device)
    params = sum(p.numel() for p in model.parameters())
    wrapped = honed.Module(model, args.model)
    data = [spec.inputs(b, device, seed=i) for i, b in enumerate(args.batches)]
    backends = quick_candidates(device) if args.candidates == "quick" else None
    started = time.perf_counter()
    report = honed.tune(wrapped, data, backends=backends, device=device)
    wall = time.perf_counter() - started
    print(
        f"{spec.title} ({params / 1e6:.1f} M parameters), "
        f"batches {args.batches}, {device}, tune wall {wall:.1f} s"
    )
    print(report.render(width=200))
    if args.json:
        args.json.write_text(report.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
