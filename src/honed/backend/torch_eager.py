"""src/honed/backend/torch_eager.py: plain PyTorch eager execution, optionally in other precisions.

The short reference every other backend can be read against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from honed.backend._precision import (
    autocast_wrapper,
    check_config,
    converted,
    memory_format_field,
    precision_field,
    tolerance,
    with_precision,
)
from honed.backend.base import Backend, BackendConfig, GraphInfo, Sample
from honed.pipeline.correctness import Tolerance


@dataclasses.dataclass
class TorchEagerBackendConfig(BackendConfig):
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None
    # fp32, tf32, bf16 or fp16 (bf16/fp16 cast the weights); see backend/_precision.py.
    precision: str = precision_field()
    # None (the module's own) or "channels_last" (image models).
    memory_format: str | None = memory_format_field()

    def __post_init__(self) -> None:
        check_config(
            "TorchEagerBackendConfig",
            self.precision,
            self.memory_format,
            self.autocast_enabled,
            self.autocast_dtype,
        )


class TorchEagerBackend(Backend):
    """Runs the module as it is (the baseline every candidate is compared with)."""

    config_class = TorchEagerBackendConfig
    portability = 0
    keeps_autograd = True  # the module itself: autograd and .train() work as they do
    build_cost = 0
    config: TorchEagerBackendConfig

    @property
    def expected_cost(self) -> float:
        return 0.0

    def tolerance(self) -> Tolerance | None:
        return tolerance(self.config.precision)

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        cfg = self.config
        fn: Callable[..., Any] = converted(
            module, example_inputs, cfg.precision, cfg.memory_format, self.name
        )
        if cfg.autocast_enabled:
            fn = autocast_wrapper(fn, graph.device.type, cfg.autocast_dtype or torch.bfloat16)
        return with_precision(fn, cfg.precision, graph.device)
