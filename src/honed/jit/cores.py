"""src/honed/jit/cores.py: a core for JIT's work while it runs beside the program.

JIT's worker processes (the graph-break check, a tune's builds and measurements) run at a lower
priority than the program (``HONED_JIT_WORKER_NICE``). On a machine whose cores the program's
calls fill (torch's intra-op threads, one per core by default, spin-waiting between ops), that
leaves them next to nothing: on the 2-core CPU machine the check of a small BERT took 53 s beside
a program running torch on two threads and 8 s beside one on a single thread, whose calls were
no slower (the model is too small for a second thread to pay).

So while JIT has work queued or running, the program's outermost module calls run with one
OpenMP thread fewer, when the program uses one per core; the first outermost call after JIT is
idle restores the count. The count changed is the calling thread's own (``omp_set_num_threads``
of the OpenMP runtime torch loaded), not torch's process-wide one (``torch.set_num_threads``):
JIT's own thread, which may compile a winner in this process, must keep compiling for every core,
since Inductor bakes the thread count into its CPU kernels. Only the thread that took the core
gives it back. A program that chose fewer threads itself is left alone, as is a torch whose
intra-op threads are not OpenMP's; ``HONED_JIT_SHARE_CORES=0`` (``honed.config.jit_share_cores``)
turns this off.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import torch

from honed import config
from honed.jit import background
from honed.jit.history import add as add_step
from honed.pipeline.isolation import cpu_cores

_OPENMP_RUNTIMES = ("libgomp", "libiomp5", "libomp")


@functools.cache
def _openmp() -> Any:
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
                    lib = ctypes.CDLL(path)  # already loaded: the same library, not a copy
                    lib.omp_get_max_threads.restype = ctypes.c_int
                    return lib
    except (OSError, AttributeError):
        pass
    return None


class _Shared:
    def __init__(self) -> None:
        self.reduced_from = 0  # the thread's count before JIT took a core (0: not taken)
        self.thread = 0  # the thread that took it
        self.said = False


_SHARED = _Shared()


def at_outermost_call() -> None:
    """On each outermost module call of the program: take a core while JIT works, give it back
    when JIT is idle. Cheap when nothing changes (two reads)."""
    busy = background.busy()
    s = _SHARED
    if busy == bool(s.reduced_from):
        return
    if not busy:
        restore()
        return
    if not config.jit_share_cores or background.in_background():
        return
    omp = _openmp()
    if omp is None:
        return
    threads = int(omp.omp_get_max_threads())
    if threads < 2 or threads < cpu_cores():
        return
    omp.omp_set_num_threads(threads - 1)
    s.reduced_from, s.thread = threads, threading.get_ident()
    if not s.said:
        s.said = True
        add_step(
            f"JIT works beside the program: the program's calls run {threads - 1} of {threads} "
            "threads until JIT is idle (HONED_JIT_SHARE_CORES=0 keeps them all)"
        )


def restore() -> None:
    """Give the core back now, when this thread took it (JIT idle, turned off or reset)."""
    s = _SHARED
    omp = _openmp()
    if s.reduced_from and omp is not None and threading.get_ident() == s.thread:
        omp.omp_set_num_threads(s.reduced_from)
        s.reduced_from = s.thread = 0
