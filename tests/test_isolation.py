"""tests/test_isolation.py: fault injection: every way a candidate can break, in worker processes.

Each bad backend fails only itself, with its reason; the good one is measured and selected.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import honed
from honed.backend import Backend, Sample

from conftest import TinyMLP, batches, interruptible

pytestmark = pytest.mark.integration  # candidates run in worker processes


def _segfault() -> None:
    ctypes.string_at(0)


class Good(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class CrashOnBuild(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        _segfault()
        return module


class CrashOnCall(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            _segfault()

        return run


class Hang(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        time.sleep(3600)
        return module


class Hog(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        hoard = []
        while True:  # ~256 MB a step, written so the pages are really resident
            hoard.append(torch.ones(64 << 20))


class NaNs(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) * float("nan")


class SlightlyWrong(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) + 1e-2


class Raises(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        raise ValueError("unsupported operator aten::frobnicate")


@pytest.fixture
def isolated() -> Iterator[None]:
    with honed.config.patch(isolation="process", build_timeout_s=4.0, worker_memory_gb=2.0):
        yield


@pytest.mark.serial  # the hog must pass 2 GB within the 4 s build limit: no other test beside it
def test_every_failure_is_contained_and_reported(isolated: None) -> None:
    bad = [CrashOnBuild(), CrashOnCall(), Hang(), Hog(), NaNs(), SlightlyWrong(), Raises()]
    model = honed.Module(TinyMLP().eval(), "m")
    timings = {"TorchEagerBackend": [2.0], "Good": [1.0]}
    with honed.config.patch(injected_latencies=timings):
        report = honed.tune(
            model, batches(2, 4), strategy=honed.MaxThroughputStrategy([*bad, Good()])
        )
    rows = {c.name: c for c in report.graphs[0].candidates}
    reasons = {name: (row.status, row.reason) for name, row in rows.items()}
    assert reasons["CrashOnBuild"][1].startswith("crashed: segmentation fault (SIGSEGV)"), reasons
    assert reasons["CrashOnCall"][1].startswith("crashed: segmentation fault (SIGSEGV)"), reasons
    assert reasons["Hang"] == ("failed", "killed after the 4 s build timeout"), reasons
    assert reasons["Hog"][1].startswith("out of memory"), reasons
    assert reasons["NaNs"][0] == "rejected" and reasons["NaNs"][1].startswith("NaN outputs")
    assert reasons["SlightlyWrong"][0] == "rejected"
    assert reasons["SlightlyWrong"][1].startswith("wrong outputs")
    assert reasons["Raises"] == (
        "failed",
        "build raised ValueError: unsupported operator aten::frobnicate",
    ), reasons
    assert rows["Good"].status == "ok" and rows["Good"].median_ms == 1.0
    assert rows["Good"].measured_on == "cpu"  # in a worker, on the tune's device
    assert report.selected() == ["Good"]
    x = batches(3, seed=1)[0]
    torch.testing.assert_close(model(x), model.module(x))


class CompilesOnFirstCall(Backend):
    """Installs like torch.compile: the first call in the caller's process compiles."""

    jit = True

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class Program:
    """What a JIT tune runs beside (graph_tuner.ProgramCalls), always calling: its calls take
    2 ms on eager and 1 ms on any variant built from the tune."""

    def __init__(self, promotes: bool = False, stand_ins: bool = False) -> None:
        self.arms: list[tuple[str, Any]] = []
        self.promotes = promotes  # offered candidates as they pass (honed.jit.config.promote)
        self.stand_ins = stand_ins  # offered those that compile nothing (config.stand_in)
        self.asked: list[tuple[str, float | None]] = []  # worth_a_stand_in's questions
        self.promoted: list[tuple[str, Any]] = []

    def worth_a_stand_in(self, label: str, quickest_ms: float | None) -> bool:
        self.asked.append((label, quickest_ms))
        return True

    def idle(self) -> bool:
        return False

    def answering(self) -> str | None:
        return self.promoted[-1][0] if self.promoted else None

    def promote(self, label: str, arm: Any, sample: Sample) -> None:
        self.promoted.append((label, arm))

    def measure(
        self, arms: list[tuple[str, Any]], sample: Sample, until: float | None = None
    ) -> list[list[float]]:
        self.arms = arms
        return [
            [(2.0 if fn is None else 1.0) * (1 + 0.001 * (k % 5)) for k in range(40)]
            for _, fn in arms
        ]


def test_beside_a_calling_program_workers_build_and_check_and_its_calls_measure(
    isolated: None, tmp_path: Path
) -> None:
    from honed.pipeline.graph_tuner import ON_PROGRAM
    from honed.pipeline.tuner import Tuner

    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([NaNs(), Good(), CompilesOnFirstCall()])
    program = Program()
    # Figures a worker would take (injected) favour eager: none is taken.
    injected = {"TorchEagerBackend": [1.0], "Good": [3.0]}
    with honed.config.patch(injected_latencies=injected):
        tuner = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=program)
        report = tuner.run(model, batches(4, 4), [])
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["NaNs"].status == "rejected"  # checked in its worker, never on the calls
    # Built and checked, but its install would compile in the program's process: left out
    # while Good installs without compiling.
    left_out = rows["CompilesOnFirstCall"]
    assert left_out.status == "not tried" and "installs without compiling" in left_out.reason
    assert left_out.median_ms is None
    assert [label for label, _ in program.arms] == ["TorchEagerBackend", "Good"]
    eager_arm, good_arm = (fn for _, fn in program.arms)
    x = batches(4, seed=1)[0]
    assert eager_arm is None  # the program's own call
    torch.testing.assert_close(good_arm(x), model.module(x))  # installed here, from the worker
    for name, median in (("TorchEagerBackend", 2.0), ("Good", 1.0)):
        assert rows[name].status == "ok" and rows[name].measured_on == ON_PROGRAM
        assert rows[name].median_ms == pytest.approx(median, rel=0.01)
    assert report.selected() == ["Good"]
    assert report.graphs[0].decision.endswith(f"measured on {ON_PROGRAM}")  # steady at once

    # The cache kept the program's figures: a later tune beside the program decides from them
    # alone, and leaves the compiling candidate out again without building it.
    again = honed.Module(model.module, "m")
    program = Program()
    with honed.config.patch(injected_latencies=injected):
        tuner = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=program)
        report = tuner.run(again, batches(4, 4), [])
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["Good"].cached and rows["Good"].measured_on == ON_PROGRAM
    assert rows["CompilesOnFirstCall"].status == "not tried"
    assert rows["CompilesOnFirstCall"].reason == left_out.reason
    assert program.arms == []  # nothing was measured again
    assert report.selected() == ["Good"]


def _in_the_tunes_process() -> bool:
    return os.environ.get("HONED_TEST_TUNE_PID") == str(os.getpid())


class BuiltLast(Backend):
    """Good, its worker's build a second and a half long: the others are built before it."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        if not _in_the_tunes_process():
            time.sleep(1.5)
        return module


class _OffHere:
    """``module``, answering off by one in the tune's process (and right in a worker)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.module(*args, **kwargs)
        return out + 1.0 if _in_the_tunes_process() else out


class WrongHere(Backend):
    """Right in its worker, wrong once installed in the tune's process."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return _OffHere(module)


class StandsIn(Backend):
    """Good, declared as compiling nothing (as CUDA graphs over eager are)."""

    stands_in = True

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


@pytest.mark.parametrize(("promotes", "stands_in"), [(True, False), (False, True), (False, False)])
def test_beside_a_program_a_candidate_built_while_others_build_is_promoted_at_once(
    isolated: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    promotes: bool,
    stands_in: bool,
) -> None:
    """A candidate whose build ends while others still build is installed and checked at once
    and offered to the program's calls (ProgramCalls.promote): they may run it meanwhile. One
    that fails its check here is not offered; the last one built is measured with the rest.
    Where the program's view does not ask for it (honed.jit.config.promote off), each is
    installed only once all are built; but one that compiles nothing (Backend.stands_in) is
    offered where the view asks for those (honed.jit.config.stand_in)."""
    from honed.pipeline.graph_tuner import GraphTuner
    from honed.pipeline.tuner import Tuner

    monkeypatch.setenv("HONED_TEST_TUNE_PID", str(os.getpid()))
    installs: list[str] = []
    install = GraphTuner._install

    def counted(self: GraphTuner, outcome: Any) -> str:
        installs.append(outcome.backend.name)
        return install(self, outcome)

    monkeypatch.setattr(GraphTuner, "_install", counted)
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([Good(), StandsIn(), WrongHere(), BuiltLast()])
    program = Program(promotes=promotes, stand_ins=stands_in)
    report = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=program).run(
        model, batches(4, 4), []
    )
    rows = {c.name: c for c in report.graphs[0].candidates}
    expected = ["Good", "StandsIn"] if promotes else ["StandsIn"] if stands_in else []
    assert sorted(label for label, _ in program.promoted) == expected
    # asked only of a stand-in offered as such, with its worker's quickest check run
    assert [label for label, _ in program.asked] == (
        ["StandsIn"] if expected == ["StandsIn"] else []
    )
    assert all(ms is not None and ms > 0 for _, ms in program.asked)
    x = batches(4, seed=1)[0]
    for _, arm in program.promoted:  # installed here, from the worker
        torch.testing.assert_close(arm(x), model.module(x))
    assert rows["WrongHere"].status == "rejected"
    assert "checked in this process before installing" in rows["WrongHere"].reason
    # Each was installed once (the promoted ones when promoted) and measured with the last
    # one built.
    assert sorted(installs) == ["BuiltLast", "Good", "StandsIn", "WrongHere"]
    assert [label for label, _ in program.arms] == [
        "TorchEagerBackend",
        "Good",
        "StandsIn",
        "BuiltLast",
    ]
    assert rows["Good"].status == rows["StandsIn"].status == rows["BuiltLast"].status == "ok"


class CountsForward(TinyMLP):
    """TinyMLP counting its forward calls in this process."""

    forwards = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        CountsForward.forwards += 1
        return super().forward(x)


LEARNED: list[int] = []  # the model's forward calls each install here made to learn eager's output


class _Unshippable:
    """``module``, holding a lock: it does not pickle, so the tune's process builds it again
    (as a CUDA graph's capture is)."""

    def __init__(self, module: torch.nn.Module) -> None:
        import threading

        self.module, self.lock = module, threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


class LearnsFromEager(Backend):
    """Builds the module as it is, after learning what eager returns (as a bf16 candidate
    learns its output dtypes: backend.base.eager_output)."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        from honed.backend.base import eager_output

        before = CountsForward.forwards
        eager_output(module, example_inputs[0])
        if _in_the_tunes_process():
            LEARNED.append(CountsForward.forwards - before)
        return _Unshippable(module)


def test_an_install_here_learns_what_eager_returns_from_the_references(
    isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate shipped without a payload is built again in the tune's process to install
    it; what it learns from eager's output there comes from the tune's references (beside a
    JIT program: the program's own outputs), not from an eager run of its own."""
    from honed.pipeline.tuner import Tuner

    monkeypatch.setenv("HONED_TEST_TUNE_PID", str(os.getpid()))
    LEARNED.clear()
    torch.manual_seed(0)
    model = honed.Module(CountsForward().eval(), "m")
    strategy = honed.MaxThroughputStrategy([LearnsFromEager()])
    report = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=Program()).run(
        model, batches(4, 4), []
    )
    assert report.selected() == ["LearnsFromEager"]
    assert LEARNED == [0]  # installed here once, and learned without running the model


@pytest.mark.parametrize("beside", [True, False])
def test_beside_a_program_eager_runs_in_no_worker_and_the_workers_space_their_runs(
    isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beside: bool
) -> None:
    """Beside a program eager is the program's own calls: no worker runs it on the samples
    (each run a call's length of the program's GPU). The jobs sent say the tune is beside a
    program, so the worker spaces its runs (courtesy.spaced_run)."""
    from honed.pipeline.pool import WorkerPool
    from honed.pipeline.tuner import Tuner

    jobs: list[tuple[str, bool]] = []
    submit = WorkerPool.submit

    def spy(self: WorkerPool, job: Any) -> Any:
        if job.kind == "evaluate":
            jobs.append((job.label, job.request["beside_program"]))
        return submit(self, job)

    monkeypatch.setattr(WorkerPool, "submit", spy)
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([Good()])
    program = Program() if beside else None
    injected = {"TorchEagerBackend": [2.0], "Good": [1.0]}  # a worker's figures, as the program's
    with honed.config.patch(injected_latencies=injected):
        report = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=program).run(
            model, batches(4, 4), []
        )
    assert report.selected() == ["Good"]
    rows = {c.name: c for c in report.graphs[0].candidates}
    if beside:
        assert jobs == [("Good", True)]
        assert program is not None and [label for label, _ in program.arms] == [
            "TorchEagerBackend",
            "Good",
        ]
        assert rows["TorchEagerBackend"].median_ms == pytest.approx(2.0, rel=0.01)
    else:
        assert sorted(jobs) == [("Good", False), ("TorchEagerBackend", False)]
    assert rows["TorchEagerBackend"].status == "ok"


@pytest.mark.parametrize("beside", [True, False])
def test_a_tune_beside_a_program_waits_for_its_workers_without_an_openmp_team(
    isolated: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beside: bool
) -> None:
    """The tune's thread ends its OpenMP team before it waits on the workers while a program
    calls (honed.pipeline.openmp: a kept team slows the program's parallel ops)."""
    import threading

    from honed.pipeline import courtesy, graph_tuner
    from honed.pipeline.tuner import Tuner

    events: list[tuple[str, int]] = []
    monkeypatch.setattr(
        graph_tuner, "release_team", lambda: events.append(("release", threading.get_ident()))
    )
    wait_all = graph_tuner.wait_all

    def waits(*args: Any, **kwargs: Any) -> Any:
        events.append(("wait", threading.get_ident()))
        return wait_all(*args, **kwargs)

    monkeypatch.setattr(graph_tuner, "wait_all", waits)
    monkeypatch.setattr(courtesy, "_probe", [(lambda: False) if beside else None])
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([Good()])
    tuner = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=Program())
    assert tuner.run(model, batches(4, 4), []).selected() == ["Good"]
    first_wait = next(e for e in events if e[0] == "wait")
    released = [e for e in events if e[0] == "release"]
    if beside:
        assert released and events.index(released[0]) < events.index(first_wait)
        assert released[0][1] == first_wait[1]  # by the thread that waits
    else:
        assert not released  # a tune without a program keeps its thread's team


class NoisyProgram(Program):
    """A program whose first ``noisy`` rounds of calls jump halfway through (a busy machine)."""

    def __init__(self, noisy: int) -> None:
        super().__init__()
        self.noisy, self.rounds = noisy, 0

    def measure(
        self, arms: list[tuple[str, Any]], sample: Sample, until: float | None = None
    ) -> list[list[float]]:
        figures = super().measure(arms, sample)
        self.rounds += 1
        if self.rounds <= self.noisy:
            figures = [f[:20] + [3 * v for v in f[20:]] for f in figures]
        return figures


@pytest.mark.parametrize("noisy", [1, 3])
def test_the_programs_calls_measure_again_while_their_figures_are_too_noisy(
    isolated: None, tmp_path: Path, noisy: int
) -> None:
    from honed.pipeline.tuner import Tuner

    model = honed.Module(TinyMLP().eval(), "m")
    program = NoisyProgram(noisy)
    strategy = honed.MaxThroughputStrategy([Good()])
    report = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=program).run(
        model, batches(4, 4), []
    )
    assert program.rounds == min(noisy + 1, 3)
    decision = report.graphs[0].decision
    if noisy == 1:  # the second round was steady: it decides
        assert report.selected() == ["Good"]
        assert decision.endswith(", after 1 round(s) too noisy to decide on"), decision
    else:  # three noisy rounds: the last decides, and noise is no evidence
        assert report.selected() == ["TorchEagerBackend"]
        assert "unstable" in decision, decision
        assert decision.endswith(", 3 rounds, each too noisy to decide on"), decision


class NoisyThenShortProgram(NoisyProgram):
    """Its first round of calls is too noisy to decide on, its second too short to count (calls
    of a second each, the tune's deadline reached)."""

    def measure(
        self, arms: list[tuple[str, Any]], sample: Sample, until: float | None = None
    ) -> list[list[float]]:
        figures = super().measure(arms, sample, until)
        return figures if self.rounds == 1 else [f[:10] for f in figures]


def test_a_round_of_the_programs_calls_too_short_to_count_leaves_the_one_before(
    isolated: None, tmp_path: Path
) -> None:
    from honed.pipeline.graph_tuner import ON_PROGRAM
    from honed.pipeline.tuner import Tuner

    model = honed.Module(TinyMLP().eval(), "m")
    program = NoisyThenShortProgram(noisy=1)
    strategy = honed.MaxThroughputStrategy([Good()])
    report = Tuner(strategy, isolation="process", cache_dir=tmp_path, live=program).run(
        model, batches(4, 4), []
    )
    assert program.rounds == 2
    rows = {c.name: c for c in report.graphs[0].candidates}
    for name in ("TorchEagerBackend", "Good"):  # the first round's figures, not "not tried"
        assert rows[name].status == "ok" and rows[name].measured_on == ON_PROGRAM, rows[name]
        assert rows[name].median_ms is not None
    decision = report.graphs[0].decision
    assert report.selected() == ["TorchEagerBackend"]  # noise is no evidence
    assert decision.endswith(", 1 rounds, each too noisy to decide on"), decision


def test_finalists_measured_side_by_side_in_a_worker_keep_their_rounds(
    isolated: None, tmp_path: Path
) -> None:
    """Finalists evaluated in workers are re-measured side by side in one worker; their
    figures come back with the rounds and one run id (what the decision pairs), and the cache
    keeps them so."""
    from honed.pipeline.cache import TuneCache

    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    windows = dict(warmup_calls=2, warmup_ms=1.0, window_calls=5, window_ms=1.0, max_windows=4)
    strategy = honed.MaxThroughputStrategy([Good()])
    with honed.config.patch(cache_dir=tmp_path, **windows):
        report = honed.tune(model, batches(4), strategy=strategy)
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert {rows[n].measured_on for n in ("TorchEagerBackend", "Good")} == {"cpu"}
    cache = TuneCache(tmp_path)
    kept = [cache.get(p.stem, unstable_too=True) for p in cache.dir.rglob("*.json")]
    figures = [r["measurement"] for r in kept if r and r.get("measurement")]
    assert len(figures) == 2 and figures[0]["run"] != 0
    assert figures[0]["run"] == figures[1]["run"]
    assert figures[0]["blocks"] == figures[1]["blocks"] and len(figures[0]["blocks"]) >= 12


def test_isolation_is_the_default() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import honed; print(honed.config.isolation)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert out == "process"


def test_unpicklable_job_falls_back_in_process_with_a_warning(
    isolated: None, caplog: pytest.LogCaptureFixture
) -> None:
    class HoldsALock(Backend):
        def __init__(self) -> None:
            super().__init__()
            import threading

            self.lock = threading.Lock()  # cannot be pickled

        def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Any:
            return module

    model = honed.Module(TinyMLP().eval(), "m")
    with caplog.at_level("WARNING", logger="honed"):
        report = honed.tune(model, batches(2), strategy=honed.OneBackendStrategy(HoldsALock()))
    assert "cannot be sent to a worker process" in caplog.text
    assert report.selected() == ["HoldsALock"]


SCRIPT = """
import torch, honed
from honed.backend import Backend

class MainModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)
    def forward(self, x):
        return self.fc(x).relu()

class MainBackend(Backend):
    def build(self, module, example_inputs):
        return module

if __name__ == "__main__":
    model = honed.Module(MainModel().eval(), "main")
    with honed.config.patch(warmup_ms=2, window_ms=2, max_windows=3, cache_enabled=False):
        report = honed.tune(model, [torch.randn(2, 8), torch.randn(4, 8)],
                            strategy=honed.OneBackendStrategy(MainBackend()))
    print("SELECTED", report.selected())
"""


def test_main_script_classes_travel_to_the_worker(tmp_path: Path) -> None:
    script = tmp_path / "user_script.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SELECTED ['MainBackend']" in proc.stdout
    assert "cannot be sent to a worker" not in proc.stderr


HANGING_SCRIPT = """
import sys, torch, honed
from honed.backend import Backend

class Hang(Backend):
    building = sys.argv[2]  # a class attribute travels to the worker with the class

    def build(self, module, example_inputs):
        import pathlib, time
        pathlib.Path(self.building).touch()  # the test waits for this: the build has begun
        time.sleep(3600)

model = honed.Module(torch.nn.Linear(4, 4).eval(), "m")
with honed.config.patch(cache_enabled=False):
    honed.tune(model, [torch.randn(2, 4)], strategy=honed.OneBackendStrategy(Hang()))
honed.save(model, sys.argv[1])
"""


def _workers(parent: int) -> set[int]:
    """Live honed worker processes whose parent is ``parent``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
                status = (entry / "status").read_text()
            except OSError:
                continue
            ppid = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")), "")
            if b"honed.pipeline._worker" in cmdline and ppid == str(parent):
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in state  # a zombie has ended


def test_ctrl_c_stops_the_tune_leaving_no_worker_and_no_artifact(tmp_path: Path) -> None:
    artifact = tmp_path / "never.honed"
    script = tmp_path / "hang.py"
    script.write_text(HANGING_SCRIPT)
    building = tmp_path / "building"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(artifact), str(building)],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
    )
    workers = _poll(lambda: _workers(proc.pid), within_s=120)
    assert workers, "no worker started"
    assert _poll(building.exists, within_s=120), "the worker never reached its hanging build"
    os.kill(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in stderr
    assert _poll(lambda: not [pid for pid in workers if _alive(pid)], within_s=10), (
        "a worker outlived the tune"
    )
    assert sorted(tmp_path.iterdir()) == sorted([script, building])


def _poll(check: Callable[[], Any], within_s: float) -> Any:
    """``check()``'s first truthy value, polled until the deadline; its last value after it."""
    deadline = time.monotonic() + within_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return value
