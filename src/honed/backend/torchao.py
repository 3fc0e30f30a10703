"""src/honed/backend/torchao.py: TorchAO quantization of the Linear layers, compiled with Inductor.

A copy of the module is quantized with ``torchao.quantization.quantize_`` (the module itself is
never changed: it stays the eager reference and the fallback), then compiled with
``torch.compile`` (Inductor), which fuses the quantize/dequantize steps into the matmuls.

Schemes (``TorchAOBackendConfig.scheme``), where each runs, and the correctness gate it gets
(quantization changes numerics on purpose: the check bounds the max error relative to the
output's scale and the cosine similarity to eager; both are reported):

  scheme            torchao config                              runs on          min cosine
  int8_weight_only  Int8WeightOnlyConfig                        CPU, CUDA        0.999
  int8_dynamic      Int8DynamicActivationInt8WeightConfig       CPU, CUDA sm80+  0.995
  fp8_weight_only   Float8WeightOnlyConfig                      CPU, CUDA sm89+  0.995
  fp8_dynamic       Float8DynamicActivationFloat8WeightConfig   CUDA sm89+       0.99
  int4_weight_only  Int4WeightOnlyConfig (tile-packed, bf16)    CUDA sm80+       0.98
  mxfp8             MXDynamicActivationMXWeightConfig           CUDA sm100+      0.99
  nvfp4             NVFP4DynamicActivationNVFP4WeightConfig     CUDA sm100+      0.98

The quantized copy runs in ``dtype`` (None: the scheme's own, bfloat16 where torchao's kernels
need it); floating inputs are cast to it and outputs back to eager's dtypes inside the compiled
function. ``set_inductor_config`` is never passed to torchao (it changes Inductor's global
config for the whole process); its recommended settings go to this compile's options instead.

Saving: nothing but the recipe is stored; ``honed.load`` quantizes the loaded weights again (the
same weights give the same quantized tensors) and compiles.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch

from honed.backend._inductor_env import inductor_available
from honed.backend._precision import CastModule
from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    eager_output,
)
from honed.errors import BackendUnavailableError, ConfigError, InputError, TuneError
from honed.pipeline.correctness import Tolerance


@dataclasses.dataclass(frozen=True)
class Scheme:
    """One quantization scheme: the torchao config class and where it runs."""

    config: str  # "module:Class" of the torchao config
    cpu: bool  # runs on the CPU
    min_cc: tuple[int, int]  # lowest CUDA compute capability
    dtype: torch.dtype | None  # compute dtype it needs (None: the model's)
    tolerance: Tolerance


_Q = "torchao.quantization"
_MX = "torchao.prototype.mx_formats"
SCHEMES: dict[str, Scheme] = {
    "int8_weight_only": Scheme(
        f"{_Q}:Int8WeightOnlyConfig", True, (7, 0), None, Tolerance(0.05, 0.05, 0.999)
    ),
    "int8_dynamic": Scheme(
        f"{_Q}:Int8DynamicActivationInt8WeightConfig",
        True,
        (8, 0),
        None,
        Tolerance(0.08, 0.08, 0.995),
    ),
    "fp8_weight_only": Scheme(
        f"{_Q}:Float8WeightOnlyConfig", True, (8, 9), None, Tolerance(0.1, 0.1, 0.995)
    ),
    "fp8_dynamic": Scheme(
        f"{_Q}:Float8DynamicActivationFloat8WeightConfig",
        False,
        (8, 9),
        torch.bfloat16,
        Tolerance(0.15, 0.15, 0.99),
    ),
    "int4_weight_only": Scheme(
        f"{_Q}:Int4WeightOnlyConfig", False, (8, 0), torch.bfloat16, Tolerance(0.2, 0.2, 0.98)
    ),
    "mxfp8": Scheme(
        f"{_MX}:MXDynamicActivationMXWeightConfig",
        False,
        (10, 0),
        torch.bfloat16,
        Tolerance(0.15, 0.15, 0.99),
    ),
    "nvfp4": Scheme(
        f"{_MX}:NVFP4DynamicActivationNVFP4WeightConfig",
        False,
        (10, 0),
        torch.bfloat16,
        Tolerance(0.25, 0.25, 0.98),
    ),
}
GRANULARITIES = ("per_row", "per_tensor")
_GRANULARITY_SCHEMES = ("int8_weight_only", "int8_dynamic", "fp8_weight_only", "fp8_dynamic")
_COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# torchao release -> the oldest torch it is made for (torchao's compatibility table; the
# C++ extensions of a release load only from that torch on). Below these pairs torchao may fail
# to import at all (the seed: torchao calling torch.utils._pytree.register_constant, which
# torch 2.6 lacks).
TORCHAO_MIN_TORCH: dict[tuple[int, int], tuple[int, int]] = {
    (0, 13): (2, 8),
    (0, 14): (2, 9),
    (0, 15): (2, 9),
    (0, 16): (2, 10),
    (0, 17): (2, 11),
    (0, 18): (2, 11),
}
# The oldest torchao whose config-based API (quantize_ with *Config classes) honed uses.
MIN_TORCHAO = (0, 13)


@dataclasses.dataclass
class TorchAOBackendConfig(BackendConfig):
    # The quantization scheme: one of SCHEMES (see the module docstring).
    scheme: str = "int8_weight_only"
    # Weight (and activation) scale granularity for the int8/fp8 schemes: per_row or
    # per_tensor; None uses torchao's default (per_row).
    granularity: str | None = None
    # Group size of int4_weight_only (32, 64, 128 or 256).
    group_size: int = 128
    # Compute dtype of the quantized copy (float32, float16, bfloat16); None: the scheme's own
    # (bfloat16 for fp8_dynamic per_row, int4 and the mx formats; else the model's dtype).
    dtype: torch.dtype | None = None
    # Compile the quantized copy with Inductor (False runs it eagerly: slow, for debugging).
    compile: bool = True
    # torch.compile mode (None, "max-autotune", "max-autotune-no-cudagraphs", ...).
    mode: str | None = None
    # Override the scheme's correctness gate: max error as a fraction of the output's largest
    # magnitude, and the lowest cosine similarity to eager.
    atol: float | None = None
    min_cosine: float | None = None

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ConfigError(
                f"TorchAOBackendConfig: unknown scheme {self.scheme!r}; use one of "
                f"{', '.join(SCHEMES)}"
            )
        if self.granularity is not None:
            if self.granularity not in GRANULARITIES:
                raise ConfigError(
                    f"TorchAOBackendConfig: granularity {self.granularity!r} is not one of "
                    f"{', '.join(GRANULARITIES)}"
                )
            if self.scheme not in _GRANULARITY_SCHEMES:
                raise ConfigError(
                    f"TorchAOBackendConfig: scheme {self.scheme} takes no granularity (it is set "
                    f"for {', '.join(_GRANULARITY_SCHEMES)})"
                )
        if self.group_size not in (32, 64, 128, 256):
            raise ConfigError(
                f"TorchAOBackendConfig: group_size={self.group_size} must be 32, 64, 128 or 256"
            )
        if self.dtype is not None and self.dtype not in _COMPUTE_DTYPES:
            raise ConfigError(
                f"TorchAOBackendConfig: dtype={self.dtype} is not a compute dtype; use "
                "torch.float32, torch.float16 or torch.bfloat16"
            )
        if self.min_cosine is not None and not 0.0 <= self.min_cosine <= 1.0:
            raise ConfigError(f"TorchAOBackendConfig: min_cosine={self.min_cosine} not in [0, 1]")
        if self.atol is not None and self.atol <= 0:
            raise ConfigError(f"TorchAOBackendConfig: atol={self.atol} must be > 0")

    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the quantized copy runs in (None: the model's own)."""
        if self.dtype is not None:
            return self.dtype
        if self.scheme == "fp8_dynamic" and self.granularity == "per_tensor":
            return None
        return SCHEMES[self.scheme].dtype


# -- availability -------------------------------------------------------------------------------
def _version_tuple(text: str) -> tuple[int, int]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    parts += [0] * (2 - len(parts))
    return parts[0], parts[1]


def _dotted(version: tuple[int, int]) -> str:
    return ".".join(map(str, version))


def torchao_for(torch_version: str) -> str:
    """Which torchao to install for ``torch_version`` (a pip requirement, or advice)."""
    have = _version_tuple(torch_version)
    fitting = [ao for ao, need in TORCHAO_MIN_TORCH.items() if need <= have]
    if not fitting:
        oldest = min(TORCHAO_MIN_TORCH.values())
        return (
            f"torch >= {_dotted(oldest)} (honed's TorchAO backend needs torchao >= "
            f"{_dotted(MIN_TORCHAO)}, made for torch {_dotted(oldest)} and newer)"
        )
    best = max(fitting)
    return f"torchao=={_dotted(best)}.* (made for torch {_dotted(TORCHAO_MIN_TORCH[best])})"


def version_verdict(torchao_version: str, torch_version: str) -> Availability:
    """Whether this torchao release is made for this torch (torchao's compatibility table)."""
    ao = _version_tuple(torchao_version)
    fix = f"pip install --no-deps '{torchao_for(torch_version)}'"
    if ao < MIN_TORCHAO:
        return Availability(
            False,
            f"torchao {torchao_version} is older than {_dotted(MIN_TORCHAO)}, the first with "
            "the config-based quantize_ API honed uses",
            fix,
        )
    need = TORCHAO_MIN_TORCH.get(ao)
    if need is None and ao > max(TORCHAO_MIN_TORCH):
        need = TORCHAO_MIN_TORCH[max(TORCHAO_MIN_TORCH)]  # a newer torchao: at least as new
    if need is not None and _version_tuple(torch_version) < need:
        return Availability(
            False,
            f"torchao {torchao_version} is made for torch >= {_dotted(need)}, but this is torch "
            f"{torch_version}",
            f"{fix}, or upgrade torch",
        )
    return Availability(True)


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def torchao_available() -> Availability:
    """torchao is installed, made for this torch, and imports with the API honed uses. Cached.

    The version check comes first, so a torchao known not to fit this torch is never imported
    (an import that raises is caught too, and named with the compatible versions).
    """
    import importlib.util

    torch_version = torch.__version__
    install = f"pip install --no-deps '{torchao_for(torch_version)}'"
    if importlib.util.find_spec("torchao") is None:
        return Availability(False, "torchao is not installed", install)
    version = _dist_version("torchao")
    if version is not None:
        verdict = version_verdict(version, torch_version)
        if not verdict:
            return verdict
    try:
        quantization = importlib.import_module("torchao.quantization")
    except Exception as e:  # any import crash makes only this backend unavailable
        first = (str(e).strip().splitlines() or [""])[0]
        return Availability(
            False,
            f"torchao {version or '(version unknown)'} fails to import with torch "
            f"{torch_version}: {type(e).__name__}: {first}",
            f"{install} (the release made for this torch), or pip uninstall torchao",
        )
    missing = [
        name
        for name in ("quantize_", "Int8WeightOnlyConfig", "Int8DynamicActivationInt8WeightConfig")
        if not hasattr(quantization, name)
    ]
    if missing:
        return Availability(
            False, f"torchao {version} lacks {', '.join(missing)}", f"{install}, or newer"
        )
    return Availability(True)


def scheme_support(scheme: str, device: torch.device) -> Availability:
    """Whether ``scheme`` runs on ``device`` (CPU, or the GPU's compute capability)."""
    spec = SCHEMES[scheme]
    cpu_schemes = ", ".join(name for name, s in SCHEMES.items() if s.cpu)
    if device.type == "cpu":
        if spec.cpu:
            return Availability(True)
        return Availability(
            False,
            f"TorchAO scheme {scheme} runs on CUDA GPUs only",
            f"tune on a CUDA device, or use a CPU scheme ({cpu_schemes})",
        )
    if device.type != "cuda":
        return Availability(False, f"TorchAO schemes run on cpu or cuda, not {device.type}")
    if not torch.cuda.is_available():
        return Availability(False, "CUDA is not available", "run honed doctor --device cuda")
    cc = torch.cuda.get_device_capability(device)
    return cc_support(scheme, cc, torch.cuda.get_device_name(device))


def cc_support(scheme: str, cc: tuple[int, int], gpu: str = "this GPU") -> Availability:
    """Whether a GPU of compute capability ``cc`` runs ``scheme``."""
    need = SCHEMES[scheme].min_cc
    if tuple(cc) >= need:
        return Availability(True)
    fitting = [n for n, s in SCHEMES.items() if tuple(cc) >= s.min_cc]
    return Availability(
        False,
        f"TorchAO scheme {scheme} needs compute capability >= {_dotted(need)}; {gpu} has "
        f"{_dotted((cc[0], cc[1]))}",
        f"use a scheme this GPU runs ({', '.join(fitting) or 'none'}) or a newer GPU",
    )


# -- building -----------------------------------------------------------------------------------
def torchao_config(cfg: TorchAOBackendConfig) -> Any:
    """The torchao config object for ``cfg`` (imports torchao)."""
    module_name, _, class_name = SCHEMES[cfg.scheme].config.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    kwargs: dict[str, Any] = {}
    if cfg.scheme in ("int8_weight_only", "int8_dynamic", "fp8_weight_only", "fp8_dynamic"):
        kwargs["set_inductor_config"] = False
        if cfg.granularity is not None:
            from torchao.quantization import PerRow, PerTensor

            kwargs["granularity"] = PerRow() if cfg.granularity == "per_row" else PerTensor()
        elif cfg.scheme == "fp8_dynamic":
            from torchao.quantization import PerRow

            kwargs["granularity"] = PerRow()
    elif cfg.scheme == "int4_weight_only":
        kwargs.update(
            group_size=cfg.group_size,
            set_inductor_config=False,
            int4_packing_format="tile_packed_to_4d",
        )
    return cls(**kwargs)


# Inductor settings torchao recommends for quantized models (its set_inductor_config), given to
# this compile only. Coordinate-descent tuning applies to Triton kernels, so CUDA only.
_CUDA_OPTIONS = {
    "coordinate_descent_tuning": True,
    "coordinate_descent_check_all_directions": True,
    "force_fuse_int_mm_with_mul": True,
}


def count_quantized(module: torch.nn.Module) -> int:
    """How many parameters of ``module`` are torchao quantized tensors."""
    try:
        from torchao.utils import TorchAOBaseTensor
    except ImportError:  # older torchao: any tensor subclass counts
        return sum(1 for p in module.parameters() if type(p.data) is not torch.Tensor)
    return sum(1 for p in module.parameters() if isinstance(p.data, TorchAOBaseTensor))


class TorchAOBackend(Backend):
    """Quantizes a copy of the module with TorchAO and compiles it with Inductor."""

    config_class = TorchAOBackendConfig
    portability = 4
    jit = True
    requires = ("torchao",)
    imports = ("torchao", "torch._inductor.compile_fx")
    config: TorchAOBackendConfig

    @classmethod
    def available(cls) -> Availability:
        inductor = inductor_available()
        return torchao_available() if inductor else inductor

    def supports(self, device: torch.device) -> Availability:
        return scheme_support(self.config.scheme, device)

    def tolerance(self) -> Tolerance:
        base = SCHEMES[self.config.scheme].tolerance
        atol = self.config.atol if self.config.atol is not None else base.atol
        cosine = self.config.min_cosine if self.config.min_cosine is not None else base.min_cosine
        return Tolerance(atol=atol, rtol=atol, min_cosine=cosine)

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        cfg = self.config
        dtype = cfg.compute_dtype()
        if not example_inputs and dtype is not None:
            raise InputError(
                f"TorchAOBackend({cfg.scheme}) needs a recorded sample to learn the output dtypes "
                f"it casts back from {dtype}"
            )
        _require(self.available())
        _require(self.supports(graph.device))
        from torchao.quantization import quantize_

        out_dtypes: list[torch.dtype | None] = []  # per output leaf (None: not a tensor)
        if example_inputs:
            leaves = torch.utils._pytree.tree_leaves(eager_output(module, example_inputs[0]))
            out_dtypes = [t.dtype if isinstance(t, torch.Tensor) else None for t in leaves]
        quantized = copy.deepcopy(module)
        if dtype is not None:
            quantized.to(dtype)
        try:
            quantize_(quantized, torchao_config(cfg))
        except Exception as e:
            first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TuneError(
                f"TorchAOBackend({cfg.scheme}): torchao could not quantize "
                f"{type(module).__name__} ({type(e).__name__}: {first_line}); try another "
                "scheme or dtype"
            ) from e
        if count_quantized(quantized) == 0:
            raise TuneError(
                f"TorchAOBackend({cfg.scheme}): no layer of {type(module).__name__} was "
                "quantized (torchao quantizes nn.Linear layers, and fp8 only those whose in and "
                "out features are multiples of 16); use another backend for this module"
            )
        wrapped = CastModule(quantized, dtype, out_dtypes).eval()
        if not cfg.compile:
            return wrapped
        kwargs: dict[str, Any] = {"backend": "inductor"}
        if graph.has_dynamic_axes:
            kwargs["dynamic"] = True
        if cfg.mode is not None:
            kwargs["mode"] = cfg.mode
        elif graph.device.type == "cuda":
            kwargs["options"] = dict(_CUDA_OPTIONS)
        compiled: Callable[..., Any] = torch.compile(wrapped, **kwargs)
        if graph.device.type == "cuda" and cfg.scheme == "int8_dynamic":
            return _explain_int_mm(compiled)
        return compiled


def _explain_int_mm(fn: Callable[..., Any]) -> Callable[..., Any]:
    """int8 dynamic quantization multiplies with torch._int_mm, which on CUDA takes only more
    than 16 rows (batch x tokens); say so instead of the kernel's bare message, which does not
    name the cause."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            if "needs to be greater than 16" not in str(e):
                raise
            first = str(e).strip().splitlines()[0]
            raise TuneError(
                "TorchAOBackend(int8_dynamic): torch._int_mm on CUDA needs more than 16 rows per "
                f"matrix product ({first}); serve batches with more than 16 rows, or use "
                "int8_weight_only or an fp8 scheme"
            ) from e

    return call


def _require(avail: Availability) -> None:
    if not avail:
        raise BackendUnavailableError(
            f"TorchAOBackend: {avail.reason}" + (f"; {avail.fix}" if avail.fix else "")
        )
