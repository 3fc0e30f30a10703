"""tests/test_pool.py: the worker pool: replacement after faults, cancel, side-by-side builds, the
measurement gate, stale folders and what a tune leaves behind (SIGTERM, setsid)."""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import honed
import honed.jit
from honed.backend import Backend, Sample
from honed.pipeline import isolation
from honed.pipeline import pool as pool_module
from honed.pipeline.isolation import GraphJobs, new_pool
from honed.pipeline.pool import JobResult, WorkerPool, clean_stale_folders

from conftest import TinyMLP, batches, ended_pid

# Every test here starts worker processes: the integration tier.
pytestmark = pytest.mark.integration


def _wait_for(path: Path, within_s: float) -> bool:
    """Whether ``path`` has content within the time given (a file another process writes: it
    exists, empty, for a moment before its content is written)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _has_content(path):
            return True
        time.sleep(0.05)
    return _has_content(path)


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except FileNotFoundError:
        return False


class Good(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class ExitsZero(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        os._exit(0)


class Crashes(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        import ctypes

        ctypes.string_at(0)
        return module


class Hangs(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        time.sleep(3600)
        return module


class Rendezvous(Backend):
    """Builds only once its partner has started building too (so both build at once)."""

    def __init__(self, mine: Path, theirs: Path) -> None:
        super().__init__()
        self.mine, self.theirs = str(mine), str(theirs)

    @property
    def name(self) -> str:
        return f"Rendezvous({Path(self.mine).name})"

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Path(self.mine).write_text(str(os.getpid()))
        if not _wait_for(Path(self.theirs), 120):
            raise RuntimeError("the partner never built beside me")
        return module


class BuildsUntilSeenPaused(Backend):
    """Keeps building until another worker has seen this one stopped while it measured."""

    def __init__(self, pid_file: Path, seen: Path) -> None:
        super().__init__()
        self.pid_file, self.seen = str(pid_file), str(seen)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Path(self.pid_file).write_text(str(os.getpid()))
        if not _wait_for(Path(self.seen), 120):
            raise RuntimeError("never paused")
        return module


class LooksForAPausedBuilder(Backend):
    """Its callable notes when the builder's process is stopped (state T) during a call."""

    def __init__(self, pid_file: Path, seen: Path) -> None:
        super().__init__()
        self.pid_file, self.seen = str(pid_file), str(seen)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        _wait_for(Path(self.pid_file), 120)
        pid_file, seen = Path(self.pid_file), Path(self.seen)

        def run(*args: Any, **kwargs: Any) -> Any:
            stat = Path(f"/proc/{pid_file.read_text()}/stat").read_text()
            if stat[stat.rindex(")") + 2] == "T":
                seen.write_text("stopped while I measured")
            return module(*args, **kwargs)

        return run


@pytest.fixture
def graph() -> GraphJobs:
    return GraphJobs(graph_fields("cpu"), "cpu")


def graph_fields(device: str) -> dict[str, Any]:
    """A TinyMLP graph's job context on ``device``: module, samples, eager's outputs."""
    torch.manual_seed(0)
    module = TinyMLP().eval().to(device)
    samples = [Sample((x.to(device),), {}) for x in batches(2, 4)]
    with torch.no_grad():
        references = [module(*s.args) for s in samples]
    return dict(
        module=module,
        samples=samples,
        references=references,
        graph=honed.backend.GraphInfo(device=torch.device(device)),
        measure_at=1,
        batch_size=4,
    )


@pytest.fixture
def short_limits() -> Iterator[None]:
    with honed.config.patch(build_timeout_s=60.0, worker_memory_gb=2.0):
        yield


def _run(pool: WorkerPool, graph: GraphJobs, backend: Backend) -> JobResult:
    return graph.evaluate(pool, backend, False).result(timeout=600)


def test_a_failed_job_fails_alone_and_its_worker_is_replaced(
    graph: GraphJobs, short_limits: None
) -> None:
    with new_pool(1) as pool:
        assert pool.size == 1
        crashed = _run(pool, graph, Crashes())
        exited = _run(pool, graph, ExitsZero())
        good = _run(pool, graph, Good())
    assert crashed.failure.startswith("crashed: segmentation fault (SIGSEGV)"), crashed.failure
    assert exited.failure == ("the worker exited without a result (exit status 0) during build"), (
        exited.failure
    )
    assert good.ok and good.reply["outcome"]["status"] == "ok"
    outcome = GraphJobs.outcome(ExitsZero(), False, exited)
    assert (outcome.status, outcome.reason) == ("failed", exited.failure)


def test_a_job_told_not_to_measure_comes_back_built_and_checked_only(
    graph: GraphJobs, short_limits: None
) -> None:
    """JIT beside a calling program: at its turn to measure, the job asks ``measure_if``; no
    means the worker skips its measurement and the outcome is the checked build, deferred."""
    asked: list[str] = []
    phases: list[str] = []

    def not_now() -> bool:
        asked.append("skip")
        return False

    with new_pool(1) as pool:
        skipped = graph.evaluate(
            pool, Good(), False, on_phase=phases.append, measure_if=not_now
        ).result(timeout=600)
        measured = graph.evaluate(pool, Good(), False, measure_if=lambda: True).result(timeout=600)
    assert skipped.ok and asked == ["skip"] and phases == ["build", "check", "measure"]
    outcome = GraphJobs.outcome(Good(), False, skipped)
    assert (outcome.status, outcome.deferred, outcome.measurement) == ("ok", True, None)
    assert outcome.check is not None and outcome.check.ok and not outcome.passed
    done = GraphJobs.outcome(Good(), False, measured)
    assert done.passed and not done.deferred


def test_cancel_ends_a_running_job_and_the_pool_goes_on(
    graph: GraphJobs, short_limits: None
) -> None:
    phases: list[str] = []
    with new_pool(1) as pool:
        job = graph.evaluate(pool, Hangs(), False, on_phase=phases.append)
        queued = graph.evaluate(pool, Good(), False)
        assert pool.cancel(queued)  # not started yet: it never runs
        deadline = time.monotonic() + 300
        while "build" not in phases and time.monotonic() < deadline:
            time.sleep(0.05)  # wait for the worker to report its build (a phase, not a timing)
        assert pool.cancel(job)
        result = job.result(timeout=60)
        after = _run(pool, graph, Good())
    assert queued.cancelled()
    assert result.cancelled and result.failure == "cancelled"
    assert after.ok


def test_builds_run_side_by_side(graph: GraphJobs, short_limits: None, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with new_pool(2) as pool:
        first = graph.evaluate(pool, Rendezvous(a, b), False)
        second = graph.evaluate(pool, Rendezvous(b, a), False)
        results = [first.result(timeout=600), second.result(timeout=600)]
    assert all(r.ok and r.reply["outcome"]["status"] == "ok" for r in results), results
    assert a.read_text() != b.read_text()  # two worker processes


def test_a_job_that_prefers_a_slot_waits_for_it_while_it_is_idle_only() -> None:
    """The pool's queue: a job for slot 1 is left to slot 1 while slot 1 waits for work, and
    taken by another slot once slot 1 is busy (or gone); jobs come by priority, then order."""
    import concurrent.futures
    import threading

    from honed.pipeline.pool import Job, _JobQueue

    def item(priority: float, seq: int, prefer: int = -1) -> tuple[Any, ...]:
        job = Job("evaluate", {}, None, "cpu", {}, priority, prefer_slot=prefer)
        return (priority, seq, job, concurrent.futures.Future())

    jobs = _JobQueue()
    got: dict[int, list[int]] = {0: [], 1: []}

    def take(slot: int, count: int) -> threading.Thread:
        def run() -> None:
            for _ in range(count):
                got[slot].append(jobs.get(slot)[1])

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    # both slots wait: the job for slot 1 goes to slot 1 whichever wakes first
    for _ in range(20):
        got = {0: [], 1: []}
        zero = take(0, 1)
        one = take(1, 1)
        deadline = time.monotonic() + 30
        while jobs._waiting != {0, 1}:  # both wait (a loaded machine starts threads late)
            assert time.monotonic() < deadline
            time.sleep(0.001)
        jobs.put(item(-1.0, 1, prefer=1))
        one.join(5)
        assert got[1] == [1]
        jobs.put(item(0.0, 2))
        zero.join(5)
        assert got[0] == [2]
    # slot 1 not waiting (busy): slot 0 takes its job rather than leave it
    got = {0: [], 1: []}
    jobs.put(item(0.0, 3, prefer=1))
    zero = take(0, 1)
    zero.join(5)
    assert got[0] == [3]
    # by priority, then order; a job for a slot that does not exist goes to anyone
    for entry in [item(2.0, 4), item(1.0, 6, prefer=7), item(1.0, 5)]:
        jobs.put(entry)
    zero = take(0, 3)
    zero.join(5)
    assert got[0] == [3, 5, 6, 4]
    with pytest.raises(queue.Empty):
        jobs.get_nowait()


def test_the_finalists_are_remeasured_by_the_worker_that_built_most_of_them(
    graph: GraphJobs, short_limits: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two candidates built side by side, one per worker: their interleaved re-measure runs on
    the worker that built the first finalist listed (the one that built most of them, ties to
    the first), which loads what it built itself, with both workers idle."""
    a, b = tmp_path / "a", tmp_path / "b"
    with new_pool(2) as pool:
        first = graph.evaluate(pool, Rendezvous(a, b), False)
        second = graph.evaluate(pool, Rendezvous(b, a), False)
        results = [first.result(timeout=600), second.result(timeout=600)]
        assert {r.slot for r in results} == {0, 1}, results
        outcomes = [
            GraphJobs.outcome(backend, False, result)
            for backend, result in zip([Rendezvous(a, b), Rendezvous(b, a)], results, strict=True)
        ]
        assert [o.slot for o in outcomes] == [r.slot for r in results]
        submitted: list[tuple[Any, Any]] = []
        plain = pool.submit

        def watched(job: Any) -> Any:
            future = plain(job)
            submitted.append((job, future))
            return future

        monkeypatch.setattr(pool, "submit", watched)
        for order in [outcomes, outcomes[::-1]] * 3:  # either worker may be the first to wait
            graph.interleave(pool, list(order))
            job, future = submitted[-1]
            assert job.kind == "interleave" and job.prefer_slot == order[0].slot
            assert future.result(timeout=600).slot == order[0].slot
        assert all(o.measurement is not None for o in outcomes)


class Package(Good):
    build_cost = 3


class Compiles(Good):
    """Loads again by tracing and compiling from Inductor's cache, as Inductor's JIT does."""

    jit = True


class LongCompile(Compiles):
    build_cost = 3


def test_the_finalists_go_to_the_worker_whose_builds_cost_the_most_to_load_again() -> None:
    from honed.pipeline.candidate import Outcome

    def built(backend: Backend, slot: int, baseline: bool = False) -> Outcome:
        outcome = Outcome(backend, baseline)
        outcome.slot = slot
        return outcome

    pick = isolation._loads_best_on
    eager = honed.backend.TorchEagerBackend()
    assert pick([built(eager, 0, True), built(Good(), 1)]) == 1  # eager loads nothing
    # a JIT compile outweighs any number of packages: its load traces again elsewhere
    assert pick([built(Package(), 1), built(Package(), 1), built(Compiles(), 0)]) == 0
    assert pick([built(Compiles(), 1), built(LongCompile(), 0)]) == 0  # by build cost
    assert pick([built(Good(), 0), built(Good(), 1), built(Good(), 1)]) == 1  # then by count
    assert pick([built(Good(), 0), built(Good(), 1)]) == 0  # ties: the first listed
    assert pick([built(Good(), -1), built(eager, 1, True)]) == -1  # none built in this pool
    assert pick([]) == -1


def test_on_a_cpu_a_measurement_pauses_the_builds(
    graph: GraphJobs, short_limits: None, tmp_path: Path
) -> None:
    pid_file, seen = tmp_path / "builder.pid", tmp_path / "seen"
    with new_pool(2) as pool:
        builder = graph.evaluate(pool, BuildsUntilSeenPaused(pid_file, seen), False)
        measurer = graph.evaluate(pool, LooksForAPausedBuilder(pid_file, seen), False)
        results = [builder.result(timeout=600), measurer.result(timeout=600)]
    assert seen.read_text() == "stopped while I measured"
    assert [r.reply["outcome"]["status"] for r in results] == ["ok", "ok"], results


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def _until(predicate: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_the_programs_slow_call_stops_a_building_worker_for_a_moment(
    graph: GraphJobs, short_limits: None, tmp_path: Path
) -> None:
    from honed.jit.pacing import HOLD_S, Pacer

    pid_file, done = tmp_path / "builder.pid", tmp_path / "done"
    pacer = Pacer(1.5)
    for _ in range(12):
        pacer.observe(7, 0.01)  # the program's pace before any worker ran
    with new_pool(1) as pool:
        job = graph.evaluate(pool, BuildsUntilSeenPaused(pid_file, done), False)
        assert _wait_for(pid_file, 300)
        pid = int(pid_file.read_text())
        pacer.watch(pool)
        assert _until(lambda: pacer.engaged, 5)
        assert _state(pid) != "T"
        pacer.observe(7, 0.03)  # a call at 3x beside the build
        assert _until(lambda: _state(pid) == "T", 2)  # stopped, by the pacer's thread
        assert _until(lambda: _state(pid) != "T", HOLD_S + 2)  # and running again
        done.write_text("done")
        result = job.result(timeout=120)
        said = pacer.unwatch(pool)
    assert result.ok and result.reply["outcome"]["status"] == "ok", result
    assert 0 < result.paused_build_s < HOLD_S + 1  # not counted as build time
    assert said.startswith("the workers stood still 1 time(s)")


class FakeSlot:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


@pytest.mark.parametrize(("device", "paused"), [("cpu", True), ("cuda:0", False)])
def test_gate_pauses_builders_only_on_a_cpu(device: str, paused: bool) -> None:
    g = pool_module._Gate(pause_builders=not device.startswith("cuda"))
    builder, measurer = FakeSlot(), FakeSlot()
    g.enter_build(builder)  # type: ignore[arg-type]
    g.enter_measure(measurer)  # type: ignore[arg-type]
    g.leave_measure(measurer)  # type: ignore[arg-type]
    assert builder.calls == (["pause", "resume"] if paused else [])
    assert measurer.calls == []


def test_stale_worker_folders_of_ended_processes_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f"honed-worker-{ended_pid()}-0-abc"
    live = tmp_path / f"honed-worker-{os.getpid()}-0-def"
    other = tmp_path / "honed-worker-notapid"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "job.pkl").write_bytes(b"x")
    assert clean_stale_folders(tmp_path) == [stale]
    assert not stale.exists() and live.exists() and other.exists()


class LeavesADaemon(Backend):
    """Starts a process in a session of its own (setsid) and leaves it running."""

    def __init__(self, pid_file: Path) -> None:
        super().__init__()
        self.pid_file = str(pid_file)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        Path(self.pid_file).write_text(str(proc.pid))
        return module


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def test_a_backend_that_calls_setsid_leaves_no_process_after_a_tune(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    model = honed.Module(TinyMLP().eval(), "m")
    with honed.config.patch(isolation="process"):
        honed.tune(model, batches(2), strategy=honed.OneBackendStrategy(LeavesADaemon(pid_file)))
    assert _gone(int(pid_file.read_text())), "the setsid process outlived the tune"


TERM_SCRIPT = """
import os, sys, time, torch, honed
from pathlib import Path
from honed.backend import Backend

PID_FILE = sys.argv[2]  # travels with the class to the worker

class Hang(Backend):
    def build(self, module, example_inputs):
        Path(PID_FILE).write_text(str(os.getpid()))
        time.sleep(3600)

model = honed.Module(torch.nn.Linear(4, 4).eval(), "m")
with honed.config.patch(cache_enabled=False):
    honed.tune(model, [torch.randn(2, 4)], strategy=honed.OneBackendStrategy(Hang()))
honed.save(model, sys.argv[1])
"""


def test_sigterm_ends_the_tune_like_ctrl_c_leaving_nothing_behind(tmp_path: Path) -> None:
    script, worker_pid = tmp_path / "term.py", tmp_path / "worker.pid"
    script.write_text(TERM_SCRIPT)
    env = dict(os.environ, TMPDIR=str(tmp_path), TORCHINDUCTOR_CACHE_DIR=tempfile.mkdtemp())
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "never.honed"), str(worker_pid)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert _wait_for(worker_pid, 300), "no worker reached its build"
    os.kill(proc.pid, signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, stderr[-2000:]
    assert _gone(int(worker_pid.read_text())), "a worker outlived the tune"
    left = sorted(p.name for p in tmp_path.iterdir())
    assert not [n for n in left if n.startswith("honed-worker-") or "never.honed" in n], left


SAVE_SCRIPT = """
import sys, torch, honed
from honed.backend import Backend

class Plain(Backend):
    def build(self, module, example_inputs):
        return module

model = honed.Module(torch.nn.Linear(16384, 8192).eval(), "m")  # 512 MB of weights to write
with honed.config.patch(cache_enabled=False, isolation="none"):
    honed.tune(model, [torch.randn(2, 16384)], strategy=honed.OneBackendStrategy(Plain()))
honed.save(model, sys.argv[1])
"""


def test_sigterm_during_a_save_leaves_no_partial_file(tmp_path: Path) -> None:
    script, out = tmp_path / "save.py", tmp_path / "out"
    script.write_text(SAVE_SCRIPT)
    out.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(out / "model.honed")])
    partial: list[Path] = []
    deadline = time.monotonic() + 600
    while not partial and proc.poll() is None and time.monotonic() < deadline:
        partial = list(out.glob(".model.honed.*.tmp"))  # the save's hidden file, being written
        time.sleep(0.002)
    if not partial:
        proc.wait(timeout=60)
        pytest.skip("the save ended before its partial file could be seen")
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=300)
    assert proc.returncode == -signal.SIGTERM
    left = [p.name for p in out.iterdir()]
    assert not [n for n in left if n.endswith(".tmp")], left  # no hidden .model.honed.*.tmp


def test_pool_closes_its_workers_and_folders(graph: GraphJobs, short_limits: None) -> None:
    with new_pool(1) as pool:
        assert _run(pool, graph, Good()).ok
        slot = pool.slots[0]
        worker_pid, folder = slot.worker.pid, slot.folder
        assert folder is not None and folder.name.startswith(f"honed-worker-{os.getpid()}-")
    assert _gone(worker_pid)
    assert not folder.exists()


@pytest.mark.parametrize("stagger", [True, False])
def test_a_staggered_pool_starts_each_worker_once_the_one_before_is_ready(
    monkeypatch: pytest.MonkeyPatch, graph: GraphJobs, short_limits: None, stagger: bool
) -> None:
    """JIT's pool (stagger) starts its workers one after another, each once the one before it
    said it was ready; a tune's pool starts them all at once. Jobs run on either."""
    starts: dict[int, float] = {}
    readies: dict[int, float] = {}
    real_start, real_ready = pool_module._Slot._start, pool_module._Slot._wait_ready

    def start(slot: Any) -> None:
        starts.setdefault(slot.index, time.monotonic())
        real_start(slot)

    def ready(slot: Any) -> str:
        why = real_ready(slot)
        if not why:
            readies.setdefault(slot.index, time.monotonic())
        return why

    monkeypatch.setattr(pool_module._Slot, "_start", start)
    monkeypatch.setattr(pool_module._Slot, "_wait_ready", ready)
    with honed.config.patch(workers=3), new_pool(3, stagger=stagger) as pool:
        assert pool.size == 3
        assert all(slot.up.wait(120) for slot in pool.slots)
        assert _run(pool, graph, Good()).ok
        if stagger:  # every worker started and ready before any job came
            assert sorted(readies) == [0, 1, 2]
            assert starts[1] >= readies[0] and starts[2] >= readies[1]
        else:  # all started at once; each says it is ready only when a job needs it
            assert sorted(starts) == [0, 1, 2]
            assert max(starts.values()) < min(readies.values())


class Spreads(Rendezvous):
    """A cheap build (so it may run on any GPU of the host) that notes where it ran."""

    build_cost = 1

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        device = next(module.parameters()).device
        assert example_inputs[0].args[0].device == device  # the whole graph moved there
        super().build(module, example_inputs)
        return module


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_measure_side_by_side_and_finalists_meet_on_the_target(tmp_path: Path) -> None:
    graph = GraphJobs(graph_fields("cuda:0"), "cuda:0")
    a, b = tmp_path / "a", tmp_path / "b"
    with new_pool(2, gpus=["cuda:0", "cuda:1"]) as pool:
        jobs = [
            graph.evaluate(pool, Spreads(a, b), False),
            graph.evaluate(pool, Spreads(b, a), False),
        ]
        results = [j.result(timeout=600) for j in jobs]
        outcomes = [GraphJobs.outcome(Spreads(a, b), False, r) for r in results]
        assert all(o.status == "ok" for o in outcomes), [o.reason for o in outcomes]
        assert sorted(r.device for r in results) == ["cuda:0", "cuda:1"]
        phases: list[str] = []
        graph.interleave(pool, outcomes, on_phase=phases.append)
    assert phases == ["load 0", "load 1", "measure"]
    assert all(o.measurement is not None and o.status == "ok" for o in outcomes)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_tune_on_a_host_with_two_gpus_selects_on_the_target() -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().cuda().eval(), "two-gpus")
    strategy = honed.MaxThroughputStrategy(
        [honed.backend.CudaGraphsBackend(), honed.backend.TorchInductorBackend()]
    )
    data = [x.cuda() for x in batches(2, 4)]
    report = honed.tune(model, data, strategy=strategy, isolation="process")
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert all(c.status == "ok" for c in rows.values()), rows
    # All three are finalists, re-measured side by side on the target: their figures say so.
    assert {c.measured_on for c in rows.values()} == {"cuda:0"}, rows
    x = batches(3, seed=1)[0].cuda()
    torch.testing.assert_close(model(x), model.module(x))


class NeedsAWorker(Backend):
    """Builds only where honed's AOTInductor loader knows it runs in a tune's worker (whose
    loads then need no probe process: a crash there fails only the job)."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        from honed.backend import _aoti_env

        if not _aoti_env.IN_WORKER:
            raise RuntimeError("not marked as a worker")
        return module


def test_workers_mark_themselves_so_aotinductor_loads_skip_the_probe() -> None:
    from honed.backend import _aoti_env

    model = honed.Module(TinyMLP().eval(), "m")
    report = honed.tune(
        model, batches(2), strategy=honed.OneBackendStrategy(NeedsAWorker()), isolation="process"
    )
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["NeedsAWorker"].status == "ok", rows["NeedsAWorker"].reason
    assert not _aoti_env.IN_WORKER  # the caller probes before its own first load


_HEAVY = ("torch._dynamo", "torch._inductor.compile_fx")


class SaysWhatItsWorkerImported(Backend):
    """Builds eager, after writing down which of the heavy modules its worker has imported."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = str(path)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Path(self.path).write_text(json.dumps({name: name in sys.modules for name in _HEAVY}))
        return module


class NeedsInductor(SaysWhatItsWorkerImported):
    imports = ("torch._inductor.compile_fx",)


def test_a_worker_imports_inductor_only_for_a_candidate_that_needs_it(
    graph: GraphJobs, tmp_path: Path
) -> None:
    """Importing Inductor is seconds of a core: a worker whose candidates need none never pays
    it, and one that needs it has it before its build starts (its build time is the build's)."""
    plain, needs, after = (tmp_path / f"{name}.json" for name in ("plain", "needs", "after"))
    with new_pool(1) as pool:
        for backend in (SaysWhatItsWorkerImported(plain), NeedsInductor(needs)):
            result = _run(pool, graph, backend)
            assert result.ok and result.reply["outcome"]["status"] == "ok", result.failure
        assert _run(pool, graph, SaysWhatItsWorkerImported(after)).ok  # the same worker
    assert json.loads(plain.read_text()) == dict.fromkeys(_HEAVY, False)
    assert json.loads(needs.read_text()) == dict.fromkeys(_HEAVY, True)
    assert json.loads(after.read_text()) == dict.fromkeys(_HEAVY, True)


def test_a_pool_told_to_preload_has_its_workers_import_before_they_are_ready(
    graph: GraphJobs, tmp_path: Path
) -> None:
    seen = tmp_path / "seen.json"
    with new_pool(1, preload=("torch._inductor.compile_fx",)) as pool:
        assert _run(pool, graph, SaysWhatItsWorkerImported(seen)).ok
    assert json.loads(seen.read_text()) == dict.fromkeys(_HEAVY, True)


def test_jits_workers_preload_dynamo_and_what_its_candidates_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JIT starts its workers while the program records, so they import then what the
    graph-break check (Dynamo) and the candidates' builds will need."""
    from honed.jit import tuner as jit_tuner

    asked: dict[str, Any] = {}

    class NoPool:
        def close(self, cancel: bool = False) -> None:
            pass

    def recording_new_pool(jobs: int, *args: Any, **kwargs: Any) -> NoPool:
        asked.update(kwargs, jobs=jobs)
        return NoPool()

    monkeypatch.setattr(isolation, "new_pool", recording_new_pool)
    with honed.jit.config.patch(backends=[honed.backend.TorchInductorBackend()]):
        workers = jit_tuner._Workers("cpu")
        workers(1)
        workers.close()
    assert asked["preload"] == ("torch._dynamo", "torch._inductor.compile_fx")
    assert asked["jobs"] == 2  # the candidate and eager


class RecordsNiceness(Backend):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = str(path)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Path(self.path).write_text(str(os.getpriority(os.PRIO_PROCESS, 0)))
        return module


def test_workers_start_at_the_niceness_asked_for(tmp_path: Path) -> None:
    """JIT's workers run below the program (HONED_JIT_WORKER_NICE) so its calls go first."""
    seen, nice = tmp_path / "nice", 7
    model = honed.Module(TinyMLP().eval(), "m")
    with honed.config.patch(worker_nice=nice):
        honed.tune(
            model,
            batches(2),
            strategy=honed.OneBackendStrategy(RecordsNiceness(seen)),
            isolation="process",
        )
    assert int(seen.read_text()) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice)


class RecordsCores(Backend):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = str(path)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        threads = os.environ["TORCHINDUCTOR_COMPILE_THREADS"]
        Path(self.path).write_text(f"{sorted(os.sched_getaffinity(0))} {threads}")
        return module


def test_a_cuda_models_jit_workers_leave_the_program_cores(
    graph: GraphJobs, tmp_path: Path
) -> None:
    """A CUDA model's JIT workers run off the cores left to the program's launching thread,
    and Inductor's compile threads fit the cores they have; a CPU model's keep every core."""
    seen = tmp_path / "cores"
    allowed = sorted(os.sched_getaffinity(0))
    with honed.config.patch(worker_spare_cores=0.25):
        cpus = isolation.worker_cpus()
        if cpus is None:
            pytest.skip("one physical core: nothing to leave")
        assert cpus and set(cpus) < set(allowed)
        with new_pool(1, device="cuda:0") as pool:
            assert _run(pool, graph, RecordsCores(seen)).ok
        assert seen.read_text() == f"{cpus} {len(cpus)}"
        with new_pool(1, device="cpu") as pool:
            assert _run(pool, graph, RecordsCores(seen)).ok
        assert seen.read_text() == f"{allowed} {len(allowed)}"


def test_the_users_inductor_compile_threads_reach_the_workers(
    graph: GraphJobs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Inductor's own TORCHINDUCTOR_COMPILE_THREADS, where the user set it, is what the workers
    compile with (fewer compilers beside a program); a value Inductor cannot take is named in
    one warning and the workers share the cores as without it."""
    seen = tmp_path / "cores"
    allowed = sorted(os.sched_getaffinity(0))
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")
    with new_pool(2, device="cpu") as pool:
        assert _run(pool, graph, RecordsCores(seen)).ok
    assert seen.read_text() == f"{allowed} 3"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "many")
    monkeypatch.setattr(isolation, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="honed"), new_pool(2, device="cpu") as pool:
        assert _run(pool, graph, RecordsCores(seen)).ok
    shared = max(1, len(allowed) // pool.size)
    assert seen.read_text() == f"{allowed} {shared}"
    (warning,) = [r.getMessage() for r in caplog.records if "COMPILE_THREADS" in r.getMessage()]
    assert "'many' is not a whole number from 1" in warning and "unset it" in warning


def test_workers_compile_with_the_threads_honed_sets_unless_the_user_set_inductors(
    graph: GraphJobs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HONED_WORKER_COMPILE_THREADS (what JIT sets for its own workers) gives each worker's
    compile that many threads instead of a share of the cores; Inductor's own
    TORCHINDUCTOR_COMPILE_THREADS, where the user set it, still decides."""
    seen = tmp_path / "cores"
    allowed = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    with honed.config.patch(worker_compile_threads=5), new_pool(1, device="cpu") as pool:
        assert _run(pool, graph, RecordsCores(seen)).ok
    assert seen.read_text() == f"{allowed} 5"
    monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", "3")
    with honed.config.patch(worker_compile_threads=5), new_pool(1, device="cpu") as pool:
        assert _run(pool, graph, RecordsCores(seen)).ok
    assert seen.read_text() == f"{allowed} 3"


def test_the_cores_left_to_the_program_are_whole_physical_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 8 physical cores, each with two hyperthreads: CPU c and c + 8
    isolation._cores.cache_clear()  # the topology is read once per set of CPUs
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(isolation, "_physical_core", lambda cpu: (0, cpu % 8))
    with honed.config.patch(worker_spare_cores=0.25):
        assert isolation.worker_cpus() == [*range(2, 8), *range(10, 16)]
    with honed.config.patch(worker_spare_cores=1.0):  # never all: one core stays the workers'
        assert isolation.worker_cpus() == [7, 15]
    with honed.config.patch(worker_spare_cores=0.0):
        assert isolation.worker_cpus() is None
    read: list[int] = []
    monkeypatch.setattr(isolation, "_physical_core", lambda cpu: read.append(cpu) or (0, 0))
    with honed.config.patch(worker_spare_cores=1.0):  # read once: no sysfs again
        assert isolation.worker_cpus() == [7, 15] and read == []
    isolation._cores.cache_clear()
    with honed.config.patch(worker_spare_cores=0.25):  # one core
        assert isolation.worker_cpus() is None
        assert isolation.worker_cpus() is None
    assert read == list(range(16))
    isolation._cores.cache_clear()


class CheapBuild(Backend):
    """A build that costs something (so its callable is shipped pickled) yet spreads."""

    build_cost = 1

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


@pytest.mark.parametrize("elsewhere", [False, True])
def test_a_build_measured_on_another_gpu_ships_no_callable_bound_to_it(elsewhere: bool) -> None:
    # On a host with several GPUs a spread job's callable holds that GPU's tensors; the finalists'
    # re-measure and the install on the target must build it there instead of unpickling it.
    from honed.pipeline.shipping import evaluate_for_caller

    ctx = graph_fields("cpu")
    with honed.config.patch(injected_latencies={"CheapBuild": [1.0]}):
        reply = evaluate_for_caller(ctx, {"backend": CheapBuild()}, lambda phase: None, elsewhere)
    assert reply["outcome"]["status"] == "ok"
    assert ("pickled" in reply) is not elsewhere


def test_a_worker_placing_its_graph_on_another_device_leaves_the_original_where_it_was() -> None:
    # A worker that measured on another GPU keeps serving jobs on the tune's device (payload
    # builds, the finalists' re-measure); its module must still be there, beside its samples.
    # "meta" stands in for the other GPU on a machine without two.
    from honed.pipeline._worker import _Server

    server = _Server(channel=None)  # type: ignore[arg-type]
    server.context = graph_fields("cpu")
    module, samples = server.context["module"], server.context["samples"]
    moved = server.context_on("meta")
    assert {p.device.type for p in moved["module"].parameters()} == {"meta"}
    assert moved["samples"][0].args[0].device.type == "meta"
    assert {p.device.type for p in module.parameters()} == {"cpu"}
    assert server.context_on("cpu")["module"] is module
    x = samples[0].args[0]
    torch.testing.assert_close(module(x), server.context["module"](x))


def test_large_bytes_of_a_request_travel_out_of_the_pickles_stream() -> None:
    """A finalist's payload (hundreds of MB for a CPU model) is not copied into the pickle: the
    pool's send joins it to the message without the GIL; the worker gets bytes back."""
    import pickle

    big = os.urandom(2 << 20)
    request = {"finalists": [{"files": {"model.onnx": big, "small": b"x"}}], "n": (1, 2)}
    frames = pool_module.request_frames(request)
    assert len(frames) == 2 and bytes(frames[1]) == big
    assert len(frames[0]) < 4096
    back = pickle.loads(frames[0], buffers=frames[1:])
    assert back == request and type(back["finalists"][0]["files"]["model.onnx"]) is bytes
