"""src/honed/backend/torch_inductor.py: torch.compile with the Inductor backend.

Config fields follow the seed torch-inductor-backend.txt: fullgraph, dynamic, mode, options,
autocast_enabled, autocast_dtype. ``mode`` and ``options`` together are an error (torch.compile
refuses them too); ``dynamic=None`` turns dynamic kernels on when the tuner found a dynamic axis.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    autocast_wrapper,
)
from honed.errors import ConfigError

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclasses.dataclass
class TorchInductorBackendConfig(BackendConfig):
    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str | None = None
    options: dict[str, Any] | None = None
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.options is not None:
            raise ConfigError(
                "TorchInductorBackendConfig: set either mode or options, not both "
                f"(got mode={self.mode!r} and options={self.options!r}); to combine a mode's "
                "settings with your own, put them all in options (see "
                "torch._inductor.list_mode_options())"
            )
        if self.mode is not None and self.mode not in MODES:
            raise ConfigError(
                f"TorchInductorBackendConfig: unknown mode {self.mode!r}; use one of {MODES}"
            )
        if self.autocast_dtype is not None and self.autocast_dtype not in (
            torch.float16,
            torch.bfloat16,
        ):
            raise ConfigError(
                f"autocast_dtype={self.autocast_dtype} is not supported; use torch.float16 or "
                "torch.bfloat16"
            )


def _inductor_available() -> tuple[bool, str, str]:
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
    except Exception as e:  # an import failure is a reason, not a crash
        return False, f"torch._dynamo cannot be imported: {e}", "reinstall torch"
    try:
        supported = bool(is_dynamo_supported())
    except Exception as e:
        return False, f"torch.compile is not supported here: {e}", "use a supported Python/torch"
    if not supported:
        return False, "torch.compile does not support this Python/torch", "use a supported Python"
    return True, "", ""


def _cpu_compiler() -> str | None:
    import os
    import shutil

    for cxx in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def cpu_available() -> Availability:
    """Inductor's CPU kernels are C++: a compiler must be on PATH."""
    if _cpu_compiler() is None:
        return Availability(
            False,
            "Inductor generates C++ for CPU and no C++ compiler was found",
            "install one (apt-get install g++) or set CXX",
        )
    return Availability(True)


class TorchInductorBackend(Backend):
    """Compiles the module with torch.compile(backend="inductor")."""

    config_class = TorchInductorBackendConfig
    portability = 1
    jit = True
    config: TorchInductorBackendConfig

    @classmethod
    def available(cls) -> Availability:
        ok, reason, fix = _inductor_available()
        return Availability(ok, reason, fix)

    def expected_build_cost(self) -> int:
        return 3 if (self.config.mode or "").startswith("max-autotune") else 2

    def build_identity(self, graph: GraphInfo) -> dict[str, Any]:
        # dynamic=None means dynamic exactly when the graph has a dynamic axis.
        recipe = self.recipe()
        if recipe["config"]["dynamic"] is None:
            recipe["config"]["dynamic"] = graph.has_dynamic_axes
        return recipe

    @property
    def uses_cudagraphs(self) -> bool:
        """Whether this config replays CUDA graphs (their outputs live in reused buffers)."""
        cfg = self.config
        if cfg.mode in ("reduce-overhead", "max-autotune"):
            return True
        return bool((cfg.options or {}).get("triton.cudagraphs", False))

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        cfg = self.config
        dynamic = cfg.dynamic
        if dynamic is None and graph.has_dynamic_axes:
            dynamic = True
        kwargs: dict[str, Any] = {"backend": "inductor", "fullgraph": cfg.fullgraph}
        kwargs["dynamic"] = dynamic
        if cfg.mode is not None:
            kwargs["mode"] = cfg.mode
        if cfg.options is not None:
            kwargs["options"] = dict(cfg.options)
        compiled: Callable[..., Any] = torch.compile(module, **kwargs)
        if graph.device.type == "cuda" and self.uses_cudagraphs:
            compiled = _owned_outputs(compiled)
        if cfg.autocast_enabled:
            dtype = cfg.autocast_dtype or torch.bfloat16
            return autocast_wrapper(compiled, graph.device.type, dtype)
        return compiled


def _owned_outputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """CUDA-graph outputs are overwritten by the next replay; eager callers own theirs.

    Each call starts a new cudagraph step and returns copies, so a caller that keeps an output
    across calls (as eager allows) never reads a buffer the next replay has overwritten.
    """

    def run(*args: Any, **kwargs: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        out = compiled(*args, **kwargs)
        return torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, out)

    return run
