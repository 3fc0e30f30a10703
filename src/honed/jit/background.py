"""src/honed/jit/background.py: JIT's work beside the program: one thread, one job at a time.

The program's calls never wait for a graph-break check, a build or a measurement: those run
here, on one daemon thread, one after the other (tunes share the machine; running two at once
would only slow both). A job ends by swapping a node's tuned wrapper in (tuner.py), which the
next call of that module picks up. ``wait()`` blocks until every job queued so far (and every job
they queued) is done: the wait mode (``honed.jit.config.wait``) and tests use it.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("honed.jit")

# How long the program's exit waits for a cancelled tune to close its workers.
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
        evidence: what the choice rests on: "worker measurement" (candidates measured in the
            worker pool), "in-process measurement" (isolation "none"), or "cache" (an earlier
            run's measurements, nothing built or measured now).
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

    def line(self) -> str:
        """The history's one-line summary."""
        tried = ", ".join(f"{name} {status}" for name, status in self.tried.items()) or "nothing"
        budget = f", budget {self.budget_s:g}s" if self.budget_s else ""
        outcome = {
            "installed": f"selected {self.selected} on {self.evidence}",
            "eager": f"eager stayed ({self.evidence})",
        }.get(self.status, f"{self.status}{': ' + self.error if self.error else ''}")
        return (
            f"Tuned {self.module} ({self.reason}{budget}) beside the program in "
            f"{self.took_s:.2f}s: tried {tried}; {outcome}; {self.calls_meanwhile} call(s) ran "
            f"{self.ran_meanwhile} meanwhile"
        )


class _Worker:
    """The daemon thread and its queue; ``pending`` counts jobs queued and not finished."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Callable[..., None], tuple[Any, ...]]] = queue.Queue()
        self.lock = threading.Condition()
        self.pending = 0
        self.thread: threading.Thread | None = None
        self.current: Any = None  # the running honed.pipeline.tuner.Tuner, for cancel at exit
        self.records: list[TuneRecord] = []

    def submit(self, job: Callable[..., None], *args: Any) -> None:
        with self.lock:
            self.pending += 1
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._loop, name="honed-jit", daemon=True)
                self.thread.start()
        self.jobs.put((job, args))

    def _loop(self) -> None:
        from honed.jit.patcher import paused

        while True:
            job, args = self.jobs.get()
            try:
                with paused():  # JIT's own calls of the modules run their originals
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


_WORKER = _Worker()


def submit(job: Callable[..., None], *args: Any) -> None:
    """Run ``job(*args)`` on JIT's background thread, after the jobs queued before it."""
    _WORKER.submit(job, *args)


def in_background() -> bool:
    """Whether the caller is JIT's background thread."""
    return threading.current_thread() is _WORKER.thread


def wait(timeout_s: float | None = None) -> bool:
    """Block until JIT has no work left (checks, tunes, installs); False if ``timeout_s`` ran out.

    Called from JIT's own thread it returns at once (a job never waits for itself).
    """
    if in_background():
        return True
    return _WORKER.wait(timeout_s)


def busy() -> bool:
    """Whether JIT has work queued or running."""
    return _WORKER.pending > 0


def set_current(tuner: Any) -> None:
    _WORKER.current = tuner


def records() -> list[TuneRecord]:
    """Every JIT tune of this process, oldest first (copies of the records)."""
    return [dataclasses.replace(r) for r in _WORKER.records]


def add_record(record: TuneRecord) -> None:
    _WORKER.records.append(record)


def clear_records() -> None:
    _WORKER.records.clear()


def cancel_and_wait(timeout_s: float | None = None) -> bool:
    """Cancel the running tune (its best candidate so far still wins) and wait for the rest."""
    tuner = _WORKER.current
    if tuner is not None:
        tuner.cancel()
    return wait(timeout_s)


def _at_exit() -> None:
    """The program ends: stop the running tune so its workers close, without waiting long."""
    if _WORKER.current is not None:
        cancel_and_wait(_EXIT_WAIT_S)


atexit.register(_at_exit)

__all__ = [
    "TuneRecord",
    "add_record",
    "busy",
    "cancel_and_wait",
    "clear_records",
    "in_background",
    "records",
    "set_current",
    "submit",
    "wait",
]
