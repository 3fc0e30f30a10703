"""tests/test_jit_background.py: JIT beside the program: calls never wait, winners swap in later.

The candidate backend here (Gated) runs the module as it is, counts its builds, loads and calls,
and blocks its build until the test opens its gate: a tune held on the gate shows, by structure
and never by timing, what the program's calls do while JIT tunes.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import honed
import honed.jit
from honed.backend.base import Backend, GraphInfo, Sample
from honed.jit import State
from honed.module import MISS

from conftest import TinyMLP, batches

# Seconds a gated build waits at most: only a safety net for a broken test, never a sync point.
GATE_TIMEOUT_S = 300


class Gated(Backend):
    """Runs the module eagerly; its build waits for ``gate``; builds, loads and calls counted."""

    gate: ClassVar[threading.Event] = threading.Event()
    builds: ClassVar[int] = 0
    tolerances: ClassVar[list[float]] = []
    loads: ClassVar[int] = 0
    calls: ClassVar[int] = 0
    saves_payload = True
    native_payload = False
    build_cost = 1

    def build(self, module: nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Gated.builds += 1
        Gated.tolerances.append(honed.config.stability_tolerance)  # what the tune measures with
        assert Gated.gate.wait(GATE_TIMEOUT_S), "the test never opened the gate"
        return _counted(module)

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        return {"gated.txt": b"nothing to keep: the module runs as it is"}

    def load_payload(
        self, files: dict[str, bytes], module: nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        assert files == {"gated.txt": b"nothing to keep: the module runs as it is"}
        Gated.loads += 1
        return _counted(module)


def _counted(module: nn.Module) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        Gated.calls += 1
        return module(*args, **kwargs)

    return run


@pytest.fixture(autouse=True)
def jit(tmp_path: Path) -> Iterator[honed.jit.JitConfig]:
    """JIT on with its defaults (nothing waits), Gated against eager, Gated measured faster."""
    honed.jit.reset()
    honed.jit.config.reset()
    Gated.gate = threading.Event()
    Gated.builds = Gated.loads = Gated.calls = 0
    Gated.tolerances = []
    faster = {"TorchEagerBackend": [2.0], "Gated": [1.0]}
    with (
        honed.config.patch(injected_latencies=faster),
        honed.jit.config.patch(
            backends=[Gated()],
            min_parameters=100,
            detect_graph_breaks=False,
            cache_dir=str(tmp_path / "jit-cache"),
        ),
    ):
        honed.jit.enable_jit_tuning()
        try:
            yield honed.jit.config
        finally:
            Gated.gate.set()  # a test that failed half-way leaves no tune blocked
            honed.jit.reset()


def run(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in inputs]


def eager(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad(), honed.jit.paused():
        return [model(x) for x in inputs]


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def finish() -> None:
    Gated.gate.set()
    assert honed.jit.wait(GATE_TIMEOUT_S), "JIT's background work did not finish"


def test_calls_run_eager_while_the_tune_is_blocked_then_the_winner_swaps_in() -> None:
    torch.manual_seed(0)
    model = TinyMLP().eval()
    inputs = batches(2, 4, 4, 3, 2)
    got = run(model, inputs[:2])  # the second call queues the tune (min_samples=2)
    root = honed.jit.roots()[0]
    assert root.busy and root.state is State.RECORDING
    # the tune cannot finish (its build waits for the gate), yet every call returns eager's answer
    got += run(model, inputs[2:])
    assert root.busy and root.state is State.RECORDING and root.tuned is None
    assert Gated.calls == 0
    assert "(tuning in the background)" in honed.jit.hierarchy()
    # the record of the running tune says where it got to (what a report at exit prints)
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while Gated.builds == 0:  # the tune reaches Gated's build (which waits for the gate)
        assert time.monotonic() < deadline, "the tune never started Gated's build"
        time.sleep(0.01)
    (running,) = honed.jit.tunes()
    assert running.status == "running"
    assert "3 call(s) ran eager meanwhile" in running.line(), running.line()
    assert "Gated running" in running.line(), running.line()
    assert_close(got, eager(model, inputs))
    finish()
    assert not root.busy and root.state is State.TUNED
    assert [type(v.backend) for v in root.tuned.variants] == [Gated]
    assert [c.state for c in root.children] == [State.DETACHED, State.DETACHED]
    calls = Gated.calls  # the tune's own checks and measurements called it too
    assert_close(run(model, inputs), eager(model, inputs))
    assert Gated.calls == calls + len(inputs)  # the calls after the swap ran the variant
    (record,) = honed.jit.tunes()
    assert record.status == "installed" and record.selected == "Gated"
    assert record.reason == "first tune" and record.evidence == "in-process measurement"
    assert record.tried == {"TorchEagerBackend": "ok", "Gated": "ok"}
    assert record.calls_meanwhile == 3 and record.ran_meanwhile == "eager"
    assert record.samples == 2 and record.batch_sizes == [2, 4, 8]  # 8: the batch headroom
    assert record.line() in honed.jit.history()
    assert record.line().startswith("Tuned TinyMLP 📊676 (first tune) beside the program in ")
    assert record.line().endswith(
        "tried TorchEagerBackend ok, Gated ok; selected Gated on in-process measurement; "
        "3 call(s) ran eager meanwhile"
    )


def test_wait_mode_makes_the_call_that_starts_a_tune_wait(jit: honed.jit.JitConfig) -> None:
    jit.wait = True
    Gated.gate.set()
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    root = honed.jit.roots()[0]
    assert root.state is State.TUNED and not root.busy and Gated.builds == 1


def test_jit_thread_ends_when_idle_and_a_new_one_takes_the_next_job(
    jit: honed.jit.JitConfig,
) -> None:
    """A thread that ran torch ops keeps its OpenMP team: left alive, it slows the program's CPU
    ops (background.py), so JIT's thread ends once its queue is empty."""
    from honed.jit import background

    jit.wait = True
    Gated.gate.set()
    run(TinyMLP().eval(), batches(2, 4))
    assert honed.jit.wait(GATE_TIMEOUT_S)
    deadline = time.monotonic() + 10  # the thread ends right after its last job
    while background._WORKER.thread is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert background._WORKER.thread is None
    assert not any(t.name == "honed-jit" and t.is_alive() for t in threading.enumerate())
    ran: list[str] = []
    assert background.submit(lambda: ran.append(threading.current_thread().name))
    assert honed.jit.wait(GATE_TIMEOUT_S) and ran == ["honed-jit"]


def test_the_time_budget_is_the_tunes_budget(jit: honed.jit.JitConfig) -> None:
    jit.time_budget_s = 0.001  # spent by the eager baseline's warm-up (2 ms) alone
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    finish()
    root = honed.jit.roots()[0]
    assert root.tuner.time_budget_s == 0.001
    (record,) = honed.jit.tunes()
    assert record.budget_s == 0.001 and Gated.builds == 0
    assert record.tried == {"TorchEagerBackend": "ok", "Gated": "not tried"}
    assert record.selected == "TorchEagerBackend"  # the baseline, the one correct candidate
    assert "(first tune, budget 0.001s)" in record.line()


def test_jit_tunes_measure_with_the_jit_stability_tolerance(jit: honed.jit.JitConfig) -> None:
    """The program's own calls share the device with JIT's measurements: a JIT tune accepts
    windows agreeing within jit's stability_tolerance (when larger), and only while it runs."""
    assert jit.stability_tolerance == honed.config.jit_stability_tolerance == 0.25
    jit.stability_tolerance = 0.4
    first, second = TinyMLP().eval(), TinyMLP().eval()  # JIT holds modules weakly
    with honed.config.patch(stability_tolerance=0.05):
        run(first, batches(2, 4))
        finish()
        assert Gated.tolerances == [0.4]
        assert honed.config.stability_tolerance == 0.05
        (record,) = honed.jit.tunes()
        assert record.selected == "Gated"
        jit.stability_tolerance = 0.01  # never tighter than honed's own
        run(second, batches(2, 4))
        finish()
        assert Gated.tolerances == [0.4, 0.05]


@pytest.mark.parametrize("seed", [0, 7], ids=["the same calls", "other values"])
def test_warm_restart_installs_the_cached_winner_without_building(seed: int) -> None:
    """The script again, its first calls of the same shapes as last time, with the same values
    or others (a program's data differ from run to run): the decision is the cache's."""
    torch.manual_seed(0)
    first = TinyMLP().eval()  # kept alive: JIT drops the tune of a module the program dropped
    run(first, batches(2, 4, 4))
    finish()
    assert honed.jit.roots()[0].state is State.TUNED and Gated.builds == 1
    loads = Gated.loads
    # the same script again: a new model with the same weights
    honed.jit.reset()
    honed.jit.enable_jit_tuning()
    Gated.gate = threading.Event()  # closed: a build now would block until the test ends
    torch.manual_seed(0)
    model = TinyMLP().eval()
    inputs = batches(2, 4, 4, seed=seed)
    got = run(model, inputs)
    assert honed.jit.wait(GATE_TIMEOUT_S)  # nothing waits on the gate: no build
    root = honed.jit.roots()[0]
    assert root.state is State.TUNED and root.from_cache
    assert Gated.builds == 1 and Gated.loads == loads + 1  # loaded from its stored payload
    (record,) = honed.jit.tunes()
    assert record.evidence == "cache" and record.status == "installed"
    assert "selected Gated on cache" in record.line()
    assert_close(got + run(model, inputs), eager(model, inputs + inputs))


class WrongOnLoad(Gated):
    """Gated whose stored payload, loaded again, answers off by one."""

    def load_payload(
        self, files: dict[str, bytes], module: nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        right = super().load_payload(files, module, graph)
        return lambda *args, **kwargs: right(*args, **kwargs) + 1


def test_a_cached_winner_is_checked_against_eager_on_the_restarts_own_calls(
    jit: honed.jit.JitConfig,
) -> None:
    """The cache decides by shapes, so what it installs must answer as eager does on this
    run's calls: a winner that does not is rejected there, and eager is chosen."""
    jit.backends = [WrongOnLoad()]
    faster = {"TorchEagerBackend": [2.0], "WrongOnLoad": [1.0]}
    with honed.config.patch(injected_latencies=faster):
        torch.manual_seed(0)
        first = TinyMLP().eval()
        run(first, batches(2, 4, 4))
        finish()
        assert honed.jit.roots()[0].backend == "WrongOnLoad"
        honed.jit.reset()
        honed.jit.enable_jit_tuning()
        torch.manual_seed(0)
        model = TinyMLP().eval()
        inputs = batches(2, 4, 4, seed=7)
        got = run(model, inputs)
        finish()
    root = honed.jit.roots()[0]
    assert root.backend == "TorchEagerBackend" and Gated.loads == 1, honed.jit.history()
    (record,) = honed.jit.tunes()
    assert record.selected == "TorchEagerBackend", record
    assert record.tried["WrongOnLoad"].startswith("rejected"), record
    assert_close(got + run(model, inputs), eager(model, inputs + inputs))


def test_a_new_batch_size_widens_the_tuned_range_in_the_background() -> None:
    Gated.gate.set()
    model = TinyMLP().eval()
    run(model, batches(2, 2))  # one batch size: no batch axis, a profile of batch 2 only
    finish()
    root = honed.jit.roots()[0]
    assert root.state is State.TUNED
    big = batches(8, seed=1)
    assert root.tuned.dispatch((big[0],), {}) is MISS
    Gated.gate = threading.Event()  # hold the widen
    got = run(model, big)  # outside the profile: eager answers, and the widen is queued
    assert root.busy and root.retunes == 1
    first = root.tuned
    calls = Gated.calls
    small = batches(2, seed=2)
    got_small = run(model, small)  # meanwhile batch 2 still runs the installed variant
    assert Gated.calls == calls + 1
    again = run(model, big)  # the same miss while the widen runs: eager, and no second widen
    assert_close(got + got_small + again, eager(model, big + small + big))
    finish()
    assert root.tuned is not first and root.retunes == 1
    assert root.tuned.dispatch((big[0],), {}) is not MISS
    steps = honed.jit.history()
    (outside,) = [s for s in steps if s.startswith("Inputs outside")]  # said once, not per call
    assert outside.endswith("; widening the tuned range in the background")
    widen = honed.jit.tunes()[-1]
    assert widen.reason == "widen for new shapes" and widen.status == "installed"
    assert widen.ran_meanwhile == "the previous variant" and widen.calls_meanwhile == 2
    calls = Gated.calls
    assert_close(run(model, big), eager(model, big))
    assert Gated.calls == calls + 1  # batch 8 now runs tuned


def test_batch_headroom_keeps_small_first_calls_from_locking_the_range(
    jit: honed.jit.JitConfig,
) -> None:
    Gated.gate.set()
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    finish()
    (variant,) = honed.jit.roots()[0].tuned.variants
    assert (variant.profile.min_batch, variant.profile.max_batch) == (2, 8)
    honed.jit.reset()
    jit.batch_headroom = 1  # only the batch sizes recorded
    honed.jit.enable_jit_tuning()
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    finish()
    (variant,) = honed.jit.roots()[0].tuned.variants
    assert (variant.profile.min_batch, variant.profile.max_batch) == (2, 4)


@pytest.mark.gpu
def test_cuda_calls_run_while_inductor_tunes_beside_them_in_workers(
    jit: honed.jit.JitConfig,
) -> None:
    inductor = honed.backend.TorchInductorBackend()
    jit.backends, jit.strategy = None, honed.OneBackendStrategy(inductor)
    with honed.config.patch(injected_latencies=None, isolation="process"):
        torch.manual_seed(0)
        model = TinyMLP().eval().cuda()
        inputs = [x.cuda() for x in batches(8, 8, 8, 8)]
        got = run(model, inputs)  # the tune starts after the second; none of these waits for it
        assert honed.jit.wait(GATE_TIMEOUT_S)
        root = honed.jit.roots()[0]
        assert root.state is State.TUNED, honed.jit.history()
        assert_close(got + run(model, inputs), eager(model, inputs + inputs))
        (record,) = honed.jit.tunes()
        assert record.status == "installed" and record.selected == "TorchInductorBackend"
        assert record.evidence == "worker measurement"


def _walked_by_the_collector(obj: object) -> bool:
    """Whether the cyclic collector's generations hold ``obj`` (frozen objects are in none)."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture
def unfrozen() -> None:
    """A collector whose permanent generation is empty, as these tests assume: JIT rightly keeps
    frozen what was frozen before its first job, and on the GPU machine objects are frozen
    before these tests start (JIT then keeps everything frozen, as documented)."""
    gc.unfreeze()


def test_a_job_freezes_what_existed_out_of_the_collector_and_reset_gives_it_back(
    jit: honed.jit.JitConfig, unfrozen: None
) -> None:
    """A full collection set off by JIT's allocations must not walk the program's objects."""
    jit.wait = True
    Gated.gate.set()
    made_before = [{"a": "container the collector tracks"}]
    assert _walked_by_the_collector(made_before)
    run(TinyMLP().eval(), batches(2, 4))
    assert Gated.builds == 1
    assert not _walked_by_the_collector(made_before) and gc.get_freeze_count() > 0
    made_after = [{"b": "made after the job"}]
    assert _walked_by_the_collector(made_after)
    honed.jit.reset()
    assert _walked_by_the_collector(made_before) and gc.get_freeze_count() == 0


def test_no_freeze_when_turned_off(jit: honed.jit.JitConfig, unfrozen: None) -> None:
    jit.wait = True
    Gated.gate.set()
    made_before = [{"a": "container the collector tracks"}]
    with honed.config.patch(jit_gc_freeze=False):
        run(TinyMLP().eval(), batches(2, 4))
    assert Gated.builds == 1
    assert _walked_by_the_collector(made_before) and gc.get_freeze_count() == 0


def test_reset_leaves_what_the_program_froze_itself_frozen(jit: honed.jit.JitConfig) -> None:
    jit.wait = True
    Gated.gate.set()
    programs = [{"frozen": "by the program"}]
    gc.freeze()
    try:
        run(TinyMLP().eval(), batches(2, 4))
        assert Gated.builds == 1
        honed.jit.reset()
        assert not _walked_by_the_collector(programs) and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_the_exit_waits_for_jits_thread_to_end_not_only_its_last_job() -> None:
    """What a job leaves is torn down on JIT's thread after the job counts as done; a daemon
    thread still inside native code when the interpreter finalizes aborts the program (seen as
    "terminate called without an active exception" when a program ended during the check)."""
    from honed.jit import background

    torn_down = threading.Event()

    class SlowToTearDown:
        def __del__(self) -> None:
            time.sleep(0.5)
            torn_down.set()

    started = threading.Event()

    def job(leftover: SlowToTearDown) -> None:
        started.set()

    assert background.submit(job, SlowToTearDown())
    assert started.wait(GATE_TIMEOUT_S)
    try:
        background._at_exit()
        assert torn_down.is_set()  # the job's leftovers went with its thread, before the exit
        assert not any(t.name == "honed-jit" and t.is_alive() for t in threading.enumerate())
    finally:
        background._reset_exit()
