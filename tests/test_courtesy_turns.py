"""tests/test_courtesy_turns.py: work in the program's process takes turns with its calls.

The program here is a module called through JIT's patch of ``Module.__call__`` (nothing is
tuned); its forward sleeps, and the work is a thread named as JIT's own, whose module calls are
the pieces (``courtesy.taking_turns``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import honed
import honed.jit
from honed.pipeline import courtesy


class Call(nn.Module):
    """The program's call: sleeps ``seconds`` and logs its span and the turns ended before it."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.spans: list[tuple[float, float]] = []
        self.turns_before: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        self.turns_before.append(courtesy._turns_ended[0])
        time.sleep(self.seconds)
        self.spans.append((start, time.perf_counter()))
        return x


class Piece(nn.Module):
    """One piece of the work: sleeps ``seconds`` and logs its span."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.spans: list[tuple[float, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        time.sleep(self.seconds)
        self.spans.append((start, time.perf_counter()))
        return x


@pytest.fixture
def jit() -> Iterator[None]:
    honed.jit.reset()
    with honed.jit.config.patch(wait=False, min_parameters=10**9):  # nothing is tuned
        honed.jit.enable_jit_tuning()
        try:
            yield
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()
    assert courtesy.TURN[0] == courtesy._FREE


def _program(model: Call, calls: int, gap_s: float = 0.0) -> threading.Thread:
    def run() -> None:
        x = torch.zeros(1)
        for _ in range(calls):
            model(x)
            if gap_s:
                time.sleep(gap_s)  # the program's host waits for the GPU

    thread = threading.Thread(target=run, name="program")
    thread.start()
    return thread


def _work(piece: Piece, pieces: int, done: list[float], on: bool = True) -> threading.Thread:
    def run() -> None:
        x = torch.zeros(1)
        with courtesy.taking_turns(on):
            for _ in range(pieces):
                piece(x)
        done.append(time.perf_counter())

    return threading.Thread(target=run, name="honed-turns")


def _overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s0, e0 in a for s1, e1 in b if s0 < e1 and s1 < e0)


def test_the_programs_calls_and_the_works_turns_alternate_and_never_overlap(jit: None) -> None:
    """A program always inside a call (no gap between its calls): each turn starts as one of
    its calls ends, and the next call waits for that turn alone; no piece of the work runs
    beside a call, and the work still ends while the program runs."""
    call, piece = Call(0.008), Piece(0.001)
    done: list[float] = []
    program = _program(call, 60)
    while len(call.spans) < 3:  # the program's pace is known: a turn is half a call
        time.sleep(0.001)
    work = _work(piece, 30, done)
    work.start()
    work.join()
    program.join()
    assert len(piece.spans) == 30
    assert _overlaps(call.spans, piece.spans) == 0
    assert done[0] < call.spans[-1][0]  # the work did not wait for the program's end
    turns = [b - a for a, b in itertools.pairwise(call.turns_before)]
    assert max(turns) == 1  # between two of the program's calls, one turn at most
    assert sum(turns) >= 30 * 0.001 / courtesy.TURN_S  # turns of 4 ms at most


def test_without_taking_turns_the_same_work_runs_beside_the_calls(jit: None) -> None:
    """The same work outside ``taking_turns`` (or with it off) runs its pieces during the
    program's calls: what the turns above prevent."""
    call, piece = Call(0.008), Piece(0.001)
    done: list[float] = []
    program = _program(call, 30)
    while len(call.spans) < 3:
        time.sleep(0.001)
    work = _work(piece, 30, done, on=False)
    work.start()
    work.join()
    program.join()
    assert _overlaps(call.spans, piece.spans) > 10
    assert courtesy._turns_ended[0] == call.turns_before[0]  # no turn was taken


def test_turns_start_while_the_program_waits_between_its_calls(jit: None) -> None:
    """Between calls (its host waiting for the GPU) the program is not held up at all by a turn
    that ends before its next call starts; calls arriving during one wait for its end."""
    call, piece = Call(0.004), Piece(0.0005)
    done: list[float] = []
    program = _program(call, 40, gap_s=0.004)
    while len(call.spans) < 3:
        time.sleep(0.001)
    work = _work(piece, 20, done)
    work.start()
    work.join()
    program.join()
    assert _overlaps(call.spans, piece.spans) == 0
    gaps = list(itertools.pairwise(call.spans))
    between = sum(
        1 for s, e in piece.spans if any(e0 <= s and e <= s1 for (_, e0), (s1, _) in gaps)
    )
    assert between == 20  # every piece between two calls


def test_an_idle_program_leaves_the_work_to_run_without_waiting(jit: None) -> None:
    piece = Piece(0.0)
    done: list[float] = []
    start = time.perf_counter()
    work = _work(piece, 200, done)
    work.start()
    work.join()
    assert len(piece.spans) == 200
    assert done[0] - start < 1.0  # 200 turns' waits of TURN_WAIT_S would take 10 s


@pytest.mark.parametrize("last_call_s", [0.03, 0.2])
def test_a_turn_that_overran_holds_a_call_as_long_as_the_last_call_at_most(
    jit: None, monkeypatch: pytest.MonkeyPatch, last_call_s: float
) -> None:
    """A piece far longer than a turn (a library's first plan): the call that arrived during it
    waits until as long after the turn's start as the program's latest call took
    (PROGRAM_WAIT_S at most), then runs beside it; the calls after it do not wait for that
    turn."""
    monkeypatch.setattr(courtesy, "_last_call_s", [last_call_s])
    wait_s = min(last_call_s, courtesy.PROGRAM_WAIT_S)
    call, piece = Call(0.002), Piece(0.3)
    done: list[float] = []
    work = _work(piece, 1, done)
    work.start()
    while courtesy.TURN[0] != courtesy._HELD:
        time.sleep(0.0005)
    began = courtesy._turn_began[0]
    program = _program(call, 20)
    program.join()
    work.join()
    first = call.spans[0][0]
    assert wait_s * 0.9 <= first - began < wait_s + 0.03
    assert call.spans[-1][1] < piece.spans[0][1]  # the rest ran beside the piece


def test_work_the_program_waits_for_takes_its_turns_at_once(jit: None) -> None:
    """While the program waits for this process's work (``program_waits``: its synchronize
    waits for a capture), the work does not wait for the program's calls to end."""
    call, piece = Call(0.05), Piece(0.0)
    done: list[float] = []
    program = _program(call, 1)
    while not honed.jit.patcher.STATE.in_call:
        time.sleep(0.0005)
    with courtesy.program_waits():
        start = time.perf_counter()
        work = _work(piece, 5, done)
        work.start()
        work.join()
    program.join()
    assert done[0] - start < 0.03  # not after the call's end


def test_work_waiting_for_a_turn_takes_it_once_the_program_waits_for_it(
    jit: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work already waiting for the program's call to end takes its turn as soon as the program
    starts waiting for it (its synchronize reaching a capture under way), not when the wait for
    the call's end runs out: the program would wait for that too."""
    monkeypatch.setattr(courtesy, "TURN_WAIT_S", 2.0)
    call, piece = Call(3.0), Piece(0.0)
    done: list[float] = []
    program = _program(call, 1)
    while not honed.jit.patcher.STATE.in_call:
        time.sleep(0.0005)
    work = _work(piece, 1, done)
    work.start()
    deadline = time.monotonic() + 5
    while not courtesy._waiting[0]:  # the work waits for the call's end
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    with courtesy.program_waits():
        start = time.perf_counter()
        work.join(5)
    program.join()
    assert piece.spans and piece.spans[0][0] - start < 0.5


def test_without_a_program_taking_turns_does_nothing() -> None:
    honed.jit.reset()
    with courtesy.taking_turns(True):
        assert courtesy.at_module_call() == 0.0
        assert courtesy.TURN[0] == courtesy._FREE
    assert not courtesy._TURN_OWNER.locked()


def test_a_turn_held_at_the_end_of_taking_turns_is_ended(jit: None) -> None:
    ended = courtesy._turns_ended[0]
    with courtesy.taking_turns(True):
        courtesy.at_module_call()  # no call runs: the turn starts at once
        assert courtesy.TURN[0] == courtesy._HELD
        with courtesy.taking_turns(True):  # nested: the outer one ends it
            pass
        assert courtesy.TURN[0] == courtesy._HELD
    assert courtesy.TURN[0] == courtesy._FREE
    assert courtesy._turns_ended[0] == ended + 1
    assert not courtesy._TURN_OWNER.locked()


def test_work_interrupted_while_it_waits_for_a_turn_leaves_none_held() -> None:
    """An error while the work waits for its turn (here the probe's) reaches the work, and
    leaves no turn held or wanted: the program's calls never wait for work that is gone."""
    honed.jit.reset()

    def broken() -> bool:
        raise RuntimeError("probe")

    courtesy.watch(broken)
    try:
        with pytest.raises(RuntimeError, match="probe"), courtesy.taking_turns(True):
            courtesy.at_module_call()
        assert courtesy.TURN[0] == courtesy._FREE
        assert not courtesy._TURN_OWNER.locked()
        courtesy.call_starting()  # returns at once
    finally:
        courtesy.watch(None)
