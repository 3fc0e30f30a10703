"""bench/torchao_schemes.py: every TorchAO scheme this device runs, against Inductor and eager.

    python bench/torchao_schemes.py [--device cuda] [--dim 4096] [--layers 4] [--batches 16 64]
                                    [--json FILE]

An MLP of ``layers`` Linear(dim, dim) layers (fp32 weights, like a user's model) is tuned with
the candidates: Inductor (fp32, and bf16 autocast) and TorchAOBackend for each scheme the device
supports (the others are listed as unavailable with the reason). Prints honed's table: latency,
speed-up over eager, max error and cosine similarity of each quantized candidate.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

import honed
from honed.backend import (
    Backend,
    TorchAOBackend,
    TorchAOBackendConfig,
    TorchInductorBackend,
    TorchInductorBackendConfig,
)
from honed.backend.torchao import SCHEMES


def mlp(dim: int, layers: int) -> nn.Module:
    blocks: list[nn.Module] = []
    for _ in range(layers):
        blocks += [nn.Linear(dim, dim), nn.GELU()]
    return nn.Sequential(*blocks)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    avail = TorchAOBackend.available()
    if not avail:
        print(f"TorchAOBackend unavailable: {avail.reason}; {avail.fix}")
        return 1
    torch.manual_seed(0)
    model = mlp(args.dim, args.layers).to(device).eval()
    backends: list[Backend] = [
        TorchInductorBackend(),
        TorchInductorBackend(
            TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
        ),
    ]
    for scheme in SCHEMES:
        backend = TorchAOBackend(TorchAOBackendConfig(scheme=scheme))
        support = backend.supports(device)
        if support:
            backends.append(backend)
        else:
            print(f"skipping {scheme}: {support.reason}")
    data = [torch.randn(b, args.dim, device=device) for b in args.batches]
    wrapped = honed.Module(model, "mlp")
    started = time.perf_counter()
    report = honed.tune(
        wrapped, data, strategy=honed.MaxThroughputStrategy(backends), device=device
    )
    wall = time.perf_counter() - started
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    import torchao

    print(
        f"MLP {args.layers} x Linear({args.dim}, {args.dim}), batches {args.batches}, {name}, "
        f"torch {torch.__version__}, torchao {torchao.__version__}, tune wall {wall:.1f} s"
    )
    print(report.render(width=220))
    if args.json:
        args.json.write_text(report.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
