"""tests/test_graph_tuner.py: one graph's tune: the time budget, installing what the worker built,
and tunes that own their state (two at once in two threads)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import honed
from honed.backend import Backend, Sample
from honed.pipeline import progress

from conftest import TinyMLP, batches


class Plain(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class Hangs(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        time.sleep(3600)
        return module


@pytest.mark.parametrize("isolation", ["none", "process"])
def test_a_spent_time_budget_leaves_the_rest_not_tried(isolation: str) -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([Plain(), Hangs()])
    report = honed.tune(
        model, batches(2, 4), strategy=strategy, isolation=isolation, time_budget_s=1e-3
    )
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["TorchEagerBackend"].status == "ok"  # the baseline always runs
    for name in ("Plain", "Hangs"):
        assert rows[name].status == "not tried", rows[name]
        assert rows[name].reason == "budget: the 0.001 s time budget was spent"
    assert report.selected() == ["TorchEagerBackend"]


@pytest.mark.parametrize("budget", [0, -1, float("inf"), float("nan"), "10"])
def test_a_bad_time_budget_is_a_clear_error(budget: Any) -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    with pytest.raises(honed.errors.InputError, match="time_budget_s must be a positive number"):
        honed.tune(model, batches(2), time_budget_s=budget)


CALLER_SCRIPT = """
import ctypes, os, time, torch, honed
from honed.backend import Backend

CALLER = os.getpid()

class CrashesInTheCaller(Backend):
    def build(self, module, example_inputs):
        if os.getpid() == CALLER:
            ctypes.string_at(0)
        return module

class HangsInTheCaller(Backend):
    def build(self, module, example_inputs):
        if os.getpid() == CALLER:
            time.sleep(3600)
        return module

if __name__ == "__main__":
    for backend in (CrashesInTheCaller(), HangsInTheCaller()):
        torch.manual_seed(0)
        model = honed.Module(torch.nn.Linear(4, 4).eval(), "m")
        with honed.config.patch(cache_enabled=False, build_timeout_s=120):
            report = honed.tune(model, [torch.randn(2, 4), torch.randn(3, 4)],
                                strategy=honed.OneBackendStrategy(backend))
        x = torch.randn(3, 4)
        print("SELECTED", report.selected(), bool(torch.allclose(model(x), model.module(x))))
"""


@pytest.mark.integration  # worker processes
def test_a_backend_that_breaks_only_in_the_caller_does_not_take_the_tune_down(
    tmp_path: Path,
) -> None:
    script = tmp_path / "caller.py"
    script.write_text(CALLER_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    # The worker's build is what is installed: the caller never builds these again.
    assert proc.stdout.splitlines() == [
        "SELECTED ['CrashesInTheCaller'] True",
        "SELECTED ['HangsInTheCaller'] True",
    ], proc.stdout


class Rendezvous(Backend):
    """Both tunes must be inside a build at the same time for either to finish its build."""

    barrier = threading.Barrier(2)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Rendezvous.barrier.wait(timeout=120)
        return module


def test_two_tunes_in_two_threads_keep_their_own_state() -> None:
    results: dict[str, Any] = {}

    def tune(name: str) -> None:
        torch.manual_seed(0)
        model = honed.Module(TinyMLP().eval(), name)
        tracker = progress.Tracker(show=False)
        with progress.tracking(tracker):
            report = honed.tune(
                model, batches(2, 4), strategy=honed.OneBackendStrategy(Rendezvous())
            )
        results[name] = (report, tracker)

    threads = [threading.Thread(target=tune, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    for name in ("a", "b"):
        report, tracker = results[name]
        assert [g.module for g in report.graphs] == [name]
        assert report.selected() == ["Rendezvous"]
        assert {e.module for e in tracker.events if e.module} == {name}
        assert sorted(f.candidate for f in tracker.done) == ["Rendezvous", "TorchEagerBackend"]
        assert {f.module for f in tracker.done} == {name}


@pytest.mark.integration  # worker processes
def test_a_tune_started_in_the_background_can_be_cancelled() -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    tracker = progress.Tracker(show=False)
    tuner = honed.pipeline.tuner.Tuner(
        honed.MaxThroughputStrategy([Hangs()]), isolation="process", tracker=tracker
    )
    future = tuner.start(lambda x: model(x), batches(2, 4))
    deadline = time.monotonic() + 300
    while not any(e.candidate == "Hangs" and e.phase == "build" for e in tracker.events):
        assert time.monotonic() < deadline, "the worker never reported its build"
        time.sleep(0.05)  # waiting for a reported phase, not for a duration
    tuner.cancel()
    report = future.result(timeout=120)
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert (rows["Hangs"].status, rows["Hangs"].reason) == ("not tried", "cancelled")
    assert report.selected() == ["TorchEagerBackend"]
