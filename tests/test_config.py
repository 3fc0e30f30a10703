"""tests/test_config.py: the one config module: defaults, patch, and environment overrides."""

from __future__ import annotations

import json
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


BAD_ENVIRONMENT = [
    ("HONED_WINDOW_MS", "inf", "is not finite"),
    ("HONED_WARMUP_MS", "1e308", "is out of range"),
    ("HONED_MAX_SAMPLES_PER_GRAPH", "0", "is out of range"),
    ("HONED_MAX_WINDOWS", "0", "is out of range"),
    ("HONED_WINDOW_CALLS", "0", "is out of range"),
    ("HONED_WINDOW_CALLS", "2.5", "is not a whole number"),
    ("HONED_STABILITY_TOLERANCE", "nan", "is not finite"),
    ("HONED_LOG_LEVEL", "garbage", "give one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ("HONED_ISOLATION", "thread", "give one of process, none"),
    ("HONED_PROGRESS", "sometimes", "give one of auto, on, off"),
    ("HONED_CACHE", "maybe", "is not a yes/no value"),
    ("HONED_DEVICE", "quantum", "is not a device"),
    ("HONED_BUILD_TIMEOUT_S", "-1", "is out of range"),
]

# Reloads honed.config under each bad value (in a child process: the reload changes its flags).
_RELOAD_EACH = """
import importlib, json, os, sys
import honed
out = []
for variable, value in json.loads(sys.argv[1]):
    os.environ[variable] = value
    try:
        importlib.reload(honed.config)
        out.append("accepted")
    except honed.ConfigError as e:
        out.append(f"{type(e).__name__}: {e}")
    del os.environ[variable]
print(json.dumps(out))
"""


def test_bad_environment_values_are_one_line_config_errors() -> None:
    pairs = [(variable, value) for variable, value, _ in BAD_ENVIRONMENT]
    proc = subprocess.run(
        [sys.executable, "-c", _RELOAD_EACH, json.dumps(pairs)],
        capture_output=True,
        text=True,
        check=True,
    )
    for (variable, value, says), message in zip(
        BAD_ENVIRONMENT, json.loads(proc.stdout), strict=True
    ):
        assert message.startswith(f"ConfigError: {variable}={value!r} "), message
        assert says in message and ": give " in message and "\n" not in message


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("window_ms", float("inf")),
        ("warmup_ms", 1e308),
        ("max_samples_per_graph", 0),
        ("max_windows", 0),
        ("window_calls", 0),
        ("stability_tolerance", float("nan")),
        ("log_level", "garbage"),
        ("isolation", "thread"),
        ("cache_enabled", "yes"),
        ("injected_latencies", {"X": [float("nan")]}),
    ],
)
def test_patch_validates_like_the_environment(flag: str, value: object) -> None:
    before = honed.config.snapshot()
    with pytest.raises(honed.ConfigError, match=rf"honed\.config\.{flag}=.* \(HONED_|{flag}"):
        with honed.config.patch(stable_windows=2, **{flag: value}):
            pass
    assert honed.config.snapshot() == before  # nothing changed, not even the valid flag


def test_patch_normalizes_accepted_values() -> None:
    with honed.config.patch(log_level="debug", progress="ON", window_calls=4.0, cache_dir="/x"):
        assert honed.config.log_level == "DEBUG"
        assert honed.config.progress == "on"
        assert honed.config.window_calls == 4 and isinstance(honed.config.window_calls, int)
        assert str(honed.config.cache_dir) == "/x"


def test_every_variable_has_a_rule() -> None:
    accepted = honed.config.environment_variables()
    assert accepted["HONED_WINDOW_MS"] == "a finite number of ms, > 0 and <= 600000"
    assert set(accepted) >= {"HONED_LOG_LEVEL", "HONED_JIT", "HONED_JIT_BACKENDS"}


def test_docs_list_every_variable_with_what_it_accepts() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "config.md").read_text()
    for variable, accepted in honed.config.environment_variables().items():
        assert f"| `{variable}` |" in text and f"| {accepted} |" in text, variable
