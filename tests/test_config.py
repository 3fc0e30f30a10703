"""tests/test_config.py: the one config module: defaults, patch, and environment overrides."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import honed


def test_patch_sets_and_restores() -> None:
    before = honed.config.warmup_ms
    with honed.config.patch(warmup_ms=1.5):
        assert honed.config.warmup_ms == 1.5
    assert honed.config.warmup_ms == before


def test_patch_rejects_unknown_flags() -> None:
    with pytest.raises(AttributeError, match="no flag"):
        with honed.config.patch(warmup_seconds=1):
            pass


@pytest.mark.integration
def test_environment_variables_are_read_at_import() -> None:
    env = dict(os.environ, HONED_WARMUP_MS="42", HONED_LOG_LEVEL="debug")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import honed; print(honed.config.warmup_ms, honed.config.log_level)",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == ["42.0", "DEBUG"]


@pytest.mark.integration
def test_bad_environment_value_names_the_variable() -> None:
    env = dict(os.environ, HONED_WARMUP_MS="soon")
    proc = subprocess.run(
        [sys.executable, "-c", "import honed"], env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert "HONED_WARMUP_MS='soon' is not a number" in proc.stderr
