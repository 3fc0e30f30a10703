"""src/honed/backend/_inductor_env.py: what Inductor needs: TorchDynamo support, a C++ compiler.

Shared by the backends that compile with Inductor (torch.compile, AOTInductor, TorchAO).
"""

from __future__ import annotations

import inspect
import os
import shutil
from collections.abc import Callable
from typing import Any

from honed.backend.base import Availability


def inductor_available() -> Availability:
    """torch.compile works with this Python and torch build."""
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
    except Exception as e:  # an import failure is a reason, not a crash
        return Availability(False, f"torch._dynamo cannot be imported: {e}", "reinstall torch")
    try:
        supported = bool(is_dynamo_supported())
    except Exception as e:
        return Availability(
            False, f"torch.compile is not supported here: {e}", "use a supported Python/torch"
        )
    if not supported:
        return Availability(
            False, "torch.compile does not support this Python/torch", "use a supported Python"
        )
    return Availability(True)


def cpu_compiler() -> str | None:
    """The C++ compiler Inductor's CPU code would use: $CXX, else the first one on PATH."""
    for cxx in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def cpu_available() -> Availability:
    """Inductor's CPU kernels are C++: a compiler must be on PATH."""
    if cpu_compiler() is None:
        return Availability(
            False,
            "Inductor generates C++ for CPU and no C++ compiler was found",
            "install one (apt-get install g++) or set CXX",
        )
    return Availability(True)


# Inductor's defaults, for the cap below: each kernel configuration's benchmark fills the L2
# this many times first, then runs its kernel for this many ms (or this many runs).
_MEMORY_WARMUP_ITERS = 100
_WARMUP_ITERS_CAPPED = 10


def cap_gpu_benchmarks(ms: float) -> None:
    """Make each of Inductor's GPU kernel benchmarks in this process run at most about ``ms``.

    A compile benchmarks its kernels' configurations (reductions' several tilings, AOTInductor's
    autotuning at compile time) back to back, up to 25 ms of the GPU each. Beside a program
    the GPU shares its time between the two processes, so a program's call that meets such a
    burst waits for it: on the H100, BERT-base's calls that returned in time and then waited
    for the GPU came mostly while AOTInductor's packages were built (docs/jit.md). A few ms
    per configuration still runs a 10-100 µs kernel tens of times, and the minimum Inductor
    keeps needs few. Applies to the process-wide ``benchmarker`` (its own benchmarks and the
    autotuners'), whichever of torch's benchmarkers it is."""
    if ms <= 0:
        return
    try:
        from torch._inductor.runtime import benchmarking
    except ImportError:
        return
    bench = benchmarking.benchmarker
    original: Callable[..., Any] = getattr(bench, "_honed_uncapped", bench.benchmark_gpu)
    try:
        accepts = inspect.signature(original).parameters
    except (TypeError, ValueError):
        return
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepts.values()):
        return  # a benchmarker that takes no settings: left as it is

    def capped(*args: Any, **kwargs: Any) -> Any:
        # InductorBenchmarker reads the first two; Triton's do_bench the last two (each
        # benchmarker drops what it does not take)
        kwargs["max_benchmark_duration"] = min(kwargs.get("max_benchmark_duration", ms), ms)
        kwargs["memory_warmup_iters"] = min(
            kwargs.get("memory_warmup_iters", _MEMORY_WARMUP_ITERS), _WARMUP_ITERS_CAPPED
        )
        kwargs["rep"] = min(kwargs.get("rep", ms), ms)
        kwargs["warmup"] = min(kwargs.get("warmup", ms), ms)
        return original(*args, **kwargs)

    # on the instance: the class's method (and every other benchmarker) stays as it is
    setattr(bench, "_honed_uncapped", original)  # noqa: B010
    setattr(bench, "benchmark_gpu", capped)  # noqa: B010
