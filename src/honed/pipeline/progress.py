"""src/honed/pipeline/progress.py: a tune's live display: where it is, candidate k of n, time left.

Each tune owns a Tracker (``tuner.Tuner`` makes one, or takes the one a caller set with
``tracking(tracker)``, e.g. a test or the CLI). The tune reports where it is: ``at_graph``,
``phase(name, candidate)``, ``finished(...)``, ``skipped(...)``. The Tracker always records those
events (tests read ``tracker.events`` and ``tracker.done``); it draws a rich live line (and one
line per finished candidate) only when ``honed.config.progress`` is "on", or "auto" with a
terminal and a log level below ERROR. The live line says "candidate k of n", the time spent
and an estimate of what is left (``estimate_left``); candidates in worker processes report
their phases (build, check, measure) as they enter them, several at once when the pool runs
them side by side, so every method is safe from any thread.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from honed import config

PHASES = ("record", "build", "check", "measure", "interleave", "install")
# Every tracker's latest steps in this process, oldest first: when each candidate entered which
# phase (a JIT program's calls set beside them say what each phase cost it: bench/jit_bert.py).
RECENT: collections.deque[Event] = collections.deque(maxlen=4096)


@dataclasses.dataclass(frozen=True)
class Event:
    """One step of a tune: where it was and what it started doing."""

    module: str
    graph: str
    candidate: str
    phase: str
    at: float = dataclasses.field(default_factory=time.perf_counter, compare=False)


@dataclasses.dataclass(frozen=True)
class Finished:
    """One candidate done: its status ("ok", "failed", "rejected", "cached", "not tried")."""

    module: str
    graph: str
    candidate: str
    status: str
    reason: str
    seconds: float
    cost: int = 2  # its expected build cost (Backend.build_cost's scale), for the estimate


def should_show(console: Any) -> bool:
    """Whether the live display is on: config.progress, the terminal and the log level."""
    mode = config.progress.lower()
    if mode == "off":
        return False
    level = logging.getLevelName(config.log_level)
    if isinstance(level, int) and level >= logging.ERROR:
        return False
    if mode == "on":
        return True
    return bool(console.is_terminal)


def estimate_left(done: list[tuple[int, float]], pending: list[int], parallel: int) -> float | None:
    """Seconds the ``pending`` candidates (their build costs) should still take.

    Each is expected to take as long as the finished ones (``done``: cost, seconds) of its cost
    took on average, or the average of all finished ones when none of its cost has finished;
    ``parallel`` candidates run at once. None before anything has finished.
    """
    if not pending:
        return 0.0
    if not done:
        return None
    overall = sum(s for _, s in done) / len(done)
    by_cost: dict[int, list[float]] = {}
    for cost, seconds in done:
        by_cost.setdefault(cost, []).append(seconds)
    total = 0.0
    for cost in pending:
        seen = by_cost.get(cost)
        total += sum(seen) / len(seen) if seen else overall
    return total / max(1, parallel)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min"


class Tracker:
    """Records a tune's steps and, when shown, draws them with rich."""

    def __init__(self, console: Any = None, show: bool | None = None) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console(stderr=True)
        self.show = should_show(self.console) if show is None else show
        self.events: list[Event] = []
        self.done: list[Finished] = []
        self.module = self.graph = self.name = ""
        self.current_phase = ""
        self.total = 0  # candidates of the current graph, the baseline included
        self.parallel = 1  # how many run at once
        self.pending_costs: list[int] = []  # build costs of those not finished yet
        self.budget_end: float | None = None  # perf_counter time the time budget runs out
        self.started = self.candidate_started = self.phase_started = time.perf_counter()
        self._running: dict[str, tuple[str, float]] = {}  # candidate -> (phase, since)
        self._graph_done = 0
        self._lock = threading.RLock()
        self._live: Any = None

    # -- what the tune calls -------------------------------------------------------------------
    def at_graph(
        self, module: str, graph: str, costs: list[int] | None = None, parallel: int = 1
    ) -> None:
        """A new graph: its candidates' build costs (for k of n and the estimate)."""
        with self._lock:
            self.module, self.graph, self.name = module, graph, ""
            self.pending_costs = list(costs or [])
            self.total, self.parallel, self._graph_done = len(self.pending_costs), parallel, 0
            self._running.clear()

    def candidate(self, name: str) -> None:
        """The candidate the next phases belong to (candidates run one at a time here)."""
        with self._lock:
            self.name = name
            self.candidate_started = time.perf_counter()

    def phase(self, phase: str, candidate: str | None = None) -> None:
        with self._lock:
            name = self.name if candidate is None else candidate
            now = time.perf_counter()
            self.current_phase, self.phase_started = phase, now
            if name:
                since = self._running.get(name, (phase, now))[1]
                self._running[name] = (phase, since if candidate is not None else now)
            event = Event(self.module, self.graph, name, phase)
            self.events.append(event)
            RECENT.append(event)
        self._refresh()

    def finished(
        self,
        status: str,
        reason: str = "",
        candidate: str | None = None,
        seconds: float | None = None,
        cost: int = 2,
    ) -> None:
        with self._lock:
            name = self.name if candidate is None else candidate
            if seconds is None:
                seconds = time.perf_counter() - self.candidate_started
            item = Finished(self.module, self.graph, name, status, reason, seconds, cost)
            self.done.append(item)
            self._running.pop(name, None)
            self._graph_done += 1
            if cost in self.pending_costs:
                self.pending_costs.remove(cost)
            if candidate is None:
                self.name, self.current_phase = "", ""
        if self.show:
            self.console.print(_finished_line(item), highlight=False)
        self._refresh()

    def skipped(self, candidate: str, reason: str, cost: int = 2) -> None:
        """A candidate the plan or the budget left out ("not tried")."""
        self.finished("not tried", reason, candidate=candidate, seconds=0.0, cost=cost)

    # -- what the display shows ----------------------------------------------------------------
    def seconds_left(self) -> float | None:
        """The estimate for this graph's candidates not finished yet (None: no basis yet)."""
        with self._lock:
            timed = [(f.cost, f.seconds) for f in self.done if f.status not in _NOT_TIMED]
            left = estimate_left(timed, self.pending_costs, self.parallel)
        if self.budget_end is not None:
            budget_left = max(0.0, self.budget_end - time.perf_counter())
            left = budget_left if left is None else min(left, budget_left)
        return left

    def status_line(self) -> str:
        now = time.perf_counter()
        with self._lock:
            where = " / ".join(p for p in (self.module, self.graph) if p)
            count = ""
            if self.total:
                k = min(self.total, self._graph_done + max(1, len(self._running)))
                count = f"candidate {k} of {self.total}: "
            running = self._running or (
                {self.name: (self.current_phase, self.phase_started)} if self.name else {}
            )
            doing = ", ".join(f"{n} {p}" for n, (p, _) in running.items()) or (
                self.current_phase or "starting"
            )
        left = self.seconds_left() if self.total else None
        tail = f"{_duration(now - self.started)} elapsed"
        if left is not None and self.total:
            tail += f", about {_duration(left)} left"
        return f"honed tune {where}: {count}{doing} ({tail})"

    def __rich__(self) -> str:
        return f"[bold]{self.status_line()}[/bold]"

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def __enter__(self) -> Tracker:
        if self.show:
            from rich.live import Live

            self._live = Live(self, console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None


_NOT_TIMED = ("cached", "not tried")


def _finished_line(item: Finished) -> str:
    colour = {"ok": "green", "cached": "cyan", "not tried": "yellow"}.get(item.status, "red")
    where = " / ".join(p for p in (item.module, item.graph, item.candidate) if p)
    reason = f": {item.reason}" if item.reason else ""
    return f"  [{colour}]{item.status}[/{colour}] {where} ({item.seconds:.1f} s){reason}"


# The tracker a caller asked the next tunes in this context to use (see tracking()).
_REQUESTED: contextvars.ContextVar[Tracker | None] = contextvars.ContextVar(
    "honed_progress_tracker", default=None
)


def requested() -> Tracker | None:
    """The tracker set with tracking() in this context, if any."""
    return _REQUESTED.get()


@contextlib.contextmanager
def tracking(tracker: Tracker | None = None) -> Iterator[Tracker]:
    """Make tunes run in this ``with`` block (in this thread or context) report to ``tracker``."""
    tracker = tracker if tracker is not None else Tracker()
    token = _REQUESTED.set(tracker)
    try:
        yield tracker
    finally:
        _REQUESTED.reset(token)
