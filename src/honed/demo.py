"""src/honed/demo.py: `honed demo`: tune a small built-in model and show every candidate.

The model is defined here (no download): a residual MLP block with LayerNorm and GELU, the kind
of pointwise-heavy network where Inductor's fusion shows. The demo tunes it over the backends
available on this machine, prints the comparison, saves the result, loads it into a fresh copy
of the model and shows that the outputs match.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

import honed


class Block(nn.Module):
    """Pre-norm residual MLP block: LayerNorm, Linear, GELU, Linear, add."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))
        return x + y


class DemoNet(nn.Module):
    """A small residual MLP classifier: six blocks of width 64 (about 0.2 M parameters).

    Many small operators per call, so operator fusion and less per-op dispatch show.
    """

    def __init__(self, dim: int = 64, hidden: int = 256, depth: int = 6, classes: int = 16) -> None:
        super().__init__()
        self.dim = dim
        self.blocks = nn.Sequential(*[Block(dim, hidden) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(self.norm(self.blocks(x))), dim=-1)


def dataset(
    device: torch.device, batch_sizes: tuple[int, ...] = (4, 16, 32), dim: int = 64
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(b, dim, generator=g).to(device) for b in batch_sizes]


def entry() -> tuple[nn.Module, list[torch.Tensor]]:
    """The command-line entry point of the docs and tests: ``honed tune honed.demo:entry``.

    A two-block DemoNet (small, so a tune takes seconds) and three batches of it.
    """
    torch.manual_seed(0)
    return DemoNet(depth=2).eval(), dataset(torch.device("cpu"), batch_sizes=(2, 8, 16))


def run(device: str = "cpu", out: Path | None = None) -> int:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # a log or a pipe: do not wrap the table
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        console.print("[red]CUDA was asked for but torch cannot use it here; run `honed doctor`")
        return 2
    torch.manual_seed(0)
    model = honed.Module(DemoNet().to(dev).eval(), "demo-net")
    data = dataset(dev)
    console.print(
        f"honed {honed.__version__}: tuning DemoNet on {dev} "
        f"({len(data)} samples, batch sizes {[int(x.shape[0]) for x in data]})"
    )
    report = honed.tune(model, data, device=dev)
    console.print(report.table())

    path = out or Path(tempfile.mkdtemp(prefix="honed-demo-")) / "demo-net.honed"
    honed.save(model, path)
    console.print(f"saved {path} ({path.stat().st_size / 1e6:.2f} MB)")

    torch.manual_seed(1)  # a fresh copy with different weights: load must bring them back
    fresh = honed.Module(DemoNet().to(dev).eval(), "demo-net")
    honed.load(fresh, path)
    probe = torch.randn(16, 64, device=dev)
    with torch.no_grad():
        expected = model(probe)
        got = fresh(probe)
    diff = float((expected - got).abs().max())
    match = torch.allclose(expected, got, rtol=1e-4, atol=1e-5)
    selected = ", ".join(str(s) for s in report.selected())
    console.print(
        f"loaded into a fresh DemoNet: variant {selected}; max abs difference {diff:.2e} -> "
        + ("[green]outputs match[/green]" if match else "[red]outputs differ[/red]")
    )
    return 0 if match else 1
