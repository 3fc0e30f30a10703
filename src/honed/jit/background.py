"""src/honed/jit/background.py: JIT's work beside the program: one thread, one job at a time.

The program's calls never wait for a graph-break check, a build or a measurement: those run
here, on one daemon thread, one after the other (tunes share the machine; running two at once
would only slow both). A job ends by swapping a node's tuned wrapper in (tuner.py), which the
next call of that module picks up. ``wait()`` blocks until every job queued so far (and every job
they queued) is done: the wait mode (``honed.jit.config.wait``) and tests use it.

When the program ends, ``_at_exit`` runs before the worker pool's own exit handler (it is
registered again after the pipeline is imported, and atexit runs the last registered first): no
job starts any more, the running tune is abandoned (its workers ended, nothing installed), the
exit waits for JIT's thread to be idle (a daemon thread still inside torch when the interpreter
finalizes can abort the process; past ``_EXIT_WAIT_S`` it says why it waits), then the exit
hooks (the HONED_JIT_REPORT report) run, so the report shows the cancelled tune.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("honed.jit")

# After this long waiting for a cancelled tune at the program's end, the exit says why it waits.
_EXIT_WAIT_S = 5.0


@dataclasses.dataclass
class TuneRecord:
    """One JIT tune of one module, for ``honed.jit.tunes()`` and the history.

    Attributes:
        module: the module, as the hierarchy names it ("TinyMLP 📊676").
        reason: why it ran: "first tune", "widen for new shapes", ...
        samples: the recorded calls it tuned on; ``batch_sizes`` the batch sizes covered
            (recorded and added by the batch headroom).
        budget_s: the time budget it ran under (None: none).
        tried: candidate name -> status ("ok", "failed", "rejected", "not tried").
        selected: the winning backend(s) ("" when eager stayed).
        evidence: what the choice rests on: "the program's calls" (candidates measured on the
            program's own calls, in turns, while it was calling), "worker measurement"
            (candidates measured in the worker pool while the program was idle or waiting),
            "in-process measurement, the program having stopped calling" (built while it
            called, measured by the tune once its calls stopped), "in-process measurement"
            (isolation "none"), or "cache" (an earlier run's
            measurements, nothing built or measured now).
        took_s: seconds from the start of the job to the install.
        calls_meanwhile: the module's calls while the job ran; ``ran_meanwhile`` what answered
            them ("eager", or "the previous variant" during a widen).
        status: "running", "installed", "eager" (nothing beat eager), "failed", "cancelled".
    """

    module: str
    reason: str
    samples: int = 0
    batch_sizes: list[int] = dataclasses.field(default_factory=list)
    budget_s: float | None = None
    tried: dict[str, str] = dataclasses.field(default_factory=dict)
    selected: str = ""
    evidence: str = ""
    took_s: float = 0.0
    calls_meanwhile: int = 0
    ran_meanwhile: str = "eager"
    status: str = "running"
    error: str = ""
    started: float = dataclasses.field(default_factory=time.perf_counter, repr=False)
    # While running: the calls so far and each candidate's state so far (the record of a tune
    # still running at exit, e.g. in its install, says where it got to).
    progress: Callable[[], tuple[int, dict[str, str]]] | None = dataclasses.field(
        default=None, repr=False, compare=False
    )

    def line(self) -> str:
        """The history's one-line summary."""
        if self.status == "running" and self.progress is not None:
            self.calls_meanwhile, self.tried = self.progress()
        tried = ", ".join(f"{name} {status}" for name, status in self.tried.items()) or "nothing"
        budget = f", budget {self.budget_s:g}s" if self.budget_s else ""
        head = f"{self.module} ({self.reason}{budget}) beside the program"
        meanwhile = f"{self.calls_meanwhile} call(s) ran {self.ran_meanwhile} meanwhile"
        if " until call " in self.ran_meanwhile:  # a variant answered from a call on
            meanwhile = f"{self.calls_meanwhile} call(s) ran meanwhile: {self.ran_meanwhile}"
        if self.status in ("installed", "eager"):
            outcome = (
                f"selected {self.selected} on {self.evidence}"
                if self.status == "installed"
                else f"eager stayed ({self.evidence})"
            )
            return f"Tuned {head} in {self.took_s:.2f}s: tried {tried}; {outcome}; {meanwhile}"
        why = f" ({self.error})" if self.error else ""
        took = time.perf_counter() - self.started if self.status == "running" else self.took_s
        return f"Tuning {head} {self.status}{why} after {took:.2f}s: tried {tried}; {meanwhile}"


class _Worker:
    """The daemon thread and its queue; ``pending`` counts jobs queued and not finished."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.Queue()
        self.lock = threading.Condition()
        self.pending = 0
        self.waiters = 0  # threads of the program in wait()
        self.thread: threading.Thread | None = None
        self.current: Any = None  # the running honed.pipeline.tuner.Tuner, for cancel at exit
        self.records: list[TuneRecord] = []
        self.exiting = False  # the program is ending: no job starts any more
        self.exit_hooks: list[Callable[[], None]] = []

    def submit(self, job: Callable[..., None], *args: Any) -> bool:
        with self.lock:
            if self.exiting:
                return False
            self.pending += 1
            self.jobs.put((job, args))  # under the lock: an idle thread ends only when empty
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="honed-jit", daemon=True)
                self.thread.start()
        return True

    def _loop(self) -> None:
        from honed.backend import _aoti_direct
        from honed.jit.patcher import paused
        from honed.pipeline.courtesy import give_way

        while True:
            # The thread ends when the queue is empty and a new one takes the next job: a thread
            # that has run torch ops keeps its OpenMP team, and with more OpenMP threads than
            # cores libgomp stops spin-waiting, so every parallel op of the program's calls
            # waits for its workers to wake (several times slower on a 2-core machine).
            with self.lock:
                if self.jobs.empty():
                    self.thread = None
                    return
            job, args = self.jobs.get()
            try:
                if self.exiting:
                    continue  # queued before the program ended: left undone
                with _prompt_gil():
                    # A job is queued from inside the program's call (its last recorded one):
                    # the job starts once that call has ended, and the collection below, one C
                    # call holding the GIL, runs between the program's calls.
                    give_way()
                    _spare_the_collector()
                    # JIT's calls of the modules run their originals; its packages load and run
                    # without the GIL, so the program's calls go on meanwhile.
                    with paused(), _aoti_direct.unlocked_loads():
                        job(*args)
            except Exception:  # a job's failure is logged; the program and other jobs go on
                log.warning("honed.jit: a background job failed", exc_info=True)
            finally:
                with self.lock:
                    self.pending -= 1
                    self.lock.notify_all()

    def wait(self, timeout_s: float | None) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: self.pending == 0, timeout_s)


# Python's switch interval while a JIT job runs: the job's in-process Python (pickling for the
# workers, imports, the install) holds the GIL, and each torch op of the program's call that gives
# the GIL up waits this long to get it back (5 ms by default) before JIT's thread is asked to let
# go. A call of a few hundred ops pays it per op: small enough that the sum stays within the call.
SWITCH_INTERVAL_S = 0.00005


@contextlib.contextmanager
def _prompt_gil() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(before)


# The cyclic garbage collector's full collection (its oldest generation) walks every tracked
# object of the process in one C call that holds the GIL: in a program that imported torch and a
# model library that is hundreds of thousands of objects. JIT's work allocates (imports of the
# backends' packages, pickling for the workers, the winner's build), and the allocation that
# crosses the collector's threshold runs that collection on JIT's thread while the program's call
# waits for the GIL. So before each job the objects that exist then are moved out of the
# collector's reach (``gc.freeze``): later collections walk only what was made since. They stay
# there: ``gc.unfreeze`` would put them all back in the oldest generation, and the next full
# collection (soon, in whichever thread allocates, usually the program's) would walk them all at
# once. Reference counting still frees any of them that is dropped; only a reference cycle among
# them is not reclaimed (a collection of the young generations first lets the cycles dropped
# lately go; honed.jit.reset gives them all back).
# ``HONED_JIT_GC_FREEZE=0`` (``honed.config.jit_gc_freeze``) turns this off.
# None: JIT has not frozen anything in this process.
_FROZE: dict[str, bool | None] = {"program_froze_first": None}


def _spare_the_collector() -> None:
    from honed import config

    if not config.jit_gc_freeze:
        return
    if _FROZE["program_froze_first"] is None:
        _FROZE["program_froze_first"] = gc.get_freeze_count() > 0
    gc.collect(1)
    gc.freeze()


def thaw() -> None:
    """Give the objects JIT froze back to the collector (``honed.jit.reset``: JIT starts over);
    a program that had frozen objects itself before JIT's first job keeps them frozen."""
    if _FROZE["program_froze_first"] is False:
        gc.unfreeze()
    _FROZE["program_froze_first"] = None


_WORKER = _Worker()


def submit(job: Callable[..., None], *args: Any) -> bool:
    """Run ``job(*args)`` on JIT's background thread, after the jobs queued before it; False
    (nothing queued) once the program is ending."""
    return _WORKER.submit(job, *args)


def exiting() -> bool:
    """Whether the program is ending (JIT starts nothing new)."""
    return _WORKER.exiting


def in_background() -> bool:
    """Whether the caller is JIT's background thread."""
    return threading.current_thread() is _WORKER.thread


def wait(timeout_s: float | None = None) -> bool:
    """Block until JIT has no work left (checks, tunes, installs); False if ``timeout_s`` ran out.

    Called from JIT's own thread it returns at once (a job never waits for itself).
    """
    if in_background():
        return True
    with _WORKER.lock:
        _WORKER.waiters += 1
    try:
        return _WORKER.wait(timeout_s)
    finally:
        with _WORKER.lock:
            _WORKER.waiters -= 1


def waited_on() -> bool:
    """Whether a thread of the program is in ``wait()`` now (it makes no call meanwhile)."""
    return _WORKER.waiters > 0


def busy() -> bool:
    """Whether JIT has work queued or running."""
    return _WORKER.pending > 0


def set_current(tuner: Any) -> bool:
    """Make ``tuner`` the one cancelled at exit; False (and nothing set) once the program ends."""
    with _WORKER.lock:
        if tuner is not None and _WORKER.exiting:
            return False
        _WORKER.current = tuner
        return True


# Held while a tune's outcome is written: the module's new state (installed, eager) and its
# record's. records() takes it too, so a program that saw either one sees both. Reentrant: a
# log handler on JIT's thread may read records().
settling = threading.RLock()


def records() -> list[TuneRecord]:
    """Every JIT tune of this process, oldest first (copies of the records)."""
    with settling:
        return [dataclasses.replace(r) for r in _WORKER.records]


def add_record(record: TuneRecord) -> None:
    _WORKER.records.append(record)


def clear_records() -> None:
    _WORKER.records.clear()


def cancel_and_wait(timeout_s: float | None = None, abandon: bool = False) -> bool:
    """Cancel the running tune and wait for the rest; False if ``timeout_s`` ran out.

    abandon: select and install nothing (at exit); otherwise the best candidate so far wins.
    """
    tuner = _WORKER.current
    if tuner is not None:
        tuner.cancel(abandon=abandon, reason="the program ended" if abandon else "cancelled")
    return wait(timeout_s)


def on_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the program ends, after JIT's running tune was cancelled."""
    if hook not in _WORKER.exit_hooks:
        _WORKER.exit_hooks.append(hook)


def register_exit() -> None:
    """(Re-)register the exit handler so that it runs before handlers registered until now
    (the worker pool's, which would end the tune's workers under it)."""
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)


def _at_exit() -> None:
    """The program ends: start nothing, abandon the running tune, wait a little, report."""
    with _WORKER.lock:
        _WORKER.exiting = True
        tuner = _WORKER.current
    if _WORKER.pending:
        started = time.perf_counter()
        if tuner is not None:
            tuner.cancel(abandon=True, reason="the program ended")
        if not wait(_EXIT_WAIT_S):
            # A build, check or install in this process cannot be interrupted, and a daemon
            # thread still inside torch when the interpreter finalizes aborts the process (the
            # program would end with SIGABRT instead of its own status): wait for that step.
            # Nothing new starts after it, so the wait is one step long.
            print(
                "honed.jit: the program ended during an install in this process; waiting for it "
                "to finish (nothing new starts)",
                file=sys.stderr,
                flush=True,
            )
            wait(None)
        log.debug("honed.jit: stopping at exit took %.2fs", time.perf_counter() - started)
    # The last job done is not the thread done: what the job leaves (its frames, a check's
    # worker pool) is torn down after it, and a daemon thread still inside native code when the
    # interpreter finalizes aborts the process ("terminate called without an active exception";
    # 3 of 11 runs of a program that ended during the graph-break check). The thread ends once
    # its queue is empty, and nothing new is queued now.
    for thread in threading.enumerate():
        if thread.name == "honed-jit" and thread is not threading.current_thread():
            thread.join(_EXIT_WAIT_S)
    for hook in list(_WORKER.exit_hooks):
        try:
            hook()
        except Exception:  # a report that fails must not change how the program ends
            log.warning("honed.jit: an exit hook failed", exc_info=True)


def _reset_exit() -> None:
    """For tests that simulate the program's end in-process: JIT may start work again."""
    with _WORKER.lock:
        _WORKER.exiting = False


register_exit()

__all__ = [
    "TuneRecord",
    "add_record",
    "busy",
    "cancel_and_wait",
    "clear_records",
    "exiting",
    "in_background",
    "on_exit",
    "records",
    "register_exit",
    "set_current",
    "submit",
    "wait",
]
