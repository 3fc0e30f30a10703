"""tests/test_jit_pacing.py: the program's calls pace JIT's workers (honed.jit.pacing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

import honed
import honed.jit
from honed.jit import State, pacing
from honed.jit.pacing import BACKOFF_S, HOLD_S, Pacer
from honed.pipeline import pool as pool_module

from conftest import FakeClock, TinyMLP


class Slot:
    def __init__(self, pool: Any, measuring: bool = False) -> None:
        self.pool = pool
        self.measuring = measuring
        self.stopped = 0
        self.calls: list[str] = []

    def pause(self, unless_measuring: bool = False) -> bool:
        if unless_measuring and self.measuring:
            return False
        self.stopped += 1
        self.calls.append("pause")
        return True

    def resume(self) -> None:
        self.stopped -= 1
        self.calls.append("resume")


class Pool:
    """A pool whose slots all build until told otherwise."""

    def __init__(self, slots: int = 2) -> None:
        self.slots = [Slot(self) for _ in range(slots)]
        self.building = True

    def busy_slots(self) -> list[Slot]:
        return [s for s in self.slots if self.building and not s.measuring]


MS = 1e-3
EAGER = 10 * MS  # the program's call with no worker running


def paced(calls: int = 12) -> tuple[Pacer, FakeClock, Pool]:
    """A pacer whose module 1 has a baseline of ``calls`` quiet calls, watching a busy pool."""
    clock = FakeClock(100.0)
    pacer = Pacer(1.5, clock=clock, start_thread=False)
    for _ in range(calls):
        pacer.observe(1, EAGER)
    pool = Pool()
    pacer.watch(pool)
    pacer.step()
    assert pacer.engaged
    return pacer, clock, pool


def stopped(pool: Pool) -> list[int]:
    return [s.stopped for s in pool.slots]


def test_a_slow_call_beside_busy_workers_stops_them_for_a_moment() -> None:
    pacer, clock, pool = paced()
    pacer.observe(1, 14 * MS)  # 1.4x: within the pace
    pacer.step()
    assert stopped(pool) == [0, 0]
    pacer.observe(1, 16 * MS)  # 1.6x
    pacer.step()
    assert stopped(pool) == [1, 1] and not pacer.engaged
    for _ in range(5):  # the calls while they stand still: back at eager's pace
        pacer.observe(1, EAGER)
    clock.now += HOLD_S / 2
    pacer.step()
    assert stopped(pool) == [1, 1]  # held for HOLD_S
    clock.now += HOLD_S / 2
    pacer.step()
    assert stopped(pool) == [0, 0] and pacer.engaged
    assert (pacer.pauses, pacer.backoffs) == (1, 0)
    assert pacer.paused_s == pytest.approx(HOLD_S)
    assert pacer.slowest == pytest.approx(1.6)
    said = pacer.unwatch(pool)
    assert said.startswith("the workers stood still 1 time(s), 0.2 s in all")
    assert "host" not in said


def test_workers_run_at_least_as_long_as_they_stood_still() -> None:
    pacer, clock, pool = paced()
    pacer.observe(1, 30 * MS)
    pacer.step()
    clock.now += HOLD_S
    pacer.step()
    assert stopped(pool) == [0, 0]
    pacer.observe(1, 30 * MS)  # slow again at once
    clock.now += HOLD_S / 2
    pacer.step()
    assert stopped(pool) == [0, 0]
    clock.now += HOLD_S / 2
    pacer.step()  # the slow call still asks, once the workers ran as long
    assert stopped(pool) == [1, 1] and pacer.pauses == 2


def test_a_pause_that_leaves_the_calls_slow_backs_off() -> None:
    pacer, clock, pool = paced()
    pacer.observe(1, 30 * MS)
    pacer.step()
    for _ in range(5):  # as slow with the workers stopped: the host, not them
        pacer.observe(1, 20 * MS)
    clock.now += HOLD_S
    pacer.step()
    assert stopped(pool) == [0, 0] and pacer.backoffs == 1
    clock.now += HOLD_S
    pacer.observe(1, 30 * MS)
    pacer.step()
    assert stopped(pool) == [0, 0]  # backing off
    clock.now += BACKOFF_S
    pacer.observe(1, 30 * MS)
    pacer.step()
    assert stopped(pool) == [1, 1]  # tried again after the back-off
    for _ in range(5):
        pacer.observe(1, 20 * MS)
    clock.now += HOLD_S
    pacer.step()
    clock.now += 1.5 * BACKOFF_S  # the second back-off is twice as long
    pacer.observe(1, 30 * MS)
    pacer.step()
    assert stopped(pool) == [0, 0] and pacer.backoffs == 2
    said = pacer.unwatch(pool)
    assert "2 of those pauses left the calls as slow (the host, not the workers)" in said


def test_without_a_baseline_a_pause_gives_the_calls_one() -> None:
    clock = FakeClock(100.0)
    pacer = Pacer(1.5, clock=clock, start_thread=False)
    pool = Pool()
    pacer.watch(pool)
    pacer.step()
    pacer.observe(1, EAGER)  # the workers ran from its first call: no pace to judge it by
    pacer.step()
    assert stopped(pool) == [1, 1]
    for _ in range(pacing.QUIET_CALLS):
        pacer.observe(1, EAGER)
    clock.now += HOLD_S
    pacer.step()
    pacer.observe(1, 12 * MS)  # judged against the quiet calls now: within the pace
    clock.now += HOLD_S
    pacer.step()
    assert stopped(pool) == [0, 0] and pacer.pauses == 1


def test_each_module_has_its_own_pace() -> None:
    pacer, _clock, pool = paced()
    pacer.engaged = False
    for _ in range(12):
        pacer.observe(2, 100 * MS)  # a larger module the program also calls
    pacer.step()
    pacer.observe(2, 110 * MS)  # 1.1x its own pace, 11x module 1's
    pacer.step()
    assert stopped(pool) == [0, 0]


def test_idle_workers_and_measuring_ones_are_not_stopped() -> None:
    pacer, clock, pool = paced()
    pool.slots[0].measuring = True
    pacer.observe(1, 30 * MS)
    pacer.step()
    assert stopped(pool) == [0, 1]
    clock.now += HOLD_S
    pacer.step()
    pool.building = False
    pacer.step()
    assert not pacer.engaged  # nothing builds: the calls are quiet ones
    pacer.observe(1, 30 * MS)
    clock.now += HOLD_S
    pacer.step()
    assert [s.calls for s in pool.slots] == [[], ["pause", "resume"]]


def test_a_worker_that_began_to_measure_since_it_was_listed_is_left_alone() -> None:
    pacer, clock, pool = paced()
    pool.slots[1].measuring = True
    pool.busy_slots = lambda: list(pool.slots)  # type: ignore[method-assign]  # listed before
    pacer.observe(1, 30 * MS)
    pacer.step()
    assert stopped(pool) == [1, 0]
    clock.now += HOLD_S
    pacer.step()
    assert [s.calls for s in pool.slots] == [["pause", "resume"], []]


def test_unwatch_runs_the_held_workers_again() -> None:
    pacer, _clock, pool = paced()
    pacer.observe(1, 30 * MS)
    pacer.step()
    assert stopped(pool) == [1, 1]
    pacer.unwatch(pool)
    assert stopped(pool) == [0, 0] and not pacer.engaged


class FakeWorker:
    def __init__(self) -> None:
        self.signals: list[str] = []

    def pause(self) -> None:
        self.signals.append("STOP")

    def resume(self) -> None:
        self.signals.append("CONT")


def test_a_slots_pauses_nest_and_spare_a_measuring_worker() -> None:
    slot = pool_module._Slot(object(), 0, "")  # type: ignore[arg-type]
    slot.worker = FakeWorker()
    assert slot.pause() and slot.pause(unless_measuring=True)  # the gate's, then pacing's
    slot.resume()
    assert slot.worker.signals == ["STOP"] and slot.paused_since is not None
    slot.resume()
    assert slot.worker.signals == ["STOP", "CONT"] and slot.paused_since is None
    slot.resume()  # one too many: nothing
    slot.measuring = True
    assert not slot.pause(unless_measuring=True)
    assert slot.worker.signals == ["STOP", "CONT"]


def test_the_flag_turns_pacing_off_and_sets_the_ratio() -> None:
    saved = pacing._PACER[0]
    try:
        with honed.config.patch(jit_pace=2.5):
            p = pacing.pacer()
            assert p is not None and p.ratio == 2.5
        with honed.config.patch(jit_pace=0):
            assert pacing.pacer() is None
            assert pacing._PACER[0] is None  # observe() no longer times calls
    finally:
        pacing._PACER[0] = saved


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[int, float]] = []

    def observe(self, key: int, seconds: float) -> None:
        self.seen.append((key, seconds))


class Tuned:
    def dispatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args[0] * 0


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    honed.jit.reset()
    saved = pacing._PACER[0]
    rec = Recorder()
    pacing._PACER[0] = rec  # type: ignore[assignment]
    with honed.jit.config.patch(min_parameters=10**9):  # every module SKIPPED: no tune starts
        honed.jit.enable_jit_tuning()
        try:
            yield rec
        finally:
            honed.jit.reset()
            pacing._PACER[0] = saved


def test_the_programs_outermost_eager_calls_are_timed_and_no_other(recorder: Recorder) -> None:
    model = TinyMLP().eval()
    x = torch.randn(4, 16)
    with torch.no_grad():
        for _ in range(3):
            model(x)
        node = honed.jit.roots()[0]
        assert node.module is model
        assert [key for key, _ in recorder.seen] == [id(node)] * 3  # not its children's calls
        assert all(0 < s < 10 for _, s in recorder.seen)
        node.state, node.tuned = State.TUNED, Tuned()
        out = model(x)
    assert torch.equal(out, torch.zeros_like(out))  # routed to the "variant"
    assert len(recorder.seen) == 3  # a variant's call is not the program's pace


def test_a_model_of_modules_nests_and_only_its_top_is_timed(recorder: Recorder) -> None:
    outer = nn.Sequential(TinyMLP(), nn.ReLU()).eval()
    with torch.no_grad():
        outer(torch.randn(2, 16))
    tops = honed.jit.roots()
    assert len(tops) == 1 and [k for k, _ in recorder.seen] == [id(tops[0])]
