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

import dataclasses
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
    generation = 0  # _MOVED's generation that kept_off belongs to


_SHARED = _Shared()
_SAID = [False]  # the history says it once per process


@dataclasses.dataclass(frozen=True)
class _Moved:
    """A thread kept off the workers' CPUs: its CPUs before, the narrower set, and the
    process's threads when it was moved (those started later inherited the narrower set)."""

    affinity: frozenset[int]
    narrowed: frozenset[int]
    threads_before: frozenset[int]


# The threads kept off now, by native id: JIT turned off or reset on one thread gives every
# moved thread its CPUs back; a new generation tells the others their kept_off is stale.
_MOVED: dict[int, _Moved] = {}
_MOVED_LOCK = threading.Lock()
_GENERATION = [1]


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
    """Give this thread's core back, and every thread kept off the workers' CPUs its CPUs,
    now (JIT turned off or reset)."""
    _give_core_back()
    with _MOVED_LOCK:
        moved = list(_MOVED.items())
        _MOVED.clear()
        _GENERATION[0] += 1
    for tid, was in moved:
        _give_back(tid, was)
    _SHARED.kept_off = frozenset()


def _give_core_back() -> None:
    omp = runtime()
    if _SHARED.reduced_from and omp is not None:
        omp.omp_set_num_threads(_SHARED.reduced_from)
    _SHARED.reduced_from = 0


def _keep_off_workers(workers: frozenset[int]) -> None:
    """Run this thread on its CPUs other than ``workers`` (none: on all of its own again).
    Cheap when nothing changed (two comparisons)."""
    if workers == _SHARED.kept_off and _SHARED.generation == _GENERATION[0]:
        return
    tid = threading.get_native_id()
    with _MOVED_LOCK:
        was = _MOVED.pop(tid, None)
        _SHARED.generation = _GENERATION[0]
    if was is not None:
        _give_back(tid, was)
    _SHARED.kept_off = workers
    if not workers or not config.jit_keep_off_workers or background.in_background():
        return
    mine = _affinity()
    left = mine - workers if mine else set()
    if left and left != mine:
        before = _threads()
        if _set_affinity(0, left):
            with _MOVED_LOCK:
                _MOVED[tid] = _Moved(frozenset(mine), frozenset(left), frozenset(before))


def _give_back(tid: int, was: _Moved) -> None:
    """``tid`` on its CPUs again, and the threads started since it was moved that inherited
    the narrower set (an OpenMP team made in one of its calls, say) with it. Processes started
    meanwhile keep theirs."""
    _set_affinity(tid, was.affinity)
    for other in _threads() - was.threads_before:
        if _affinity(other) == was.narrowed:  # empty for a thread that ended meanwhile
            _set_affinity(other, was.affinity)


def _threads() -> set[int]:
    """This process's threads by native id (empty where /proc does not say)."""
    try:
        return {int(tid) for tid in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def _affinity(tid: int = 0) -> set[int]:
    """``tid``'s CPUs (0: the calling thread's, on Linux); empty where the platform does not
    say or the thread ended."""
    try:
        return set(os.sched_getaffinity(tid))
    except (AttributeError, OSError):
        return set()


def _set_affinity(tid: int, cpus: set[int] | frozenset[int]) -> bool:
    """``tid``'s CPUs (0: the calling thread's); False where that failed (a thread that
    ended, a platform without affinity)."""
    try:
        os.sched_setaffinity(tid, cpus)
    except (AttributeError, OSError):
        return False
    return True
