"""bench/overhead.py: per-call cost of a tuned honed.Module over calling its variant directly.

For a tiny model, the tuned module's call (signature conversion + engine dispatch + the variant)
and a direct call of the same variant are measured interleaved by the engine, one call per sample,
over >= 100k calls each; the added cost is the difference of the medians. Two variants: an
Inductor-compiled one and the plain eager module (where the difference is honed alone).

    python bench/overhead.py [--device cpu|cuda] [--calls 200000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path
from typing import Any

import torch
from provenance import commit  # bench/provenance.py

import honed
from honed import _core
from honed.backend import Backend, TorchInductorBackend


class _Eager(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Any:
        return module


def measure(backend: Backend, device: torch.device, calls: int) -> dict[str, float]:
    model = honed.Module(torch.nn.Linear(8, 8).to(device).eval(), "tiny")
    data = [torch.randn(b, 8, device=device) for b in (1, 2, 4)]
    with honed.config.patch(warmup_ms=5.0, window_ms=5.0, max_windows=3):
        honed.tune(model, data, strategy=honed.OneBackendStrategy(backend))
    assert model.is_tuned, "the variant was not installed"
    variant = model.variants[0].fn
    x = torch.randn(2, 8, device=device)
    rounds = 400
    per_round = max(1, calls // rounds)
    timer = _core.HostTimer()
    with torch.no_grad():
        direct, wrapped = _core.interleaved(
            [lambda: variant(x), lambda: model(x)], timer, rounds, per_round, 1
        )
    return {
        "calls_each": direct.calls,
        "direct_median_us": direct.median_ms * 1e3,
        "honed_median_us": wrapped.median_ms * 1e3,
        "added_us": (wrapped.median_ms - direct.median_ms) * 1e3,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    rows = {
        "eager variant": measure(_Eager(), device, args.calls),
        "inductor variant": measure(TorchInductorBackend(), device, args.calls),
    }
    record = {
        "bench": "overhead",
        "commit": commit(),
        "device": str(device),
        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
        "torch": torch.__version__,
        "honed": honed.__version__,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "results": rows,
    }
    print(f"| variant ({device}) | calls each | direct µs | honed.Module µs | added µs |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['calls_each']:,} | {r['direct_median_us']:.3f} | "
            f"{r['honed_median_us']:.3f} | {r['added_us']:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
