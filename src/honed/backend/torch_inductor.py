"""src/honed/backend/torch_inductor.py: torch.compile with the Inductor backend.

Config fields follow the seed torch-inductor-backend.txt: fullgraph, dynamic, mode, options,
autocast_enabled, autocast_dtype. ``mode`` and ``options`` together are an error (torch.compile
refuses them too); ``dynamic=None`` turns dynamic kernels on when the tuner found a dynamic axis.
Beyond the seed: ``precision`` and ``memory_format`` (see _precision.py), and two Inductor
settings worth a candidate of their own, ``coordinate_descent_tuning`` (tunes each Triton
kernel's launch parameters further) and ``freezing`` (folds the weights in as constants, which
lets Inductor pre-pack them and fold more; inference only, as honed runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from honed.backend._inductor_env import inductor_available
from honed.backend._precision import (
    autocast_wrapper,
    check_config,
    converted,
    flag_field,
    memory_format_field,
    precision_field,
    tolerance,
    with_precision,
)
from honed.backend.base import Availability, Backend, BackendConfig, GraphInfo, Sample
from honed.errors import ConfigError
from honed.pipeline.correctness import Tolerance

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclasses.dataclass
class TorchInductorBackendConfig(BackendConfig):
    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str | None = None
    options: dict[str, Any] | None = None
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None
    # fp32, tf32, bf16 or fp16 (bf16/fp16 cast the weights); see backend/_precision.py.
    precision: str = precision_field()
    # None (the module's own) or "channels_last" (image models).
    memory_format: str | None = memory_format_field()
    # Inductor's coordinate_descent_tuning and freezing, added to the mode's or options' settings.
    coordinate_descent_tuning: bool = flag_field("coordinate descent")
    freezing: bool = flag_field("freezing")

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
        check_config(
            "TorchInductorBackendConfig",
            self.precision,
            self.memory_format,
            self.autocast_enabled,
            self.autocast_dtype,
        )

    def compile_settings(self, dynamic: bool | None) -> dict[str, Any]:
        """torch.compile's ``mode``/``options`` keyword arguments for this config."""
        extra = {
            k: True
            for k, on in (
                ("coordinate_descent_tuning", self.coordinate_descent_tuning),
                ("freezing", self.freezing),
            )
            if on
        }
        if not extra:
            if self.mode is not None:
                return {"mode": self.mode}
            return {"options": dict(self.options)} if self.options is not None else {}
        # torch.compile takes a mode or options: a mode's settings become options here.
        from torch._inductor import list_mode_options

        if self.options is not None:
            base = dict(self.options)
        else:  # list_mode_options(None) lists every mode
            base = dict(list_mode_options(self.mode, dynamic)) if self.mode else {}
        return {"options": {**base, **extra}}


class TorchInductorBackend(Backend):
    """Compiles the module with torch.compile(backend="inductor")."""

    config_class = TorchInductorBackendConfig
    portability = 1
    keeps_autograd = True  # torch.compile of the module itself: autograd and .train() work
    jit = True
    imports = ("torch._inductor.compile_fx",)
    config: TorchInductorBackendConfig

    @classmethod
    def available(cls) -> Availability:
        return inductor_available()

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
        settings = self.config.compile_settings(None)
        if settings.get("mode") in ("reduce-overhead", "max-autotune"):
            return True
        return bool(settings.get("options", {}).get("triton.cudagraphs", False))

    @property
    def expected_cost(self) -> float:
        cfg = self.config
        autotune = cfg.mode in ("max-autotune", "max-autotune-no-cudagraphs") or bool(
            (cfg.options or {}).get("max_autotune")
        )
        return (5.0 if autotune else 1.0) + (1.0 if cfg.coordinate_descent_tuning else 0.0)

    @property
    def expected_gain(self) -> float:
        cfg = self.config
        gain = 1.3 * (1.3 if self.uses_cudagraphs else 1.0)
        reduced = cfg.precision in ("bf16", "fp16") or cfg.autocast_enabled
        return gain * (1.5 if reduced else 1.0) * (1.1 if cfg.memory_format else 1.0)

    def tolerance(self) -> Tolerance | None:
        return tolerance(self.config.precision)

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        cfg = self.config
        dynamic = cfg.dynamic
        if dynamic is None and graph.has_dynamic_axes:
            dynamic = True
        module = converted(module, example_inputs, cfg.precision, cfg.memory_format, self.name)
        compiled: Callable[..., Any] = torch.compile(
            module,
            backend="inductor",
            fullgraph=cfg.fullgraph,
            dynamic=dynamic,
            **cfg.compile_settings(dynamic),
        )
        if graph.device.type == "cuda" and self.uses_cudagraphs:
            compiled = _owned_outputs(compiled)
        if cfg.autocast_enabled:
            dtype = cfg.autocast_dtype or torch.bfloat16
            compiled = autocast_wrapper(compiled, graph.device.type, dtype)
        return with_precision(compiled, cfg.precision, graph.device)


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
