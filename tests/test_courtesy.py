"""tests/test_courtesy.py: JIT's work beside the program waits while the program's call runs."""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

import honed
import honed.jit
from honed.pipeline import courtesy

from conftest import ended_pid


class Slow(nn.Module):
    """A call that lasts ``seconds``, announcing its start."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.started = threading.Event()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.started.set()
        time.sleep(self.seconds)
        return x


def _give_way_during_a_call(
    model: Slow, limit_s: float, wait: Any = courtesy.give_way
) -> tuple[float, float]:
    """(seconds ``wait`` (give_way) waited on another thread while ``model`` ran a call, the
    call's own)."""
    took: dict[str, float] = {}

    def call() -> None:
        start = time.perf_counter()
        model(torch.zeros(1))
        took["call"] = time.perf_counter() - start

    thread = threading.Thread(target=call)
    thread.start()
    assert model.started.wait(5)
    time.sleep(2 * courtesy.SLICE_S)  # this thread's work since it last waited: a slice
    waited = wait(limit_s)
    thread.join()
    return waited, took["call"]


def test_work_waits_for_the_programs_call_to_end() -> None:
    honed.jit.reset()
    with honed.jit.config.patch(wait=False, min_parameters=10**9):  # nothing is tuned
        honed.jit.enable_jit_tuning()
        try:
            waited, call = _give_way_during_a_call(Slow(0.3), limit_s=5.0)
            assert 0.2 < waited <= call + 0.05, (waited, call)
            # at most limit_s: a program always inside a call still lets the work go on
            waited, _ = _give_way_during_a_call(Slow(0.5), limit_s=0.05)
            assert 0.05 <= waited < 0.3, waited
            assert courtesy.give_way(5.0) == 0.0  # no call running: no wait
            with honed.jit.config.patch(wait=True):  # the program waits for JIT: no courtesy
                waited, _ = _give_way_during_a_call(Slow(0.3), limit_s=5.0)
                assert waited == 0.0
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()


def test_a_piece_that_starts_between_calls_waits_however_recently_the_thread_waited() -> None:
    """give_way lets a thread that waited within the last slice go on; wait_for_call_end,
    for a piece that must start between the program's calls, waits for the call's end even
    then (limit_s at most), and not where no call runs or the program waits for JIT."""
    honed.jit.reset()

    def just_waited(limit_s: float) -> float:
        courtesy._local.resumed = time.perf_counter()  # as if this thread had just waited
        return courtesy.give_way(limit_s)

    def just_waited_then_start(limit_s: float) -> float:
        courtesy._local.resumed = time.perf_counter()
        return courtesy.wait_for_call_end(limit_s)

    with honed.jit.config.patch(wait=False, min_parameters=10**9):  # nothing is tuned
        honed.jit.enable_jit_tuning()
        try:
            waited, _ = _give_way_during_a_call(Slow(0.3), 5.0, just_waited)
            assert waited == 0.0
            waited, call = _give_way_during_a_call(Slow(0.3), 5.0, just_waited_then_start)
            assert 0.2 < waited <= call + 0.05, (waited, call)
            waited, _ = _give_way_during_a_call(Slow(0.5), 0.05, courtesy.wait_for_call_end)
            assert 0.05 <= waited < 0.3, waited
            assert courtesy.wait_for_call_end(5.0) == 0.0  # no call running
            with honed.jit.config.patch(wait=True):  # the program waits for JIT: no courtesy
                waited, _ = _give_way_during_a_call(Slow(0.3), 5.0, courtesy.wait_for_call_end)
                assert waited == 0.0
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()
    assert courtesy.wait_for_call_end(5.0) == 0.0  # without JIT nothing waits


def test_a_waiting_thread_is_woken_by_the_calls_end_and_does_not_poll() -> None:
    """While it waits, the thread does not look again and again (each look takes the GIL back
    from the program's call): it asks whether a call runs once, and once more when woken."""
    honed.jit.reset()
    with honed.jit.config.patch(wait=False, min_parameters=10**9):  # nothing is tuned
        honed.jit.enable_jit_tuning()
        jit_probe = courtesy._probe[0]
        assert jit_probe is not None
        asked = []

        def counting() -> bool:
            asked.append(1)
            return jit_probe()

        courtesy.watch(counting)
        try:
            waited, call = _give_way_during_a_call(Slow(0.3), limit_s=5.0)
            assert 0.2 < waited <= call + 0.05, (waited, call)
            assert len(asked) <= 4, len(asked)
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()


def test_without_jit_nothing_waits() -> None:
    honed.jit.reset()
    waited, call = _give_way_during_a_call(Slow(0.3), limit_s=5.0)
    assert waited == 0.0 and call >= 0.3


def test_the_calling_thread_never_waits_for_itself() -> None:
    honed.jit.reset()
    seen: list[float] = []

    class WaitsInside(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(courtesy.give_way(5.0))
            return x

    with honed.jit.config.patch(wait=False, min_parameters=10**9):
        honed.jit.enable_jit_tuning()
        try:
            WaitsInside()(torch.zeros(1))
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()
    assert seen == [0.0]


def test_the_programs_device_syncs_wait_for_a_capture_beside_them() -> None:
    """A device-wide synchronize during another thread's CUDA-graph capture breaks both: beside
    a program, torch.cuda.synchronize waits for honed's capture to end (and only then)."""
    from honed.backend import cuda_graphs

    plain = torch.cuda.synchronize
    synced: list[float] = []
    honed.jit.reset()
    honed.jit.enable_jit_tuning()
    real = cuda_graphs._PLAIN_SYNCHRONIZE[0]
    try:
        assert torch.cuda.synchronize is not plain
        cuda_graphs._PLAIN_SYNCHRONIZE[0] = lambda device=None: synced.append(time.perf_counter())
        capture_ends = threading.Event()
        ended_at: list[float] = []

        def capture() -> None:
            with cuda_graphs.CAPTURING:
                torch.cuda.synchronize()  # as torch.cuda.graph does, on the capturing thread
                capture_ends.wait(5)
                ended_at.append(time.perf_counter())

        thread = threading.Thread(target=capture)
        thread.start()
        time.sleep(0.1)
        threading.Timer(0.2, capture_ends.set).start()
        torch.cuda.synchronize()  # the program's: after the capture
        thread.join()
        assert len(synced) == 2 and synced[1] >= ended_at[0]
    finally:
        cuda_graphs._PLAIN_SYNCHRONIZE[0] = real
        honed.jit.disable_jit_tuning()
        honed.jit.reset()
    assert torch.cuda.synchronize is plain


def test_a_synchronize_bound_while_guarded_runs_torchs_after_the_guard_is_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Code that took torch.cuda.synchronize while JIT guarded it (torch._dynamo's CUDA device
    interface binds it at its first import) keeps that function: once JIT is off, calling it
    runs torch's synchronize, without waiting for captures, and JIT on again guards it again."""
    from honed.backend import cuda_graphs

    synced: list[Any] = []
    plain = lambda device=None: synced.append(device)  # noqa: E731
    monkeypatch.setattr(torch.cuda, "synchronize", plain)
    cuda_graphs.guard_synchronize(True)
    try:
        bound = torch.cuda.synchronize
        assert bound is not plain
    finally:
        cuda_graphs.guard_synchronize(False)
    assert torch.cuda.synchronize is plain
    holding, release = threading.Event(), threading.Event()

    def capture_elsewhere() -> None:  # a capture under way: the guard would wait for its end
        with cuda_graphs.CAPTURING:
            holding.set()
            release.wait(10)

    capturer = threading.Thread(target=capture_elsewhere)
    capturer.start()
    try:
        assert holding.wait(5)
        bound("cuda:1")
        assert synced == ["cuda:1"]
    finally:
        release.set()
        capturer.join()
    cuda_graphs.guard_synchronize(True)
    try:
        assert torch.cuda.synchronize is bound
        assert courtesy._held[0] == 0
    finally:
        cuda_graphs.guard_synchronize(False)
    assert torch.cuda.synchronize is plain


@contextlib.contextmanager
def _inside_a_programs_call(seconds: float = 1.0) -> Iterator[None]:
    """JIT on, and a thread of the program inside a call of ``seconds`` while the body runs."""
    honed.jit.reset()
    model = Slow(seconds)
    with honed.jit.config.patch(wait=False, min_parameters=10**9):
        honed.jit.enable_jit_tuning()
        try:
            thread = threading.Thread(target=model, args=(torch.zeros(1),))
            thread.start()
            assert model.started.wait(5)
            yield
            thread.join()
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()


def test_work_gives_way_once_per_slice_not_per_piece() -> None:
    with _inside_a_programs_call():
        time.sleep(2 * courtesy.SLICE_S)
        assert courtesy.give_way(0.05) >= 0.05  # the call goes on: waited the limit
        assert courtesy.give_way(5.0) == 0.0  # right after a wait: the next piece goes on
        time.sleep(2 * courtesy.SLICE_S)
        assert courtesy.give_way(0.05) >= 0.05  # a slice later: gives way again


def test_work_giving_way_goes_on_once_the_program_waits_for_it() -> None:
    """Work already giving way to the program's call goes on when the program starts waiting
    for it, not at the call's end."""
    with _inside_a_programs_call(seconds=3.0):
        waited: list[float] = []
        worker = threading.Thread(target=lambda: waited.append(courtesy.give_way(5.0)))
        worker.start()
        deadline = time.monotonic() + 5
        while not courtesy._waiting[0]:
            assert time.monotonic() < deadline
            time.sleep(0.0005)
        with courtesy.program_waits():
            worker.join(5)
        assert waited and waited[0] < 0.5


@pytest.mark.parametrize("waits", ["program_waits", "a guarded synchronize"])
def test_work_the_program_waits_for_does_not_give_way_to_its_call(waits: str) -> None:
    """While a thread of the program waits for this process's work (its synchronize waiting for
    a capture under way), the work goes on even though the program is inside a call: waiting
    for that call's end would hold the call up instead."""
    from honed.backend import cuda_graphs

    real = cuda_graphs._PLAIN_SYNCHRONIZE
    with _inside_a_programs_call():
        leave = threading.Event()

        def program_waits() -> None:
            with courtesy.program_waits():
                leave.wait(5)

        plain = real[0]
        real[0] = lambda device=None: None
        try:
            with cuda_graphs.CAPTURING:  # a capture under way on this thread
                waiter = threading.Thread(
                    target=program_waits if waits == "program_waits" else torch.cuda.synchronize
                )
                waiter.start()
                deadline = time.monotonic() + 5
                while not courtesy._held[0]:
                    assert time.monotonic() < deadline
                    time.sleep(0.001)
                time.sleep(2 * courtesy.SLICE_S)
                assert courtesy.give_way(0.05) == 0.0
                leave.set()
            waiter.join()
        finally:
            real[0] = plain
        time.sleep(2 * courtesy.SLICE_S)
        assert courtesy.give_way(0.05) >= 0.05  # the call goes on, nothing waits: gives way


@pytest.mark.parametrize("on", [True, False])
def test_jits_own_module_calls_give_way_inside_giving_way_at_module_calls(
    monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    """Inside ``giving_way_at_module_calls(on)``, each module call of JIT's own thread gives way
    first (one for the container, one for each child); the program's own module calls never
    do, and without a program nothing does."""
    honed.jit.reset()
    asked: list[str] = []  # the threads that asked whether a call runs (give_way's probe)

    def idle() -> bool:
        asked.append(threading.current_thread().name)
        return False

    monkeypatch.setattr(courtesy, "SLICE_S", 0.0)  # each give_way asks
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert courtesy.at_module_call() == 0.0  # no program: nothing to give way to
    with courtesy.giving_way_at_module_calls(True):
        assert courtesy.at_module_call() == 0.0
    with honed.jit.config.patch(wait=False, min_parameters=10**9):
        honed.jit.enable_jit_tuning()
        courtesy.watch(idle)
        try:

            def call() -> None:
                with courtesy.giving_way_at_module_calls(on):
                    model(torch.zeros(1, 4))

            for name in ("honed-capture", "program"):
                thread = threading.Thread(target=call, name=name)
                thread.start()
                thread.join()
            assert asked.count("honed-capture") == (3 if on else 0)
            assert asked.count("program") == 0
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()


def test_without_a_program_own_stream_leaves_the_stream_as_it_is() -> None:
    honed.jit.reset()
    with courtesy.own_stream(torch.device("cuda:0")):  # no probe: not even CUDA is touched
        x = torch.ones(3) * 2
    assert x.tolist() == [2.0, 2.0, 2.0]


@pytest.mark.gpu
def test_beside_a_program_gpu_work_runs_on_a_stream_of_its_own() -> None:
    """A check or an eager reference on JIT's thread: off the default stream the program's
    thread shares, after what the calling stream held, and done when the block ends."""
    honed.jit.reset()
    honed.jit.enable_jit_tuning()
    try:
        device = torch.device("cuda:0")
        default = torch.cuda.current_stream(device)
        before = torch.full((1 << 20,), 3.0, device=device)  # queued on the default stream
        with courtesy.own_stream(device):
            inside = torch.cuda.current_stream(device)
            assert inside != default
            after = before * 2
            done = torch.cuda.Event()
            done.record(inside)
        assert torch.cuda.current_stream(device) == default
        assert done.query()  # finished at the block's end
        assert bool((after == 6.0).all())
    finally:
        honed.jit.disable_jit_tuning()
        honed.jit.reset()


def test_without_a_program_or_on_the_cpu_runs_are_not_spaced() -> None:
    honed.jit.reset()
    courtesy.space_runs(False)
    started = time.perf_counter()
    for _ in range(20):  # no probe: CUDA is not touched, nothing waits
        with courtesy.spaced_run(torch.device("cuda:0")):
            pass
    courtesy.space_runs(True)  # a worker beside a program, on the CPU: nothing to space
    try:
        for _ in range(20):
            with courtesy.spaced_run(torch.device("cpu")):
                pass
    finally:
        courtesy.space_runs(False)
    assert time.perf_counter() - started < 20 * courtesy.MIN_GAP_S


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["worker", "program"])
def test_beside_a_program_gpu_runs_leave_it_the_gpu_between_them(where: str) -> None:
    """A check's runs on the GPU beside a program (a worker told so, or JIT's thread in the
    program's process): each waits for the previous one's end plus twice its length."""
    device = torch.device("cuda:0")
    cycles = int(torch.cuda.get_device_properties(device).clock_rate * 1e3 * 0.01)  # ~10 ms
    honed.jit.reset()
    if where == "worker":
        courtesy.space_runs(True)
    else:
        honed.jit.enable_jit_tuning()
    try:
        spans = []
        for _ in range(3):
            with courtesy.spaced_run(device):
                started = time.perf_counter()
                torch.cuda._sleep(cycles)
            spans.append((started, time.perf_counter()))  # ended: synchronized by the block
        for (s0, e0), (s1, _) in itertools.pairwise(spans):
            run = e0 - s0
            assert run > 0.005  # the block waited for the GPU's work
            gap = min(courtesy.MAX_GAP_S, courtesy.GAP_FACTOR * run)
            assert s1 - e0 >= 0.9 * gap
    finally:
        courtesy.space_runs(False)
        honed.jit.disable_jit_tuning()
        honed.jit.reset()


class _Timed(nn.Module):
    """A GPU call of about ``cycles`` clock cycles; when each call was made and had ended."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.cycles = cycles
        self.spans: list[tuple[float, float]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        if not torch.cuda.is_current_stream_capturing():
            torch.cuda._sleep(self.cycles)
            torch.cuda.current_stream().synchronize()
            self.spans.append((started, time.perf_counter()))
        return x * 2


@pytest.mark.gpu
@pytest.mark.parametrize("beside", [True, False])
def test_a_captures_warm_up_calls_are_spaced_only_beside_a_program(beside: bool) -> None:
    """A CUDA graph's warm-up calls, queued back to back, held a program's next call up for all
    of them at once: beside a program each starts after the previous one's gap."""
    from honed.backend.cuda_graphs import CudaGraphed, CudaGraphsBackendConfig

    device = torch.device("cuda:0")
    cycles = int(torch.cuda.get_device_properties(device).clock_rate * 1e3 * 0.005)  # ~5 ms
    model = _Timed(cycles)
    honed.jit.reset()
    if beside:
        courtesy.space_runs(True)
    try:
        graphs = CudaGraphed(model, device, CudaGraphsBackendConfig(warmup_iters=3))
        out = graphs(torch.ones(4, device=device))
        assert bool((out == 2).all())
        assert len(model.spans) == 3
        gaps = [s1 - e0 for (_, e0), (s1, _) in itertools.pairwise(model.spans)]
        if beside:
            assert min(gaps) >= 0.9 * courtesy.MIN_GAP_S
        else:
            assert max(gaps) < courtesy.MIN_GAP_S
    finally:
        courtesy.space_runs(False)
        honed.jit.reset()


def _captured_on_jits_thread(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A CUDA graph of ``model`` built and run on ``x`` on a thread named as JIT's own."""
    from honed.backend.cuda_graphs import CudaGraphed, CudaGraphsBackendConfig

    out: dict[str, torch.Tensor] = {}

    def build() -> None:
        graphs = CudaGraphed(model, x.device, CudaGraphsBackendConfig(warmup_iters=1))
        out["y"] = graphs(x)

    thread = threading.Thread(target=build, name="honed-capture")
    thread.start()
    thread.join()
    return out["y"]


@pytest.mark.gpu
@pytest.mark.parametrize("on", [True, False])
def test_a_captures_recording_gives_way_at_its_module_calls_where_configured(
    monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    """With ``honed.config.jit_capture_gives_way``, a capture on JIT's thread beside a program
    gives way at each module call of its warm-up run (one: beside a program, a build that is not
    a first build warms up off the captured path) and of its recorded forward; off (the
    default), never. The graph answers as eager either way."""
    from honed import config

    honed.jit.reset()
    monkeypatch.setattr(config, "jit_capture_gives_way", on)
    monkeypatch.setattr(config, "jit_takes_turns", False)  # which takes precedence
    monkeypatch.setattr(courtesy, "SLICE_S", 0.0)  # each give_way asks
    recording: list[bool] = []  # whether a stream captured, at each ask of the capture's thread
    # The warm-up run and the recording each start between the program's calls (spaced_run's
    # wait_for_call_end): those asks are counted apart.
    starting = [False]
    starts: list[bool] = []
    real_start = courtesy.wait_for_call_end

    def start(limit_s: float = courtesy.LIMIT_S) -> float:
        starting[0] = True
        try:
            return real_start(limit_s)
        finally:
            starting[0] = False

    monkeypatch.setattr(courtesy, "wait_for_call_end", start)

    def idle() -> bool:
        if threading.current_thread().name == "honed-capture":
            capturing = bool(torch._C._cuda_isCurrentStreamCapturing())
            (starts if starting[0] else recording).append(capturing)
        return False

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU()).cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    with honed.jit.config.patch(wait=False, min_parameters=10**9):
        honed.jit.enable_jit_tuning()
        courtesy.watch(idle)
        try:
            y = _captured_on_jits_thread(model, x)
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()
    assert recording.count(True) == (3 if on else 0)  # the recorded forward's module calls
    assert recording.count(False) == (3 if on else 0)  # the warm-up run's module calls
    assert starts == [False, False]  # the warm-up run's start and the recording's, on or off
    with torch.no_grad():
        torch.testing.assert_close(y, model(x))


class _Turns(nn.Module):
    """Logs, at each forward, whether its thread holds a turn and whether a stream captures."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.seen: list[tuple[str, bool, bool]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(
            (
                threading.current_thread().name,
                courtesy.TURN[0] == courtesy._HELD,
                bool(torch._C._cuda_isCurrentStreamCapturing()),
            )
        )
        return torch.relu(self.linear(x))


@pytest.mark.gpu
@pytest.mark.parametrize("on", [True, False])
def test_a_captures_warm_up_and_recording_take_turns_with_the_programs_calls(
    monkeypatch: pytest.MonkeyPatch, on: bool
) -> None:
    """With ``honed.config.jit_takes_turns`` (the default), a capture on JIT's thread beside a
    program runs its warm-up call and its recorded forward within turns, and holds none once
    built; off, it never takes one. The graph answers as eager either way."""
    from honed import config

    honed.jit.reset()
    monkeypatch.setattr(config, "jit_takes_turns", on)
    torch.manual_seed(0)
    model = _Turns().cuda().eval()
    x = torch.randn(4, 16, device="cuda")
    ended = courtesy._turns_ended[0]
    with honed.jit.config.patch(wait=False, min_parameters=10**9):
        honed.jit.enable_jit_tuning()
        try:
            y = _captured_on_jits_thread(model, x)
            assert courtesy.TURN[0] == courtesy._FREE
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()
    assert [(held, capturing) for _, held, capturing in model.seen] == [
        (on, False),  # the warm-up call
        (on, True),  # the recorded forward
    ]
    assert (courtesy._turns_ended[0] - ended >= 2) is on
    with torch.no_grad():
        torch.testing.assert_close(y, torch.relu(model.linear(x)))


def test_a_job_queued_inside_a_programs_call_starts_once_the_call_has_ended() -> None:
    """JIT queues a module's tune from inside its last recorded call: the job's first work (a
    collection, one C call holding the GIL, then Python) waits for that call's end."""
    from honed.jit import background, patcher

    started: list[float] = []

    class Queues(nn.Module):
        queue = False

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.queue:
                background.submit(lambda: started.append(time.monotonic()))
            time.sleep(0.01)  # the rest of the program's call
            return x

    honed.jit.reset()
    honed.jit.enable_jit_tuning()
    try:
        model = Queues()
        # JIT's start-up runs in a top module's first call (and lasts longer than a job waits
        # for a call's end the first time in a process): the job is queued from the second.
        model(torch.zeros(1))
        model.queue = True
        model(torch.zeros(1))
        ended = patcher.STATE.call_ended  # where JIT marks the call's end, before it returns
        assert background.wait(5.0)
    finally:
        honed.jit.disable_jit_tuning()
        honed.jit.reset()
    assert len(started) == 1
    assert started[0] >= ended - 0.001


# -- the call clock: a worker's GPU runs start halfway through a program's call ------------------
def test_a_run_waits_for_the_middle_of_the_programs_call() -> None:
    wait = courtesy.mid_call_wait
    assert wait(100.0, 99.99, 0.02, 100.001) == pytest.approx(0.009)  # early in a call
    assert wait(100.0, 99.99, 0.02, 100.012) == 0.0  # past its middle: at once
    assert wait(100.0, 99.99, 0.02, 100.5) == 0.0  # a call running long: at once
    assert 0.0 < wait(99.97, 99.99, 0.02, 99.9905) <= 0.0005  # between two calls: the next's
    assert wait(99.97, 99.99, 0.02, 100.2) == 0.0  # the program is idle
    assert wait(0.0, 0.0, 0.0, 5.0) == 0.0  # no call has ended yet: nothing to go by


class _FakeTime:
    def __init__(self, now: float) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_waiting_for_the_middle_of_a_call_is_bounded() -> None:
    t = _FakeTime(100.001)
    courtesy.wait_mid_call([100.0, 99.99, 0.02], t.clock, t.sleep)
    assert t.now == pytest.approx(100.010) and len(t.slept) == 1
    t = _FakeTime(99.9905)  # between calls, and the next never starts: until the program
    courtesy.wait_mid_call([99.97, 99.99, 0.02], t.clock, t.sleep)  # is idle (2 calls' time)
    assert t.now == pytest.approx(99.99 + 2 * 0.02, abs=0.0006)
    t = _FakeTime(99.9905)  # the same after long calls: MAX_ALIGN_S at most
    courtesy.wait_mid_call([99.87, 99.99, 0.12], t.clock, t.sleep)
    assert t.now - 99.9905 == pytest.approx(courtesy.MAX_ALIGN_S)
    t = _FakeTime(100.2)  # idle program: no wait
    courtesy.wait_mid_call([99.97, 99.99, 0.02], t.clock, t.sleep)
    assert t.slept == []


def test_jits_outermost_calls_keep_the_call_clock_that_workers_read() -> None:
    import mmap
    import struct

    honed.jit.reset()
    with honed.jit.config.patch(wait=False, min_parameters=10**9):  # nothing is tuned
        honed.jit.enable_jit_tuning()
        try:
            path = courtesy.open_call_clock()
            assert courtesy.open_call_clock() == path  # one per process
            with open(path, "rb") as f:  # as a worker maps it: another mapping of the file
                mapped = mmap.mmap(f.fileno(), 24, prot=mmap.PROT_READ)

            def read() -> tuple[float, ...]:
                return struct.unpack("3d", mapped[:24])

            model = Slow(0.05)
            thread = threading.Thread(target=model, args=(torch.zeros(1),))
            before = time.monotonic()
            thread.start()
            assert model.started.wait(5)
            started, ended, _ = read()
            assert started >= before and started > ended  # inside a call
            thread.join()
            started2, ended2, last = read()
            assert started2 == started and ended2 > started and last == ended2 - started
            assert last >= 0.05
            mapped.close()
        finally:
            honed.jit.disable_jit_tuning()
            honed.jit.reset()


def test_a_job_beside_a_program_on_a_gpu_carries_the_call_clock() -> None:
    from honed.pipeline.isolation import _call_clock

    assert _call_clock("cpu") == ""
    assert _call_clock("cuda:0") == courtesy.open_call_clock()


def _spaced_runs_beside_gpu_calls(worker: bool, pause_s: float, where: Any) -> list[Any]:
    """A program calls a module of about 10 ms of GPU work in a loop (``pause_s`` between
    calls); five spaced runs on this thread, as a worker told so with the program's call
    clock (``worker``) or as JIT's thread in the program's process: ``where()`` at each run's
    start."""
    device = torch.device("cuda:0")
    cycles = int(torch.cuda.get_device_properties(device).clock_rate * 1e3 * 0.01)
    model = _Timed(cycles)
    honed.jit.reset()
    stop = threading.Event()
    with honed.jit.config.patch(wait=False, min_parameters=10**9):  # nothing is tuned
        honed.jit.enable_jit_tuning()
        try:
            if worker:
                courtesy.space_runs(True, courtesy.open_call_clock())

            def program() -> None:
                x = torch.ones(4, device=device)
                while not stop.is_set():
                    model(x)
                    time.sleep(pause_s)

            thread = threading.Thread(target=program)
            thread.start()
            deadline = time.monotonic() + 10
            while len(model.spans) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)  # a few calls first: the clock knows a call's length
            places = []
            for _ in range(5):
                with courtesy.spaced_run(device):
                    places.append(where())
            stop.set()
            thread.join()
            assert len(model.spans) > 3  # the program called on beside the runs
            return places
        finally:
            stop.set()
            courtesy.space_runs(False)
            honed.jit.disable_jit_tuning()
            honed.jit.reset()


@pytest.mark.gpu
def test_beside_a_program_gpu_runs_start_halfway_through_its_calls() -> None:
    """Each spaced run of a worker (told so, with the program's call clock) starts in the
    second half of one of the program's calls."""

    def place() -> tuple[bool, float]:
        view = courtesy.CALL_CLOCK[0]
        return view[0] > view[1], (time.monotonic() - view[0]) / view[2]

    places = _spaced_runs_beside_gpu_calls(True, 0.0, place)
    assert all(inside and 0.45 <= at for inside, at in places), places


@pytest.mark.gpu
def test_in_the_programs_process_gpu_runs_start_between_its_calls() -> None:
    """Each spaced run of JIT's thread in the program's process (an install's warm-up,
    capture and check) starts outside the program's calls (which pause as a sync would)."""
    from honed.jit.patcher import STATE

    inside = _spaced_runs_beside_gpu_calls(False, 0.004, lambda: STATE.in_call != 0)
    assert not any(inside), inside


def test_a_killed_programs_call_clock_is_removed_by_the_next_one(tmp_path: Path) -> None:
    stale = tmp_path / f"honed-calls-{ended_pid()}-abc"
    live = tmp_path / f"honed-calls-{os.getpid()}-abc"
    other = tmp_path / "someone-else"
    for f in (stale, live, other):
        f.write_bytes(bytes(24))
    courtesy._remove_stale_clocks(str(tmp_path))
    assert not stale.exists() and live.exists() and other.exists()


class _Breaks(nn.Module):
    """Two graphs for Dynamo: ``.item()`` breaks the trace."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if y.sum().item() > 0:
            return y + 1
        return y - 1


def _recorded_spaced_runs(monkeypatch: pytest.MonkeyPatch, spaces: bool) -> list[Any]:
    runs: list[Any] = []

    @contextlib.contextmanager
    def recorded(device: Any) -> Iterator[None]:
        runs.append(device)
        yield

    monkeypatch.setattr(courtesy, "spaces", lambda device: spaces)
    monkeypatch.setattr(courtesy, "spaced_run", recorded)
    return runs


@pytest.mark.parametrize("spaces", [True, False])
def test_the_graph_break_checks_graph_runs_are_spaced_where_runs_are(
    monkeypatch: pytest.MonkeyPatch, spaces: bool
) -> None:
    """Where the check runs the graphs Dynamo traced (a module with breaks), each run is a
    spaced run where runs are spaced (beside a program on a GPU), on the sample's device;
    elsewhere none is. A module traced whole runs no graph at all."""
    from torch._dynamo.backends import debugging

    from honed.pipeline.graph_breaks import explain

    runs = _recorded_spaced_runs(monkeypatch, spaces)
    detail = debugging._explain_graph_detail
    assert explain(_Breaks(), ((torch.ones(3),), {})) == (1, [mock.ANY])
    assert runs == ([torch.device("cpu")] * 2 if spaces else [])
    runs.clear()
    assert explain(nn.Linear(3, 3), ((torch.ones(2, 3),), {})) == (0, [])
    assert runs == []
    assert debugging._explain_graph_detail is detail  # explain's own function again


class _Counts(nn.Module):
    """One graph; each run of it adds one to ``runs``; outputs nested and of several shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("runs", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        self.runs.add_(1)
        return {"double": x * 2, "more": (x.t().contiguous(), x.sum(), x[:, :1])}


class _NeedsRealValues(nn.Module):
    """Breaks at ``.item()``; the code after the break fails on any other value than the
    real one, as code after a break may on the empty outputs of a graph that did not run."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("runs", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs.add_(1)
        if x.sum().item() != 7:
            raise ValueError("not the sample's sum")
        return x + 1


@pytest.mark.parametrize("spaces", [True, False])
def test_the_check_runs_no_graph_of_a_module_traced_whole(
    monkeypatch: pytest.MonkeyPatch, spaces: bool
) -> None:
    """The check traces first with each graph's outputs made empty instead of computed: one
    graph and no break is the answer, and the module never ran (beside a program on a GPU a
    run of it can hold one of the program's calls up to twice its time). Breaks, or a failure of
    the code after one on those empty outputs, send it to the real runs, whose answer is
    Dynamo's own."""
    import torch._dynamo

    from honed.pipeline.graph_breaks import explain

    runs = _recorded_spaced_runs(monkeypatch, spaces)
    whole = _Counts()
    assert explain(whole, ((torch.ones(2, 3),), {})) == (0, [])
    assert int(whole.runs) == 0 and runs == []

    sample = torch.tensor([3, 4])
    needs = _NeedsRealValues()
    count, reasons = explain(needs, ((sample,), {}))
    assert int(needs.runs) == 1  # the real runs: once, after the dry pass failed
    dynamo = torch._dynamo.explain(_NeedsRealValues())(sample)
    assert count == dynamo.graph_break_count == 1
    assert len(reasons) == 1 and "item" in reasons[0]
    assert runs == ([torch.device("cpu")] * 2 if spaces else [])


def test_a_check_beside_a_program_is_sent_with_its_call_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The graph-break check's job tells the worker to space its runs, with the program's call
    clock on a GPU, only beside a program."""
    from honed.pipeline import isolation
    from honed.pipeline.pool import JobResult

    sent: list[Any] = []

    class Pool:
        def submit(self, job: Any) -> Any:
            sent.append(job.request)
            future: Any = concurrent.futures.Future()
            future.set_result(JobResult(reply={"graph_breaks": 0, "reasons": []}))
            return future

    sample = ((torch.ones(2, 3),), {})
    for beside in (False, True):
        monkeypatch.setattr(isolation, "beside_program", lambda b=beside: b)
        check = isolation.IsolatedCheck(nn.Linear(3, 3), sample, "cuda:0", lambda jobs: Pool())
        assert check.run() == (0, [])
    assert sent[0] == {"beside_program": False, "call_clock": ""}
    assert sent[1] == {"beside_program": True, "call_clock": courtesy.open_call_clock()}


def test_a_tunes_recording_asks_between_samples_whether_a_call_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Noting the samples' calls at a tune's start is Python on JIT's thread beside the
    program's calls: before each sample it gives way (asks whether one of the program's calls
    runs, and would wait for its end), as the tune's other loops do."""
    from honed.pipeline import tuner

    asked: list[int] = []

    def idle() -> bool:
        asked.append(1)
        return False  # no call runs: nothing waits, the question is what is counted

    monkeypatch.setattr(courtesy, "SLICE_S", 0.0)  # every give_way asks
    courtesy.watch(idle)
    try:
        module = honed.Module(nn.Linear(3, 3), "lin")
        tuner._record(module, [torch.ones(2, 3)] * 3, [], runs=True)
    finally:
        courtesy.watch(None)
    assert len(asked) == 3


class _Benchmarker:
    """Inductor's benchmarker as far as spaced_benchmarks sees it: what each call was given."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def benchmark_gpu(
        self,
        fn: Any,
        estimation_iters: int = 5,
        memory_warmup_iters: int = 100,
        benchmark_iters: int = 100,
        max_benchmark_duration: int = 25,
        **kwargs: Any,
    ) -> float:
        fn()
        self.calls.append(
            {"flushes": memory_warmup_iters, "max_ms": max_benchmark_duration, **kwargs}
        )
        return 1.5


@pytest.mark.parametrize("spaces", [True, False])
def test_inductors_gpu_benchmarks_in_a_build_beside_a_program_are_spaced_and_short(
    monkeypatch: pytest.MonkeyPatch, spaces: bool
) -> None:
    """A compile's kernel benchmarks run a kernel for 25 ms after 100 cache flushes, GPU time
    the program's calls get none of: beside a program on a GPU each one is a spaced run, cut to
    a few milliseconds; elsewhere it runs as Inductor asks, and afterwards as before."""
    from torch._inductor.runtime import benchmarking

    bench = _Benchmarker()
    monkeypatch.setattr(benchmarking, "benchmarker", bench)
    runs = _recorded_spaced_runs(monkeypatch, spaces)
    ran: list[int] = []
    device = torch.device("cuda:0")
    with courtesy.spaced_benchmarks(device):
        with courtesy.spaced_benchmarks(device):  # nested (a JIT backend's first run)
            assert benchmarking.benchmarker.benchmark_gpu(lambda: ran.append(1), rep=40) == 1.5
        assert (
            benchmarking.benchmarker.benchmark_gpu(
                lambda: ran.append(2), max_benchmark_duration=1, memory_warmup_iters=200
            )
            == 1.5
        )
    assert ran == [1, 2]
    if spaces:
        assert runs == [device, device]  # one spaced run each, not one per nesting
        assert bench.calls == [
            {"flushes": courtesy.BENCH_FLUSHES, "max_ms": courtesy.BENCH_MAX_MS, "rep": 40},
            {"flushes": courtesy.BENCH_FLUSHES, "max_ms": 1},  # a shorter ask stays
        ]
    else:
        assert runs == []
        assert bench.calls == [
            {"flushes": 100, "max_ms": 25, "rep": 40},
            {"flushes": 200, "max_ms": 1},
        ]
    assert "benchmark_gpu" not in vars(bench)  # the benchmarker's own method again


def test_a_candidates_build_and_first_run_benchmark_spaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A build's compile benchmarks either in build_graph (AOTInductor) or at its first call (a
    JIT backend): both run inside spaced_benchmarks, for the graph's device; the check does too
    (a JIT backend compiles again for a new shape there), the measurement never."""
    from honed.backend import Backend, GraphInfo, Sample
    from honed.pipeline import candidate

    inside = [0]
    seen: list[tuple[str, int]] = []

    @contextlib.contextmanager
    def counted(device: Any) -> Iterator[None]:
        assert device == torch.device("cpu")
        inside[0] += 1
        try:
            yield
        finally:
            inside[0] -= 1

    monkeypatch.setattr(candidate, "spaced_benchmarks", counted)

    class Compiles(Backend):
        jit = True

        def build(self, module: nn.Module, example_inputs: list[Sample]) -> Any:
            seen.append(("build", inside[0]))

            def run(x: torch.Tensor) -> Any:
                seen.append(("run", inside[0]))
                return module(x)

            return run

    model = nn.Linear(3, 3).eval()
    samples = [Sample((torch.ones(2, 3),), {}), Sample((torch.ones(4, 3),), {})]
    with torch.no_grad():
        references = [model(*s.args) for s in samples]
    outcome = candidate.evaluate(
        Compiles(), model, samples, references, GraphInfo(device=torch.device("cpu")), 1, 4
    )
    assert outcome.status == "ok", outcome.reason
    built = seen.index(("build", 1))
    assert seen[built + 1] == ("run", 1)  # the first run
    assert ("run", 0) in seen[built + 1 :]  # the measurement's calls, outside
    assert all(depth == 1 for _, depth in seen[: seen.index(("run", 0))])


@pytest.mark.gpu
def test_a_compiles_kernel_benchmarks_beside_a_program_on_the_gpu_are_spaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real Inductor compile with kernel benchmarks (max-autotune's GEMM templates) in a
    worker beside a program: every GPU benchmark runs spaced and cut, and the compiled model
    answers as eager does."""
    import functools

    from torch._inductor import config as inductor_config
    from torch._inductor.runtime import benchmarking

    device = torch.device("cuda:0")
    cls = type(benchmarking.benchmarker)
    real = cls.benchmark_gpu
    given: list[dict[str, Any]] = []
    spaced: list[Any] = []
    real_run = courtesy.spaced_run

    @functools.wraps(real)
    def recorded(self: Any, *args: Any, **kwargs: Any) -> Any:
        given.append(dict(kwargs))
        return real(self, *args, **kwargs)

    @contextlib.contextmanager
    def counted(where: Any) -> Iterator[None]:
        spaced.append(where)
        with real_run(where):
            yield

    monkeypatch.setattr(cls, "benchmark_gpu", recorded)
    monkeypatch.setattr(courtesy, "spaced_run", counted)
    a, b = torch.randn(256, 512, device=device), torch.randn(512, 384, device=device)
    courtesy.space_runs(True)
    try:
        with (
            inductor_config.patch(
                max_autotune=True,
                max_autotune_gemm_backends="TRITON",
                force_disable_caches=True,
                autotune_in_subproc=False,
            ),
            courtesy.spaced_benchmarks(device),
        ):
            out = torch.compile(lambda x, y: torch.relu(x @ y), dynamic=False)(a, b)
    finally:
        courtesy.space_runs(False)
        torch._dynamo.reset()
    torch.testing.assert_close(out, torch.relu(a @ b), rtol=1e-2, atol=1e-2)
    assert given, "the compile benchmarked nothing"
    assert spaced == [device] * len(given)
    for kwargs in given:
        assert kwargs["max_benchmark_duration"] <= courtesy.BENCH_MAX_MS
        assert kwargs["memory_warmup_iters"] <= courtesy.BENCH_FLUSHES


def test_installing_a_tuned_module_gives_way_while_detaching_its_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tuned transformer has hundreds of child modules, each detached and noted in the history
    on JIT's thread beside the program's calls: it asks before each whether a call runs."""
    from honed.jit.hierarchy import Node, State
    from honed.jit.tuner import _install

    asked: list[int] = []

    def idle() -> bool:
        asked.append(1)
        return False

    model = nn.Sequential(nn.Linear(3, 3), nn.Sequential(nn.ReLU(), nn.Linear(3, 3)))
    root = Node(model, None)
    for child in (model[0], model[1]):
        node = Node(child, root)
    for grandchild in model[1]:
        Node(grandchild, node)
    monkeypatch.setattr(courtesy, "SLICE_S", 0.0)
    courtesy.watch(idle)
    try:
        _install(root, object(), "AnyBackend", None)
    finally:
        courtesy.watch(None)
    assert root.state is State.TUNED
    assert [n.state for n in root.descendants()] == [State.DETACHED] * 4
    assert len(asked) == 4


def test_a_graph_with_symbolic_output_sizes_runs_in_the_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Empty outputs need fixed sizes: a graph traced with a dynamic axis runs for real (spaced
    where runs are), and the answer is the same."""
    import torch._dynamo

    from honed.pipeline.graph_breaks import explain

    runs = _recorded_spaced_runs(monkeypatch, True)
    x = torch.ones(4, 3)
    torch._dynamo.mark_dynamic(x, 0)
    module = _Counts()
    assert explain(module, ((x,), {})) == (0, [])
    assert int(module.runs) == 1 and runs == [torch.device("cpu")]
