"""src/honed/jit/pacing.py: JIT's workers stop while the program's calls run slow beside them.

JIT's worker processes run below the program's priority and off the cores left to it
(``HONED_JIT_WORKER_NICE``, ``HONED_JIT_SPARE_CORES``), yet on a GPU host that is a virtual
machine the program's launching thread still ran 1.5-1.8x slower while they compiled: its own CPU
time per call rising as much, from what the scheduler cannot see (hyperthread pairs the
hypervisor hides, shared caches and clocks). Only the program's calls show it, so they pace the
workers: each eager call of a module the program calls outermost is timed on the host clock
(two clock reads and a few list operations on the program's thread), and once the module's
calls have a baseline taken while no worker ran, a call slower than ``ratio`` times it stops
every worker that builds, checks or starts (SIGSTOP to its process tree, through the pool; the
pause does not count against the job's limits) for ``HOLD_S``. A measuring worker is never
stopped (its figures would be wrong).

The pause is a test as well as a remedy: when the calls made while the workers stood still are
slow too, the host is slow by itself (another tenant, JIT's own work in this process) and
stopping the workers helps nothing, so pacing backs off, for ``BACKOFF_S`` doubling up to
``BACKOFF_MAX_S``. Workers run at least as long as they were stopped between two pauses, so a
tune beside a program whose calls are always slow takes at most about twice as long.

A module tuned (its calls routed to a variant) or in a live trial is not timed here: those
calls are the variants' and their figures the trial's. Only a CUDA model's pool is paced (a
CPU model's calls and its workers share the same cores by design; ``honed.jit.cores``), and
not while the program waits for JIT (``config.wait``).

Off by default (``HONED_JIT_PACE=0``; ``HONED_JIT_PACE=1.5`` is the ratio measured): on the H200
host, cold BERT-base runs paced this way had as many of the program's calls over 2x eager as
runs without, or more, and longer tunes, each time it was judged (docs/jit.md). Stopping a
process that holds a CUDA context may hold up the GPU's other users in ways the host clock
cannot tell from the workers' compiles.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from typing import Any

HOLD_S = 0.25  # how long one pause stops the workers
BACKOFF_S = 5.0  # after a pause that did not speed the calls up, none for this long (doubling)
BACKOFF_MAX_S = 60.0
QUIET_CALLS = 8  # calls made with no worker running before a module's baseline is trusted
NOT_OURS = 1.3  # calls during a pause this many times the baseline: the host is slow by itself
_TICK_S = 0.02


class _Calls:
    """One module's outermost eager calls: the recent ones made while no worker ran."""

    __slots__ = ("baseline", "fresh", "quiet")

    def __init__(self) -> None:
        self.quiet: deque[float] = deque(maxlen=64)
        self.baseline = 0.0
        self.fresh = 0

    def add_quiet(self, seconds: float) -> None:
        self.quiet.append(seconds)
        self.fresh += 1
        # the median of 64 is recomputed every few calls, not on each
        if len(self.quiet) >= QUIET_CALLS and (self.fresh >= 8 or not self.baseline):
            self.baseline = statistics.median(self.quiet)
            self.fresh = 0


class Pacer:
    """Stops the watched pools' busy workers while the program's calls run slow beside them
    (see the module docstring). ``clock`` and ``start_thread`` are for tests."""

    def __init__(
        self, ratio: float, clock: Any = time.monotonic, start_thread: bool = True
    ) -> None:
        self.ratio = ratio
        self._clock = clock
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pools: list[Any] = []
        self._marks: dict[int, tuple[int, float, int]] = {}  # the counts when a pool came
        self._calls: dict[int, _Calls] = {}
        self.engaged = False  # a watched worker runs now (read on the program's thread)
        self._asked = False  # a slow call asked for a pause
        self._held: list[Any] = []  # the slots this pause stopped
        self._held_until = 0.0
        self._held_at = 0.0
        self._released_at = 0.0
        self._during: list[float] = []  # calls made during the pause, as ratios to baseline
        self._backoff_s = BACKOFF_S
        self._backoff_until = 0.0
        self.pauses = 0
        self.paused_s = 0.0
        self.backoffs = 0
        self.slowest = 0.0  # the slowest call timed beside running workers, x its baseline
        self._thread: threading.Thread | None = None
        self._start_thread = start_thread

    # -- the program's thread ------------------------------------------------------------------
    def observe(self, key: int, seconds: float) -> None:
        """One outermost eager call of module ``key`` took ``seconds`` on the host clock."""
        calls = self._calls.get(key)
        if calls is None:
            calls = self._calls[key] = _Calls()
        if not self.engaged:
            calls.add_quiet(seconds)
            if self._held:
                if calls.baseline:
                    self._during.append(seconds / calls.baseline)
            return
        if not calls.baseline:
            if not self._asked:  # no baseline yet: a pause makes calls with no worker running
                self._asked = True
                self._wake.set()
            return
        ratio = seconds / calls.baseline
        if ratio > self.slowest:
            self.slowest = ratio
        if ratio > self.ratio and not self._asked:
            self._asked = True
            self._wake.set()

    # -- JIT's thread ------------------------------------------------------------------------------
    def watch(self, pool: Any) -> None:
        """Pace ``pool``'s workers from now on."""
        with self._lock:
            self._pools.append(pool)
            self._marks[id(pool)] = (self.pauses, self.paused_s, self.backoffs)
            if self._start_thread and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="honed-pacer", daemon=True)
                self._thread.start()
        self._wake.set()

    def unwatch(self, pool: Any) -> str:
        """Stop pacing ``pool`` (its held workers run again); what pacing did meanwhile, for
        the history ("" when it never stopped them)."""
        with self._lock:
            if pool in self._pools:
                self._pools.remove(pool)
            ours = [s for s in self._held if s.pool is pool]
            if ours and len(ours) == len(self._held):
                self._release(self._clock(), judged=False)  # the pause was this pool's alone
            else:
                for slot in ours:
                    slot.resume()
                    self._held.remove(slot)
            self._update_engaged()
            pauses, paused_s, backoffs = self._marks.pop(id(pool), (0, 0.0, 0))
            pauses, paused_s, backoffs = (
                self.pauses - pauses,
                self.paused_s - paused_s,
                self.backoffs - backoffs,
            )
        if not pauses:
            return ""
        text = (
            f"the workers stood still {pauses} time(s), {paused_s:.1f} s in all, while the "
            f"program's calls ran over {self.ratio:g}x their pace without them"
        )
        if backoffs:
            text += (
                f"; {backoffs} of those pauses left the calls as slow (the host, not the "
                "workers), and pacing waited before the next"
            )
        return text

    # -- the pacer's thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(_TICK_S if self._pools or self._held else None)
            self._wake.clear()
            self.step()

    def step(self) -> None:
        """Start, end or judge a pause (on the pacer's thread; tests call it directly)."""
        now = self._clock()
        with self._lock:
            if self._held and now >= self._held_until:
                self._release(now, judged=True)
            elif (
                self._asked
                and not self._held
                and now >= self._backoff_until
                and now - self._released_at >= self._last_hold_s()
            ):
                self._hold(now)
            elif self._asked and not self._held and now < self._backoff_until:
                self._asked = False  # backing off: this slow call is the host's
            self._update_engaged()

    def _last_hold_s(self) -> float:
        return HOLD_S if self.pauses else 0.0

    def _hold(self, now: float) -> None:
        self._asked = False
        busy = [slot for pool in self._pools for slot in pool.busy_slots()]
        # one that began to measure since it was listed is left alone
        slots = [slot for slot in busy if slot.pause(unless_measuring=True)]
        if not slots:
            return
        self._held = slots
        self._held_at, self._held_until = now, now + HOLD_S
        self._during = []
        self.pauses += 1

    def _release(self, now: float, judged: bool) -> None:
        for slot in self._held:
            slot.resume()
        if self._held_at:
            self.paused_s += now - self._held_at
        if judged and len(self._during) >= 3:
            if statistics.median(self._during) > NOT_OURS:
                self.backoffs += 1
                self._backoff_until = now + self._backoff_s
                self._backoff_s = min(BACKOFF_MAX_S, 2 * self._backoff_s)
            else:
                self._backoff_s = BACKOFF_S
        self._held, self._held_at, self._during = [], 0.0, []
        self._released_at = now
        self._asked = False  # the calls that asked ran before or during this pause

    def _update_engaged(self) -> None:
        self.engaged = not self._held and any(pool.busy_slots() for pool in self._pools)


_PACER: list[Pacer | None] = [None]


def pacer() -> Pacer | None:
    """The process's pacer, None while pacing is off (``HONED_JIT_PACE=0``)."""
    from honed import config

    ratio = config.jit_pace
    if ratio <= 0:
        _PACER[0] = None  # turned off: the program's calls are no longer timed either
        return None
    if _PACER[0] is None or _PACER[0].ratio != ratio:
        _PACER[0] = Pacer(ratio)
    return _PACER[0]


def observe(key: int, seconds: float) -> None:
    """On the program's thread, after an outermost eager call (nothing without a pacer)."""
    p = _PACER[0]
    if p is not None:
        p.observe(key, seconds)
