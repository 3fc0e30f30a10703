"""src/honed/pipeline/openmp.py: the OpenMP runtime of torch's intra-op threads; a thread's team.

libgomp spin-waits a team's threads between parallel regions only while the process has no more
OpenMP threads than cores; past that, every parallel op waits for its team to wake. Each thread
that has run a parallel op keeps a team of its own, idle or not, so a thread of honed's that
waits beside a program (JIT's thread, a tune's thread) ends its team first (``release_team``).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

_OPENMP_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def runtime() -> Any:
    """The OpenMP runtime torch's intra-op threads use, loaded in this process (None when they
    are not OpenMP's or the runtime cannot be found)."""
    try:
        if "OpenMP" not in torch.__config__.parallel_info():
            return None
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if ".so" in line}
        for name in _OPENMP_RUNTIMES:
            for path in sorted(paths):
                if path.rsplit("/", 1)[-1].startswith(name):
                    return ctypes.CDLL(path)  # already loaded: the same library, not a copy
    except (OSError, AttributeError):
        pass
    return None


# omp_pause_soft (OpenMP 5.0): free the calling thread's idle team; the next parallel op makes one
_OMP_PAUSE_SOFT = 1


def release_team() -> None:
    """End the calling thread's idle OpenMP team now (its threads exit; the thread's next
    parallel op starts a new one), before the thread waits while a program calls.

    A team a waiting thread keeps counts against the cores: the program's eager and
    AOTInductor calls (OpenMP in the calling thread) ran slower while one lived and ONNX
    Runtime's (threads of its own) did not, so a JIT tune measuring them on the program's calls
    chose against the AOT tune's choice (docs/jit.md, "session 13"). Without OpenMP 5.0's pause
    the team lives until its thread ends (honed.jit.background ends JIT's thread when idle for
    that reason too)."""
    omp = runtime()
    pause = getattr(omp, "omp_pause_resource_all", None) if omp is not None else None
    if pause is not None:
        pause(ctypes.c_int(_OMP_PAUSE_SOFT))
