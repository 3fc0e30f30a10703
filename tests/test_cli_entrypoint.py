"""tests/test_cli_entrypoint.py: the real `honed` command: one-line errors, exit codes and flags.

Every test runs the installed console script (``.venv/bin/honed``) in a subprocess, on tiny
models, eager or one candidate, isolation none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import honed
from honed.artifact import read_artifact

from conftest import interruptible

# Every test here runs the real honed command in a new process: the integration tier.
pytestmark = pytest.mark.integration

HONED = str(Path(sys.executable).parent / "honed")

MODELS = """
import torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))
"""

ENTRIES = """
import sys, time
import torch
import honed
from models import Tiny  # a module beside this file, as `python entries.py` would find it

def build():
    torch.manual_seed(0)
    return Tiny().eval(), [torch.randn(b, 8) for b in (2, 4)]

def boom():
    raise ValueError("the data folder is missing")

class Hang(honed.backend.Backend):
    def build(self, module, example_inputs):
        print("BUILDING", file=sys.stderr, flush=True)
        time.sleep(600)  # interrupted by the test's SIGINT

def hang():
    return Tiny().eval(), [torch.randn(2, 8)], {"strategy": honed.OneBackendStrategy(Hang())}
"""


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """A folder with entries.py importing models.py beside it; the tests run from elsewhere."""
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "entries.py").write_text(ENTRIES)
    (tmp_path / "broken.py").write_text("def build(:\n    pass\n")
    (tmp_path / "run").mkdir()
    return tmp_path


def honed_cli(*argv: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [HONED, *argv],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "HONED_PROGRESS": "off", **env},
        timeout=300,
    )


def one_line(proc: subprocess.CompletedProcess[str], code: int, *parts: str) -> str:
    """The command exited with ``code`` and said one line on stderr holding ``parts``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]


def test_version() -> None:
    proc = honed_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"honed {honed.__version__}"


@pytest.mark.parametrize(
    ("variable", "value"),
    [("HONED_LOG_LEVEL", "garbage"), ("HONED_WINDOW_MS", "inf"), ("HONED_MAX_WINDOWS", "0")],
)
def test_a_bad_environment_variable_is_one_line_and_exit_2(variable: str, value: str) -> None:
    one_line(honed_cli("report", "x.honed", **{variable: value}), 2, f"{variable}={value!r}")


def test_an_entry_that_raises_or_does_not_parse_is_one_line(work: Path) -> None:
    line = one_line(
        honed_cli("tune", str(work / "entries.py:boom")),
        2,
        "ValueError: the data folder is missing",
    )
    assert "entries.py:" in line and "--traceback" in line
    one_line(honed_cli("inspect", str(work / "broken.py:build")), 2, "syntax error", "line 1")
    traced = honed_cli("tune", str(work / "entries.py:boom"), "--traceback")
    assert traced.returncode != 0 and "Traceback" in traced.stderr
    assert 'raise ValueError("the data folder is missing")' in traced.stderr


def test_bad_devices_are_one_line(work: Path) -> None:
    one_line(
        honed_cli("tune", str(work / "entries.py:build"), "--device", "quantum"),
        2,
        "--device 'quantum' is not a device",
    )
    if not torch.cuda.is_available():
        one_line(
            honed_cli("tune", str(work / "entries.py:build"), "--device", "cuda"),
            2,
            "CUDA cannot run here",
            "honed doctor --device cuda",
        )
        one_line(honed_cli("demo", "--device", "cuda"), 2, "CUDA cannot run here")


def test_dry_run_imports_the_entry_beside_its_models_and_tunes_nothing(work: Path) -> None:
    proc = honed_cli("tune", str(work / "entries.py:build"), "--dry-run", cwd=work / "run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # no third-party warnings either
    text = proc.stdout
    tried, _, skipped = text.partition("not tried:")
    assert "would try:" in tried and "TorchEagerBackend" in tried
    assert "TorchInductorBackend" in tried
    assert "TensorRTBackend" in skipped and "unavailable: " in skipped
    assert not list((work / "run").iterdir())  # nothing saved


def test_tune_refuses_to_overwrite_without_force_and_saves_shapes(work: Path) -> None:
    out = work / "run" / "tiny.honed"
    out.write_bytes(b"the user's file")
    argv = [str(work / "entries.py:build"), "--backend", "TorchEagerBackend", "--isolation"]
    argv += ["none", "--no-cache", "--out", str(out)]
    one_line(honed_cli("tune", *argv), 2, f"{out} exists; pass --force")
    assert out.read_bytes() == b"the user's file"

    proc = honed_cli("tune", *argv, "--force", "--shapes", "x:1x8/4x8/16x8", "--batch-sizes", "3")
    assert proc.returncode == 0, proc.stderr
    manifest, _ = read_artifact(out)
    (graph,) = manifest["modules"][0]["graphs"]
    assert (graph["profile"]["min_batch"], graph["profile"]["max_batch"]) == (1, 16)
    assert "tuned graph fixes" not in proc.stderr  # several shapes: no fixed-shape warning


def test_bad_shape_flags_are_one_line(work: Path) -> None:
    entry = str(work / "entries.py:build")
    one_line(
        honed_cli("tune", entry, "--shapes", "x:1x8/4x8"), 2, "--shapes x:1x8/4x8", "MIN/OPT/MAX"
    )
    one_line(honed_cli("tune", entry, "--batch-sizes", "0,8"), 2, "--batch-sizes '0,8'")


def test_ctrl_c_is_one_line_exit_130_and_saves_nothing(work: Path) -> None:
    out = work / "run" / "hang.honed"
    proc = subprocess.Popen(
        [HONED, "tune", str(work / "entries.py:hang"), "--isolation", "none", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HONED_PROGRESS": "off"},
        preexec_fn=interruptible,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # the candidate's build has started
        if "BUILDING" in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.strip() == "honed tune: interrupted; nothing saved"
    assert not out.exists()


def _untuned_artifact(path: Path) -> Path:
    honed.save(honed.Module(torch.nn.Linear(2, 2), "plain"), path)
    return path


def test_report_of_an_untuned_artifact_says_never_tuned(tmp_path: Path) -> None:
    art = _untuned_artifact(tmp_path / "plain.honed")
    one_line(honed_cli("report", str(art)), 2, "'plain' never tuned")


def test_report_out_to_a_folder_is_one_line(tmp_path: Path) -> None:
    one_line(
        honed_cli("report", str(tmp_path / "any.honed"), "--out", str(tmp_path)),
        2,
        "is a folder",
    )


class FakeOnnx(honed.backend.Backend):
    """Stores a payload named like ONNXRuntimeBackend's (the export only copies bytes)."""

    saves_payload = True

    def build(self, module: torch.nn.Module, example_inputs: list[Any]) -> Any:
        return module

    def export_payload(self, fn: Any) -> dict[str, bytes]:
        return {"model.onnx": b"onnx bytes", "calling.json": b"{}"}


def test_export_writes_the_payload_or_names_what_the_artifact_has(tmp_path: Path) -> None:
    model = honed.Module(torch.nn.Linear(8, 2).eval(), "lin")
    with honed.config.patch(isolation="none"):
        honed.tune(
            model,
            [torch.randn(b, 8) for b in (1, 2)],
            strategy=honed.OneBackendStrategy(FakeOnnx()),
        )
    art = honed.save(model, tmp_path / "lin.honed")
    out = tmp_path / "model.onnx"
    proc = honed_cli("export", str(art), "--format", "onnx", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes() == b"onnx bytes"
    one_line(honed_cli("export", str(art), "--format", "onnx", "--out", str(out)), 2, "--force")
    one_line(
        honed_cli("export", str(art), "--format", "plan", "--out", str(tmp_path / "m.plan")),
        2,
        "no plan payload",
        "module 'lin' graph 0: test_cli_entrypoint.FakeOnnx (onnx)",
    )
    untuned = _untuned_artifact(tmp_path / "plain.honed")
    one_line(
        honed_cli("export", str(untuned), "--format", "pt2", "--out", str(tmp_path / "m.pt2")),
        2,
        "never tuned",
    )


def _subparsers() -> dict[str, Any]:
    import argparse

    from honed.cli import _parser

    parser = _parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_flag_of_every_command_has_help() -> None:
    for name, parser in _subparsers().items():
        for action in parser._actions:
            assert action.help, f"honed {name} {action.option_strings or action.dest}: no help"


def test_subcommand_help_has_its_own_examples_not_the_global_ones() -> None:
    from honed.cli import EXAMPLES

    global_only = "honed report demo.honed      the tuning report stored in an artifact"
    assert global_only in EXAMPLES
    for name, parser in _subparsers().items():
        text = parser.format_help()
        assert global_only not in text, name
        assert "examples:" in text and f"honed {name}" in text, name
    proc = honed_cli("inspect", "--help")
    assert proc.returncode == 0
    words = " ".join(proc.stdout.split())  # help text wraps at the terminal's width
    assert "--max-depth N" in words and "0: the model only" in words
    assert global_only not in proc.stdout


@pytest.mark.slow
def test_an_exported_onnx_model_runs_in_onnxruntime(tmp_path: Path) -> None:
    if not honed.backend.ONNXRuntimeBackend.available():
        pytest.skip("ONNX Runtime is not available here")
    import onnxruntime

    model = honed.Module(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval(), "m")
    backend = honed.backend.ONNXRuntimeBackend()
    with honed.config.patch(isolation="none"):
        honed.tune(
            model, [torch.randn(b, 8) for b in (2, 4)], strategy=honed.OneBackendStrategy(backend)
        )
    art = honed.save(model, tmp_path / "m.honed")
    out = tmp_path / "m.onnx"
    proc = honed_cli("export", str(art), "--format", "onnx", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    session = onnxruntime.InferenceSession(str(out))
    x = torch.randn(3, 8)
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        assert torch.allclose(torch.from_numpy(got), model.module(x), atol=1e-5)
