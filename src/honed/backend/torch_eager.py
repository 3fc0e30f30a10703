"""src/honed/backend/torch_eager.py: plain PyTorch eager execution, optionally under autocast.

The short reference every other backend can be read against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from honed.backend.base import Backend, BackendConfig, GraphInfo, Sample, autocast_wrapper
from honed.errors import ConfigError

_AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass
class TorchEagerBackendConfig(BackendConfig):
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.autocast_dtype is not None and self.autocast_dtype not in _AUTOCAST_DTYPES:
            raise ConfigError(
                f"autocast_dtype={self.autocast_dtype} is not supported; use torch.float16 or "
                "torch.bfloat16"
            )


class TorchEagerBackend(Backend):
    """Runs the module as it is (the baseline every candidate is compared with)."""

    config_class = TorchEagerBackendConfig
    portability = 0
    build_cost = 0
    config: TorchEagerBackendConfig

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        if self.config.autocast_enabled:
            dtype = self.config.autocast_dtype or torch.bfloat16
            return autocast_wrapper(module, graph.device.type, dtype)
        return module
