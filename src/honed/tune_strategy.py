"""src/honed/tune_strategy.py: tune strategies, thin over the engine's select functions.

A strategy names the backends to try and how to choose among them; the choosing itself is a
pure C++ function over the candidates' results (status, correctness, figures, memory).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from honed import _core, config
from honed.backend.base import Backend, GraphInfo
from honed.backend.registry import default_backends
from honed.errors import ConfigError


def _check_backends(owner: str, backends: Sequence[Backend] | None) -> list[Backend] | None:
    if backends is None:
        return None
    backends = list(backends)
    for b in backends:
        if not isinstance(b, Backend):
            raise ConfigError(
                f"{owner}: {b!r} is not a backend; pass instances such as "
                "honed.backend.TorchInductorBackend() (did you pass the class instead?)"
            )
    if not backends:
        raise ConfigError(f"{owner}: the backend list is empty; pass at least one backend")
    return backends


def _margin() -> float:
    """honed.config.decision_margin (HONED_DECISION_MARGIN), checked."""
    margin = float(config.decision_margin)
    if not margin >= 0:
        raise ConfigError(
            f"HONED_DECISION_MARGIN (honed.config.decision_margin) must be >= 0, got {margin}; "
            "e.g. 0.02 for a 2 % margin"
        )
    return margin


class TuneStrategy:
    """Base of the strategies: which backends to try, and how the engine picks one."""

    uses_baseline = True  # whether eager competes (and is the fallback)

    def __init__(self, backends: Sequence[Backend] | None = None) -> None:
        self._backends = _check_backends(type(self).__name__, backends)

    @property
    def uses_defaults(self) -> bool:
        """Whether the candidates are honed's defaults (none were given): the planning rules
        that prune defaults apply (honed.pipeline.planning)."""
        return self._backends is None

    def backends(self, device: torch.device, graph: GraphInfo | None = None) -> list[Backend]:
        """The candidates to try on ``device``: the given ones, or every available default
        (fitted to the kind of model when ``graph`` says what its inputs are)."""
        if self._backends is not None:
            return list(self._backends)
        return default_backends(device, graph)

    def select(self, candidates: list[_core.CandidateResult]) -> _core.Decision:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__

    def __repr__(self) -> str:
        return self.describe()


class OneBackendStrategy(TuneStrategy):
    """Use exactly one backend; eager is kept only when it fails."""

    uses_baseline = False

    def __init__(self, backend: Backend) -> None:
        if isinstance(backend, type):
            raise ConfigError(
                f"OneBackendStrategy got the class {backend.__name__}; pass an instance, "
                f"e.g. {backend.__name__}()"
            )
        super().__init__([backend])

    def select(self, candidates: list[_core.CandidateResult]) -> _core.Decision:
        return _core.select_one_backend(candidates)


class FirstWinsStrategy(TuneStrategy):
    """Try backends in order; take the first that is correct and beats eager by min_speedup
    (when not given: honed.config.first_wins_min_speedup, read when the strategy selects)."""

    def __init__(
        self, backends: Sequence[Backend] | None = None, min_speedup: float | None = None
    ) -> None:
        super().__init__(backends)
        if min_speedup is not None and not min_speedup > 0:
            raise ConfigError(f"FirstWinsStrategy: min_speedup must be > 0, got {min_speedup}")
        self._min_speedup = None if min_speedup is None else float(min_speedup)

    @property
    def min_speedup(self) -> float:
        """The factor a candidate must beat eager by: the one given, else the config's."""
        if self._min_speedup is not None:
            return self._min_speedup
        value = float(config.first_wins_min_speedup)
        if not value > 0:
            raise ConfigError(
                "HONED_FIRST_WINS_MIN_SPEEDUP (honed.config.first_wins_min_speedup) must be > 0, "
                f"got {value}; e.g. 1.1 for a 10 % speed-up over eager"
            )
        return value

    def select(self, candidates: list[_core.CandidateResult]) -> _core.Decision:
        return _core.select_first_wins(candidates, self.min_speedup, _margin())


class MaxThroughputStrategy(TuneStrategy):
    """Measure every correct candidate and keep the highest throughput (samples per second);
    a candidate beats a simpler one only with evidence (honed.config.decision_margin)."""

    def select(self, candidates: list[_core.CandidateResult]) -> _core.Decision:
        return _core.select_max_throughput(candidates, _margin())


class MinLatencyStrategy(TuneStrategy):
    """Measure every correct candidate and keep the lowest median latency (with evidence)."""

    def select(self, candidates: list[_core.CandidateResult]) -> _core.Decision:
        return _core.select_min_latency(candidates, _margin())


class LatencyBudgetStrategy(TuneStrategy):
    """The highest throughput among candidates whose tail latency fits the budget."""

    def __init__(self, latency_budget_ms: float, backends: Sequence[Backend] | None = None) -> None:
        super().__init__(backends)
        if latency_budget_ms <= 0:
            raise ConfigError(
                f"LatencyBudgetStrategy: latency_budget_ms must be > 0, got {latency_budget_ms}"
            )
        self.latency_budget_ms = float(latency_budget_ms)

    def select(self, candidates: list[_core.CandidateResult]) -> _core.Decision:
        return _core.select_latency_budget(candidates, self.latency_budget_ms, _margin())

    def describe(self) -> str:
        return f"LatencyBudgetStrategy({self.latency_budget_ms} ms)"


__all__ = [
    "FirstWinsStrategy",
    "LatencyBudgetStrategy",
    "MaxThroughputStrategy",
    "MinLatencyStrategy",
    "OneBackendStrategy",
    "TuneStrategy",
]
