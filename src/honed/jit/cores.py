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
since Inductor bakes the thread count into its CPU kernels. Each of the program's threads takes
and gives back its own core count. A program that chose fewer threads itself is left alone, as
is a torch whose intra-op threads are not OpenMP's; ``HONED_JIT_SHARE_CORES=0``
(``honed.config.jit_share_cores``) turns this off.
"""

from __future__ import annotations

import threading

import torch

from honed import config
from honed.jit import background
from honed.jit.history import add as add_step
from honed.pipeline.isolation import cpu_cores
from honed.pipeline.openmp import runtime


class _Shared(threading.local):
    """Per thread (an OpenMP count is the calling thread's): what JIT took from this thread."""

    reduced_from = 0  # the thread's count before JIT took a core (0: not taken)


_SHARED = _Shared()
_SAID = [False]  # the history says it once per process


def at_outermost_call(measuring: bool = False) -> None:
    """On each outermost module call of the program: take a core while JIT works, give it back
    when JIT is idle. Cheap when nothing changes (two reads).

    ``measuring``: the call is one of a tune's measurements on the program's calls (a live
    trial). It runs with every thread, as the variant will once installed: with a core taken,
    a trial would judge torch's variants (eager, Inductor, AOTInductor: OpenMP in the calling
    thread) on one thread fewer than ONNX Runtime, whose own thread pool keeps them all. (Only
    the outermost module's own trial counts: a trial of a module called inside another's call
    runs with the core taken.)"""
    busy = background.busy() and not measuring
    if busy == bool(_SHARED.reduced_from):
        return
    if not busy:
        restore()
        return
    if not config.jit_share_cores or background.in_background():
        return
    omp = runtime()
    if omp is None:
        return
    # torch's own reading first: it sets a thread's count from the process-wide one once, on
    # the thread's first use, which would undo a count set before it.
    threads = torch.get_num_threads()
    if threads < 2 or threads < cpu_cores():
        return
    omp.omp_set_num_threads(threads - 1)
    _SHARED.reduced_from = threads
    if not _SAID[0]:
        _SAID[0] = True
        add_step(
            f"JIT works beside the program: the program's calls run {threads - 1} of {threads} "
            "threads until JIT is idle (HONED_JIT_SHARE_CORES=0 keeps them all)"
        )


def restore() -> None:
    """Give this thread's core back now (JIT idle, turned off or reset)."""
    omp = runtime()
    if _SHARED.reduced_from and omp is not None:
        omp.omp_set_num_threads(_SHARED.reduced_from)
    _SHARED.reduced_from = 0
