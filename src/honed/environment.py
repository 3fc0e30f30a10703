"""src/honed/environment.py: the environment fingerprint and the machine section of artifacts.

The fingerprint decides whether an artifact loads here (artifact.py's compatibility rules); the
machine section (machine.describe: CPU model, cores, threads, GPU clocks and power limit, driver,
whether the GPU or the machine was busy) only describes where the figures were measured.
"""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

from honed._version import __version__


def fingerprint(device: torch.device | None = None) -> dict[str, Any]:
    """GPU name and compute capability (when on CUDA), CUDA runtime, torch, python, honed."""
    env: dict[str, Any] = {
        "honed": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "cpu": platform.processor() or platform.machine(),
        "device": str(device) if device is not None else "cpu",
        "gpu": None,
        "compute_capability": None,
    }
    if device is not None and device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        env["gpu"] = props.name
        env["compute_capability"] = f"{props.major}.{props.minor}"
    return env


def machine_section(modules: list[Any], device: torch.device | None) -> dict[str, Any]:
    """The artifact's "machine" section: the one the tune of these modules recorded, else a
    description of this machine now (modules loaded rather than tuned)."""
    for module in modules:
        report = getattr(module, "report", None)
        if report is not None and getattr(report, "machine", None):
            return dict(report.machine)
    from honed.pipeline.machine import describe

    return describe(device)
