"""src/honed/pipeline/courtesy.py: work beside a program that waits while the program's call runs.

A JIT tune works in the program's own process, on a thread of its own, and much of that work is
Python (pickling a model for the workers, hashing its weights for the cache key, laying out a
package's constants): while it runs, every torch op of the program's call that gives the GIL up
waits for it again, the switch interval each time, and a call of a few hundred ops runs several
times its length (bench/profile/share_stall.py, docs/jit.md). Such loops call ``give_way()``
between their pieces: while the program is inside a call, it sleeps (the GIL free) until the
call ends, for ``limit_s`` at most, so that a program that is always inside a call still lets
the work go on, slowly. A thread gives way once per ``SLICE_S`` of its work, not per piece.

JIT says what "inside a call" means (``watch``: whether a thread other than the asking one is
inside an outermost module call) and when a call ends (``call_ended``, which wakes the waiting
threads); without a probe (no JIT) it returns at once, and the thread making the call never
waits for itself.

On a GPU the work that competes with the program's calls is the GPU's own: a check runs the
candidate on every recorded sample, and runs queued back to back, in a worker's CUDA context
(which the GPU time-slices with the program's) or on honed's stream here, hold the program's
kernels back for as long as they last. ``spaced_run`` lets each such run finish, then leaves the
GPU to the program for twice as long before the next, so that a call of the program overlaps
about one run, not eight. Two contexts that both have work share the GPU about evenly, so a run
as long as one of the program's calls, started as that call starts, makes it last twice as long
(bench/gpu_neighbours.py); started halfway through a call it shares the GPU with the end of one
call and the start of the next, each about a half longer. So the program's process keeps a
call clock (``open_call_clock``: when its latest outermost call started, ended, and how long the
last complete one took, in a small shared file JIT writes at each call's start and end), a
worker beside it maps it (``space_runs``), and each spaced run starts halfway through a call.
In the program's own process (a winner's install on JIT's thread: its warm-up, capture and check
runs) a spaced run starts as one of the program's calls ends instead (``wait_for_call_end``):
its launches go into the program's CUDA context from the program's process, and a call they
overlap waits at each of its own launches in turn (the GIL, the driver's locks: its thread's
voluntary switches, docs/jit.md).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

LIMIT_S = 0.02  # the longest one give_way waits
# How long a thread works on between waits: pieces of work far shorter than a call (a small
# tensor's hash) would otherwise each wait for a call's end, and a program always inside a call
# would slow the work to a piece per LIMIT_S. A call overlapping such a slice pays for the
# slice's GIL hand-overs at most.
SLICE_S = 0.002
_local = threading.local()

_probe: list[Callable[[], bool] | None] = [None]
# Wakes the threads waiting in give_way when one of the program's calls ends. A waiting thread
# that looked again every fraction of a millisecond took the GIL back each time, and each time
# the program's call had to hand it over (the switch interval), dozens of times a call.
_ENDED = threading.Condition()
_waiting = [0]  # threads in give_way: the program's thread takes the lock only while some wait


def watch(busy: Callable[[], bool] | None) -> None:
    """Set (or clear, None) the probe: is another thread than the caller inside a call now?
    Whoever sets it also calls ``call_ended`` as each call ends: a thread in give_way sleeps
    until then (``limit_s`` at most)."""
    _probe[0] = busy


def call_ended(length_s: float = 0.0) -> None:
    """The program's call just ended, after ``length_s`` (JIT calls this at the end of each
    outermost call): wakes the threads waiting in give_way or for a turn. Nearly free when none
    waits."""
    _ends[0] += 1
    if length_s > 0.0:
        _last_call_s[0] = length_s
    if _waiting[0]:
        with _ENDED:
            _ENDED.notify_all()


def call_starting() -> None:
    """One of the program's calls is about to start: while work in this process takes its turn
    (``taking_turns``), the call waits for the end of that turn. Nearly free when no work takes
    turns. JIT's patch reads ``TURN`` itself, after marking the call begun, and calls this with
    the mark cleared."""
    if TURN[0]:
        _await_turn()


def beside_program() -> bool:
    """Whether this process runs a program whose calls JIT works beside (a probe is set)."""
    return _probe[0] is not None


@contextlib.contextmanager
def first_build() -> Iterator[None]:
    """Around a build on this thread that no worker has done before it (JIT's early stand-in):
    what its libraries do once for a model (cuDNN's plans, CUDA loading the kernels) has not
    happened in this process or on the machine yet. A backend may then prepare differently
    beside the program (``in_first_build``)."""
    _local.first_build = getattr(_local, "first_build", 0) + 1
    try:
        yield
    finally:
        _local.first_build -= 1


def in_first_build() -> bool:
    """Whether this thread is inside ``first_build``."""
    return getattr(_local, "first_build", 0) > 0


# The program's threads waiting for this process's work now (a torch.cuda.synchronize that
# waits for a capture under way): work they wait for gives way to none of their calls.
_held = [0]
_HELD_LOCK = threading.Lock()


@contextlib.contextmanager
def program_waits() -> Iterator[None]:
    """Around a wait of the program's for JIT's work in this process: give_way returns at once
    meanwhile (a call that waits for the work would otherwise hold the work up until its end)."""
    with _HELD_LOCK:
        _held[0] += 1
    if _waiting[0]:  # work waiting for one of the program's calls to end goes on now
        with _ENDED:
            _ENDED.notify_all()
    try:
        yield
    finally:
        with _HELD_LOCK:
            _held[0] -= 1


@contextlib.contextmanager
def giving_way_at_module_calls(on: bool = True) -> Iterator[None]:
    """Inside (``on``, beside a program): each module call on this thread gives way first
    (``at_module_call``, which JIT's patch calls for the module calls of JIT's own threads).
    For work that the program will wait for and that is a model's forward in Python (a capture's
    recording): run between the program's calls, not beside them, it holds each call up once,
    for its own length, instead of slowing both by turns on the GIL."""
    before = getattr(_local, "at_module_calls", False)
    _local.at_module_calls = on and beside_program()
    try:
        yield
    finally:
        _local.at_module_calls = before


def at_module_call() -> float:
    """A module call on this thread is about to run: take a turn or go on with the one held,
    inside ``taking_turns``; give way, inside ``giving_way_at_module_calls``; the seconds
    waited."""
    if getattr(_local, "turns", False):
        return _next_piece()
    if getattr(_local, "at_module_calls", False):
        return give_way()
    return 0.0


# Turns. Work in the program's process that runs a model's forward in Python (a capture's
# warm-up calls and its recording) and that runs beside one of the program's calls makes both
# slower: the two threads take the GIL in turns at every op, each hand-over costs the switch
# interval, and a first run's pieces (a library choosing its kernels, CUDA loading them) hold
# the program's launches up. Inside ``taking_turns`` such work runs its module calls in turns
# instead: a turn starts while the program is between calls (its host waits for the GPU, or it
# is idle) or waits at the start of one (``call_starting``), lasts at most TURN_SHARE of the
# program's latest call (TURN_S at most, MIN_TURN_S at least), and the program's next call
# waits for the turn's end. So a call waits for one turn at most, beside which nothing slows
# its own ops; after a turn during which the program waited, the next turn waits for one of
# its calls to end, so the program's calls and the work's turns alternate.
TURN_S = 0.004
TURN_SHARE = 0.5
MIN_TURN_S = 0.0005
# The longest the work waits for the program's call to end before it takes its turn beside the
# call (a program whose calls are far longer than a turn: the work would otherwise creep).
TURN_WAIT_S = 0.05
# The longest a turn holds the program's calls, from its start: as long as the program's latest
# call (a turn never more than doubles a call), PROGRAM_WAIT_MIN_S at least, PROGRAM_WAIT_S at
# most. A piece far longer than a turn (a library's first plan, CUDA loading a kernel) then runs
# beside the calls instead of holding them up longer.
PROGRAM_WAIT_S = 0.05
PROGRAM_WAIT_MIN_S = 0.002
_FREE, _WANTED, _HELD = 0, 1, 2
# The turn's state. JIT's patch reads it at each outermost call after marking the call begun,
# and the work marks a turn held before it looks whether a call runs: under the GIL one of the
# two sees the other, so a call and a turn never both begin.
TURN = [_FREE]
_turns_ended = [0]  # turns ended in this process, counted: a waiting call waits for one more
_parked = [0]  # the program's calls waiting at their start for a turn to end
_owed = [-1]  # the count of program calls ended that the next turn waits to see passed
_ends = [0]  # the program's outermost calls ended, counted (call_ended)
_last_call_s = [0.0]  # the length of the program's latest outermost call
_turn_began = [0.0]  # perf_counter() at the start of the latest turn
_TURN_OWNER = threading.Lock()  # held by the thread whose turn it is


@contextlib.contextmanager
def taking_turns(on: bool = True) -> Iterator[None]:
    """Inside (``on``, beside a program): this thread's module calls run in turns with the
    program's calls (above), through JIT's patch of ``Module.__call__``. A turn held at the
    end is ended: the program's next call never waits for work that is over."""
    before = getattr(_local, "turns", False)
    _local.turns = on and beside_program()
    try:
        yield
    finally:
        _local.turns = before
        if not before:
            _end_turn()


def _turn_length() -> float:
    return max(MIN_TURN_S, min(TURN_S, TURN_SHARE * _last_call_s[0]))


def _program_wait() -> float:
    return max(PROGRAM_WAIT_MIN_S, min(PROGRAM_WAIT_S, _last_call_s[0]))


def _next_piece() -> float:
    """The next module call of work taking turns: go on within the turn held, or end it and
    wait for the next; the seconds waited."""
    now = time.perf_counter()
    if getattr(_local, "turn_started", None) is not None:
        if now - _local.turn_started < _turn_length():
            return 0.0
        _end_turn()
    return _take_turn(now)


def _take_turn(start: float) -> float:
    busy = _probe[0]
    _TURN_OWNER.acquire()  # another of JIT's threads taking turns holds one now: after it
    try:
        with _ENDED:
            _waiting[0] += 1
            TURN[0] = _WANTED
            try:
                while not _held[0] and busy is not None:
                    now = time.perf_counter()
                    if now - start >= TURN_WAIT_S:
                        break  # the program's calls are long: this turn runs beside one
                    if _ends[0] > _owed[0] and (_parked[0] or not busy()):
                        TURN[0] = _HELD
                        if _parked[0] or not busy():
                            break
                        TURN[0] = _WANTED  # a call began meanwhile: its end comes first
                    _ENDED.wait(TURN_WAIT_S - (now - start))
                TURN[0] = _HELD
            finally:
                _waiting[0] -= 1
    except BaseException:  # interrupted while waiting: no turn is held, none is wanted
        with _ENDED:
            TURN[0] = _FREE
            _ENDED.notify_all()
        _TURN_OWNER.release()
        raise
    _local.turn_started = _turn_began[0] = now = time.perf_counter()
    return now - start


def _end_turn() -> None:
    if getattr(_local, "turn_started", None) is None:
        return
    _local.turn_started = None
    with _ENDED:
        # a call that waited for this turn runs before the next one
        _owed[0] = _ends[0] if _parked[0] else -1
        TURN[0] = _FREE
        _turns_ended[0] += 1
        _ENDED.notify_all()
    _TURN_OWNER.release()


def _await_turn() -> None:
    """The program's call waits at its start for the turn under way, or about to be, to end
    (``_program_wait`` from the turn's start at most); it does not wait for the turns that
    follow."""
    start = time.perf_counter()
    with _ENDED:
        if not TURN[0] or (TURN[0] == _WANTED and _ends[0] <= _owed[0]):
            return  # no turn, or one that waits for this call: it runs first
        ended = _turns_ended[0]
        _parked[0] += 1
        _ENDED.notify_all()  # work waiting for the program's pause takes its turn now
        try:
            while TURN[0] and _turns_ended[0] == ended:
                # from the turn's start, where one runs: a turn that overran holds no more calls
                since = _turn_began[0] if TURN[0] == _HELD else start
                left = _program_wait() - (time.perf_counter() - since)
                if left <= 0:
                    break
                _ENDED.wait(left)
        finally:
            _parked[0] -= 1


def give_way(limit_s: float = LIMIT_S) -> float:
    """Wait while the program is inside a call (``limit_s`` at most), once this thread has run
    ``SLICE_S`` since it last waited, unless the program waits for this process's work
    (``program_waits``); the seconds waited."""
    busy = _probe[0]
    if busy is None or _held[0]:
        return 0.0
    now = time.perf_counter()
    if now - getattr(_local, "resumed", 0.0) < SLICE_S or not busy():
        return 0.0
    return _wait_out_call(busy, now, limit_s)


def wait_for_call_end(limit_s: float = LIMIT_S) -> float:
    """Wait while the program is inside a call (``limit_s`` at most), however little this
    thread ran since it last waited, unless the program waits for this process's work; the
    seconds waited. For a piece of work that must start between the program's calls, not just
    work that runs long."""
    busy = _probe[0]
    if busy is None or _held[0] or not busy():
        return 0.0
    return _wait_out_call(busy, time.perf_counter(), limit_s)


def _wait_out_call(busy: Callable[[], bool], start: float, limit_s: float) -> float:
    # The look and the wait under one lock: a call that ends in between notifies only once the
    # wait has released it, so no end is missed.
    with _ENDED:
        _waiting[0] += 1
        try:
            while True:
                now = time.perf_counter()
                if now - start >= limit_s or not busy() or _held[0]:
                    _local.resumed = now
                    return now - start
                _ENDED.wait(limit_s - (now - start))
        finally:
            _waiting[0] -= 1


# A run's gap: GAP_FACTOR times its length, within these bounds (a run that compiled, a build's
# first, is long on the host but not on the GPU).
GAP_FACTOR = 2.0
MIN_GAP_S = 0.005
MAX_GAP_S = 0.05
_SPACED = [False]  # a worker's job for a tune beside a program (space_runs)
MAX_ALIGN_S = 0.05  # the longest a spaced run waits for the middle of a call

# The call clock: three float64 of time.monotonic() (one clock for every process): the latest
# outermost call's start, its end (below its start while it runs), the last complete call's
# length. The program writes it (JIT's patched outermost call, through CALL_CLOCK, inline: it
# runs on every call) once JIT opened it; a worker maps it read-only. A torn read costs one
# badly placed run, nothing else.
_CLOCK_SLOTS = 3
CALL_CLOCK: list[Any] = [None]  # this process's view of the clock (a memoryview of float64)
_clock_file: list[Any] = [None, None]  # (path, mmap) kept open with the view
_CLOCK_LOCK = threading.Lock()
_CLOCK_PREFIX = "honed-calls-"


def open_call_clock() -> str:
    """The program's call clock's file (made on first use, removed at exit): JIT writes each
    outermost call's start and end there from now on."""
    with _CLOCK_LOCK:
        if _clock_file[0] is None:
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
            _remove_stale_clocks(folder or tempfile.gettempdir())
            fd, path = tempfile.mkstemp(prefix=f"{_CLOCK_PREFIX}{os.getpid()}-", dir=folder)
            os.write(fd, bytes(8 * _CLOCK_SLOTS))
            mapped = mmap.mmap(fd, 8 * _CLOCK_SLOTS)
            os.close(fd)
            import atexit

            atexit.register(_remove, path)
            _clock_file[:] = [path, mapped]
            CALL_CLOCK[0] = memoryview(mapped).cast("d")
        return str(_clock_file[0])


def _remove_stale_clocks(folder: str) -> None:
    """Remove the call clocks of processes that ended without their exit handlers (killed)."""
    from honed.pipeline.pool import pid_alive

    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            if not name.startswith(_CLOCK_PREFIX):
                continue
            pid = name[len(_CLOCK_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                _remove(os.path.join(folder, name))


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _map_clock(path: str) -> None:
    """In a worker: read the program's call clock at ``path`` ("" or unreadable: none)."""
    if _clock_file[0] == path:
        return
    CALL_CLOCK[0] = None
    if _clock_file[1] is not None:
        with contextlib.suppress(Exception):
            _clock_file[1].close()
    _clock_file[:] = [None, None]
    if not path:
        return
    try:
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), 8 * _CLOCK_SLOTS, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return
    _clock_file[:] = [path, mapped]
    CALL_CLOCK[0] = memoryview(mapped).cast("d")


def mid_call_wait(started: float, ended: float, last: float, now: float) -> float:
    """Seconds to wait before a run so that it starts halfway through a call of the program:
    0 when no call has ended yet (nothing to go by), when the program is idle (no call for two
    call lengths), or when the running call is past its middle; a short wait between two calls
    (the next is about to start: a program calling in a loop)."""
    if last <= 0.0:
        return 0.0
    if started > ended:  # inside a call
        return max(0.0, started + last / 2 - now)
    if now - ended > 2 * last:
        return 0.0
    return min(last / 4, 0.0005)


def wait_mid_call(
    view: Any = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait (``MAX_ALIGN_S`` at most) until the program is halfway through a call, by its call
    clock (``view``: this process's, if any; ``clock`` and ``sleep`` for tests)."""
    view = CALL_CLOCK[0] if view is None else view
    if view is None:
        return
    deadline = clock() + MAX_ALIGN_S
    while True:
        now = clock()
        wait = mid_call_wait(view[0], view[1], view[2], now)
        if wait <= 0.0 or now >= deadline:
            return
        sleep(min(wait, deadline - now))


def space_runs(on: bool, clock: str = "") -> None:
    """Space this process's model runs (``spaced_run``) as beside a program, or not: a worker
    process has no probe, and is told per job (with the program's call clock's file, if any)."""
    _SPACED[0] = on
    if on:
        _map_clock(clock)


def spaces(device: Any) -> bool:
    """Whether ``spaced_run`` spaces a run on ``device`` here (beside a program, on a GPU)."""
    return (_SPACED[0] or _probe[0] is not None) and _on_cuda(device)


@contextlib.contextmanager
def spaced_run(device: Any) -> Iterator[None]:
    """One run of a model on ``device`` (a check's, a build's first): beside a program on a
    CUDA device, started once the previous run's gap has passed and, with the program's call
    clock, halfway through one of its calls (``MAX_ALIGN_S`` at most), and waited for at its end
    (without the GIL) to set the next gap; elsewhere run as is. Never for a measurement: its
    calls are timed back to back."""
    if not spaces(device):
        yield
        return
    import torch

    wait = getattr(_local, "next_run", 0.0) - time.perf_counter()
    if wait > 0:
        time.sleep(wait)
    if _SPACED[0]:  # a worker: its own CUDA context, which the GPU time-slices with the
        # program's: halfway through a call, it overlaps the end of one and the start of the next.
        wait_mid_call()
    else:
        # In the program's process (JIT's thread: an install's warm-up, capture and check) the
        # run launches into the program's own CUDA context: beside a call, its launches and the
        # call's take turns (the GIL, the driver's locks), the call waiting at each turn.
        # Started as a call ends, its launches fall in the program's wait for the GPU.
        wait_for_call_end()
    started = time.perf_counter()
    yield
    torch.cuda.current_stream(device).synchronize()
    ended = time.perf_counter()
    gap = min(MAX_GAP_S, max(MIN_GAP_S, GAP_FACTOR * (ended - started)))
    _local.next_run = ended + gap


# Inductor's kernel benchmarks (a compile picking among a kernel's configs, in a worker's build):
# each runs its kernel for up to 25 ms after flushing the L2 cache 100 times, GPU time the
# program's context gets no slice of. Beside a program each is a spaced run, cut to these.
BENCH_MAX_MS = 3
BENCH_FLUSHES = 10


@contextlib.contextmanager
def spaced_benchmarks(device: Any) -> Iterator[None]:
    """While a build compiles for ``device`` beside a program on a GPU (``spaces``): each GPU
    benchmark Inductor runs (``benchmarker.benchmark_gpu``) is a ``spaced_run``, its kernel run
    for ``BENCH_MAX_MS`` at most after ``BENCH_FLUSHES`` cache flushes; elsewhere, and for a
    benchmarker that takes neither, as is. The choice among configs needs the fastest run, which
    a few runs give; a benchmark as long as three of the program's calls would hold each back."""
    if not spaces(device):
        yield
        return
    try:
        from torch._inductor.runtime import benchmarking
    except ImportError:  # a torch without Inductor's runtime: nothing benchmarks
        yield
        return
    bench: Any = getattr(benchmarking, "benchmarker", None)
    real = getattr(bench, "benchmark_gpu", None)
    if real is None or "benchmark_gpu" in vars(bench):  # none, or spaced already (nested)
        yield
        return
    import inspect

    try:
        takes = set(inspect.signature(real).parameters)
    except (TypeError, ValueError):
        takes = set()
    cuts = {"max_benchmark_duration": BENCH_MAX_MS, "memory_warmup_iters": BENCH_FLUSHES}

    def spaced(fn: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
        for name, most in cuts.items():
            if name in takes:
                given = kwargs.get(name)
                kwargs[name] = most if given is None else min(given, most)
        with spaced_run(device):
            return real(fn, *args, **kwargs)

    bench.benchmark_gpu = spaced
    try:
        yield
    finally:
        if vars(bench).get("benchmark_gpu") is spaced:
            del bench.benchmark_gpu


def _on_cuda(device: Any) -> bool:
    return device is not None and getattr(device, "type", str(device)).split(":")[0] == "cuda"


_STREAMS: dict[Any, Any] = {}
_STREAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def own_stream(device: Any) -> Iterator[None]:
    """Beside a program (a probe is set) on a CUDA ``device``: the block's GPU work on a stream
    of honed's own, after what the calling thread's stream holds, and finished at the end.

    A thread's current stream is the device's default stream unless it chose one, and the
    program's thread shares it: each kernel of a check or an eager reference run there queues
    the program's next kernels behind it. Elsewhere (no probe, the CPU) the block runs as is."""
    import torch

    if _probe[0] is None or not _on_cuda(device):
        yield
        return
    device = torch.device(device)
    with _STREAMS_LOCK:
        side = _STREAMS.get(device)
        if side is None:
            side = _STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield
    side.synchronize()  # its results are read on other streams next (waits without the GIL)


__all__ = [
    "CALL_CLOCK",
    "LIMIT_S",
    "TURN",
    "beside_program",
    "call_ended",
    "call_starting",
    "give_way",
    "mid_call_wait",
    "open_call_clock",
    "own_stream",
    "space_runs",
    "spaced_benchmarks",
    "spaced_run",
    "spaces",
    "taking_turns",
    "wait_for_call_end",
    "wait_mid_call",
    "watch",
]
