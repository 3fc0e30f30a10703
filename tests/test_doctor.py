"""tests/test_doctor.py: `honed doctor`: JSON schema, exit status, broken packages, the seed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import honed
from honed import _core
from honed.cli import doctor, main

from conftest import TinyMLP, batches

pytestmark = pytest.mark.integration  # most run `honed doctor` or import probes in new processes

REGISTER_CONSTANT_ERROR = (
    "AttributeError: module 'torch.utils._pytree' has no attribute 'register_constant'"
)


def honed_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "honed.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def fake_package(root: Path, name: str, version: str, body: str) -> None:
    """A package `name` whose import runs `body`, with metadata naming its version."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(body)
    dist_info = root / f"{name}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )


@pytest.fixture(scope="module")
def probes_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("probes")


@pytest.fixture
def probes_remembered(private_cache: None, probes_folder: Path) -> Iterator[None]:
    """One cache folder for this file's in-process diagnoses, so the optional packages' imports
    (a new interpreter each, torchao's importing torch) are probed once, then remembered as
    `honed doctor` does (test_good_imports_are_remembered_and_failures_probed_again checks that
    part, with a folder of its own)."""
    with honed.config.patch(cache_dir=probes_folder):
        yield


@pytest.fixture(scope="module")
def broken_packages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """torchao raising the seed's error, onnx crashing on import, onnxruntime hanging."""
    root = tmp_path_factory.mktemp("site")
    fake_package(
        root,
        "torchao",
        "0.13.0",
        "raise AttributeError(\"module 'torch.utils._pytree' has no attribute "
        "'register_constant'\")\n",
    )
    fake_package(
        root, "onnx", "1.17.0", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
    )
    fake_package(root, "onnxruntime", "1.20.0", "import time\ntime.sleep(60)\n")
    pythonpath = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=pythonpath, HONED_DOCTOR_IMPORT_TIMEOUT_S="1.5")


@pytest.fixture(scope="module")
def broken_report(broken_packages: dict[str, str]) -> tuple[int, dict[str, Any]]:
    proc = honed_cli("doctor", "--json", env=broken_packages)
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.usefixtures("probes_remembered")
def test_json_schema_and_exit_status_on_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert set(report) == {
        "ok",
        "device",
        "problems",
        "warnings",
        "honed",
        "python",
        "platform",
        "driver",
        "gpus",
        "torch",
        "driver_diagnosis",
        "packages",
        "backends",
    }
    assert report["device"] == "cpu"
    assert report["ok"] is True and report["problems"] == []
    assert status == 0
    assert set(report["driver"]) == {"loaded", "error", "version", "cuda_version", "cuda"}
    assert report["torch"]["version"] == torch.__version__
    assert report["torch"]["cuda"] == torch.version.cuda
    assert report["torch"]["cuda_available"] == torch.cuda.is_available()
    assert set(report["driver_diagnosis"]) == {"ok", "message", "fix"}
    names = [p["name"] for p in report["packages"]]
    assert names == [name for name, _dists, _use in doctor.OPTIONAL_PACKAGES]
    numpy_row = report["packages"][names.index("numpy")]
    import numpy

    assert numpy_row == {
        "name": "numpy",
        "installed": True,
        "version": numpy.__version__,
        "imports": True,
        "error": None,
    }
    backends = {b["name"]: b for b in report["backends"]}
    assert backends["TorchEagerBackend"]["available"] is True
    assert set(backends["TorchEagerBackend"]) == {"name", "available", "reason", "fix"}
    for gpu in report["gpus"]:
        assert set(gpu) == {"index", "name", "compute_capability", "total_memory_bytes"}
    if not report["driver"]["loaded"]:
        assert report["driver"]["cuda_version"] == 0 and report["gpus"] == []
        assert "could not be loaded" in report["driver"]["error"]


@pytest.mark.usefixtures("probes_remembered")
@pytest.mark.skipif(torch.version.cuda is not None, reason="needs a CPU-only torch build")
def test_cpu_build_diagnosis() -> None:
    report = doctor.diagnose("cpu")
    assert report.driver_diagnosis["ok"] is False
    assert report.driver_diagnosis["message"] == f"torch {torch.__version__} is a CPU-only build"
    assert "install" in report.driver_diagnosis["fix"]


@pytest.mark.usefixtures("probes_remembered")
@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA works here")
def test_cuda_exits_1_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--device", "cuda", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["device"] == "cuda"
    assert report["problems"]
    assert all(". Fix: " in p for p in report["problems"])
    joined = "\n".join(report["problems"])
    if torch.version.cuda is None:
        assert f"torch {torch.__version__} is a CPU-only build" in joined
    if not report["driver"]["loaded"]:
        assert "no NVIDIA driver" in joined


@pytest.mark.usefixtures("probes_remembered")
def test_readable_report_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "honed doctor (cpu)" in out
    assert "TorchEagerBackend" in out
    assert "ok: honed can run on cpu here" in out
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    assert "honed doctor --device cuda --json" in help_text
    assert "honed demo --device cuda" in help_text


def test_torchao_failing_to_import_is_a_diagnosis(
    broken_report: tuple[int, dict[str, Any]],
) -> None:
    status, report = broken_report
    assert status == 0  # the CPU path still runs
    torchao = next(p for p in report["packages"] if p["name"] == "torchao")
    assert torchao == {
        "name": "torchao",
        "installed": True,
        "version": "0.13.0",
        "imports": False,
        "error": REGISTER_CONSTANT_ERROR,
    }
    expected = f"torchao 0.13.0 fails to import with torch {torch.__version__}: " + (
        REGISTER_CONSTANT_ERROR
    )
    warning = next(w for w in report["warnings"] if w.startswith("torchao"))
    assert warning.startswith(expected + ". Fix: install the torchao release made for torch ")
    assert warning.endswith("or pip uninstall torchao; honed skips what needs it")


def test_crashing_and_hanging_imports_are_diagnoses(
    broken_report: tuple[int, dict[str, Any]],
) -> None:
    _, report = broken_report
    packages = {p["name"]: p for p in report["packages"]}
    assert packages["onnx"]["imports"] is False
    assert packages["onnx"]["error"] == "crashed: segmentation fault (SIGSEGV)"
    assert packages["onnxruntime"]["imports"] is False
    assert packages["onnxruntime"]["error"] == "killed after the 1.5 s timeout"
    warnings = "\n".join(report["warnings"])
    assert f"onnx 1.17.0 crashes on import with torch {torch.__version__}" in warnings
    assert f"onnxruntime 1.20.0 hangs on import with torch {torch.__version__}" in warnings


def test_honed_imports_next_to_a_broken_torchao(broken_packages: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import honed, honed.cli.doctor; print(honed.__version__)"],
        capture_output=True,
        text=True,
        env=broken_packages,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == honed.__version__


def test_readable_report_names_the_broken_torchao(broken_packages: dict[str, str]) -> None:
    proc = honed_cli("doctor", env=broken_packages)
    assert proc.returncode == 0
    out = " ".join(proc.stdout.split())
    assert f"warning: torchao 0.13.0 fails to import with torch {torch.__version__}" in out
    assert "register_constant" in out


def test_seed_driver_diagnosis() -> None:
    d = _core.diagnose_driver(12080, "2.11.0+cu130", "13.0")
    assert d.ok is False
    assert d.message == "this driver supports CUDA 12.8; torch 2.11.0+cu130 needs 13.0"
    assert d.fix == (
        "install a +cu128 build of torch "
        "(pip install torch --index-url https://download.pytorch.org/whl/cu128) "
        "or update the NVIDIA driver"
    )
    assert _core.cuda_version_string(12080) == "12.8"
    assert _core.parse_cuda_version("13.0") == 13000


def test_seed_machine_gives_one_problem_with_the_fix() -> None:
    """The seed's RTX 3090: driver for CUDA 12.8, torch 2.11.0+cu130 that cannot start CUDA."""
    gpu = SimpleNamespace(index=0, name="NVIDIA GeForce RTX 3090", cc_major=8, cc_minor=6)
    probe = SimpleNamespace(driver_loaded=True, error="", driver_cuda_version=12080, gpus=[gpu])
    warning = (
        "CUDA initialization: The NVIDIA driver on your system is too old (found version 12080)."
    )
    torch_info = {
        "version": "2.11.0+cu130",
        "cuda": "13.0",
        "cuda_available": False,
        "cuda_warning": warning,
    }
    diag = _core.diagnose_driver(12080, "2.11.0+cu130", "13.0")
    problems = doctor._cuda_problems(probe, torch_info, diag)
    assert problems == [
        "this driver supports CUDA 12.8; torch 2.11.0+cu130 needs 13.0 "
        f"(torch says: {warning}). Fix: install a +cu128 build of torch "
        "(pip install torch --index-url https://download.pytorch.org/whl/cu128) "
        "or update the NVIDIA driver"
    ]


@pytest.mark.usefixtures("probes_remembered")
def test_diagnose_api() -> None:
    report = doctor.diagnose()
    assert report.ok and report.problems == []
    assert json.loads(json.dumps(report.to_dict()))["ok"] is True
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        doctor.diagnose("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine where CUDA cannot start")
def test_tune_on_cuda_without_cuda_stops_with_the_diagnosis() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    with pytest.raises(honed.TuneError) as info:
        honed.tune(model, batches(2), device="cuda")
    message = str(info.value)
    assert "never falls back to the CPU silently" in message
    assert "CPU-only build" in message or "no NVIDIA driver" in message
    assert "honed doctor --device cuda" in message


@pytest.mark.usefixtures("probes_remembered")
def test_cuda_problems_are_what_diagnose_says_of_cuda() -> None:
    """The device's own check is the CUDA part of the full diagnosis: its lines come first in
    diagnose("cuda")'s problems, word for word ([] where CUDA runs)."""
    problems = doctor.cuda_problems()
    assert doctor.diagnose("cuda").problems[: len(problems)] == problems
    assert bool(problems) == (not torch.cuda.is_available())


@pytest.fixture
def no_package_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA taken away, and the optional packages' and backends' probes made to fail: a check
    of the device alone never reaches them."""

    def probed(*_: Any, **__: Any) -> Any:
        raise AssertionError("the packages and backends were probed for a device check")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(doctor, "_probe_packages", probed)
    monkeypatch.setattr(doctor, "_backends", probed)


@pytest.mark.usefixtures("no_package_probes")
def test_a_cuda_device_that_cannot_run_is_refused_without_probing_the_packages() -> None:
    """`--device cuda` and tune(device="cuda") where CUDA cannot run say why at once: the
    driver and torch's build, not seconds of importing every backend's packages first."""
    from honed.cli.model_commands import check_device
    from honed.errors import ConfigError

    why = doctor.cuda_problems()
    with pytest.raises(ConfigError) as cli:
        check_device("cuda")
    assert "--device cuda: CUDA cannot run here (" in str(cli.value)
    assert (why[0].split(". Fix:")[0] if why else "is_available() is False") in str(cli.value)
    with pytest.raises(honed.TuneError) as api:
        honed.tune(honed.Module(TinyMLP().eval(), "m"), batches(2), device="cuda")
    assert "never falls back to the CPU silently" in str(api.value)
    assert all(line in str(api.value) for line in why)


@pytest.mark.usefixtures("probes_remembered")
@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here"
)
def test_tensorrt_backends_are_listed_unavailable_with_reason_and_fix() -> None:
    report = doctor.diagnose("cpu")
    rows = {b["name"]: b for b in report.backends}
    for name in ("TensorRTBackend", "TorchTensorRTJitBackend", "TorchTensorRTAotBackend"):
        assert rows[name]["available"] is False
        assert rows[name]["reason"] and rows[name]["fix"]
    assert rows["TensorRTBackend"]["reason"] == "TensorRT is not installed"
    assert "pip install tensorrt" in rows["TensorRTBackend"]["fix"]
    if importlib.util.find_spec("torch_tensorrt") is None:
        minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
        assert rows["TorchTensorRTAotBackend"]["reason"] == "Torch-TensorRT is not installed"
        assert f"torch-tensorrt=={minor}.*" in rows["TorchTensorRTAotBackend"]["fix"]
    assert report.ok  # none of them blocks the CPU path


def test_broken_torchao_makes_only_the_torchao_backend_unavailable(
    broken_report: tuple[int, dict[str, Any]],
) -> None:
    _, report = broken_report
    rows = {b["name"]: b for b in report["backends"]}
    assert rows["TorchAOBackend"]["available"] is False
    assert "register_constant" in rows["TorchAOBackend"]["reason"]
    assert rows["TorchInductorBackend"]["available"] is True


def test_good_imports_are_remembered_and_failures_probed_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = doctor._probe_package
    probed: list[str] = []

    def probe(name: str, dists: tuple[str, ...]) -> tuple[doctor.PackageStatus, str]:
        probed.append(name)
        if name == "numpy":  # numpy "fails" this time: never remembered
            return doctor.PackageStatus(name, True, "1.0", False, "ImportError: no"), "fails"
        return real(name, dists)

    monkeypatch.setattr(doctor, "_probe_package", probe)
    installed = [n for n, _, _ in doctor.OPTIONAL_PACKAGES if importlib.util.find_spec(n)]
    first = doctor.diagnose("cpu")
    assert sorted(probed) == sorted(installed)
    probed.clear()
    second = doctor.diagnose("cpu")
    assert probed == ["numpy"]
    assert [p.imports for p in first.packages] == [p.imports for p in second.packages]
    probed.clear()
    doctor.diagnose("cpu", fresh=True)
    assert sorted(probed) == sorted(installed)


def test_doctor_prints_no_third_party_warnings() -> None:
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "honed"), "doctor", "--fresh"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0
    assert proc.stderr == ""
    assert "honed doctor (cpu)" in proc.stdout
