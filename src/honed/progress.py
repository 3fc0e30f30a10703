"""src/honed/progress.py: the live display of a tune: module, graph, candidate, phase, elapsed.

``honed.tune`` opens a Tracker with ``tracking()`` and reports where it is through the module-level
``current()`` tracker: ``phase("build")``, ``candidate(name)``, ``finished(...)``. The Tracker
always records those events (tests read ``tracker.events``); it draws a rich live line (and one
line per finished candidate) only when ``honed.config.progress`` is "on", or "auto" with a
terminal and a log level below ERROR. Phases inside a worker process are not visible here: a
candidate evaluated in a worker shows as ``WORKER_PHASE`` while the worker runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

from honed import config

PHASES = ("record", "build", "check", "measure", "interleave", "install")
WORKER_PHASE = "build/check/measure (worker)"


@dataclasses.dataclass(frozen=True)
class Event:
    """One step of a tune: where it was and what it started doing."""

    module: str
    graph: str
    candidate: str
    phase: str


@dataclasses.dataclass(frozen=True)
class Finished:
    """One candidate done: its status ("ok", "failed", "rejected", "cached") and reason."""

    module: str
    graph: str
    candidate: str
    status: str
    reason: str
    seconds: float


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
        self.started = self.candidate_started = self.phase_started = time.perf_counter()
        self._live: Any = None

    # -- what tuning.py calls ------------------------------------------------------------------
    def at_graph(self, module: str, graph: str) -> None:
        self.module, self.graph, self.name = module, graph, ""

    def candidate(self, name: str) -> None:
        self.name = name
        self.candidate_started = time.perf_counter()

    def phase(self, phase: str) -> None:
        self.current_phase = phase
        self.phase_started = time.perf_counter()
        self.events.append(Event(self.module, self.graph, self.name, phase))
        self._refresh()

    def finished(self, status: str, reason: str = "") -> None:
        seconds = time.perf_counter() - self.candidate_started
        item = Finished(self.module, self.graph, self.name, status, reason, seconds)
        self.done.append(item)
        if self.show:
            self.console.print(_finished_line(item), highlight=False)
        self.name, self.current_phase = "", ""
        self._refresh()

    # -- drawing -------------------------------------------------------------------------------
    def __rich__(self) -> str:
        now = time.perf_counter()
        where = " / ".join(p for p in (self.module, self.graph, self.name) if p)
        return (
            f"[bold]honed tune[/bold] {where}: {self.current_phase or 'starting'} "
            f"({now - self.phase_started:.1f} s; {now - self.started:.1f} s in all)"
        )

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


def _finished_line(item: Finished) -> str:
    colour = {"ok": "green", "cached": "cyan"}.get(item.status, "red")
    where = " / ".join(p for p in (item.module, item.graph, item.candidate) if p)
    reason = f": {item.reason}" if item.reason else ""
    return f"  [{colour}]{item.status}[/{colour}] {where} ({item.seconds:.1f} s){reason}"


_current: Tracker | None = None
_quiet: Tracker | None = None


def current() -> Tracker:
    """The tracker of the tune that is running (a silent one outside a tune)."""
    global _quiet
    if _current is not None:
        return _current
    if _quiet is None:
        _quiet = Tracker(show=False)
    return _quiet


@contextlib.contextmanager
def tracking(tracker: Tracker | None = None) -> Iterator[Tracker]:
    """Make ``tracker`` (default: a new one for the terminal) current for a ``with`` block."""
    global _current
    saved = _current
    if tracker is None and saved is not None:  # a caller (e.g. a test) already tracks this tune
        yield saved
        return
    _current = tracker if tracker is not None else Tracker()
    try:
        with _current:
            yield _current
    finally:
        _current = saved
