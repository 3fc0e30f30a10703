"""src/honed/config.py: the one config module; every HONED_* environment variable is read here.

Each flag is a typed attribute with a comment. Tests and callers change flags for a block with
``honed.config.patch(name=value, ...)`` rather than touching os.environ. Every value, from the
environment or from ``patch``, is checked against its flag's rule (finite, in range, a known
word); a bad one is a one-line ``ConfigError`` naming the variable and what it accepts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from honed.errors import ConfigError


class _Bad(Exception):
    """A value that breaks a rule; its message says how (e.g. "is not a number")."""


@dataclasses.dataclass(frozen=True)
class _Number:
    lo: float
    hi: float
    integer: bool = False
    lo_open: bool = False  # lo itself is not allowed
    unit: str = ""

    def parse(self, raw: str) -> Any:
        try:
            value = float(raw)
        except ValueError:
            raise _Bad("is not a number") from None
        if self.integer and math.isfinite(value) and value.is_integer():
            return int(value)
        return value

    def check(self, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _Bad("is not a number")
        if self.integer and not (isinstance(value, int) or float(value).is_integer()):
            raise _Bad("is not a whole number")
        if not math.isfinite(value):
            raise _Bad("is not finite")
        low_ok = value > self.lo if self.lo_open else value >= self.lo
        if not (low_ok and value <= self.hi):
            raise _Bad("is out of range")
        return int(value) if self.integer else float(value)

    def accepted(self) -> str:
        kind = "a whole number" if self.integer else "a finite number"
        unit = f" of {self.unit}" if self.unit else ""
        low = f"> {_shown(self.lo)}" if self.lo_open else f">= {_shown(self.lo)}"
        return f"{kind}{unit}, {low} and <= {_shown(self.hi)}"


def _shown(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclasses.dataclass(frozen=True)
class _Choice:
    choices: tuple[str, ...]
    upper: bool = False  # stored upper-case (log levels); otherwise lower-case

    def parse(self, raw: str) -> Any:
        return raw

    def check(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise _Bad("is not a word")
        word = value.strip().upper() if self.upper else value.strip().lower()
        if word not in self.choices:
            raise _Bad("is not a known value")
        return word

    def accepted(self) -> str:
        return "one of " + ", ".join(self.choices)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class _Bool:
    def parse(self, raw: str) -> Any:
        word = raw.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
        raise _Bad("is not a yes/no value")

    def check(self, value: Any) -> Any:
        if not isinstance(value, bool):
            raise _Bad("is not True or False")
        return value

    def accepted(self) -> str:
        return "one of " + ", ".join(_TRUE + _FALSE)


_DEVICE = re.compile(r"(cpu|cuda(:\d+)?|mps|xpu(:\d+)?)")


@dataclasses.dataclass(frozen=True)
class _Device:
    extra: tuple[str, ...]  # words accepted besides a device, e.g. "auto"

    def parse(self, raw: str) -> Any:
        return raw

    def check(self, value: Any) -> Any:
        word = str(value).strip().lower()
        if word not in self.extra and not _DEVICE.fullmatch(word):
            raise _Bad("is not a device")
        return word

    def accepted(self) -> str:
        words = ", ".join(repr(w) for w in self.extra)
        return f"{words} or a device: cpu, cuda, cuda:N, mps, xpu"


@dataclasses.dataclass(frozen=True)
class _Text:
    path: bool = False  # stored as a Path
    listed: bool = False  # comma-separated in the environment, a list of words in Python

    def parse(self, raw: str) -> Any:
        if self.listed:
            return [part.strip() for part in raw.split(",") if part.strip()]
        return raw

    def check(self, value: Any) -> Any:
        if self.listed:
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
                raise _Bad("is not a list of names")
            return list(value)
        if self.path:
            if not isinstance(value, str | os.PathLike) or not str(value):
                raise _Bad("is not a path")
            return Path(value)
        if not isinstance(value, str):
            raise _Bad("is not text")
        return value

    def accepted(self) -> str:
        if self.listed:
            return "comma-separated names"
        return "a folder path" if self.path else "text"


@dataclasses.dataclass(frozen=True)
class _Latencies:
    """The test hook's {name: [ms, ...]} (set through patch only)."""

    def parse(self, raw: str) -> Any:
        raise _Bad("cannot be set from the environment")

    def check(self, value: Any) -> Any:
        if value is None:
            return None
        ok = isinstance(value, dict) and all(
            isinstance(k, str)
            and isinstance(v, list | tuple)
            and v
            and all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in v)
            for k, v in value.items()
        )
        if not ok:
            raise _Bad("is not a dict of names to lists of positive milliseconds")
        return value

    def accepted(self) -> str:
        return "None or {name: [milliseconds > 0, ...]}"


_Rule = _Number | _Choice | _Bool | _Device | _Text | _Latencies
_RULES: dict[str, tuple[str, _Rule]] = {}  # flag name -> (its environment variable, its rule)


def _started_as_cli() -> bool:
    """Whether this process is the `honed` command (so an import-time error is one line)."""
    if Path(sys.argv[0]).name == "honed":
        return True
    argv = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b in ("honed", "honed.cli") for a, b in itertools.pairwise(argv))


def _error(name: str, value: Any, why: str, from_env: bool) -> ConfigError:
    env, rule = _RULES[name]
    where = f"{env}={value!r}" if from_env else f"honed.config.{name}={value!r} ({env})"
    return ConfigError(f"{where} {why}: give {rule.accepted()}")


def _checked(name: str, value: Any, from_env: bool) -> Any:
    rule = _RULES[name][1]
    try:
        return rule.check(rule.parse(value) if from_env else value)
    except _Bad as bad:
        raise _error(name, value, str(bad), from_env) from None


def _flag(name: str, env: str, default: Any, rule: _Rule) -> Any:
    """The flag's value: from ``env`` when it is set (checked by ``rule``), else ``default``."""
    _RULES[name] = (env, rule)
    raw = os.environ.get(env)
    if raw is None or raw.strip() == "":
        return default
    try:
        return _checked(name, raw, from_env=True)
    except ConfigError as e:
        if _started_as_cli():  # `honed ...`: one line and exit 2, not an import traceback
            print(f"honed: error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        raise


def _default_cache_dir() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "honed" if xdg else Path.home() / ".cache" / "honed"


def _default_config_dir() -> Path:
    xdg = os.environ.get("XDG_CONFIG_HOME")
    return Path(xdg) / "honed" if xdg and os.path.isabs(xdg) else Path.home() / ".config" / "honed"


_MS = 600_000.0  # ten minutes: longer warm-ups or windows would look like a hang
_CALLS = 10_000_000
_DAY_S = 86_400.0

# Logging: DEBUG, INFO, WARNING, ERROR. WARNING keeps tunes quiet but for fallbacks and failures.
log_level: str = _flag(
    "log_level",
    "HONED_LOG_LEVEL",
    "WARNING",
    _Choice(("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"), upper=True),
)

# The live progress display of tune(): "auto" (on a terminal, unless log_level is ERROR or higher),
# "on" (always, e.g. in a CI log) or "off".
progress: str = _flag("progress", "HONED_PROGRESS", "auto", _Choice(("auto", "on", "off")))

# Where tuning caches and compiler caches live.
cache_dir: Path = _flag("cache_dir", "HONED_CACHE_DIR", _default_cache_dir(), _Text(path=True))

# Where honed's keys live (`honed keygen`, `honed trust`): $XDG_CONFIG_HOME/honed or
# ~/.config/honed; the C++ runtime (honed-run) looks in the same place (docs/trust.md).
config_dir: Path = _default_config_dir()
_RULES["config_dir"] = ("XDG_CONFIG_HOME", _Text(path=True))

# The Ed25519 private key honed.save signs artifacts with ("" = <config_dir>/signing_key.pem when
# `honed keygen` made one; without a key, artifacts are saved unsigned).
signing_key: str = _flag("signing_key", "HONED_SIGNING_KEY", "", _Text())

# Whether tune() reuses earlier candidate outcomes from the cache (HONED_CACHE=0 turns it off).
cache_enabled: bool = _flag("cache_enabled", "HONED_CACHE", True, _Bool())

# Device used by tune() when none is given: "auto" = cuda when torch can use it, else cpu.
device: str = _flag("device", "HONED_DEVICE", "auto", _Device(("auto",)))

# Measurement protocol (DESIGN.md): warm-up by count and time, windows, stability rule. Upper
# bounds keep a typo from turning a tune into a hang.
warmup_calls: int = _flag("warmup_calls", "HONED_WARMUP_CALLS", 10, _Number(0, _CALLS, True))
warmup_ms: float = _flag("warmup_ms", "HONED_WARMUP_MS", 200.0, _Number(0, _MS, unit="ms"))
window_calls: int = _flag("window_calls", "HONED_WINDOW_CALLS", 10, _Number(1, _CALLS, True))
window_ms: float = _flag(
    "window_ms", "HONED_WINDOW_MS", 100.0, _Number(0, _MS, lo_open=True, unit="ms")
)
stable_windows: int = _flag("stable_windows", "HONED_STABLE_WINDOWS", 3, _Number(1, 1000, True))
stability_tolerance: float = _flag(
    "stability_tolerance", "HONED_STABILITY_TOLERANCE", 0.05, _Number(0, 1e9, lo_open=True)
)
max_windows: int = _flag("max_windows", "HONED_MAX_WINDOWS", 10, _Number(1, 10_000, True))

# A decision needs evidence: a candidate beats eager (or another candidate) only when both
# measurements are stable and the 99 % bootstrap interval of the ratio of their figures lies
# above 1 + this margin (0.02: the interval must exclude everything under a 2 % gain).
decision_margin: float = _flag("decision_margin", "HONED_DECISION_MARGIN", 0.02, _Number(0, 1))

# Threads torch uses while CPU candidates are measured (torch.set_num_threads); 0 = the physical
# cores of this machine (of the CPUs this process may run on). Recorded in the report.
cpu_threads: int = _flag("cpu_threads", "HONED_CPU_THREADS", 0, _Number(0, 4096, True))

# The busy-machine check at the start of a tune: busy when a short CPU calibration's mean chunk
# takes more than busy_slowdown times its fastest one, or the 1-minute load average exceeds
# busy_load_per_cpu per CPU, or another process holds the GPU. A busy machine is named in the log
# and the report; wait_for_quiet_s > 0 first waits up to that many seconds for a quiet one.
busy_slowdown: float = _flag(
    "busy_slowdown", "HONED_BUSY_SLOWDOWN", 1.5, _Number(0, 1e9, lo_open=True)
)
busy_load_per_cpu: float = _flag(
    "busy_load_per_cpu", "HONED_BUSY_LOAD_PER_CPU", 1.0, _Number(0, 1e9)
)
wait_for_quiet_s: float = _flag(
    "wait_for_quiet_s", "HONED_WAIT_FOR_QUIET_S", 0.0, _Number(0, _DAY_S, unit="s")
)

# Where candidates are built, checked and measured: "process" (a pool of worker processes, so a
# crash, hang or runaway allocation fails only that candidate) or "none" (in this process).
isolation: str = _flag("isolation", "HONED_ISOLATION", "process", _Choice(("process", "none")))

# Worker limits: seconds for the build (+ check) phase and for the measure phase, and the
# resident-memory ceiling in GiB (0: a default of 80 % of this machine's memory).
build_timeout_s: float = _flag(
    "build_timeout_s", "HONED_BUILD_TIMEOUT_S", 1800.0, _Number(0, _DAY_S, lo_open=True, unit="s")
)
measure_timeout_s: float = _flag(
    "measure_timeout_s",
    "HONED_MEASURE_TIMEOUT_S",
    600.0,
    _Number(0, _DAY_S, lo_open=True, unit="s"),
)
worker_memory_gb: float = _flag(
    "worker_memory_gb", "HONED_WORKER_MEMORY_GB", 0.0, _Number(0, 1 << 20, unit="GiB")
)

# Worker processes of a tune's pool (0: one per CPU core, at most 8, never more than the jobs).
# Builds run side by side; each device measures one candidate at a time (docs/tuning.md).
workers: int = _flag("workers", "HONED_WORKERS", 0, _Number(0, 1024, True))

# On a host with several GPUs of the target's model, measure candidates on all of them (each
# GPU one at a time); the finalists are re-measured on the target GPU. "0": the target only.
spread_gpus: bool = _flag("spread_gpus", "HONED_SPREAD_GPUS", True, _Bool())

# Samples kept per graph while recording (bounded so long datasets do not hold everything).
max_samples_per_graph: int = _flag(
    "max_samples_per_graph", "HONED_MAX_SAMPLES_PER_GRAPH", 32, _Number(1, 100_000, True)
)

# FirstWinsStrategy: a candidate must beat eager by at least this factor (beyond the noise).
first_wins_min_speedup: float = _flag(
    "first_wins_min_speedup", "HONED_FIRST_WINS_MIN_SPEEDUP", 1.0, _Number(0, 1000, lo_open=True)
)

# honed doctor: how long importing one optional package (probed in a subprocess) may take before
# it is reported as hanging. Packages that import torch need a few seconds.
doctor_import_timeout_s: float = _flag(
    "doctor_import_timeout_s",
    "HONED_DOCTOR_IMPORT_TIMEOUT_S",
    60.0,
    _Number(0, 3600, lo_open=True, unit="s"),
)

# -- JIT mode (honed.jit; its config object honed.jit.config takes its defaults from these) ----
# HONED_JIT=1 starts JIT tuning at interpreter start-up (through the .pth hook installed with the
# package). The hook itself tests the variable with os.environ before importing anything: the one
# read outside this module, so that an unset variable costs nothing.
jit: bool = _flag("jit", "HONED_JIT", False, _Bool())

# Calls of a module recorded before it is tried (at least 1; 2+ lets dynamic axes show).
jit_min_samples: int = _flag(
    "jit_min_samples", "HONED_JIT_MIN_SAMPLES", 2, _Number(1, 10_000, True)
)

# Try a module only once its samples show a batch axis (two batch sizes seen).
jit_batch_axis_required: bool = _flag(
    "jit_batch_axis_required", "HONED_JIT_BATCH_AXIS_REQUIRED", False, _Bool()
)

# Deepest module level tried (0: the top modules only, 1: also their children, ...).
jit_max_depth_level: int = _flag(
    "jit_max_depth_level", "HONED_JIT_MAX_DEPTH_LEVEL", 3, _Number(0, 1000, True)
)

# Modules with fewer parameters than this are SKIPPED (their children are smaller still).
jit_min_parameters: int = _flag(
    "jit_min_parameters", "HONED_JIT_MIN_PARAMETERS", 1000, _Number(0, 1e15, True)
)

# Check a module with torch._dynamo.explain before tuning; a graph break sends JIT to its children.
jit_detect_graph_breaks: bool = _flag(
    "jit_detect_graph_breaks", "HONED_JIT_DETECT_GRAPH_BREAKS", True, _Bool()
)

# Module class names never tuned (comma-separated), e.g. "BatchNorm2d,LayerNorm".
jit_skip_modules: list[str] = _flag(
    "jit_skip_modules", "HONED_JIT_SKIP_MODULES", [], _Text(listed=True)
)

# Device JIT tunes for ("" = the device the module's parameters are on).
jit_device: str = _flag("jit_device", "HONED_JIT_DEVICE", "", _Device(("",)))

# Log and record what would be tuned, without tuning anything.
jit_dry_run: bool = _flag("jit_dry_run", "HONED_JIT_DRY_RUN", False, _Bool())

# Backend class names JIT tries (comma-separated, e.g. "TorchInductorBackend"); empty = the
# default candidates of MaxThroughputStrategy.
jit_backends: list[str] = _flag("jit_backends", "HONED_JIT_BACKENDS", [], _Text(listed=True))

# Where JIT's tuning cache lives ("" = cache_dir above).
jit_cache_dir: str = _flag("jit_cache_dir", "HONED_JIT_CACHE_DIR", "", _Text())

# At exit, print JIT's hierarchy and history to stderr (for scripts run with no code change).
jit_report: bool = _flag("jit_report", "HONED_JIT_REPORT", False, _Bool())

# JIT measures beside the program, whose own calls share the device: the medians of successive
# windows wander with the program's load, so a JIT tune accepts windows agreeing within this
# (instead of stability_tolerance, when larger). A decision still needs the 99 % interval of the
# ratio above 1 + decision_margin, measured interleaved, so load that hits all alike decides
# nothing.
jit_stability_tolerance: float = _flag(
    "jit_stability_tolerance",
    "HONED_JIT_STABILITY_TOLERANCE",
    0.25,
    _Number(0, 1e9, lo_open=True),
)

# Samples kept per module while recording (the first ones, and new shapes up to twice this).
jit_max_samples: int = _flag(
    "jit_max_samples", "HONED_JIT_MAX_SAMPLES", 8, _Number(1, 10_000, True)
)

# A tuned module that receives shapes outside its tuned profile runs them eager; with this flag,
# a new batch size (or min_samples calls of another new shape) starts a re-tune in the background
# over the old and the new shapes (at most 3 per module), the calls meanwhile running as before.
jit_retune_on_new_shapes: bool = _flag(
    "jit_retune_on_new_shapes", "HONED_JIT_RETUNE_ON_NEW_SHAPES", True, _Bool()
)

# JIT tunes beside the program (calls never wait for a build or a measurement); 1 makes the call
# that starts a tune wait for it, for batch jobs that prefer a tuned model over an early answer.
jit_wait: bool = _flag("jit_wait", "HONED_JIT_WAIT", False, _Bool())

# Seconds one JIT tune may spend trying candidates (the best correct one so far wins; 0 = none).
jit_time_budget_s: float = _flag(
    "jit_time_budget_s", "HONED_JIT_TIME_BUDGET_S", 0.0, _Number(0, _DAY_S, unit="s")
)

# Worker processes of JIT's tunes beside a calling program when HONED_WORKERS does not say (0: as
# honed.tune's; a program waiting for JIT, HONED_JIT_WAIT, gets honed.tune's count). Each worker's
# start (importing torch and Inductor) and each build beside the program slow its calls; two
# build the default candidates side by side as fast as more do (docs/jit.md).
jit_workers: int = _flag("jit_workers", "HONED_JIT_WORKERS", 2, _Number(0, 1024, True))

# With HONED_JIT=1 (or ``import honed.jit.enable``) in a script's own process, JIT's workers start
# as JIT turns on, so their interpreters import torch and the compilers while the program starts
# rather than beside its first calls; skipped where the script's last run needed none (its
# decisions came from the cache: honed.jit.early).
jit_early_workers: bool = _flag("jit_early_workers", "HONED_JIT_EARLY_WORKERS", True, _Bool())

# Niceness added to the worker processes of JIT's checks and tunes (0-19), so that on a machine
# without cores to spare the program's calls run first and the tune takes what is left.
jit_worker_nice: int = _flag("jit_worker_nice", "HONED_JIT_WORKER_NICE", 10, _Number(0, 19, True))

# While JIT checks or tunes beside the program, the program's calls run one OpenMP thread fewer
# (when they use one per core), so the work has a core: niced workers on a machine whose cores
# the program's calls fill get next to nothing (honed.jit.cores; restored when JIT is idle).
jit_share_cores: bool = _flag("jit_share_cores", "HONED_JIT_SHARE_CORES", True, _Bool())

# Before each JIT job, the objects of the program's process are frozen out of the cyclic garbage
# collector (gc.freeze): a full collection that JIT's allocations set off then walks only what
# was made since, instead of the whole process while the program's call waits for the GIL
# (honed.jit.background; a reference cycle among the frozen objects is not reclaimed).
jit_gc_freeze: bool = _flag("jit_gc_freeze", "HONED_JIT_GC_FREEZE", True, _Bool())

# Which loader runs AOTInductor packages (honed.backend._aoti_direct): "auto" (in a JIT process,
# honed's own for CPU and CUDA packages: it releases the GIL, so the program's calls go on while
# a winner loads; torch's elsewhere), "direct" (honed's for every package it can take), "torch"
# (torch's AOTIModelPackageLoader for every package).
aoti_loader: str = _flag(
    "aoti_loader", "HONED_AOTI_LOADER", "auto", _Choice(("auto", "direct", "torch"))
)

# Niceness added to a tune's worker processes (JIT sets it from jit_worker_nice for its own).
worker_nice: int = _flag("worker_nice", "HONED_WORKER_NICE", 0, _Number(0, 19, True))

# The share of the machine's physical cores (at least one, never all) that the worker processes
# of a CUDA model's JIT tune stay off, with their hyperthreads, so the program's launching
# thread keeps a core of its own while the workers compile on every other (honed.pipeline.
# isolation.worker_cpus); 0 lets them use all. A CPU model's tune is left alone: its program
# computes on every core, and its workers' kernels are built for the cores they see. Half: on a
# 16-CPU GPU host the program's calls over 2x eager during a tune halved against a quarter,
# and the tune took no longer (docs/jit.md).
jit_spare_cores: float = _flag("jit_spare_cores", "HONED_JIT_SPARE_CORES", 0.5, _Number(0, 1))

# While JIT's workers run on CPUs of their own (jit_spare_cores), the program's thread that calls
# the model runs on the others, and gets its CPUs back when JIT is idle (honed.jit.cores): the
# kernel otherwise may run it on a CPU that a compile shares.
jit_keep_off_workers: bool = _flag(
    "jit_keep_off_workers", "HONED_JIT_KEEP_OFF_WORKERS", True, _Bool()
)

# While a CUDA model's JIT workers build beside the program, a call of the program slower than
# this many times its pace with no worker running stops them for a moment (honed.jit.pacing);
# when the calls stay as slow without them, pacing backs off. 0 (the default) turns it off: in
# the one pair of BERT-base runs measured, the paced run had more calls over 2x eager, not fewer
# (docs/jit.md).
jit_pace: float = _flag("jit_pace", "HONED_JIT_PACE", 0.0, _Number(0, 100))

# The same for a tune's worker processes (JIT sets it from jit_spare_cores for its own).
worker_spare_cores: float = _flag(
    "worker_spare_cores", "HONED_WORKER_SPARE_CORES", 0.0, _Number(0, 1)
)

# Inductor's compile threads in each of JIT's worker processes (0: as honed.tune's, the workers'
# cores shared among them); the user's own TORCHINDUCTOR_COMPILE_THREADS, where set, decides, but
# it also sets the program's own compiles. With more than one thread a compile starts a pool of
# compile processes, each importing torch, on as many CPUs. One: beside BERT-base on a GPU host
# the tune took as long with one thread a worker as with four, so the pool only took CPUs from
# the program; the calls over 2x eager were as many either way (docs/jit.md). A program waiting
# for JIT (jit_wait) gets honed.tune's.
jit_compile_threads: int = _flag(
    "jit_compile_threads", "HONED_JIT_COMPILE_THREADS", 1, _Number(0, 1024, True)
)

# The same for a tune's worker processes (0: the workers' cores shared among them; JIT sets it
# from jit_compile_threads for its own).
worker_compile_threads: int = _flag(
    "worker_compile_threads", "HONED_WORKER_COMPILE_THREADS", 0, _Number(0, 1024, True)
)

# JIT measures its candidates on the program's own calls while the program calls (the workers
# only build and check them), and ends a tune its workers measured with a trial of the pick and
# its runners-up on those calls; a runner-up replaces the pick only with evidence (honed.jit.live).
jit_live_choice: bool = _flag("jit_live_choice", "HONED_JIT_LIVE_CHOICE", True, _Bool())

# While the program calls, a candidate built while others still build is installed at once and,
# when the program's calls show it faster than what answers them, answers them until the tune
# ends (honed.jit.live.ProgramCalls.promote). Off by default: on the 2-core CPU machine its
# trials, run beside the other builds, put more calls over twice eager's time than they saved,
# and on the H100 BERT-base's two packages were built too close together for it to pay
# (docs/jit.md).
jit_promote: bool = _flag("jit_promote", "HONED_JIT_PROMOTE", False, _Bool())

# While the program calls, a candidate that compiles nothing (CUDA graphs over eager: a capture of
# eager's own kernels, ready seconds into the tune) is promoted as above even with jit_promote
# off, where its worker's check ran quicker than the program's last call: on a GPU its replays
# answer the program's calls while the packages build. Off by default: its capture records
# eager's forward in the program's process, the process's first run of the path a capture takes,
# and the program's synchronize waited for all of it, one call many times eager's length in
# every cold run on the GPU host; without it the program runs eager until the tune ends
# (docs/jit.md).
jit_stand_in: bool = _flag("jit_stand_in", "HONED_JIT_STAND_IN", False, _Bool())

# The first stand-in is captured in the program's process as soon as the module's calls are
# recorded, before any worker has started (a worker took 9-10 s to import torch and its builders
# on the GPU host, and 4 s more to map the model, beside eager calls). Off by default: a
# program's torch.cuda.synchronize waits for a capture under way, and the process's first warm-up
# and capture held one or two calls of the cold run past twice eager's time (docs/jit.md). On,
# the stand-in answers only after its check against the program's own outputs and a trial on its
# calls.
jit_stand_in_early: bool = _flag("jit_stand_in_early", "HONED_JIT_STAND_IN_EARLY", False, _Bool())

# Beside a program, a CUDA-graph capture of an eager module records its forward in Python, and
# the program's torch.cuda.synchronize waits for it; recorded while the program's call launches
# its own ops, both take the GIL in turns and run slower. On, the capture waits at each module
# call of its forward, and of its warm-up runs, while the program is inside a call
# (courtesy.give_way), so that call launches at full speed and then waits only for the rest of
# the recording. Off by default: on the GPU host the paused capture took longer, and the call
# that waited for it with it (docs/jit.md).
jit_capture_gives_way: bool = _flag(
    "jit_capture_gives_way", "HONED_JIT_CAPTURE_GIVES_WAY", False, _Bool()
)

# Beside a program, work in its process that runs a model's forward in Python (a CUDA-graph
# capture's warm-up calls and recording) runs its module calls in turns with the program's calls
# (courtesy.taking_turns): each turn starts while the program is between calls, is short next to
# its calls, and the program's next call waits for the turn's end, instead of both threads
# taking the GIL in turns at every op for the length of the work (docs/jit.md). Takes
# precedence over jit_capture_gives_way.
jit_takes_turns: bool = _flag("jit_takes_turns", "HONED_JIT_TAKES_TURNS", True, _Bool())

# When the recorded calls show a batch axis, JIT also tunes batches up to this factor times the
# largest batch seen (rounded up to a power of two), so a few small first calls do not lock the
# tuned range to small batches (1 = only the batch sizes seen).
jit_batch_headroom: int = _flag(
    "jit_batch_headroom", "HONED_JIT_BATCH_HEADROOM", 2, _Number(1, 1024, True)
)

# Test hook (STYLE.md rule 6): candidate name or backend class name -> latencies in ms that the
# engine's InjectedTimer returns instead of real time, so the picker can be tested
# deterministically. Never set outside tests and benchmarks that distort on purpose; set it
# through patch(), never from the environment.
injected_latencies: dict[str, list[float]] | None = None
_RULES["injected_latencies"] = ("patch only", _Latencies())


_NAMES = frozenset(_RULES)


def snapshot() -> dict[str, Any]:
    """The current value of every flag, by name."""
    g = globals()
    return {name: g[name] for name in sorted(_NAMES)}


def environment_variables() -> dict[str, str]:
    """Every flag's environment variable and what it accepts (for docs and `honed doctor`)."""
    return {env: rule.accepted() for env, rule in _RULES.values() if env.startswith("HONED_")}


@contextlib.contextmanager
def patch(**changes: Any) -> Iterator[None]:
    """Set flags for the duration of a ``with`` block.

    Unknown names are an AttributeError; a value its flag does not accept is a ConfigError
    (checked as the environment variable would be), raised before anything changes.
    """
    unknown = set(changes) - _NAMES
    if unknown:
        raise AttributeError(
            f"honed.config has no flag(s) {sorted(unknown)}; known flags: {sorted(_NAMES)}"
        )
    checked = {name: _checked(name, value, from_env=False) for name, value in changes.items()}
    g = globals()
    saved = {name: g[name] for name in checked}
    g.update(checked)
    try:
        yield
    finally:
        g.update(saved)
