"""tests/test_machine.py: the machine a tune measures on: the busy check (named at the start and in
every report format), the machine section of reports and artifacts, the CPU thread count."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

import honed
from honed import _core
from honed.backend import Backend, Sample
from honed.pipeline import machine
from honed.report import TuneReport

from conftest import TinyMLP, batches

# The compatibility fingerprint's keys: the machine section is beside it, never in it.
FINGERPRINT_KEYS = {
    "honed",
    "torch",
    "torch_cuda",
    "python",
    "platform",
    "cpu",
    "device",
    "gpu",
    "compute_capability",
}


class SameWork(Backend):
    """A candidate that runs exactly the work eager runs."""

    portability = 1

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class CountsThreads(Backend):
    """Records the torch thread count each time it runs."""

    seen: ClassVar[list[int]] = []

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            CountsThreads.seen.append(torch.get_num_threads())
            return module(*args, **kwargs)

        return run


def _tune(**patch: Any) -> tuple[honed.Module, TuneReport]:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    with honed.config.patch(**patch):
        return model, honed.tune(model, batches(4, 8), strategy=strategy)


# -- the verdict -------------------------------------------------------------------------------
def test_the_engine_weighs_the_load_signals() -> None:
    quiet = _core.LoadSignals([0.5] * 40, 0.5, 8, 0)
    verdict = _core.assess_load(quiet)
    assert not verdict.busy and verdict.summary.startswith("quiet (")
    loaded = _core.LoadSignals([0.5, 0.5, 2.0] * 20, 18.6, 2, 1)
    verdict = _core.assess_load(loaded)
    assert verdict.busy
    assert verdict.reasons == [
        "CPU calibration 2.00x slower than its fastest chunk",
        "load average 18.6 on 2 CPUs",
        "1 other process on the GPU",
    ]
    # The limits are the caller's (honed.config.busy_slowdown, busy_load_per_cpu).
    assert not _core.assess_load(_core.LoadSignals([0.5, 0.5, 2.0] * 20, 3.0, 2), 5.0, 2.0).busy
    assert not _core.probe_gpu_details("0", "libnvidia-ml-missing.so.1").nvml


def test_a_busy_machine_is_named_at_the_start_and_in_every_format(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Thresholds no machine passes: the calibration is never faster than its fastest chunk.
    timings = {"TorchEagerBackend": [2.0], "SameWork": [2.0]}
    with caplog.at_level(logging.WARNING, logger="honed"):
        _, report = _tune(busy_slowdown=0.5, busy_load_per_cpu=0.0, injected_latencies=timings)
    starts = [r.getMessage() for r in caplog.records if "this machine is busy" in r.getMessage()]
    assert len(starts) == 1 and "CPU calibration" in starts[0]
    assert report.machine["busy"] is True
    assert report.busy.startswith("busy: CPU calibration ")
    assert f"**busy machine:** {report.busy}" in report.to_markdown()
    assert "busy machine:" in report.to_html() and report.busy in report.to_html()
    assert json.loads(report.to_json())["machine"]["busy"] is True
    assert "busy machine: busy: CPU calibration" in report.render(width=200)


def test_a_quiet_machine_is_not_called_busy(caplog: pytest.LogCaptureFixture) -> None:
    timings = {"TorchEagerBackend": [2.0], "SameWork": [2.0]}
    with caplog.at_level(logging.WARNING, logger="honed"):
        _, report = _tune(busy_slowdown=1e9, busy_load_per_cpu=1e9, injected_latencies=timings)
    assert "busy" not in caplog.text
    assert report.machine["busy"] is False and report.busy == ""
    assert report.machine["load"].startswith("quiet (CPU calibration ")
    assert "busy machine" not in report.to_markdown() + report.to_html() + report.render(200)


def test_wait_for_quiet_gives_up_after_its_time(caplog: pytest.LogCaptureFixture) -> None:
    with (
        honed.config.patch(busy_slowdown=0.5, wait_for_quiet_s=0.2),
        caplog.at_level(logging.INFO, logger="honed"),
    ):
        section = machine.start_of_tune(torch.device("cpu"))
    assert section["busy"] is True
    assert "waiting up to 0.2 s for a quiet machine (busy: CPU calibration" in caplog.text


# -- a really loaded machine -------------------------------------------------------------------
@pytest.fixture
def loaded_cpu() -> Iterator[Any]:
    """Busy processes on every CPU (twice over) until the check calls the machine busy."""
    cpus = int(machine.cpu().logical_cpus)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * cpus)]
    try:
        deadline = time.monotonic() + 60
        verdict = machine.check_load(torch.device("cpu"))
        while not verdict.busy and time.monotonic() < deadline:  # poll: no fixed sleep
            verdict = machine.check_load(torch.device("cpu"))
        assert verdict.busy, f"{2 * cpus} busy processes never showed: {verdict.summary}"
        yield verdict
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


@pytest.mark.serial  # its busy processes on every CPU would slow the tests running beside it
def test_under_real_load_eager_keeps_its_place_and_the_report_says_busy(loaded_cpu: Any) -> None:
    for _ in range(3):
        _, report = _tune()
        g = report.graphs[0]
        assert g.selected == "TorchEagerBackend", g.decision
        assert report.machine["busy"] is True and report.busy.startswith("busy: ")
        assert "busy machine:" in report.to_markdown()


# -- the machine section and the thread count --------------------------------------------------
def test_the_machine_section_describes_the_cpu_and_the_threads(tmp_path: Path) -> None:
    model, report = _tune(injected_latencies={"TorchEagerBackend": [2.0], "SameWork": [2.0]})
    section = report.machine
    info = _core.probe_cpu()
    assert section["cpu_model"] == (info.model or None)
    assert section["physical_cores"] == info.physical_cores >= 1
    assert section["logical_cpus"] == info.logical_cpus >= section["physical_cores"]
    assert section["torch_threads"] == info.physical_cores
    assert section["torch_threads_source"] == "physical cores"
    assert "gpu" not in section  # measured on the CPU
    md = report.to_markdown()
    assert "## Machine" in md and f"| torch_threads | {info.physical_cores} |" in md
    path = honed.save(model, tmp_path / "m.honed")
    with zipfile.ZipFile(path) as zf:
        manifest = json.loads(zf.read("manifest.json"))
    assert manifest["machine"] == section
    assert set(manifest["environment"]) == FINGERPRINT_KEYS
    assert honed.report.load_report(path).machine == section


def test_cpu_candidates_are_measured_with_the_stated_threads() -> None:
    torch.set_num_threads(2)
    model = honed.Module(TinyMLP().eval(), "m")
    CountsThreads.seen = []
    with honed.config.patch(cpu_threads=1):
        report = honed.tune(
            model, batches(4, 8), strategy=honed.OneBackendStrategy(CountsThreads())
        )
    assert CountsThreads.seen and CountsThreads.seen[-1] == 1  # the measurement's calls
    assert torch.get_num_threads() == 2  # restored afterwards
    assert report.machine["torch_threads"] == 1
    assert report.machine["torch_threads_source"] == "HONED_CPU_THREADS"


@pytest.mark.gpu
def test_the_machine_section_describes_the_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval().cuda(), "m")
    strategy = honed.MaxThroughputStrategy([honed.backend.TorchEagerBackend(), SameWork()])
    report = honed.tune(model, [x.cuda() for x in batches(4, 8)], strategy=strategy)
    section = report.machine
    assert section["gpu"] == torch.cuda.get_device_name()
    assert section["gpu_driver"]  # NVML ships with the driver
    assert section["gpu_max_sm_clock_mhz"] > 0 and section["gpu_power_limit_w"] > 0
    assert section["gpu_shared"] in (True, False)
    assert section["torch_threads_source"] == "torch default (GPU measurement)"
    print(json.dumps(section, indent=2))


# -- beside a JIT program ----------------------------------------------------------------------
@pytest.fixture
def beside_a_program() -> Iterator[None]:
    """The courtesy probe JIT sets: a program's calls run in this process."""
    from honed.pipeline import courtesy

    courtesy.watch(lambda: False)
    try:
        yield
    finally:
        courtesy.watch(None)


def _counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    calls: list[Any] = []
    real = getattr(machine._core, name)
    monkeypatch.setattr(machine._core, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


def test_beside_a_program_the_check_spins_no_calibration(
    monkeypatch: pytest.MonkeyPatch, beside_a_program: None, caplog: pytest.LogCaptureFixture
) -> None:
    """JIT's thread measures nothing, and a calibration spinning beside the program's calls
    slowed them: beside a program the section says the load was checked without one."""
    calibrations = _counting(monkeypatch, "calibrate_cpu")
    with caplog.at_level(logging.INFO, logger="honed"):
        section = machine.start_of_tune(torch.device("cpu"))
    assert calibrations == []
    assert "CPU calibration" not in section["load"]
    assert section["calibration_slowdown"] is None
    assert section["load_checked"].startswith("beside the program")
    assert caplog.text == ""  # the program's output is left alone


def test_beside_a_program_the_gpus_other_processes_are_counted_once(
    monkeypatch: pytest.MonkeyPatch, beside_a_program: None
) -> None:
    """Counting them reads the children of every thread of the process, beside the program's
    calls: the load verdict and the machine section share one count."""
    gpu = SimpleNamespace(
        processes_known=True,
        process_pids=[],
        name="a GPU",
        driver_version="1.0",
        sm_clock_mhz=-1,
        max_sm_clock_mhz=-1,
        mem_clock_mhz=-1,
        power_limit_w=-1,
        nvml=True,
    )
    monkeypatch.setattr(machine, "_gpu", lambda device, fresh=True: gpu)
    reads: list[int] = []
    real = machine._own_pids
    monkeypatch.setattr(machine, "_own_pids", lambda: reads.append(1) or real())
    section = machine.start_of_tune(torch.device("cpu"))
    assert reads == [1]
    assert section["gpu"] == "a GPU" and section["gpu_other_processes"] == 0
    assert section["gpu_shared"] is False


def test_without_a_program_the_check_calibrates(monkeypatch: pytest.MonkeyPatch) -> None:
    calibrations = _counting(monkeypatch, "calibrate_cpu")
    section = machine.start_of_tune(torch.device("cpu"))
    assert len(calibrations) == 1 and section["calibration_slowdown"] >= 1.0
    assert "load_checked" not in section


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_tune_probes_the_gpu_once_and_beside_a_program_not_at_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NVML's probe slowed a JIT program's calls beside it: JIT probes in its first call
    (``machine.prepare``) and its tunes reuse that; a tune without a program probes once."""
    from honed.pipeline import courtesy

    device = torch.device("cuda", torch.cuda.current_device())
    probes = _counting(monkeypatch, "probe_gpu_details")
    section = machine.start_of_tune(device)
    assert len(probes) == 1 and section["gpu"]
    machine._PROBED.clear()
    machine.prepare(device)
    assert len(probes) == 2
    courtesy.watch(lambda: False)
    try:
        beside = machine.start_of_tune(device)
    finally:
        courtesy.watch(None)
    assert len(probes) == 2  # none beside the program
    assert beside["gpu"] == section["gpu"] and beside["gpu_driver"] == section["gpu_driver"]


def test_own_processes_include_children_started_by_any_thread() -> None:
    """The pool starts its workers from threads of its own: their children count as ours."""
    import os
    import threading

    from honed.pipeline import machine

    started: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "5"])))
    thread.start()
    thread.join()
    try:
        pids = machine._own_pids()
        assert pids[0] == os.getpid() and started[0].pid in pids
    finally:
        started[0].kill()
        started[0].wait()
