"""tests/test_cli.py: `honed demo` end to end (the README's first command) and --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from honed.cli import main


def test_help_shows_examples() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "honed.cli", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "honed demo --device cuda" in out


def test_demo_prints_the_table_and_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", "--out", str(tmp_path / "demo.honed")]) == 0
    out = capsys.readouterr().out
    assert "TorchEagerBackend (baseline)" in out
    assert "TorchInductorBackend" in out
    assert "decision:" in out
    assert "outputs match" in out
    assert (tmp_path / "demo.honed").is_file()
