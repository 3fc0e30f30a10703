"""tests/test_progress.py: the live display of a tune and the per-candidate build.log files."""

from __future__ import annotations

import io
import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from rich.console import Console

import honed
from honed.backend import Backend
from honed.pipeline import progress

from conftest import TinyMLP, batches


class Plain(Backend):
    """Runs the module as it is: a candidate that builds in no time."""

    def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Any:
        return module


class Noisy(Backend):
    """Like Plain, but talks while it builds, the way compilers do."""

    def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Any:
        warnings.warn("noisy compiler: falling back to a slow kernel", stacklevel=1)
        logging.getLogger("torch._inductor.noisy").warning("inductor chatter %d", 42)
        return module


def _console() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=True, width=200), buf


def _tune(tracker: progress.Tracker, backend: Backend) -> honed.TuneReport:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny")
    with progress.tracking(tracker):
        return honed.tune(model, batches(2, 4), strategy=honed.OneBackendStrategy(backend))


def test_tracker_records_phases_in_order() -> None:
    console, _ = _console()
    tracker = progress.Tracker(console, show=False)
    _tune(tracker, Plain())
    phases = [e.phase for e in tracker.events]
    assert phases == [
        "record",
        *("build", "check", "measure"),  # the eager baseline
        *("build", "check", "measure"),  # Plain
        "install",  # Plain alone competes: nothing to re-measure side by side
    ]
    assert [e.candidate for e in tracker.events[1:7]] == ["TorchEagerBackend"] * 3 + ["Plain"] * 3
    assert {(e.module, e.graph) for e in tracker.events[1:]} == {("tiny", "graph 0")}
    assert [(f.candidate, f.status) for f in tracker.done] == [
        ("TorchEagerBackend", "ok"),
        ("Plain", "ok"),
    ]
    assert all(f.seconds >= 0 for f in tracker.done)


def test_finalists_are_re_measured_side_by_side_when_two_compete() -> None:
    console, _ = _console()
    tracker = progress.Tracker(console, show=False)
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny")
    with progress.tracking(tracker):
        honed.tune(model, batches(2, 4), strategy=honed.MaxThroughputStrategy(backends=[Plain()]))
    phases = [e.phase for e in tracker.events]
    assert phases == [
        "record",
        *("build", "check", "measure"),  # the eager baseline, which competes here
        *("build", "check", "measure"),  # Plain
        "interleave",
        "install",
    ]


def test_shown_tracker_prints_one_line_per_candidate() -> None:
    console, buf = _console()
    with honed.config.patch(progress="on"):
        tracker = progress.Tracker(console)
    assert tracker.show
    _tune(tracker, Plain())
    out = buf.getvalue()
    assert "ok" in out and "tiny / graph 0 / Plain" in out
    assert "tiny / graph 0 / TorchEagerBackend" in out


@pytest.mark.parametrize(
    ("mode", "level"), [("auto", "ERROR"), ("on", "ERROR"), ("off", "INFO"), ("off", "WARNING")]
)
def test_quiet_prints_nothing(mode: str, level: str) -> None:
    console, buf = _console()
    with honed.config.patch(progress=mode, log_level=level):
        tracker = progress.Tracker(console)
        assert not tracker.show
        _tune(tracker, Plain())
    assert buf.getvalue() == ""
    assert len(tracker.done) == 2  # still recorded


def test_auto_shows_on_a_terminal_only() -> None:
    with honed.config.patch(progress="auto", log_level="WARNING"):
        assert progress.should_show(Console(file=io.StringIO(), force_terminal=True))
        assert not progress.should_show(Console(file=io.StringIO(), force_terminal=False))


def test_compiler_output_goes_to_build_log(capsys: pytest.CaptureFixture[str]) -> None:
    tracker = progress.Tracker(show=False)
    report = _tune(tracker, Noisy())
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["TorchEagerBackend"].build_log is None  # said nothing: no file
    path = Path(str(rows["Noisy"].build_log))
    assert path.name == "Noisy.build.log"
    assert path.parent.name == "0" and path.parent.parent.name == "tiny"
    assert path.is_relative_to(Path(honed.config.cache_dir) / "runs")
    text = path.read_text()
    assert "noisy compiler: falling back to a slow kernel" in text
    assert "WARNING torch._inductor.noisy: inductor chatter 42" in text
    captured = capsys.readouterr()
    assert "chatter" not in captured.out + captured.err
    assert "build.log file(s) in" in report.render(width=300)


class Chatty(Backend):
    """Like Plain, but prints to stderr while it builds, the way a compiler does."""

    def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Any:
        import sys

        print("ptxas info: 12 registers", file=sys.stderr, flush=True)
        return module


@pytest.mark.integration  # worker processes
def test_worker_candidates_report_their_phases() -> None:
    tracker = progress.Tracker(show=False)
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny")
    with progress.tracking(tracker):
        report = honed.tune(
            model, batches(2, 4), strategy=honed.OneBackendStrategy(Chatty()), isolation="process"
        )
    by_candidate: dict[str, list[str]] = {}
    for e in tracker.events:
        by_candidate.setdefault(e.candidate, []).append(e.phase)
    # Each worker reports its phases as it enters them; the pool may run both side by side.
    assert by_candidate["TorchEagerBackend"] == ["build", "check", "measure"]
    # ... and the winner is installed here from what its worker shipped.
    assert by_candidate["Chatty"] == ["build", "check", "measure", "install"]
    phases = [e.phase for e in tracker.events]
    assert (phases[0], phases[-1]) == ("record", "install")
    log = report.graphs[0].candidates[1].build_log
    assert log is not None and "ptxas info: 12 registers" in Path(log).read_text()


def test_estimate_left_takes_each_cost_at_its_own_average() -> None:
    done = [(0, 1.0), (2, 30.0), (2, 50.0)]
    # cost 2: its own average (40 s); cost 3 never seen: the average of all (27 s); two at once
    assert progress.estimate_left(done, [2, 3], parallel=2) == pytest.approx((40.0 + 27.0) / 2)
    assert progress.estimate_left([], [2], parallel=1) is None  # nothing to go by yet
    assert progress.estimate_left(done, [], parallel=1) == 0.0


def test_status_line_says_candidate_k_of_n_and_what_is_left() -> None:
    tracker = progress.Tracker(show=False)
    tracker.at_graph("m", "graph 0", costs=[0, 2, 2], parallel=1)
    tracker.phase("build", "TorchEagerBackend")
    assert "m / graph 0: candidate 1 of 3: TorchEagerBackend build (" in tracker.status_line()
    assert " left" not in tracker.status_line()  # no estimate before anything has finished
    tracker.finished("ok", candidate="TorchEagerBackend", seconds=2.0, cost=0)
    tracker.phase("measure", "Inductor")
    line = tracker.status_line()
    assert "candidate 2 of 3: Inductor measure (" in line
    assert line.endswith("elapsed, about 4 s left)"), line  # two more at the 2 s seen so far
    tracker.skipped("Inductor2", "budget: the 1 s time budget was spent")
    assert tracker.done[-1].status == "not tried"
