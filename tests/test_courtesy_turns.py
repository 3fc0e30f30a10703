"""tests/test_courtesy_turns.py: work in the program's process takes turns with its calls.

The program here is a module called through JIT's patch of ``Module.__call__`` (nothing is
tuned); its forward sleeps, and the work is a thread named as JIT's own, whose module calls are
the pieces (``courtesy.taking_turns``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

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


def _spans_on_jits_thread(
    body: Callable[[list[tuple[float, float]]], None], call: Call, calls: int = 60
) -> list[tuple[float, float]]:
    """``body(spans)`` on a thread named as JIT's own, while the program calls ``call`` back to
    back; the spans ``body`` logged."""
    spans: list[tuple[float, float]] = []
    program = _program(call, calls)
    while len(call.spans) < 3:  # the program's pace is known: a turn is half a call
        time.sleep(0.001)
    work = threading.Thread(target=body, args=(spans,), name="honed-turns")
    work.start()
    work.join()
    program.join()
    return spans


def _slept(spans: list[tuple[float, float]], seconds: float = 0.001) -> None:
    start = time.perf_counter()
    time.sleep(seconds)
    spans.append((start, time.perf_counter()))


@pytest.mark.parametrize("on", [True, False])
def test_a_block_that_calls_no_module_runs_in_a_turn_of_its_own(jit: None, on: bool) -> None:
    """A run that makes no module call (an AOTInductor package's, one C++ call) inside
    ``taking_turns`` starts in a turn: it never runs beside the program's call. Off, it does."""
    call = Call(0.008)

    def body(spans: list[tuple[float, float]]) -> None:
        for _ in range(20):
            with courtesy.taking_turns(on):
                _slept(spans)

    spans = _spans_on_jits_thread(body, call)
    assert len(spans) == 20
    if on:
        assert _overlaps(call.spans, spans) == 0
    else:
        assert _overlaps(call.spans, spans) >= 10


def test_pieces_between_pieces_run_in_turns_inside_taking_turns(jit: None) -> None:
    """A loop of short Python pieces (a package's constants laid out, a tuned module's children
    detached) that marks each with ``between_pieces`` runs them in turns with the calls."""
    call = Call(0.008)

    def body(spans: list[tuple[float, float]]) -> None:
        with courtesy.taking_turns(True):
            for _ in range(30):
                courtesy.between_pieces()
                _slept(spans)

    spans = _spans_on_jits_thread(body, call)
    assert len(spans) == 30
    assert _overlaps(call.spans, spans) == 0
    assert spans[-1][1] < call.spans[-1][0]  # the work did not wait for the program's end


def test_a_checks_runs_beside_a_program_take_turns_with_its_calls(jit: None) -> None:
    """JIT's check of a variant in the program's process (its install) runs each sample in a
    turn: the variant's host work never runs beside the program's call."""
    from honed.backend.base import Sample
    from honed.pipeline.candidate import _check

    call = Call(0.008)
    result: list[Any] = []

    def body(spans: list[tuple[float, float]]) -> None:
        def variant(x: torch.Tensor) -> torch.Tensor:
            _slept(spans)
            return x + 1

        samples = [Sample((torch.full((2,), float(i)),), {}) for i in range(12)]
        references = [s.args[0] + 1 for s in samples]
        result.append(_check(variant, samples, references, False, device=torch.device("cpu")))

    spans = _spans_on_jits_thread(body, call)
    assert result[0].ok
    assert len(spans) == 12
    assert _overlaps(call.spans, spans) == 0


def test_installing_a_tuned_module_detaches_its_children_in_turns_with_the_calls(
    jit: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tuned transformer has hundreds of child modules, each detached and noted in the history
    on JIT's thread beside the program's calls: in turns with those calls, never beside one."""
    from honed.jit import tuner
    from honed.jit.hierarchy import Node, State

    call = Call(0.008)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(2, 2), nn.ReLU()) for _ in range(8)))
    root = Node(model, None)
    for block in model:
        node = Node(block, root)
        for layer in block:
            Node(layer, node)

    def body(spans: list[tuple[float, float]]) -> None:
        monkeypatch.setattr(tuner, "add_step", lambda *a, **k: _slept(spans))
        tuner._install(root, object(), "AnyBackend", None)

    spans = _spans_on_jits_thread(body, call)
    assert root.state is State.TUNED
    assert [n.state for n in root.descendants()] == [State.DETACHED] * 24
    assert len(spans) == 24
    assert _overlaps(call.spans, spans) == 0


def test_a_packages_constants_are_laid_out_in_turns_with_the_calls(
    jit: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AOTInductor package's constants, taken from the module's weights (cast where the
    package computes in bf16) on JIT's thread in the program's process: in turns with its calls."""
    import json

    from honed.backend import _aoti_constants

    call = Call(0.008)
    model = nn.Sequential(*(nn.Linear(4, 4) for _ in range(6)))
    entries = [
        {
            "fqn": f"inner.{name}",
            "dtype": "bfloat16",
            "cast_from": "float32",
            "shape": list(t.shape),
            "stride": list(t.stride()),
            "source": "weights",
            "key": name,
        }
        for name, t in model.state_dict().items()
    ]
    listing = {"format": _aoti_constants.FORMAT, "constants": entries}
    files = {_aoti_constants.CONSTANTS_JSON: json.dumps(listing).encode()}
    real = _aoti_constants._handed_as_is
    out: list[dict[str, torch.Tensor] | None] = []

    def body(spans: list[tuple[float, float]]) -> None:
        def handed(*args: Any) -> bool:
            _slept(spans)
            return real(*args)

        monkeypatch.setattr(_aoti_constants, "_handed_as_is", handed)
        out.append(_aoti_constants.tensors(files, model, torch.device("cpu")))

    spans = _spans_on_jits_thread(body, call)
    constants = out[0]
    assert constants is not None and len(constants) == len(entries) == len(spans) == 12
    for name, t in model.state_dict().items():
        torch.testing.assert_close(constants[f"inner.{name}"], t.to(torch.bfloat16))
    assert _overlaps(call.spans, spans) == 0
