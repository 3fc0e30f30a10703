"""tests/test_cli.py: `honed demo`, `honed tune | inspect | bench` on entry points, and --help."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import honed
import honed.demo
from honed.cli import main
from honed.cli.model_commands import parse_backend, parse_strategy
from honed.errors import ConfigError


@pytest.mark.integration
def test_help_shows_examples() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "honed.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "honed demo --device cuda" in out


@pytest.mark.integration
def test_demo_prints_the_table_and_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The demo's own flow on a smaller DemoNet with one compiled candidate: the whole default
    # set is tuned by the README's quick start (tests/test_docs.py) and by `make demo`.
    inductor = honed.backend.TorchInductorBackend()
    monkeypatch.setattr(
        honed.tune_strategy, "default_backends", lambda device, graph=None: [inductor]
    )
    monkeypatch.setattr(honed.demo, "DemoNet", functools.partial(honed.demo.DemoNet, depth=2))
    assert main(["demo", "--out", str(tmp_path / "demo.honed")]) == 0
    out = capsys.readouterr().out
    assert "TorchEagerBackend (baseline)" in out
    assert "TorchInductorBackend" in out
    assert "decision:" in out
    assert "outputs match" in out
    assert (tmp_path / "demo.honed").is_file()


MODELS = """
import torch

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))

def build():
    torch.manual_seed(0)
    return Tiny().eval(), [torch.randn(b, 8) for b in (2, 4)], {"batch_sizes": [8]}

def single():
    return torch.nn.Linear(2, 2)

def needs_arg(n):
    return None

not_a_function = 3
"""


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


@pytest.mark.integration
def test_every_subcommand_help_shows_examples() -> None:
    for command, example in [
        ("tune", "honed tune honed.demo:entry --backend TorchInductorBackend:mode=max-autotune"),
        ("inspect", "honed inspect honed.demo:entry"),
        ("bench", "honed bench demo.honed --entry honed.demo:entry"),
    ]:
        out = subprocess.run(
            [sys.executable, "-m", "honed.cli", command, "--help"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "examples:" in out and example in out, command


def test_tune_from_a_file_entry_saves_an_artifact_that_loads(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.honed"
    argv = ["tune", f"{models}:build", "--isolation", "none", "--no-cache", "--out", str(out)]
    assert main([*argv, "--backend", "TorchEagerBackend:autocast_enabled=False"]) == 0
    printed = capsys.readouterr().out
    assert "TorchEagerBackend (baseline)" in printed
    assert "decision:" in printed and f"saved {out}" in printed
    manifest, _ = honed.artifact.read_artifact(out)
    assert [m["name"] for m in manifest["modules"]] == ["build"]  # the function's name

    import importlib.util

    spec = importlib.util.spec_from_file_location("models_check", models)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    trained, data, _ = mod.build()
    torch.manual_seed(5)  # other weights: load must bring the tuned ones back
    fresh = honed.Module(mod.Tiny().eval(), "build")
    honed.load(fresh, out)
    with torch.no_grad():
        assert torch.allclose(fresh(data[1]), trained(data[1]))


def test_tune_time_budget_flag_leaves_the_rest_not_tried(
    models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.honed"
    argv = ["tune", f"{models}:build", "--isolation", "none", "--no-cache", "--out", str(out)]
    argv += ["--backend", "TorchEagerBackend:autocast_enabled=True", "--time-budget", "0.001"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "not tried: budget: the 0.001 s time budget was" in printed
    rows = honed.report.load_report(out).graphs[0].candidates
    assert [(c.name, c.status, c.reason) for c in rows][1] == (
        "TorchEagerBackend(autocast_enabled=True)",
        "not tried",
        "budget: the 0.001 s time budget was spent",
    )


@pytest.mark.integration
def test_tune_the_demo_entry_with_inductor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demo.honed"
    argv = ["tune", "honed.demo:entry", "--backend", "TorchInductorBackend:dynamic=False"]
    argv += ["--strategy", "min-latency", "--isolation", "none", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "TorchInductorBackend(dynamic=False)" in printed
    assert "MinLatency" in printed
    assert out.is_file()

    assert main(["bench", str(out), "--entry", "honed.demo:entry"]) == 0
    bench = capsys.readouterr().out
    assert "honed bench" in bench and "batch 16" in bench
    assert "eager" in bench and "tuned" in bench
    assert "max abs difference tuned vs eager" in bench


def test_inspect_prints_the_module_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "honed.demo:entry", "--max-depth", "1"]) == 0
    out = capsys.readouterr().out
    assert "honed inspect on cpu (3 samples" in out
    assert "DemoNet" in out and "Sequential" in out and "worth wrapping" in out
    assert "Block" not in out  # depth 2: cut by --max-depth 1


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("honed.demo:nope", "module honed.demo has no function nope"),
        ("honed.demo", "must look like pkg.module:function or path/to/file.py:function"),
        ("no_such_pkg_xyz:f", "cannot import module no_such_pkg_xyz"),
        ("MODELS:single", "single must return (model, dataset) or (model, dataset, "),
        ("MODELS:needs_arg", "needs_arg must be callable with no arguments"),
        ("MODELS:not_a_function", "is a int, not a function"),
        ("missing/file.py:build", "entry point file missing/file.py does not exist"),
    ],
)
def test_bad_entry_points_exit_2_with_a_clear_message(
    entry: str, message: str, models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    entry = entry.replace("MODELS", str(models))
    for argv in (["tune", entry], ["inspect", entry]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"honed {argv[0]}: error: ")
        assert message in err


def test_single_return_says_what_it_got(models: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", f"{models}:single"]) == 2
    assert "got a Linear" in capsys.readouterr().err


def test_backend_and_strategy_specs() -> None:
    b = parse_backend("TorchInductorBackend:mode=max-autotune")
    assert isinstance(b, honed.backend.TorchInductorBackend)
    assert b.config.mode == "max-autotune" and b.config.dynamic is None
    b = parse_backend("TorchInductor:dynamic=False,autocast_enabled=True,autocast_dtype=bfloat16")
    assert b.config.dynamic is False and b.config.autocast_dtype is torch.bfloat16
    assert type(parse_backend("torcheagerbackend")).__name__ == "TorchEagerBackend"
    with pytest.raises(ConfigError, match="no builtin backend 'Nope'"):
        parse_backend("Nope")
    with pytest.raises(ConfigError, match=r"has no config field\(s\) \['speed'\]"):
        parse_backend("TorchInductorBackend:speed=11")
    with pytest.raises(ConfigError, match="is not key=value"):
        parse_backend("TorchInductorBackend:fast")
    s = parse_strategy("latency-budget=5", None)
    assert isinstance(s, honed.LatencyBudgetStrategy)
    assert isinstance(parse_strategy("first-wins", [b]), honed.FirstWinsStrategy)
    with pytest.raises(ConfigError, match="give one of"):
        parse_strategy("fastest", None)
    with pytest.raises(ConfigError, match="budget in ms"):
        parse_strategy("latency-budget=soon", None)


def test_bad_backend_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "honed.demo:entry", "--backend", "Nope"]) == 2
    assert "no builtin backend 'Nope'" in capsys.readouterr().err
