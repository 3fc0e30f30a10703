"""src/honed/config.py: the one config module; every HONED_* environment variable is read here.

Each flag is a typed attribute with a comment. Tests and callers change flags for a block with
``honed.config.patch(name=value, ...)`` rather than touching os.environ.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError as e:
        raise ValueError(f"{name}={raw!r} is not a number; unset it or give e.g. {default}") from e


def _env_int(name: str, default: int) -> int:
    return int(_env_float(name, default))


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() not in ("0", "false", "no", "off")


def _env_list(name: str) -> list[str]:
    raw = os.environ.get(name, "")
    return [part.strip() for part in raw.split(",") if part.strip()]


def _default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "honed" if xdg else Path.home() / ".cache" / "honed"


def _default_config_dir() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return Path(xdg) / "honed" if xdg and os.path.isabs(xdg) else Path.home() / ".config" / "honed"


# Logging: DEBUG, INFO, WARNING, ERROR. WARNING keeps tunes quiet but for fallbacks and failures.
log_level: str = _env_str("HONED_LOG_LEVEL", "WARNING").upper()

# The live progress display of tune(): "auto" (on a terminal, unless log_level is ERROR or higher),
# "on" (always, e.g. in a CI log) or "off".
progress: str = _env_str("HONED_PROGRESS", "auto")

# Where tuning caches and compiler caches live.
cache_dir: Path = Path(_env_str("HONED_CACHE_DIR", str(_default_cache_dir())))

# Where honed's keys live (`honed keygen`, `honed trust`): $XDG_CONFIG_HOME/honed or
# ~/.config/honed; the C++ runtime (honed-run) looks in the same place (docs/trust.md).
config_dir: Path = _default_config_dir()

# The Ed25519 private key honed.save signs artifacts with ("" = <config_dir>/signing_key.pem when
# `honed keygen` made one; without a key, artifacts are saved unsigned).
signing_key: str = _env_str("HONED_SIGNING_KEY", "")

# Whether tune() reuses earlier candidate outcomes from the cache (HONED_CACHE=0 turns it off).
cache_enabled: bool = _env_str("HONED_CACHE", "1").lower() not in ("0", "false", "no", "off")

# Device used by tune() when none is given: "auto" = cuda when torch can use it, else cpu.
device: str = _env_str("HONED_DEVICE", "auto")

# Measurement protocol (DESIGN.md): warm-up by count and time, windows, stability rule.
warmup_calls: int = _env_int("HONED_WARMUP_CALLS", 10)
warmup_ms: float = _env_float("HONED_WARMUP_MS", 200.0)
window_calls: int = _env_int("HONED_WINDOW_CALLS", 10)
window_ms: float = _env_float("HONED_WINDOW_MS", 100.0)
stable_windows: int = _env_int("HONED_STABLE_WINDOWS", 3)
stability_tolerance: float = _env_float("HONED_STABILITY_TOLERANCE", 0.05)
max_windows: int = _env_int("HONED_MAX_WINDOWS", 10)

# Where candidates are built, checked and measured: "process" (a pool of worker processes, so a
# crash, hang or runaway allocation fails only that candidate) or "none" (in this process).
isolation: str = _env_str("HONED_ISOLATION", "process")

# Worker limits: seconds for the build (+ check) phase and for the measure phase, and the
# resident-memory ceiling in GiB (0: a default of 80 % of this machine's memory).
build_timeout_s: float = _env_float("HONED_BUILD_TIMEOUT_S", 1800.0)
measure_timeout_s: float = _env_float("HONED_MEASURE_TIMEOUT_S", 600.0)
worker_memory_gb: float = _env_float("HONED_WORKER_MEMORY_GB", 0.0)

# Worker processes of a tune's pool (0: one per CPU core, at most 8, never more than the jobs).
# Builds run side by side; each device measures one candidate at a time (docs/tuning.md).
workers: int = _env_int("HONED_WORKERS", 0)

# On a host with several GPUs of the target's model, measure candidates on all of them (each
# GPU one at a time); the finalists are re-measured on the target GPU. "0": the target only.
spread_gpus: bool = _env_bool("HONED_SPREAD_GPUS", True)

# Samples kept per graph while recording (bounded so long datasets do not hold everything).
max_samples_per_graph: int = _env_int("HONED_MAX_SAMPLES_PER_GRAPH", 32)

# FirstWinsStrategy: a candidate must beat eager by at least this factor (beyond the noise).
first_wins_min_speedup: float = _env_float("HONED_FIRST_WINS_MIN_SPEEDUP", 1.0)

# honed doctor: how long importing one optional package (probed in a subprocess) may take before
# it is reported as hanging. Packages that import torch need a few seconds.
doctor_import_timeout_s: float = _env_float("HONED_DOCTOR_IMPORT_TIMEOUT_S", 60.0)

# -- JIT mode (honed.jit; its config object honed.jit.config takes its defaults from these) ----
# HONED_JIT=1 starts JIT tuning at interpreter start-up (through the .pth hook installed with the
# package). The hook itself tests the variable with os.environ before importing anything: the one
# read outside this module, so that an unset variable costs nothing.
jit: bool = _env_bool("HONED_JIT", False)

# Calls of a module recorded before it is tried (at least 1; 2+ lets dynamic axes show).
jit_min_samples: int = _env_int("HONED_JIT_MIN_SAMPLES", 2)

# Try a module only once its samples show a batch axis (two batch sizes seen).
jit_batch_axis_required: bool = _env_bool("HONED_JIT_BATCH_AXIS_REQUIRED", False)

# Deepest module level tried (0: the top modules only, 1: also their children, ...).
jit_max_depth_level: int = _env_int("HONED_JIT_MAX_DEPTH_LEVEL", 3)

# Modules with fewer parameters than this are SKIPPED (their children are smaller still).
jit_min_parameters: int = _env_int("HONED_JIT_MIN_PARAMETERS", 1000)

# Check a module with torch._dynamo.explain before tuning; a graph break sends JIT to its children.
jit_detect_graph_breaks: bool = _env_bool("HONED_JIT_DETECT_GRAPH_BREAKS", True)

# Module class names never tuned (comma-separated), e.g. "BatchNorm2d,LayerNorm".
jit_skip_modules: list[str] = _env_list("HONED_JIT_SKIP_MODULES")

# Device JIT tunes for ("" = the device the module's parameters are on).
jit_device: str = _env_str("HONED_JIT_DEVICE", "")

# Log and record what would be tuned, without tuning anything.
jit_dry_run: bool = _env_bool("HONED_JIT_DRY_RUN", False)

# Backend class names JIT tries (comma-separated, e.g. "TorchInductorBackend"); empty = the
# default candidates of MaxThroughputStrategy.
jit_backends: list[str] = _env_list("HONED_JIT_BACKENDS")

# Where JIT's tuning cache lives ("" = cache_dir above).
jit_cache_dir: str = _env_str("HONED_JIT_CACHE_DIR", "")

# At exit, print JIT's hierarchy and history to stderr (for scripts run with no code change).
jit_report: bool = _env_bool("HONED_JIT_REPORT", False)

# Samples kept per module while recording (the first ones, and new shapes up to twice this).
jit_max_samples: int = _env_int("HONED_JIT_MAX_SAMPLES", 8)

# A tuned module that receives shapes outside its tuned profile runs them eager; with this flag,
# min_samples such calls trigger a re-tune over the old and the new shapes (at most 3 per module).
jit_retune_on_new_shapes: bool = _env_bool("HONED_JIT_RETUNE_ON_NEW_SHAPES", False)

# Test hook (STYLE.md rule 6): candidate name or backend class name -> latencies in ms that the
# engine's InjectedTimer returns instead of real time, so the picker can be tested
# deterministically. Never set outside tests and benchmarks that distort on purpose.
injected_latencies: dict[str, list[float]] | None = None


_NAMES = frozenset(
    name for name, value in dict(globals()).items() if not name.startswith("_") and name.islower()
) - {"annotations", "contextlib", "os", "patch", "snapshot"}


def snapshot() -> dict[str, Any]:
    """The current value of every flag, by name."""
    g = globals()
    return {name: g[name] for name in sorted(_NAMES)}


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Set flags for the duration of a ``with`` block; unknown names are an error."""
    unknown = set(changes) - _NAMES
    if unknown:
        raise AttributeError(
            f"honed.config has no flag(s) {sorted(unknown)}; known flags: {sorted(_NAMES)}"
        )
    g = globals()
    saved = {name: g[name] for name in changes}
    g.update(changes)
    try:
        yield
    finally:
        g.update(saved)
