"""src/honed/pipeline/pool.py: the worker pool: long-lived processes that build, check and measure.

Shaped like torch's ``_inductor/autotune_process.py``: each slot of the pool is a thread that owns
one worker process (``python -m honed.pipeline._worker``, started once: torch, and Inductor where
a candidate needs it, are imported once per worker, not once per candidate) and feeds it jobs
over a socket (the engine's ``_core.Worker``: memory ceiling of the worker's whole process tree,
crash and exit detection).
A job that runs past its phase limit, crashes the worker, passes the memory ceiling or ends the
worker without a result fails alone: its worker is ended with every process below it and a
fresh one takes the next job.

Jobs and futures: ``submit(job)`` returns a ``concurrent.futures.Future`` whose result is a
``JobResult`` (never an exception for a failing job), so a background thread (JIT) can submit,
poll, add callbacks and ``cancel(future)`` while its program runs.

Sound figures: a worker asks before it measures (``("phase", "measure")``) and waits for a
``go``. Per device, one job measures at a time. On a CPU device builds would steal the cores
being timed, so while a job measures there every building worker is paused (SIGSTOP to its
process tree, SIGCONT after; the pause does not count against its time limit) and no build
starts: no worker waits for another's long build to finish before it measures. A job's
``measure_if`` may answer ``skip`` instead (JIT: the program is calling, its calls measure).
"""

from __future__ import annotations

import atexit
import bisect
import concurrent.futures
import contextlib
import dataclasses
import io
import itertools
import logging
import os
import pickle
import queue
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle

from honed import _core
from honed.pipeline import buildlog

log = logging.getLogger("honed")

WORKER_PREFIX = "honed-worker-"
_START_TIMEOUT_S = 300.0  # importing torch and Inductor on a loaded machine
_SEND_TIMEOUT_S = 120.0  # a worker between jobs reads at once; this only catches a stuck one
_EXIT_GRACE_S = 5.0  # a worker told to exit: time to leave by itself before SIGKILL
_POLL_MS = 50.0  # how often a waiting slot checks the worker's memory
_RECYCLE_SHARE = 0.5  # a worker above this share of its memory ceiling is replaced after a job


@dataclasses.dataclass
class Context:
    """Data many jobs share (module, samples, references), sent once per worker: ``blob``, or
    ``fresh()`` when each worker needs a blob of its own (honed.pipeline.sharing's handles).
    A blob is frames: a pickle's stream, then the buffers it left out of band."""

    key: str
    blob: list[Any]
    fresh: Callable[[], list[Any]] | None = None

    def payload(self) -> list[Any]:
        return self.fresh() if self.fresh is not None else self.blob


@dataclasses.dataclass
class Job:
    """One request to a worker.

    kind: "evaluate" or "interleave" (see honed.pipeline._worker); request: its picklable fields;
    device: where it measures ("cpu", "cuda:0"); spread: it may run on any GPU of the pool
    (the worker moves the context there); limits: seconds per phase ("build" starts the job,
    "measure" starts at the go; each phase restarts the clock); priority: lower runs first;
    on_phase: called from the slot's thread as the worker enters a phase; measure_if: asked
    once the job's turn to measure comes: False tells the worker to skip its measurement.
    """

    kind: str
    request: dict[str, Any]
    context: Context | None
    device: str
    limits: dict[str, float]
    priority: float = 0.0
    spread: bool = False
    on_phase: Callable[[str], None] | None = None
    label: str = ""
    measure_if: Callable[[], bool] | None = None
    # the slot (WorkerPool.slots) it should run on while that slot is idle, -1 none: a job that
    # loads what a worker built (the finalists' re-measure) finds that worker's imports, traces
    # and compiled kernels in place
    prefer_slot: int = -1


@dataclasses.dataclass
class JobResult:
    """How a job went: the worker's reply, or a one-line failure saying how the worker failed."""

    reply: Any = None
    failure: str = ""
    phase: str = ""  # the phase the job was in when it ended
    output: str = ""  # the worker's stdout/stderr during the job (their tails)
    seconds: float = 0.0
    device: str = ""  # where it ran
    cancelled: bool = False
    paused_build_s: float = 0.0  # of its build phase, seconds its worker spent paused
    slot: int = -1  # the pool slot that ran it (Job.prefer_slot)

    @property
    def ok(self) -> bool:
        return not self.failure and not self.cancelled


class _JobQueue:
    """The pool's jobs by (priority, order), shared by its slots' threads. A job that prefers
    a slot (``Job.prefer_slot``) goes to that slot while it waits for work, and to any slot while
    it is busy or gone; the others leave it alone meanwhile."""

    def __init__(self) -> None:
        self._items: list[tuple[Any, ...]] = []  # (priority, seq, job, future), in order
        self._cond = threading.Condition()
        self._waiting: set[int] = set()  # the slots waiting in get()

    def put(self, item: tuple[Any, ...]) -> None:
        with self._cond:
            bisect.insort(self._items, item)
            self._cond.notify_all()

    def get(self, slot: int) -> tuple[Any, ...]:
        """The first item ``slot`` may take, waiting for one."""
        with self._cond:
            self._waiting.add(slot)
            try:
                while True:
                    for i, item in enumerate(self._items):
                        prefer = _preferred(item)
                        if prefer in (-1, slot) or prefer not in self._waiting:
                            del self._items[i]
                            self._cond.notify_all()  # this slot is no longer idle
                            return item
                    self._cond.wait()
            finally:
                self._waiting.discard(slot)

    def get_nowait(self) -> tuple[Any, ...]:
        with self._cond:
            if not self._items:
                raise queue.Empty
            return self._items.pop(0)


def _preferred(item: tuple[Any, ...]) -> int:
    job = item[2]
    return job.prefer_slot if job is not None else -1


class _Gate:
    """Who builds and who measures on one device (see the module docstring).

    One measurement at a time. On a CPU device (``pause_builders``) a measurement pauses every
    worker that is building (SIGSTOP to its process tree, SIGCONT after), and no build starts
    while one runs: the measured code has the cores to itself, yet no worker waits for another's
    build to finish before it measures.
    """

    def __init__(self, pause_builders: bool) -> None:
        self.pause_builders = pause_builders
        self._cond = threading.Condition()
        self._builders: set[_Slot] = set()
        self._measuring: _Slot | None = None
        self._paused: list[_Slot] = []

    def enter_build(self, slot: _Slot) -> None:
        with self._cond:
            while self.pause_builders and self._measuring is not None:
                self._cond.wait()
            self._builders.add(slot)

    def leave_build(self, slot: _Slot) -> None:
        with self._cond:
            self._builders.discard(slot)

    def enter_measure(self, slot: _Slot) -> None:
        with self._cond:
            while self._measuring is not None:
                self._cond.wait()
            self._measuring = slot
            if self.pause_builders:
                self._paused = [s for s in self._builders if s is not slot]
                for s in self._paused:
                    s.pause()

    def leave_measure(self, slot: _Slot) -> None:
        with self._cond:
            for s in self._paused:
                s.resume()
            self._paused = []
            if self._measuring is slot:
                self._measuring = None
            self._cond.notify_all()


# Bytes this large in a job's request (a finalist's payload, hundreds of MB for a CPU model's
# ONNX file) leave the pickle's stream: the pool's Worker.send joins them without the GIL.
_OUT_OF_BAND_BYTES = 1 << 20


class _OutOfBand:
    """Large bytes of a request, pickled as an out-of-band buffer; bytes again when loaded."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> Any:
        return bytes, (pickle.PickleBuffer(self.data),)


def _large_bytes_aside(value: Any) -> Any:
    if isinstance(value, bytes) and len(value) >= _OUT_OF_BAND_BYTES:
        return _OutOfBand(value)
    if type(value) is dict:
        return {k: _large_bytes_aside(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_large_bytes_aside(v) for v in value)
    return value


def request_frames(request: Any) -> list[Any]:
    """A job's request as frames: cloudpickle's stream (classes of the user's __main__ travel by
    value), then its large bytes (pickling copies none of them)."""
    stream, buffers = io.BytesIO(), []
    pickler = cloudpickle.Pickler(
        stream, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=lambda b: buffers.append(b.raw())
    )
    pickler.dump(_large_bytes_aside(request))
    return [stream.getbuffer(), *buffers]


def _message(tag: str, name: str, frames: list[Any]) -> list[Any]:
    """A worker's message of frames: the envelope ``(tag, name, sizes)`` pickled, then the
    frames, which Worker.send joins without the GIL (honed.pipeline._worker splits them)."""
    head = (tag, name, [len(memoryview(f)) for f in frames])
    return [pickle.dumps(head), *frames]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_folders(root: Path | None = None) -> list[Path]:
    """Remove ``honed-worker-PID-*`` folders whose process is gone; returns what was removed."""
    root = Path(root or tempfile.gettempdir())
    removed = []
    for path in root.glob(f"{WORKER_PREFIX}*"):
        pid_text = path.name[len(WORKER_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or pid_alive(int(pid_text)):
            continue
        try:
            if path.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        log.info("honed: removed %d folder(s) of ended tunes: %s", len(removed), removed)
    return removed


def _ended_reason(ended: Any, phase: str) -> str:
    """One line for a worker that ended during a job."""
    if ended.ok or (ended.exit_code == 0 and not ended.signal):
        return f"the worker exited without a result (exit status 0) during {phase or 'the job'}"
    reason = str(ended.summary())
    tail = _last_line(ended.stderr_tail)
    if tail and not ended.timed_out and not ended.memory_exceeded:
        reason = f"{reason}: {tail}"
    return reason


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    line = lines[-1]
    return line if len(line) <= 200 else line[:197] + "..."


class _Slot:
    """One thread and the worker process it owns (restarted after a failure)."""

    def __init__(self, pool: WorkerPool, index: int, device: str) -> None:
        self.pool = pool
        self.index = index
        self.device = device  # the GPU this slot's spread jobs measure on ("" for none)
        self.worker: Any = None
        self.folder: Path | None = None
        self.context_key = ""
        self.ready = False
        self.current: concurrent.futures.Future[JobResult] | None = None
        self.cancel_current = False  # pool.cancel() asked to end the job in progress
        self.paused_since: float | None = None
        self.paused_total = 0.0
        self.measuring = False  # its worker measures now: never paused (its figures)
        self._pauses = 0  # pause() calls not yet resumed (the gate's, JIT's pacing)
        self._pause_lock = threading.Lock()
        self.up = threading.Event()  # its first start is over (ready, failed, or none made)
        self.thread = threading.Thread(target=self._loop, name=f"honed-pool-{index}", daemon=True)

    # -- pausing (another worker measures on this CPU; JIT's pacing) ------------------------------
    def pause(self, unless_measuring: bool = False) -> bool:
        """Stop this slot's worker until as many resume() calls as pause() calls have come;
        ``unless_measuring``: not while it measures (then False, and no resume() is owed)."""
        with self._pause_lock:
            if unless_measuring and self.measuring:
                return False
            self._pauses += 1
            worker = self.worker
            if self._pauses == 1 and worker is not None:
                self.paused_since = time.monotonic()
                worker.pause()
            return True

    def resume(self) -> None:
        with self._pause_lock:
            if self._pauses == 0:
                return
            self._pauses -= 1
            if self._pauses:
                return
            if self.paused_since is not None:
                self.paused_total += time.monotonic() - self.paused_since
                self.paused_since = None
            worker = self.worker
            if worker is not None:
                worker.resume()

    def paused_seconds(self) -> float:
        """Seconds this slot's worker has spent paused (they do not count against its limits)."""
        since = self.paused_since
        return self.paused_total + (time.monotonic() - since if since is not None else 0.0)

    # -- the worker's life ---------------------------------------------------------------------
    def _start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix=f"{WORKER_PREFIX}{os.getpid()}-{self.index}-"))
        env = dict(self.pool.env)
        env["TMPDIR"] = str(self.folder)  # the worker's temporary files end with it
        options = _core.IsolateOptions(
            argv=[sys.executable, "-m", "honed.pipeline._worker"],
            env=sorted(env.items()),
            memory_limit_bytes=self.pool.memory_limit_bytes,
            poll_ms=_POLL_MS,
        )
        self.worker = _core.Worker(options)
        self.context_key, self.ready = "", False
        if self.worker.running and self.pool.nice > 0:
            # Set before the worker is told anything: all of its start (importing torch) and
            # every thread and compiler it starts afterwards inherit it.
            with contextlib.suppress(OSError):
                os.setpriority(
                    os.PRIO_PROCESS,
                    self.worker.pid,
                    os.getpriority(os.PRIO_PROCESS, 0) + self.pool.nice,
                )
        if self.worker.running and self.pool.cpus:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.worker.pid, self.pool.cpus)
        if self.worker.running:
            hello = {
                "sys_path": [p for p in sys.path if p],
                "config": self.pool.worker_config,
                "preload": list(self.pool.preload),
            }
            self.worker.send(pickle.dumps(("hello", hello)), _SEND_TIMEOUT_S)

    def _stop(self, grace_s: float) -> Any:
        ended = None
        if self.worker is not None:
            if self.worker.running and grace_s > 0:
                self.worker.send(pickle.dumps(("exit",)), 1.0)
            ended = self.worker.stop(grace_s)
            self.worker = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None
        return ended

    def _wait_ready(self) -> str:
        """ "" when the worker is ready for jobs, else why it is not."""
        if self.worker is None or not self.worker.running:
            self._stop(0.0)
            self._start()
        if self.ready:
            return ""
        if not self.worker.running:
            return f"the worker could not start: {self.worker.start_error}"
        event = self.worker.receive(_START_TIMEOUT_S)
        if event.kind == "message" and pickle.loads(event.message)[0] == "ready":
            self.ready = True
            self.worker.take_output()
            return ""
        if event.kind == "cancelled":
            self._stop(0.0)
            return "cancelled"
        if event.kind == "message":
            text = pickle.loads(event.message)
            why = f"the worker failed to start: {text[-1] if isinstance(text, tuple) else text}"
        elif event.kind == "timed_out":
            why = f"the worker did not start within {_START_TIMEOUT_S:g} s"
        else:
            why = "the worker failed to start: " + _ended_reason(event.ended, "start-up")
        self._stop(0.0)
        return why

    def _first_start(self) -> None:
        """Start this slot's worker; in a staggered pool, after the slot before it is up, and
        wait for it to be ready (a worker that fails to start is started again by its first job)."""
        if not self.pool.stagger:
            self._start()
            return
        if self.index:
            before = self.pool.slots[self.index - 1].up
            while not before.wait(0.5):
                if self.pool.closed:
                    return
        if self.pool.closed:
            return
        self._start()
        if not self.pool.closed:
            self._wait_ready()

    # -- the thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            try:
                if not self.pool.lazy:
                    self._first_start()
            finally:
                self.up.set()
            while True:
                item = self.pool.queue.get(self.index)
                if item[-1] is None:  # the pool is closing
                    break
                job, future = item[2], item[3]
                self.current, self.cancel_current = future, False
                if not future.set_running_or_notify_cancel():
                    self.current = None
                    continue
                try:
                    result = self._run(job)
                except BaseException as e:  # never leave a future without an answer
                    log.debug("honed: pool slot %d failed", self.index, exc_info=True)
                    self._stop(0.0)
                    result = JobResult(failure=f"the pool failed: {type(e).__name__}: {e}")
                finally:
                    self.current = None
                future.set_result(result)
        finally:
            self._stop(_EXIT_GRACE_S if not self.pool.cancelling else 0.0)

    def _run(self, job: Job) -> JobResult:
        started = time.perf_counter()
        device = self.device if (job.spread and self.device) else job.device
        result = self._converse(job, device, self.pool.gate(device))
        result.seconds = time.perf_counter() - started
        result.device = device
        result.slot = self.index
        if self.worker is not None and self.worker.running and self.pool.memory_limit_bytes:
            if self.worker.resident_bytes() > _RECYCLE_SHARE * self.pool.memory_limit_bytes:
                self._stop(_EXIT_GRACE_S)  # what its last jobs left behind: start afresh
        return result

    def _converse(self, job: Job, device: str, gate: _Gate) -> JobResult:
        """Send the job, follow its phases under their limits, return how it ended."""
        phase = "start-up"
        gate.enter_build(self)
        in_build = True
        try:
            why = self._wait_ready()
            if why:
                return JobResult(failure=why, phase=phase, cancelled=why == "cancelled")
            if self.cancel_current:
                self.worker.cancel()
            if job.context is not None and job.context.key != self.context_key:
                event = self.worker.send(
                    _message("context", job.context.key, job.context.payload()), -1
                )
                if event.kind != "sent":
                    return self._failed(event, "sending the job", job)
                self.context_key = job.context.key
            request = request_frames(dict(job.request, device=device))
            event = self.worker.send(_message("job", job.kind, request), _SEND_TIMEOUT_S)
            if event.kind != "sent":
                return self._failed(event, "sending the job", job)
            phase = "build"
            limit = job.limits.get("build", 0.0)
            deadline = time.monotonic() + limit if limit > 0 else None
            paused = build_mark = self.paused_seconds()
            build_paused = 0.0
            while True:
                wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
                event = self.worker.receive(wait)
                if event.kind == "timed_out" and deadline is not None:
                    now_paused = self.paused_seconds()
                    if now_paused > paused or self.paused_since is not None:
                        deadline += now_paused - paused  # time spent paused is not its time
                        paused = now_paused
                        continue
                if event.kind == "timed_out":
                    self._stop(0.0)
                    return JobResult(
                        failure=f"killed after the {limit:g} s {phase} timeout",
                        phase=phase,
                        output=self._output(),
                    )
                if event.kind != "message":
                    return self._failed(event, phase, job)
                message = pickle.loads(event.message)
                if message[0] == "result":
                    result = JobResult(reply=message[1], phase=phase, output=self._output())
                    in_build_phase = self.paused_seconds() - build_mark
                    result.paused_build_s = in_build_phase if phase == "build" else build_paused
                    if len(message) > 2 and message[2]:  # its CUDA context broke: a new one
                        self._stop(0.0)
                    return result
                if message[0] == "error":
                    result = JobResult(failure=message[1], phase=phase, output=self._output())
                    if device.startswith("cuda"):
                        # A CUDA error (a device-side assert, an illegal access) is sticky: every
                        # later call in that process fails, so the next job gets a new worker.
                        self._stop(0.0)
                    return result
                if message[0] != "phase":
                    continue
                if phase == "build":  # leaving it: what it spent paused is not build time
                    build_paused = self.paused_seconds() - build_mark
                phase = message[1]
                if job.on_phase is not None:
                    job.on_phase(phase)
                if phase == "measure":
                    if in_build:
                        gate.leave_build(self)
                        in_build = False
                    go = job.measure_if is None or job.measure_if()
                    if go:  # else measured elsewhere: no turn on the device is taken
                        gate.enter_measure(self)
                        with self._pause_lock:  # from here pacing leaves it running
                            self.measuring = True
                    event = self.worker.send(
                        pickle.dumps(("go" if go else "skip",)), _SEND_TIMEOUT_S
                    )
                    if event.kind != "sent":
                        return self._failed(event, phase, job)
                if phase in job.limits:
                    limit = job.limits[phase]
                    deadline = time.monotonic() + limit if limit > 0 else None
                    paused = self.paused_seconds()
        finally:
            if in_build:
                gate.leave_build(self)
            if self.measuring:
                self.measuring = False
                gate.leave_measure(self)

    def _failed(self, event: Any, phase: str, job: Job) -> JobResult:
        output = self._output(event)
        if event.kind == "cancelled":
            self._stop(0.0)
            return JobResult(failure="cancelled", phase=phase, output=output, cancelled=True)
        if event.kind == "timed_out":
            self._stop(0.0)
            return JobResult(failure=f"the worker stopped reading ({phase})", phase=phase)
        reason = _ended_reason(event.ended, phase)
        log.debug("honed: worker for %s ended: %s\n%s", job.label, reason, event.ended.stderr_tail)
        self._stop(0.0)
        return JobResult(failure=reason, phase=phase, output=output)

    def _output(self, event: Any = None) -> str:
        if self.worker is None:
            return ""
        out, err = self.worker.take_output()
        if event is not None and event.kind in ("ended", "cancelled"):
            out, err = out or event.ended.stdout_tail, err or event.ended.stderr_tail
        return buildlog.worker_text(out, err)


_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
# The CPUs that open pools keep their workers on: read on each of a JIT program's calls while JIT
# works (honed.jit.cores), so it is worked out as such a pool opens or closes, not there.
_PLACED: list[frozenset[int]] = [frozenset()]


def placed_cpus() -> frozenset[int]:
    """The CPUs that the open pools placed on some of them keep their workers on (empty: no
    open pool is placed)."""
    return _PLACED[0]


_PLACED_LOCK = threading.Lock()  # pools open and close on several threads (JIT's, a tune's)


def _update_placed() -> None:
    with _PLACED_LOCK:
        _PLACED[0] = frozenset(
            cpu for pool in list(_POOLS) if pool.cpus and not pool.closed for cpu in pool.cpus
        )


class WorkerPool:
    """Worker processes that run jobs (see the module docstring). Use as a context manager."""

    def __init__(
        self,
        size: int,
        *,
        memory_limit_bytes: int = 0,
        env: dict[str, str] | None = None,
        worker_config: dict[str, Any] | None = None,
        gpus: list[str] | None = None,
        lazy: bool = False,
        nice: int = 0,
        cpus: list[int] | None = None,
        stagger: bool = False,
        preload: tuple[str, ...] = (),
    ) -> None:
        if size < 1:
            raise ValueError(f"WorkerPool: size must be at least 1, got {size}")
        clean_stale_folders()
        # Workers start one after another, each once the one before it is ready (JIT: beside a
        # program, several interpreters importing torch at once slowed its calls).
        self.stagger = stagger and not lazy
        self.nice = nice  # added to each worker's niceness as it starts (JIT: below the program)
        self.cpus = cpus  # the CPUs each worker runs on (None: this process's)
        self.memory_limit_bytes = memory_limit_bytes
        self.env = dict(env or {})
        self.worker_config = dict(worker_config or {})
        self.lazy = lazy
        self.preload = preload  # modules each worker imports before it is ready
        self.cancelling = False
        self.closed = False
        self.queue = _JobQueue()
        self._seq = itertools.count()
        self._gates: dict[str, _Gate] = {}
        self._gates_lock = threading.Lock()
        self.slots = [_Slot(self, i, "") for i in range(size)]
        self.spread_over(list(gpus or []))
        for slot in self.slots:
            slot.thread.start()
        _POOLS.add(self)
        if cpus:
            _update_placed()

    @property
    def size(self) -> int:
        return len(self.slots)

    def spread_over(self, gpus: list[str]) -> None:
        """The GPUs the slots' spread jobs measure on, as the constructor's ``gpus`` (a pool
        started before its model's device was known is given them when it is)."""
        for slot in self.slots:
            slot.device = gpus[slot.index % len(gpus)] if gpus else ""

    def busy_slots(self) -> list[_Slot]:
        """The slots whose worker starts, builds or checks now (not one that measures)."""
        return [
            slot
            for slot in self.slots
            if slot.worker is not None
            and not slot.measuring
            and (slot.current is not None or not slot.ready)
        ]

    def gate(self, device: str) -> _Gate:
        with self._gates_lock:
            if device not in self._gates:
                self._gates[device] = _Gate(pause_builders=not device.startswith("cuda"))
            return self._gates[device]

    def submit(self, job: Job) -> concurrent.futures.Future[JobResult]:
        """Queue ``job``; its future's result is a JobResult (a failing job is a result too)."""
        if self.closed:
            raise RuntimeError("WorkerPool.submit: the pool is closed")
        future: concurrent.futures.Future[JobResult] = concurrent.futures.Future()
        self.queue.put((job.priority, next(self._seq), job, future))
        return future

    def cancel(self, future: concurrent.futures.Future[JobResult]) -> bool:
        """Cancel a queued job, or end the worker running it (the job fails as "cancelled")."""
        if future.cancel():
            return True
        for slot in self.slots:
            if slot.current is future:
                slot.cancel_current = True
                if slot.worker is not None:
                    slot.worker.cancel()
                return True
        return False

    def close(self, cancel: bool = False, timeout_s: float = 30.0) -> None:
        """End every worker (with its whole process tree) and remove their folders.

        cancel: end running jobs now instead of letting them finish; queued jobs are cancelled.
        """
        if self.closed:
            return
        self.closed = True
        if self.cpus:
            _update_placed()
        self.cancelling = cancel
        with contextlib.suppress(queue.Empty):
            while True:
                item = self.queue.get_nowait()
                item[3].cancel()
        if cancel:
            for slot in self.slots:
                if slot.worker is not None:
                    slot.worker.cancel()
        for _ in self.slots:
            self.queue.put((float("inf"), next(self._seq), None, None))
        deadline = time.monotonic() + timeout_s
        for slot in self.slots:
            slot.thread.join(max(0.0, deadline - time.monotonic()))
            if slot.thread.is_alive() and slot.worker is not None:
                slot.worker.cancel()  # a job that would not finish in time
                slot.thread.join(5.0)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(cancel=exc_type is not None)


def wait_all(
    futures: list[concurrent.futures.Future[JobResult]], timeout_s: float | None = None
) -> Iterator[concurrent.futures.Future[JobResult]]:
    """Yield futures as they finish, waking often enough for Ctrl-C and SIGTERM to be seen."""
    pending = set(futures)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while pending:
        wait = 0.5 if deadline is None else min(0.5, max(0.0, deadline - time.monotonic()))
        done, pending = concurrent.futures.wait(
            pending, timeout=wait, return_when=concurrent.futures.FIRST_COMPLETED
        )
        yield from done
        if deadline is not None and time.monotonic() >= deadline:
            return


def _close_all() -> None:
    for pool in list(_POOLS):
        pool.close(cancel=True, timeout_s=5.0)


atexit.register(_close_all)
