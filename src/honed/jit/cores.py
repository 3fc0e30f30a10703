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

A CUDA model's JIT workers run on CPUs of their own (``isolation.worker_cpus``, the rest left to
the program), but the kernel may still run the program's launching thread on one of theirs, and
a call launched from a CPU that a compile shares runs slower. So while JIT works and a pool keeps
its workers on some CPUs, the thread making the outermost calls runs on the others (its own
affinity, not the process's), and gets its CPUs back when JIT is idle;
``HONED_JIT_KEEP_OFF_WORKERS=0`` (``honed.config.jit_keep_off_workers``) turns this off. Threads
that thread starts meanwhile (an OpenMP team made in one of its calls) inherit the narrower set
and get theirs back with it; processes it starts meanwhile keep the narrower set.
"""

from __future__ import annotations

import os
import threading

import torch

from honed import config
from honed.jit import background
from honed.jit.history import add as add_step
from honed.pipeline.isolation import cpu_cores
from honed.pipeline.openmp import runtime
from honed.pipeline.pool import placed_cpus


class _Shared(threading.local):
    """Per thread (an OpenMP count is the calling thread's): what JIT took from this thread."""

    reduced_from = 0  # the thread's count before JIT took a core (0: not taken)
    kept_off: frozenset[int] = frozenset()  # the workers' CPUs this thread was last kept off
    affinity: set[int] | None = None  # the thread's CPUs before it was kept off (None: not moved)
    narrowed: frozenset[int] = frozenset()  # the CPUs it ran on meanwhile
    threads_before: frozenset[int] = frozenset()  # the process's threads when it was moved


_SHARED = _Shared()
_SAID = [False]  # the history says it once per process


def at_outermost_call(measuring: bool = False) -> None:
    """On each outermost module call of the program: take a core while JIT works, give it back
    when JIT is idle. Cheap when nothing changes (a few reads).

    ``measuring``: the call is one of a tune's measurements on the program's calls (a live
    trial). It runs with every thread, as the variant will once installed: with a core taken,
    a trial would judge torch's variants (eager, Inductor, AOTInductor: OpenMP in the calling
    thread) on one thread fewer than ONNX Runtime, whose own thread pool keeps them all. (Only
    the outermost module's own trial counts: a trial of a module called inside another's call
    runs with the core taken.)

    The thread also stays off the CPUs of JIT's placed workers while JIT works, measuring or
    not: a variant is judged as it will run once installed, and that is on a CPU no compile
    shares."""
    working = background.busy()
    if working or _SHARED.kept_off:
        _keep_off_workers(placed_cpus() if working else frozenset())
    busy = working and not measuring
    if busy == bool(_SHARED.reduced_from):
        return
    if not busy:
        _give_core_back()
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
    """Give this thread's core and CPUs back now (JIT turned off or reset)."""
    _give_core_back()
    _keep_off_workers(frozenset())


def _give_core_back() -> None:
    omp = runtime()
    if _SHARED.reduced_from and omp is not None:
        omp.omp_set_num_threads(_SHARED.reduced_from)
    _SHARED.reduced_from = 0


def _keep_off_workers(workers: frozenset[int]) -> None:
    """Run this thread on its CPUs other than ``workers`` (none: on all of its own again).
    Cheap when nothing changed (one comparison)."""
    if workers == _SHARED.kept_off:
        return
    if _SHARED.affinity is not None:
        _set_affinity(_SHARED.affinity)
        _give_threads_back(_SHARED.affinity)
        _SHARED.affinity = None
    _SHARED.kept_off = workers
    if not workers or not config.jit_keep_off_workers or background.in_background():
        return
    mine = _affinity()
    left = mine - workers if mine else set()
    if left and left != mine:
        before = _threads()
        if _set_affinity(left):
            _SHARED.affinity = mine
            _SHARED.narrowed, _SHARED.threads_before = frozenset(left), frozenset(before)


def _give_threads_back(cpus: set[int]) -> None:
    """The threads this thread started while it was kept off (an OpenMP team made in one of
    its calls, say) inherited the narrower set: they get ``cpus`` back with it. Processes it
    started keep theirs."""
    for tid in _threads() - _SHARED.threads_before:
        try:
            if set(os.sched_getaffinity(tid)) == _SHARED.narrowed:
                os.sched_setaffinity(tid, cpus)
        except OSError:
            continue  # ended meanwhile
    _SHARED.narrowed, _SHARED.threads_before = frozenset(), frozenset()


def _threads() -> set[int]:
    """This process's threads by native id (empty where /proc does not say)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _affinity() -> set[int]:
    """The calling thread's CPUs (empty where the platform does not say)."""
    try:
        return set(os.sched_getaffinity(0))  # 0: the calling thread, on Linux
    except (AttributeError, OSError):
        return set()


def _set_affinity(cpus: set[int]) -> bool:
    try:
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError):
        return False
    return True
