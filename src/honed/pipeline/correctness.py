"""src/honed/pipeline/correctness.py: compares a candidate's outputs with eager's.

Same structure, shapes and dtypes; values within a per-dtype tolerance (looser for reduced
precision); NaN or Inf where eager has none fails. Max abs/rel error and cosine similarity are
recorded for the report.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch.utils import _pytree as pytree

from honed import _core
from honed.pipeline.courtesy import give_way


@dataclasses.dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    min_cosine: float = 0.0


# Full precision: Inductor reorders reductions and fuses, so bit equality is not expected.
FP32 = Tolerance(atol=1e-4, rtol=1e-3)
# Half-precision references or autocast candidates.
REDUCED = Tolerance(atol=3e-2, rtol=3e-2, min_cosine=0.999)
# TF32 keeps 10 mantissa bits in matmul and convolution inputs (accumulating in fp32): looser
# than fp32 kernels, much tighter than bf16.
TF32 = Tolerance(atol=1e-2, rtol=1e-2, min_cosine=0.9999)


def eager_tolerance(module: torch.nn.Module, device: torch.device) -> Tolerance | None:
    """The tolerance an fp32 candidate is held to when eager itself is not fp32-exact, else None.

    On CUDA, PyTorch runs cuDNN convolutions on TF32 tensor cores by default
    (``torch.backends.cudnn.allow_tf32``), and matmuls too when the user allows it: eager's own
    outputs then carry TF32 rounding, and an fp32 compile of the same model (other algorithms,
    batch norm folded into the convolution) differs from them by that much, not by fp32's.
    """
    if device.type != "cuda":
        return None
    matmul = (
        torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    )
    conv = torch.backends.cudnn.allow_tf32 and any(
        isinstance(m, torch.nn.modules.conv._ConvNd) for m in module.modules()
    )
    return TF32 if matmul or conv else None


def tolerance_for(dtype: torch.dtype, reduced_precision: bool, fp32: Tolerance = FP32) -> Tolerance:
    if reduced_precision or dtype in (torch.float16, torch.bfloat16):
        return REDUCED
    return fp32


@dataclasses.dataclass
class CheckResult:
    ok: bool
    reason: str = ""
    max_abs_error: float = 0.0
    max_rel_error: float = 0.0
    min_cosine: float = 1.0

    def merge(self, other: CheckResult) -> CheckResult:
        return CheckResult(
            ok=self.ok and other.ok,
            reason=self.reason or other.reason,
            max_abs_error=max(self.max_abs_error, other.max_abs_error),
            max_rel_error=max(self.max_rel_error, other.max_rel_error),
            min_cosine=min(self.min_cosine, other.min_cosine),
        )


def compare(
    reference: Any,
    candidate: Any,
    reduced_precision: bool = False,
    tolerance: Tolerance | None = None,
    fp32: Tolerance = FP32,
) -> CheckResult:
    """Check ``candidate`` against ``reference`` (eager outputs of the same inputs).

    ``tolerance`` replaces the per-dtype one for floating outputs (quantized backends); ``fp32``
    is the one for float32 outputs of a full-precision candidate (eager_tolerance).
    """
    ref_leaves, ref_spec = _flatten(reference)
    out_leaves, out_spec = _flatten(candidate)
    if ref_spec != out_spec:
        return CheckResult(False, f"wrong output structure: expected {ref_spec}, got {out_spec}")
    result = CheckResult(True)
    for i, (ref, out) in enumerate(zip(ref_leaves, out_leaves, strict=True)):
        give_way()  # beside a JIT program: between its calls
        result = result.merge(_compare_leaf(i, ref, out, reduced_precision, tolerance, fp32))
    return result


# Leaves of these types compare by value; any other object is opened up (see _flatten). The
# precision candidates restore eager's dtypes by the same rule (honed.backend._precision).
VALUE_TYPES = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)
MAX_OBJECT_DEPTH = 4


def _flatten(value: Any, depth: int = 0) -> tuple[list[Any], Any]:
    """pytree's flattening, with objects pytree does not know opened up to their attributes.

    A model may return an object that holds tensors (e.g. a transformers KV cache); comparing it by
    identity would reject eager itself, so its public attributes are compared instead, in name
    order, under a spec that records the object's type.
    """
    leaves, spec = pytree.tree_flatten(value)
    if depth >= MAX_OBJECT_DEPTH:
        return leaves, spec
    out: list[Any] = []
    specs: list[Any] = []
    for leaf in leaves:
        attrs = getattr(leaf, "__dict__", None)
        if isinstance(leaf, (torch.Tensor, *VALUE_TYPES)) or not isinstance(attrs, dict):
            out.append(leaf)
            specs.append(None)
            continue
        public = {k: v for k, v in sorted(attrs.items()) if not k.startswith("_")}
        inner, inner_spec = _flatten(public, depth + 1)
        out.extend(inner)
        specs.append((type(leaf).__qualname__, inner_spec))
    return out, (spec, tuple(specs))


def _compare_leaf(
    i: int,
    ref: Any,
    out: Any,
    reduced_precision: bool,
    tolerance: Tolerance | None,
    fp32: Tolerance,
) -> CheckResult:
    if not isinstance(ref, torch.Tensor):
        if isinstance(out, torch.Tensor) or ref != out:
            return CheckResult(False, f"wrong outputs: output {i} is {out!r}, expected {ref!r}")
        return CheckResult(True)
    if not isinstance(out, torch.Tensor):
        return CheckResult(False, f"wrong outputs: output {i} is {type(out).__name__}, not Tensor")
    if out.shape != ref.shape:
        return CheckResult(
            False,
            f"wrong outputs: output {i} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}",
        )
    if out.dtype != ref.dtype:
        return CheckResult(
            False, f"wrong outputs: output {i} has dtype {out.dtype}, expected {ref.dtype}"
        )
    tol = tolerance or tolerance_for(ref.dtype, reduced_precision, fp32)
    ref, out = _on_host(ref, out)
    if not (ref.is_floating_point() or ref.is_complex()):
        if torch.equal(ref, out):
            return CheckResult(True)
        return CheckResult(False, f"wrong outputs: output {i} ({ref.dtype}) differs from eager")
    if ref.is_complex():  # each part held to the tolerance
        ref, out = torch.view_as_real(ref.resolve_conj()), torch.view_as_real(out.resolve_conj())
    if ref.dtype not in _KINDS:  # float8 and the like: widened first
        ref, out = ref.double(), out.double()
    # the values as they read (a lazily negated view's bytes are not), one after another
    ref, out = (t.resolve_neg().contiguous() for t in (ref, out))
    # The figures in the engine, in one call without the GIL: beside a JIT program, each torch
    # op of a figure made here took the GIL back from the program's thread, which then waited
    # for it up to the switch interval, its call running several times its length.
    c = _core.closeness(
        ref.data_ptr(), out.data_ptr(), ref.numel(), _KINDS[ref.dtype], tol.atol, tol.rtol
    )
    if c.bad:
        kind = "NaN" if c.bad_nan else "Inf"
        return CheckResult(
            False,
            f"{kind} outputs: output {i} has {c.bad} {kind} values where eager has finite ones",
        )
    if not c.compared:
        return CheckResult(True)
    cos = 1.0 if math.isclose(c.cosine, 1.0) else c.cosine
    ok = c.within and cos >= tol.min_cosine
    reason = ""
    if not ok:
        reason = (
            f"wrong outputs: output {i} max abs error {c.max_abs:.3g} (rel {c.max_rel:.3g}, "
            f"cosine {cos:.6f}) exceeds atol={tol.atol:g}, rtol={tol.rtol:g}"
            + (f", min cosine {tol.min_cosine:g}" if tol.min_cosine else "")
        )
    return CheckResult(ok, reason, c.max_abs, c.max_rel, cos)


_KINDS = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
}


def _on_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """``tensors`` on the CPU: a GPU tensor copied as it is, into pinned memory on the current
    stream (honed's own beside a JIT program), then waited for without the GIL on an event that
    blocks this thread (a stream synchronize spins where the context does, polling the driver
    beside the program's launches).

    No kernel runs: a kernel this process has not run yet is loaded at its first launch, and
    CUDA may wait for the whole device to load it, a JIT program's calls with it (lazy
    loading). Nor a copy into pageable memory: beside a program such copies, back to back,
    held its calls up to seven times their length (bench/profile/beside_stall.py)."""
    copies = [t.to("cpu", non_blocking=True) if t.is_cuda else t.cpu() for t in tensors]
    for device in {t.device for t in tensors if t.is_cuda}:
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(device))
        done.synchronize()
    return copies
