"""tests/test_jit_cores.py: while JIT works beside the program, the program leaves it a core.

The program's outermost module calls run with one OpenMP thread fewer while JIT has work (when
the program uses one per core), and the first call after JIT is idle gives it back. The count is
the calling thread's own: another thread (JIT's, which may compile a winner and must compile it
for every core) keeps its count."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import torch

import honed
import honed.jit
from honed.jit import background, cores
from honed.pipeline import openmp

from conftest import TinyMLP, batches


@pytest.fixture(autouse=True)
def jit_that_tunes_nothing(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[bool]]:
    """JIT on, every module too small to tune; JIT's busy flag and the core count are the
    test's (two cores, the program on two threads)."""
    threads = torch.get_num_threads()
    honed.jit.reset()
    honed.jit.config.reset()
    busy = [False]
    monkeypatch.setattr(background, "busy", lambda: busy[0])
    monkeypatch.setattr(cores, "cpu_cores", lambda: 2)
    monkeypatch.setattr(cores, "_SAID", [False])
    cores.restore()  # nothing an earlier test of this process took is left taken
    if openmp.runtime() is None:
        pytest.skip("torch's intra-op threads are not OpenMP's here")
    torch.set_num_threads(2)
    with honed.jit.config.patch(min_parameters=10**9):
        honed.jit.enable_jit_tuning()
        try:
            yield busy
        finally:
            honed.jit.reset()
            torch.set_num_threads(threads)


def call(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(batches(1, 4)[0])


def test_a_core_is_left_to_jit_while_it_works_and_given_back_after(
    jit_that_tunes_nothing: list[bool],
) -> None:
    busy = jit_that_tunes_nothing
    model = TinyMLP().eval()
    expected = model.forward(batches(1, 4)[0])
    call(model)
    assert torch.get_num_threads() == 2  # JIT idle: nothing taken
    busy[0] = True
    torch.testing.assert_close(call(model), expected)
    assert torch.get_num_threads() == 1
    assert any("the program's calls run 1 of 2 threads" in s for s in honed.jit.history())
    call(model)
    assert torch.get_num_threads() == 1
    elsewhere: list[int] = []
    other = threading.Thread(target=lambda: elsewhere.append(torch.get_num_threads()))
    other.start()
    other.join()
    assert elsewhere == [2]  # another thread (JIT's) keeps every core
    busy[0] = False
    torch.testing.assert_close(call(model), expected)
    assert torch.get_num_threads() == 2


def test_calls_that_measure_candidates_run_with_every_thread(
    jit_that_tunes_nothing: list[bool],
) -> None:
    """A live trial's calls run as the installed variant will: on every thread (with a core
    taken, torch's variants would be judged on one thread fewer than ONNX Runtime's pool)."""
    from honed.jit.patcher import STATE

    busy = jit_that_tunes_nothing
    model = TinyMLP().eval()
    call(model)
    busy[0] = True
    call(model)
    assert torch.get_num_threads() == 1
    node = STATE.nodes[model]
    node.trial = object()  # a tune measuring its candidates on this module's calls
    try:
        call(model)
        assert torch.get_num_threads() == 2
    finally:
        node.trial = None
    call(model)
    assert torch.get_num_threads() == 1  # JIT still works: the core is taken again


def test_turning_jit_off_gives_the_core_back(jit_that_tunes_nothing: list[bool]) -> None:
    jit_that_tunes_nothing[0] = True
    call(TinyMLP().eval())
    assert torch.get_num_threads() == 1
    honed.jit.disable_jit_tuning()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("why", ["the program chose fewer threads", "HONED_JIT_SHARE_CORES=0"])
def test_threads_are_left_alone(
    jit_that_tunes_nothing: list[bool], why: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    jit_that_tunes_nothing[0] = True
    if why == "the program chose fewer threads":
        monkeypatch.setattr(cores, "cpu_cores", lambda: 4)  # two threads on four cores
        call(TinyMLP().eval())
        assert torch.get_num_threads() == 2
        jit_that_tunes_nothing[0] = False
        call(TinyMLP().eval())
        assert torch.get_num_threads() == 2
    else:
        with honed.config.patch(jit_share_cores=False):
            call(TinyMLP().eval())
        assert torch.get_num_threads() == 2


def test_each_of_the_programs_threads_takes_and_gives_back_its_own(
    jit_that_tunes_nothing: list[bool],
) -> None:
    # A thread that took a core and ended must not keep another thread from taking one.
    busy = jit_that_tunes_nothing
    busy[0] = True
    model = TinyMLP().eval()
    seen: list[int] = []

    def in_a_thread() -> None:
        torch.set_num_threads(2)
        call(model)
        seen.append(torch.get_num_threads())

    other = threading.Thread(target=in_a_thread)
    other.start()
    other.join()
    call(model)
    assert seen == [1] and torch.get_num_threads() == 1
    busy[0] = False
    call(model)
    assert torch.get_num_threads() == 2


def _own_cpus_or_skip() -> set[int]:
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("this platform sets no thread's CPUs")
    mine = set(os.sched_getaffinity(0))
    if len(mine) < 2:
        pytest.skip("one CPU: nothing to keep the program's thread off")
    return mine


def test_while_jit_works_the_calling_thread_stays_off_the_cpus_of_placed_workers(
    jit_that_tunes_nothing: list[bool],
) -> None:
    """A CUDA model's JIT workers run on CPUs of their own; the program's calling thread runs on
    the others while JIT works, measuring calls too, and on all of its own once JIT is idle or
    no pool keeps its workers apart. Another thread (JIT's) keeps its CPUs."""
    from honed.jit.patcher import STATE
    from honed.pipeline.pool import WorkerPool

    busy = jit_that_tunes_nothing
    mine = _own_cpus_or_skip()
    workers = [max(mine)]
    model = TinyMLP().eval()
    expected = model.forward(batches(1, 4)[0])
    elsewhere: list[set[int]] = []
    go = threading.Event()

    def jits_thread() -> None:
        go.wait(30)
        elsewhere.append(set(os.sched_getaffinity(0)))

    other = threading.Thread(target=jits_thread)
    other.start()  # before the program's thread is moved: a thread inherits its maker's CPUs
    pool = WorkerPool(1, lazy=True, cpus=workers)
    try:
        call(model)
        assert set(os.sched_getaffinity(0)) == mine  # JIT idle: where it was
        busy[0] = True
        torch.testing.assert_close(call(model), expected)
        assert set(os.sched_getaffinity(0)) == mine - set(workers)
        go.set()
        other.join()
        assert elsewhere == [mine]
        # A thread the program's thread starts meanwhile (an OpenMP team, say) inherits the
        # narrower set, and gets its CPUs back with it.
        started, release = threading.Event(), threading.Event()
        tid: list[int] = []

        def started_meanwhile() -> None:
            tid.append(threading.get_native_id())
            started.set()
            release.wait(30)

        late = threading.Thread(target=started_meanwhile)
        late.start()
        assert started.wait(30)
        assert set(os.sched_getaffinity(tid[0])) == mine - set(workers)
        node = STATE.nodes[model]
        node.trial = object()  # a tune measuring its candidates on this module's calls
        try:
            call(model)
            assert set(os.sched_getaffinity(0)) == mine - set(workers)
        finally:
            node.trial = None
        busy[0] = False
        call(model)
        assert set(os.sched_getaffinity(0)) == mine
        assert set(os.sched_getaffinity(tid[0])) == mine
        release.set()
        late.join()
        busy[0] = True
        call(model)
        assert set(os.sched_getaffinity(0)) == mine - set(workers)
    finally:
        go.set()
        pool.close()
    call(model)  # JIT still works, but no pool keeps its workers apart now
    assert set(os.sched_getaffinity(0)) == mine


@pytest.mark.parametrize("why", ["HONED_JIT_KEEP_OFF_WORKERS=0", "JIT turned off"])
def test_the_calling_threads_cpus_are_left_or_given_back(
    jit_that_tunes_nothing: list[bool], why: str
) -> None:
    from honed.pipeline.pool import WorkerPool

    """Turned off on one thread, JIT gives every thread it kept off the workers' CPUs its CPUs
    back, another thread of the program's too (it may never call a module again)."""
    jit_that_tunes_nothing[0] = True
    mine = _own_cpus_or_skip()
    model = TinyMLP().eval()
    with WorkerPool(1, lazy=True, cpus=[min(mine)]):
        if why == "JIT turned off":
            called, release = threading.Event(), threading.Event()
            tid: list[int] = []

            def another_callers() -> None:
                tid.append(threading.get_native_id())
                call(model)
                called.set()
                release.wait(30)

            other = threading.Thread(target=another_callers)
            other.start()
            try:
                assert called.wait(30)
                call(model)
                assert set(os.sched_getaffinity(0)) == mine - {min(mine)}
                assert set(os.sched_getaffinity(tid[0])) == mine - {min(mine)}
                honed.jit.disable_jit_tuning()
                assert set(os.sched_getaffinity(tid[0])) == mine
            finally:
                release.set()
                other.join()
        else:
            with honed.config.patch(jit_keep_off_workers=False):
                call(model)
        assert set(os.sched_getaffinity(0)) == mine


def _threads() -> set[int]:
    """This process's threads now (an OpenMP team's workers included), by native id."""
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _parallel_op() -> None:
    torch.ones(1 << 20).exp_()  # far above torch's grain: runs on the calling thread's team


def _pause_or_skip() -> None:
    if getattr(openmp.runtime(), "omp_pause_resource_all", None) is None:
        pytest.skip("this OpenMP runtime has no omp_pause_resource_all (OpenMP 5.0)")


def _team_of_a_waiting_thread(then: Callable[[], set[int]]) -> tuple[set[int], set[int]]:
    """The threads a helper thread's parallel op started (its team's workers), and those of
    them still alive while the helper waits after ``then`` ran on it (``then`` returns the
    threads it saw). Threads of earlier tests may end meanwhile: only the team's are judged."""
    _pause_or_skip()
    torch.set_num_threads(2)
    before = _threads()
    seen: list[set[int]] = []
    helper_id: list[int] = []
    ran, go, done = threading.Event(), threading.Event(), threading.Event()

    def helper() -> None:
        helper_id.append(threading.get_native_id())
        _parallel_op()
        ran.set()
        go.wait()
        seen.append(then())
        done.wait()

    t = threading.Thread(target=helper)
    t.start()
    try:
        assert ran.wait(30)
        team = _threads() - before - set(helper_id)
        go.set()
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        done.set()
        t.join()
    return team, team & seen[0]


def test_a_jit_thread_that_waits_ends_its_openmp_team(jit_that_tunes_nothing: list[bool]) -> None:
    """libgomp stops spin-waiting once the process has more OpenMP threads than cores, so a
    team kept by a waiting JIT thread slows every parallel op of the program's calls."""

    def release() -> set[int]:
        openmp.release_team()
        return _threads()

    team, left = _team_of_a_waiting_thread(release)
    assert team  # the helper's op ran on a team of its own
    assert not left  # its workers ended
    # the team comes back on the thread's next parallel op, and the op is right
    x = torch.ones(1 << 20)
    openmp.release_team()
    torch.testing.assert_close(x.exp(), torch.full_like(x, torch.e))


def test_measuring_on_the_programs_calls_waits_without_an_openmp_team(
    jit_that_tunes_nothing: list[bool],
) -> None:
    from honed.backend import Sample
    from honed.jit import live

    model = TinyMLP().eval()

    class Node:
        module = model
        call_count = 0
        trial = None

    seen: list[set[int]] = []

    def stopped() -> bool:  # asked while the measure waits for the program's calls
        seen.append(_threads())
        return True

    def measure() -> set[int]:
        calls = live.ProgramCalls(Node(), "cpu", lambda s: False, stopped)
        sample = Sample((batches(1, 4)[0],), {})
        assert calls.measure([("TorchEagerBackend", None)], sample) is None  # it stopped
        return seen[0]

    team, left = _team_of_a_waiting_thread(measure)
    assert team
    assert not left
