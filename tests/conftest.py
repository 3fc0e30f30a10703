"""tests/conftest.py: shared fixtures: tiny models, fast measurement, one shared Inductor tune."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import honed


class TinyMLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class KwModel(nn.Module):
    """Keyword tensor input, a non-tensor constant and a nested dict/tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, scale: float = 1.0) -> Any:
        y = self.fc(x) * scale + bias
        return {"y": y, "parts": (y.relu(), y.sum(dim=1))}


def batches(*sizes: int, dim: int = 16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, dim, generator=g) for b in sizes]


@pytest.fixture(autouse=True)
def fast_measurement() -> Iterator[None]:
    """Short warm-up and windows: tests check behaviour, never timings."""
    with honed.config.patch(
        warmup_ms=2.0, warmup_calls=2, window_ms=2.0, window_calls=3, max_windows=4
    ):
        yield


@pytest.fixture(scope="session")
def inductor_tuned() -> honed.Module:
    """A TinyMLP tuned once with Inductor on batches 2, 4 and 8 (shared: compiling is slow)."""
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny")
    strategy = honed.OneBackendStrategy(honed.backend.TorchInductorBackend())
    with honed.config.patch(
        warmup_ms=2.0,
        warmup_calls=2,
        window_ms=2.0,
        window_calls=3,
        max_windows=4,
        cache_enabled=False,
    ):
        honed.tune(model, batches(2, 4, 8), strategy=strategy)
    return model


@pytest.fixture(autouse=True)
def in_process() -> Iterator[None]:
    """Tests of the tuner's logic evaluate candidates in-process (fast); the isolation tests
    (tests/test_isolation.py) opt back in to worker processes."""
    with honed.config.patch(isolation="none"):
        yield


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Each test gets its own tuning cache, so no test sees another's outcomes."""
    with honed.config.patch(cache_dir=tmp_path_factory.mktemp("cache")):
        yield
