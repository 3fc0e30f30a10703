"""src/honed/backend/_precision.py: precision and memory format, the axes several backends share.

``precision`` says how floating-point math runs:
  fp32  as the module is (the default);
  tf32  float32 matmuls and convolutions on TF32 tensor cores (CUDA; a no-op on CPU), checked
        with a tolerance of its own;
  bf16, fp16  the module's weights cast to that dtype; floating inputs are cast at the boundary
        and outputs come back in the dtypes (and layouts) eager returns, so callers see no
        difference beyond rounding.
Autocast (fp32 weights, matmuls in half precision) stays the configs' ``autocast_enabled``.

``memory_format="channels_last"`` stores the 4-D weights and feeds the 4-D inputs of an image
model as NHWC, which convolution kernels prefer; it is refused for models without a 4-D input.

The conversions run inside what a backend compiles (``CastModule``), so a compiler fuses the
input casts into the first kernels and the output casts into the last.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from honed.backend.base import eager_output
from honed.errors import ConfigError, InputError, TuneError
from honed.pipeline.correctness import MAX_OBJECT_DEPTH, REDUCED, TF32, VALUE_TYPES, Tolerance

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
MEMORY_FORMATS = (None, "channels_last")
AUTOCAST_DTYPES = (torch.float16, torch.bfloat16)

_CAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_config(
    owner: str,
    precision: str,
    memory_format: str | None,
    autocast_enabled: bool,
    autocast_dtype: torch.dtype | None,
    precisions: tuple[str, ...] = PRECISIONS,
) -> None:
    """Raise ConfigError, naming ``owner`` and the fix, for values a config cannot take."""
    if autocast_dtype is not None and autocast_dtype not in AUTOCAST_DTYPES:
        raise ConfigError(
            f"autocast_dtype={autocast_dtype} is not supported; use torch.float16 or torch.bfloat16"
        )
    if precision not in precisions:
        raise ConfigError(f"{owner}: precision={precision!r} is not one of {', '.join(precisions)}")
    if memory_format not in MEMORY_FORMATS:
        raise ConfigError(
            f"{owner}: memory_format={memory_format!r} is not supported; use 'channels_last' "
            "or None (keep the module's)"
        )
    if autocast_enabled and precision != "fp32":
        raise ConfigError(
            f"{owner}: autocast_enabled runs fp32 weights in reduced precision and "
            f"precision={precision!r} sets the precision itself; choose one of them"
        )


def cast_dtype(precision: str) -> torch.dtype | None:
    """The dtype the module is cast to, or None when its weights stay as they are."""
    return _CAST.get(precision)


def tolerance(precision: str) -> Tolerance | None:
    """The correctness tolerance of a precision; None keeps the per-dtype default."""
    if precision in _CAST:
        return REDUCED
    if precision == "tf32":
        return TF32
    return None


def has_image_input(shapes: Any) -> bool:
    """Whether a graph takes a 4-D tensor (its inputs' shapes, e.g. GraphInfo.min_shapes)."""
    return any(len(s) == 4 for s in shapes)


# -- the converted module ------------------------------------------------------------------------
def converted(
    module: torch.nn.Module,
    samples: list[Any],
    precision: str,
    memory_format: str | None,
    who: str,
) -> torch.nn.Module:
    """``module`` as ``precision`` and ``memory_format`` ask, taking and returning what eager
    does; ``module`` itself when neither changes anything. ``samples``: the recorded ones."""
    dtype = cast_dtype(precision)
    fmt = torch.channels_last if memory_format == "channels_last" else None
    if dtype is None and fmt is None:
        return module
    if not samples:
        raise InputError(f"{who} needs a recorded sample to learn the dtypes eager returns")
    if fmt is not None and not any(
        isinstance(t, torch.Tensor) and t.dim() == 4
        for s in samples
        for t in tree_leaves((s.args, s.kwargs))
    ):
        raise TuneError(
            f"{who}: memory_format='channels_last' is for models with a 4-D image input and "
            "this graph has none; leave memory_format None for this model"
        )
    leaves = output_tensors(eager_output(module, samples[0]))
    out_dtypes: list[torch.dtype | None] = [
        t if isinstance(t, torch.dtype) else t.dtype for t in leaves
    ]
    out_plain = [isinstance(t, torch.Tensor) and t.is_contiguous() for t in leaves]
    return CastModule(_copy(module, dtype, fmt, who), dtype, out_dtypes, fmt, out_plain).eval()


def _copy(
    module: torch.nn.Module,
    dtype: torch.dtype | None,
    fmt: torch.memory_format | None,
    who: str,
) -> torch.nn.Module:
    """A copy of ``module`` with converted parameters and buffers, made without first copying
    them in their old precision (deepcopy's memo maps each tensor to its converted twin)."""
    memo: dict[int, Any] = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        new = t.detach()
        if dtype is not None and new.is_floating_point():
            new = new.to(dtype)
        if fmt is not None and new.dim() == 4:
            new = new.contiguous(memory_format=fmt)
        if isinstance(t, torch.nn.Parameter):
            new = torch.nn.Parameter(new, requires_grad=False)
        memo[id(t)] = new
    try:
        return copy.deepcopy(module, memo)
    except Exception as e:
        raise TuneError(
            f"{who}: the module cannot be copied to change its precision or memory format "
            f"({type(e).__name__}: {e}); use precision='fp32' and memory_format=None for it"
        ) from e


class CastModule(torch.nn.Module):
    """Runs ``inner`` in ``dtype`` (and ``memory_format``): floating inputs are cast to it (4-D
    ones converted), outputs come back in eager's dtypes (contiguous where eager's were)."""

    def __init__(
        self,
        inner: torch.nn.Module,
        dtype: torch.dtype | None,
        out_dtypes: list[torch.dtype | None],
        memory_format: torch.memory_format | None = None,
        out_contiguous: list[bool] | None = None,
    ) -> None:
        super().__init__()
        self.inner = inner
        self.dtype = dtype
        self.out_dtypes = out_dtypes
        self.memory_format = memory_format
        self.out_contiguous = out_contiguous or [False] * len(out_dtypes)

    def _input(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if self.dtype is not None and t.is_floating_point():
            t = t.to(self.dtype)
        if self.memory_format is not None and t.dim() == 4:
            t = t.contiguous(memory_format=self.memory_format)
        return t

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = tree_map(self._input, (args, kwargs))
        out = self.inner(*args, **kwargs)
        if len(output_tensors(out)) != len(self.out_dtypes):
            return out
        wanted = iter(zip(self.out_dtypes, self.out_contiguous, strict=True))
        return map_output_tensors(out, lambda t: _as_eager(t, *next(wanted)))


def _as_eager(t: Typed, dtype: torch.dtype | None, contiguous: bool) -> Typed:
    if isinstance(t, torch.dtype):  # a dtype the output records: eager's
        return dtype if dtype is not None else t
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t.contiguous() if contiguous else t


Typed = torch.Tensor | torch.dtype


def map_output_tensors(value: Any, fn: Callable[[Typed], Typed], depth: int = 0) -> Any:
    """``value`` with ``fn`` applied to each tensor and dtype in it, in a fixed order: pytree's,
    and inside an object pytree does not know (a transformers KV cache), its public attributes in
    name order, replaced in place. Such an object is made by the call that returned it, and the
    correctness check compares it by those attributes (honed.pipeline.correctness), so its tensors
    come back in eager's dtypes, and a dtype it records with them says so too."""
    leaves, spec = tree_flatten(value)
    out = []
    for leaf in leaves:
        if isinstance(leaf, (torch.Tensor, torch.dtype)):
            leaf = fn(leaf)
        elif depth < MAX_OBJECT_DEPTH and not isinstance(leaf, VALUE_TYPES):
            found = getattr(leaf, "__dict__", None)
            attrs = found if isinstance(found, dict) else {}
            for name in sorted(k for k in attrs if not k.startswith("_")):
                before = attrs[name]
                after = map_output_tensors(before, fn, depth + 1)
                if after is not before:
                    setattr(leaf, name, after)
        out.append(leaf)
    if all(a is b for a, b in zip(out, leaves, strict=True)):
        return value
    return tree_unflatten(out, spec)


def output_tensors(value: Any) -> list[Typed]:
    """The tensors and dtypes of an output, in map_output_tensors' order (objects opened up)."""
    found: list[Typed] = []

    def keep(t: Typed) -> Typed:
        found.append(t)
        return t

    map_output_tensors(value, keep)
    return found


# -- autocast and TF32 around a call ------------------------------------------------------------
def autocast_wrapper(
    fn: Callable[..., Any], device_type: str, dtype: torch.dtype
) -> Callable[..., Any]:
    """Run ``fn`` under autocast and cast its outputs in ``dtype`` back to float32 as eager
    returns them (inside objects too, as map_output_tensors opens them)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type=device_type, dtype=dtype):
            out = fn(*args, **kwargs)
        return map_output_tensors(out, lambda t: _float32(t, dtype))

    return run


def _float32(t: Typed, dtype: torch.dtype) -> Typed:
    if isinstance(t, torch.dtype):
        return torch.float32 if t == dtype else t
    return t.float() if t.dtype == dtype else t


@contextlib.contextmanager
def tf32_enabled() -> Iterator[None]:
    """float32 matmuls and cuDNN convolutions on TF32 tensor cores, restored afterwards."""
    matmul = torch.get_float32_matmul_precision()
    conv = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = conv


def with_precision(
    fn: Callable[..., Any], precision: str, device: torch.device
) -> Callable[..., Any]:
    """``fn`` with the process-wide math settings ``precision`` needs around each call (TF32 on
    CUDA: compiling, capturing and running all read them); ``fn`` itself otherwise."""
    if precision != "tf32" or device.type != "cuda":
        return fn

    def run(*args: Any, **kwargs: Any) -> Any:
        with tf32_enabled():
            return fn(*args, **kwargs)

    return run


# -- config fields ---------------------------------------------------------------------------------
def precision_field() -> Any:
    """A config's ``precision`` field (see the module docstring); named in words."""
    return _worded("fp32", describe_precision)


def memory_format_field() -> Any:
    """A config's ``memory_format`` field: None (the module's own) or "channels_last"."""
    return _worded(None, lambda v: str(v))


def flag_field(words: str) -> Any:
    """A boolean config field, off by default, named ``words`` in candidate names when on."""
    return _worded(False, lambda v: words if v else "")


def describe_precision(precision: str) -> str:
    return f"{precision} weights" if precision in _CAST else precision


def _worded(default: Any, words: Callable[[Any], str]) -> Any:
    import dataclasses

    return dataclasses.field(default=default, metadata={"describe": words})
