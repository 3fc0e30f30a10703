"""src/honed/backend/registry.py: the built-in backends and the default candidate list."""

from __future__ import annotations

import torch

from honed.backend.base import Availability, Backend
from honed.backend.torch_eager import TorchEagerBackend
from honed.backend.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig


def builtin_backends() -> list[type[Backend]]:
    """Every backend class honed ships, available here or not."""
    return [TorchEagerBackend, TorchInductorBackend]


def available_backends() -> dict[str, Availability]:
    """Backend name -> availability (with the reason and fix when unavailable)."""
    return {cls.__name__: cls.available() for cls in builtin_backends()}


def default_backends(device: torch.device) -> list[Backend]:
    """Every available backend with sensible configs for ``device`` (eager first)."""
    candidates: list[Backend] = [TorchInductorBackend(TorchInductorBackendConfig())]
    if device.type == "cuda":
        candidates += [
            TorchInductorBackend(TorchInductorBackendConfig(mode="max-autotune-no-cudagraphs")),
            TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead")),
        ]
    else:
        candidates.append(TorchInductorBackend(TorchInductorBackendConfig(dynamic=False)))
    return [b for b in candidates if type(b).available()]
