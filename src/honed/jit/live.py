"""src/honed/jit/live.py: measuring and choosing variants on the program's own calls.

A JIT tune measures its candidates in workers while the program runs, so on a machine without
cores to spare the worker's figures carry the program's load: on the 2-core CPU machine small
BERT's tune kept eager although AOTInductor ran 1.7x faster in a tune of its own. Once the tune
is done, the program's own calls are the better evidence: they run the real inputs, on the
cores as the program leaves them. A trial routes the module's calls to the pick and its best
rivals (the runners-up) in turn, in blocks of about the same time (so drift hits all alike; the
first call of each block is not counted), times each call with the host clock, and adopts a
rival only when the 99 % bootstrap interval of the ratio of medians clears
honed.config.decision_margin, the rule of every other decision (the fastest such rival, when
several do). Otherwise the tune's pick stays, and the history says the live figures did not
decide.

On the CPU a call's host time is its cost: a call returns when its work is done. A CUDA call
returns once its work is launched, so there each call is timed with a pair of CUDA events
recorded on the calling stream around it: the GPU time from the call's first work to its last,
which includes any wait for launches that lag behind (a launch-bound call's real cost), and
excludes work queued before the call. Nothing waits for an event: the figures are read once the
events completed, and a trial whose last events are still running decides on a later call.

The same turns measure a tune's candidates while the program calls (ProgramCalls, the tune's
``live``): the workers then only build and check them, since a worker measuring on the program's
GPU (or cores) slows the program's calls, and every checked candidate takes its turns on the
program's calls instead; the tune compares the figures with its usual statistics and rule.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from honed import _core
from honed import config as _flags
from honed.jit.history import add as add_step
from honed.module import MISS
from honed.pipeline import courtesy
from honed.pipeline.openmp import release_team

log = logging.getLogger("honed.jit")

# A block is about this long (at least _MIN_BLOCK_CALLS calls), each variant gets _ROUNDS blocks,
# and a trial that has not finished after _MAX_S (a program calling rarely) decides on what it
# has once each variant has _MIN_SAMPLES counted calls, else keeps the tune's pick.
_BLOCK_MS = 25.0
_MIN_BLOCK_CALLS = 4
_ROUNDS = 12
_MAX_S = 20.0
_MIN_SAMPLES = 20
# A trial that only measures (a tune's finalists on the program's calls) goes on past _MAX_S
# until its variants have taken graph_tuner.MIN_PROGRAM_ROUNDS rounds of turns, up to the tune's
# deadline and this long at most: on a CPU a call may take a second (BERT-base on two cores),
# and 20 s gave each variant three calls, too few to count, so the tune kept eager without a
# figure. The program's calls are answered all along.
_PATIENT_MAX_S = 300.0
_CONFIDENCE = 0.99


class HostClock:
    """Times a call with the host clock (the CPU: a call returns when its work is done)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock

    def start(self) -> Any:
        return self.clock()

    def stop(self, started: Any) -> Any:
        return (self.clock() - started) * 1e3

    def ready(self, stamp: Any) -> bool:
        return True

    def ms(self, stamp: Any) -> float:
        return float(stamp)


class CudaEvents:
    """Times a call with two CUDA events on the stream it was called on; a stamp is read only
    once its end event completed (``ready``), so no call waits for the GPU."""

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def start(self) -> Any:
        event = self.torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stop(self, started: Any) -> Any:
        end = self.torch.cuda.Event(enable_timing=True)
        end.record()
        return started, end

    def ready(self, stamp: Any) -> bool:
        return bool(stamp[1].query())

    def ms(self, stamp: Any) -> float:
        return float(stamp[0].elapsed_time(stamp[1]))


@dataclasses.dataclass
class Arm:
    """One side of a trial: a tuned honed.Module (``wrapper``), or eager (``wrapper`` None).
    ``samples_ms``: its counted calls' times read so far; ``pending``: the stamps of counted
    calls whose times are not readable yet (CUDA events still running)."""

    label: str
    wrapper: Any = None
    samples_ms: list[float] = dataclasses.field(default_factory=list)
    pending: list[Any] = dataclasses.field(default_factory=list)
    takes: Callable[[Any, Any], bool] | None = None  # the calls it runs (None: all it can)
    block: int = 0  # calls per block (the Trial sizes it)
    host_ms: list[float] = dataclasses.field(default_factory=list)  # first round, host clock
    blocks: list[int] = dataclasses.field(default_factory=list)  # counted calls of each turn
    counted: int = 0  # counted calls of the turn under way

    def settle(self, timer: Any) -> bool:
        """Read every pending stamp that is ready; True when none is left."""
        read = 0
        while read < len(self.pending) and timer.ready(self.pending[read]):
            self.samples_ms.append(timer.ms(self.pending[read]))
            read += 1
        del self.pending[:read]  # once, not an element at a time (a block may be thousands)
        return not self.pending

    def run(self, module: Any, eager: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if self.takes is not None and not self.takes(args, kwargs):
            return MISS
        if self.wrapper is None:
            return eager(module, *args, **kwargs)
        return self.wrapper.dispatch(args, kwargs)


@dataclasses.dataclass
class Rival:
    """One rival's figures against the pick: ``ratio`` the pick's median call over the rival's
    (above 1: the rival is faster), with its 99 % interval."""

    label: str
    ratio: float
    lo: float
    hi: float
    calls: int


@dataclasses.dataclass
class Verdict:
    """What a trial found: ``adopted`` the rival that replaces the pick, or None."""

    pick: str
    pick_calls: int
    rivals: list[Rival]
    adopted: str | None
    seconds: float

    def describe(self) -> str:
        parts = [
            f"{r.label} ran {r.ratio:.3f}x {self.pick}'s speed (99% CI {r.lo:.3f}-{r.hi:.3f}, "
            f"{r.calls} calls)"
            if r.calls
            else f"{r.label} not measured"
            for r in self.rivals
        ]
        figures = (
            f"{'; '.join(parts)}; {self.pick} {self.pick_calls} calls; on the program's calls "
            f"in {self.seconds:.1f}s"
        )
        if self.adopted:
            return f"{figures}: {self.adopted} adopted"
        return f"{figures}: not enough evidence to change, {self.pick} stays"


def _block(per_call_ms: float) -> int:
    return max(_MIN_BLOCK_CALLS, int(_BLOCK_MS / max(per_call_ms, 1e-3)))


class Trial:
    """The pick and its rivals taking turns on one module's calls; ``done`` gets the verdict: on
    the program's thread, in the call that ends the trial, or, beside a program, on a thread of
    its own while the pick answers the calls (``_decide``). Either way it must be brief."""

    def __init__(
        self,
        pick: Arm,
        rivals: list[Arm],
        per_call_ms: float,
        done: Callable[[Verdict | None], None],
        clock: Callable[[], float] = time.perf_counter,
        timer: Any = None,
        judge: bool = True,
        patient: bool = False,
        until: float | None = None,
    ) -> None:
        """``timer``: how a call is timed (HostClock, the default, or CudaEvents); ``clock``
        keeps the trial's own time (its blocks' sizing on the host, its time limit).
        ``judge=False``: only measure (``done`` gets None; the arms hold the figures).
        ``patient``: past _MAX_S, go on until the arms have taken MIN_PROGRAM_ROUNDS rounds,
        until ``until`` (a ``clock`` time) and _PATIENT_MAX_S at most."""
        if not rivals and judge:
            raise ValueError("a live trial needs at least one rival")
        self.judge = judge
        self.arms = [pick, *rivals]
        for arm in self.arms:
            arm.block = _block(per_call_ms)
        self.turn = 0
        self.in_block = 0
        self.rounds = 0
        self.done = done
        self.clock = clock
        self.timer = timer if timer is not None else HostClock(clock)
        self.started = clock()
        self.finished = False
        self.stopped = False  # the blocks are done; the verdict waits for the last figures
        self.until = until
        self.enough_rounds = 0  # patient: past _MAX_S, the rounds that make a figure
        if patient:
            from honed.pipeline.graph_tuner import MIN_PROGRAM_ROUNDS

            self.enough_rounds = MIN_PROGRAM_ROUNDS

    def call(self, module: Any, eager: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Run this call on the variant whose turn it is; MISS when that variant does not take
        these inputs (the caller runs eager, uncounted). Once the blocks are done, the pick
        answers until the last figures are readable and the verdict is given."""
        if self.stopped:
            out = self.arms[0].run(module, eager, args, kwargs)
            self._decide()
            return out
        arm = self.arms[self.turn]
        h0 = self.clock()
        t0 = self.timer.start()
        out = arm.run(module, eager, args, kwargs)
        stamp = self.timer.stop(t0)
        if out is MISS:
            return out
        if self.in_block > 0:  # a block's first call pays for the switch: not counted
            arm.pending.append(stamp)
            arm.counted += 1
            if self.rounds == 0:
                arm.host_ms.append((self.clock() - h0) * 1e3)
        self.in_block += 1
        if self.in_block >= arm.block:
            self.in_block = 0
            arm.blocks.append(arm.counted)
            arm.counted = 0
            arm.settle(self.timer)
            self.turn = (self.turn + 1) % len(self.arms)
            if self.turn == 0:
                self.rounds += 1
                if self.rounds == 1:
                    self._size_blocks()
        if self.rounds >= _ROUNDS or self._out_of_time():
            self.stopped = True
            self._decide()
        return out

    def _out_of_time(self) -> bool:
        now = self.clock()
        took = now - self.started
        if took <= _MAX_S:
            return False
        if not self.enough_rounds or took >= _PATIENT_MAX_S:
            return True
        if self.until is not None and now >= self.until:
            return True
        return self.rounds >= self.enough_rounds

    def _decide(self) -> None:
        """Give the verdict once every counted call's figure is readable (at once on the
        CPU); until then the pick answers the calls. Beside a program a judging verdict is
        worked out on a thread of its own: its bootstrap takes milliseconds (without the GIL),
        which the call that ended the trial would otherwise pay; the pick answers meanwhile."""
        if self.finished or not all(arm.settle(self.timer) for arm in self.arms):
            return
        self.finished = True
        if self.judge and courtesy.beside_program():
            thread = threading.Thread(target=self._give_verdict, name="honed-verdict", daemon=True)
            with _VERDICTS_LOCK:
                _verdicts.add(thread)
            thread.start()
        else:
            self._give_verdict()

    def _give_verdict(self) -> None:
        try:
            self.done(self.verdict() if self.judge else None)
        finally:
            with _VERDICTS_LOCK:
                _verdicts.discard(threading.current_thread())

    def _size_blocks(self) -> None:
        """After the first round, each arm's blocks sized from its calls just timed, so that
        every block lasts about _BLOCK_MS (drift hits all alike, and eager's slow calls do not
        stretch the trial): the tune's figure (``per_call_ms``) was measured beside the program
        and may be far off. The figures read so far, else the host times (a CUDA call's launch
        time is a floor of its cost)."""
        for arm in self.arms:
            arm.settle(self.timer)
            timed = sorted(arm.samples_ms) or sorted(arm.host_ms)
            if timed:
                arm.block = _block(timed[len(timed) // 2])

    def verdict(self) -> Verdict:
        for arm in self.arms:  # on the CPU every figure is read; CUDA: what completed
            arm.settle(self.timer)
        pick, *rivals = self.arms
        took = self.clock() - self.started
        margin = 1.0 + float(_flags.decision_margin)
        figures = []
        for arm in rivals:
            if min(len(pick.samples_ms), len(arm.samples_ms)) < _MIN_SAMPLES:
                figures.append(Rival(arm.label, 1.0, 1.0, 1.0, len(arm.samples_ms)))
                continue
            c = compare(pick, arm)
            figures.append(Rival(arm.label, c.ratio, c.lo, c.hi, len(arm.samples_ms)))
        clear = [r for r in figures if r.lo > margin]
        best = max(clear, key=lambda r: r.ratio, default=None)
        return Verdict(
            pick.label, len(pick.samples_ms), figures, best.label if best else None, took
        )


# The verdicts being worked out off the program's thread (Trial._decide): JIT's reset waits
# for them, so that none installs into what was forgotten.
_verdicts: set[threading.Thread] = set()
_VERDICTS_LOCK = threading.Lock()


def wait_for_verdicts(timeout_s: float | None = None) -> bool:
    """Wait for the verdicts being worked out off the program's thread, ``timeout_s`` at most
    each; whether none is left."""
    with _VERDICTS_LOCK:
        threads = list(_verdicts)
    for thread in threads:
        thread.join(timeout_s)
    with _VERDICTS_LOCK:
        return not _verdicts


def rounds_of(arms: list[Arm]) -> int:
    """How many rounds every arm finished its turn in (a trial ended by its time limit may
    have stopped within a round)."""
    return min(len(arm.blocks) for arm in arms)


def turns_of(arm: Arm, rounds: int) -> tuple[list[float], list[int]]:
    """``arm``'s counted calls of its first ``rounds`` turns (read: settled), and how many fell
    in each turn."""
    blocks = arm.blocks[:rounds]
    return arm.samples_ms[: sum(blocks)], blocks


def compare(pick: Arm, rival: Arm) -> Any:
    """The ratio of ``pick``'s median call over ``rival``'s with its interval: over the rounds,
    paired (turn i of each ran in round i, one moment of the machine), where there are enough of
    them; else over single calls."""
    rounds = rounds_of([pick, rival])
    if rounds >= _core.MIN_PAIRED_ROUNDS:
        a, blocks_a = turns_of(pick, rounds)
        b, blocks_b = turns_of(rival, rounds)
        if len(a) == sum(blocks_a) and len(b) == sum(blocks_b):
            return _core.compare_paired(
                a, blocks_a, b, blocks_b, confidence=_CONFIDENCE, statistic="median"
            )
    return _core.compare(
        pick.samples_ms, rival.samples_ms, confidence=_CONFIDENCE, statistic="median"
    )


def rivals(report: Any, most: int = 2, within: float | None = None) -> list[Any]:
    """The report's best passed candidates other than the selected one (by the tune's ranking
    figure, throughput), at most ``most``, for a one-graph module; with ``within``, only those
    whose throughput is at least the selected one's divided by it."""
    if len(report.graphs) != 1:
        return []
    graph = report.graphs[0]
    passed = [c for c in graph.candidates if c.status == "ok" and not c.selected and c.throughput]
    if within is not None:
        pick = next((c for c in graph.candidates if c.selected and c.throughput), None)
        if pick is not None:
            passed = [c for c in passed if c.throughput * within >= pick.throughput]
    return sorted(passed, key=lambda c: c.throughput, reverse=True)[:most]


# A worker may measure once the program's latest call ended this long ago (ProgramCalls.idle);
# a measurement on the program's calls gives up once they stopped for _STALL_S, or for _IDLE_S
# while a thread of the program waits for JIT (honed.jit.wait: it makes no call meanwhile).
_IDLE_S = 0.5
_STALL_S = 5.0


class Route:
    """A tune's best variant so far (ProgramCalls.promote): it answers the module's calls that
    ``takes`` while the tune goes on; the patcher runs the others eager (MISS)."""

    def __init__(self, label: str, wrapper: Any, takes: Callable[[Any, Any], bool]) -> None:
        self.label = label
        self.wrapper = wrapper
        self.takes = takes

    def call(self, module: Any, eager: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        if not self.takes(args, kwargs):
            return MISS
        return self.wrapper.dispatch(args, kwargs)


class ProgramCalls:
    """A tune's view of the program it runs beside (honed.pipeline.graph_tuner.ProgramCalls):
    ``node``'s calls. ``quiet(s)``: whether the program is in no call and ended none during the
    last ``s`` seconds (honed.jit.patcher.program_idle); ``stopped()``: whether the tune should
    give up (the program ends); ``waiting()``: whether the program waits for JIT.

    ``promotes``: whether the tune offers a candidate built while others build (``promote``);
    ``stand_ins``: whether it offers those that compile nothing, promotes or not (``stand_in``),
    where ``worth_a_stand_in`` finds one worth it;
    ``route``: the variant promoted so far, which answers the calls between the tune's
    measurements until ``end_route``; ``routed`` lists each promotion as (label, the module's
    call count then)."""

    def __init__(
        self,
        node: Any,
        device_type: str,
        quiet: Callable[[float], bool],
        stopped: Callable[[], bool],
        waiting: Callable[[], bool] = lambda: False,
        promotes: bool = False,
        stand_ins: bool = False,
    ) -> None:
        self.node = node
        self.promotes = promotes
        self.stand_ins = stand_ins
        self.device_type = device_type
        self.quiet = quiet
        self.stopped = stopped
        self.waiting = waiting
        self.route: Route | None = None
        self.routed: list[tuple[str, int]] = []

    def idle(self) -> bool:
        """The program is in no call and ended none during the last _IDLE_S."""
        return self.quiet(_IDLE_S)

    def measure(
        self, arms: list[tuple[str, Any]], sample: Any, until: float | None = None
    ) -> list[Any] | None:
        """Each arm's times on the program's calls with ``sample``'s shapes (``sample`` is bound
        to the module's signature; each call is bound alike before it is compared), in turns (a
        patient Trial that only measures, to ``until`` at most: the tune's deadline), as
        graph_tuner.Turns of the rounds every arm finished; None when the program stopped
        calling or ends first."""
        from honed.pipeline.graph_tuner import Turns

        takes = self._taker(sample)
        if takes is None:  # the program dropped the module
            return None
        turns = [Arm(label, wrapper, takes=takes) for label, wrapper in arms]
        if self._run(turns[0], turns[1:], judge=False, patient=True, until=until) is None:
            return None
        rounds = rounds_of(turns)
        return [Turns(*turns_of(arm, rounds)) for arm in turns]

    def call_ms(self) -> float | None:
        """The program's last complete outermost call (ms), by its call clock; None where
        no clock is open (a tune beside a CPU program) or no call ended since."""
        from honed.pipeline.courtesy import CALL_CLOCK

        view = CALL_CLOCK[0]
        return view[2] * 1e3 if view is not None and view[2] > 0.0 else None

    def worth_a_stand_in(self, label: str, quickest_ms: float | None) -> bool:
        """Whether a candidate that compiles nothing is worth its install and trial as a stand-in:
        its quickest check run (``quickest_ms``, a worker's, beside the program) was quicker
        than the program's last call. One no quicker (CUDA graphs over a model whose calls the
        GPU bounds) would only add its install's runs beside the calls; the history says so."""
        now = self.call_ms()
        if quickest_ms is None or now is None or quickest_ms < now:
            return True
        add_step(
            f"{label} does not stand in for {self.node.short()}'s calls: its quickest check run "
            f"took {quickest_ms:.2f} ms, the program's last call {now:.2f} ms"
        )
        return False

    def answering(self) -> str | None:
        """The label of the variant promoted to answer the calls now; None: eager answers."""
        return self.route.label if self.route is not None else None

    def promote(
        self, label: str, wrapper: Any, sample: Any, meanwhile: str = "the tune goes on"
    ) -> None:
        """Judge ``wrapper`` (a honed.Module with one checked candidate installed) against what
        answers the calls now (eager, or the variant promoted before) on the program's calls
        with ``sample``'s shapes, by the live trial's rule; where it wins, it answers those
        calls from now until ``end_route``. The history says which way it went (and that it
        answers while ``meanwhile``)."""
        takes = self._taker(sample)
        if takes is None:
            return
        now = self.route
        pick = Arm(now.label if now else "eager", now.wrapper if now else None, takes=takes)
        rival = Arm(label, wrapper, takes=takes)
        verdict = self._run(pick, [rival], judge=True)
        if not isinstance(verdict, Verdict):  # the program stopped calling, or ends
            return
        node = self.node
        if verdict.adopted != label:
            add_step(f"{label} does not answer {node.short()}'s calls yet: {verdict.describe()}")
            return
        self.route = Route(label, wrapper, takes)
        node.trial = self.route
        self.routed.append((label, node.call_count))
        add_step(f"{label} answers {node.short()}'s calls while {meanwhile}: {verdict.describe()}")

    def end_route(self) -> None:
        """The tune is over: the promoted variant stops answering (its outcome is installed,
        or eager answers again)."""
        route, self.route = self.route, None
        if route is not None and self.node.trial is route:
            self.node.trial = None

    def _taker(self, sample: Any) -> Callable[[Any, Any], bool] | None:
        """Which calls a trial or route takes: those bound like ``sample`` with its shapes;
        None when the program dropped the module."""
        from honed.calls import CallBinder
        from honed.pipeline.candidate import shapes_key

        module = self.node.module
        if module is None:
            return None
        key = shapes_key(sample.args, sample.kwargs)
        binder = CallBinder(module.forward)

        def takes(args: Any, kwargs: Any) -> bool:
            return shapes_key(*binder.bind(args, kwargs)) == key

        return takes

    def _run(
        self,
        pick: Arm,
        rivals: list[Arm],
        judge: bool,
        patient: bool = False,
        until: float | None = None,
    ) -> Verdict | bool | None:
        """Route the module's calls through a Trial of ``pick`` and ``rivals`` until it is
        done: its verdict (``judge``; True for one that only measures), or None when the
        program stopped calling or ends first. The promoted variant, if any, answers the calls
        again after. ``patient``, ``until``: as Trial's."""
        given: list[Verdict | None] = []
        finished = threading.Event()

        def done(verdict: Verdict | None) -> None:  # brief: it may run on the program's thread
            given.append(verdict)
            finished.set()

        timer = CudaEvents() if self.device_type == "cuda" else None
        trial = Trial(
            pick, rivals, 1.0, done, timer=timer, judge=judge, patient=patient, until=until
        )
        # this thread installed and checked the arms: its OpenMP team would slow the calls
        # measured (honed.pipeline.openmp)
        release_team()
        node = self.node
        node.trial = trial
        try:
            calls, moved = node.call_count, time.monotonic()
            while not finished.wait(0.25):
                if self.stopped():
                    return None
                if node.call_count != calls:
                    calls, moved = node.call_count, time.monotonic()
                elif time.monotonic() - moved > (_IDLE_S if self.waiting() else _STALL_S):
                    return None
        finally:
            node.trial = self.route
        return given[0] if judge else True
