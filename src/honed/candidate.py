"""src/honed/candidate.py: builds, checks and measures one candidate for one graph.

A failing candidate never stops the tune: any exception becomes its failure reason. Figures come
from the engine's measure (host clock, CUDA events, or injected samples in tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from honed import _core, config
from honed.backend.base import Backend, GraphInfo, Sample
from honed.correctness import CheckResult, compare

log = logging.getLogger("honed")

# Called with "build" and "measure" as evaluate() enters those phases (the worker's watchdog).
_phase_hook: Callable[[str], None] | None = None


@contextlib.contextmanager
def watch_phases(hook: Callable[[str], None]) -> Iterator[None]:
    """Call ``hook(phase)`` as evaluate() enters its build and measure phases."""
    global _phase_hook
    saved, _phase_hook = _phase_hook, hook
    try:
        yield
    finally:
        _phase_hook = saved


def _enter(phase: str) -> None:
    if _phase_hook is not None:
        _phase_hook(phase)


# Interleaved re-measurement of finalists: rounds, and the time each round aims at.
_INTERLEAVED_ROUNDS = 12
_INTERLEAVED_ROUND_MS = 25.0
_FINALISTS = 3


@dataclasses.dataclass
class Outcome:
    """What happened to one candidate on one graph."""

    backend: Backend
    is_baseline: bool = False
    status: str = "ok"  # ok | failed | rejected
    reason: str = ""
    fn: Callable[..., Any] | None = None
    build_s: float | None = None
    check: CheckResult | None = None
    measurement: Any = None  # _core.Measurement
    memory_bytes: int = 0
    injected: bool = False
    cached: bool = False  # figures came from the tuning cache; fn is built only if selected
    cache_key: str | None = None
    isolated: bool = False  # evaluated in a worker process; fn is built only if selected
    payload_files: dict[str, bytes] | None = None  # a worker's payload (e.g. the .pt2)

    @property
    def passed(self) -> bool:
        return self.status == "ok" and self.measurement is not None

    def to_record(self) -> dict[str, Any]:
        """What the tuning cache stores: everything but the callable."""
        m = self.measurement
        return {
            "status": self.status,
            "reason": self.reason,
            "build_s": self.build_s,
            "check": dataclasses.asdict(self.check) if self.check is not None else None,
            "measurement": None
            if m is None
            else {
                "samples_ms": list(m.samples_ms),
                "batch_size": int(m.batch_size),
                "wall_ms": float(m.wall_ms),
                "windows": int(m.windows),
                "stable": bool(m.stable),
            },
            "memory_bytes": self.memory_bytes,
            "injected": self.injected,
        }

    @classmethod
    def from_record(
        cls, backend: Backend, record: dict[str, Any], is_baseline: bool, key: str
    ) -> Outcome:
        m = record.get("measurement")
        return cls(
            backend,
            is_baseline=is_baseline,
            status=record["status"],
            reason=record["reason"],
            build_s=record["build_s"],
            check=CheckResult(**record["check"]) if record.get("check") else None,
            measurement=None
            if m is None
            else _core.Measurement.from_samples(
                m["samples_ms"], m["batch_size"], m["wall_ms"], m["windows"], m["stable"]
            ),
            memory_bytes=record.get("memory_bytes", 0),
            injected=record.get("injected", False),
            cached=True,
            cache_key=key,
        )

    def result(self) -> Any:
        """The engine's view of this candidate, for the strategies."""
        return _core.CandidateResult(
            name=self.backend.name,
            backend=type(self.backend).__name__,
            ok=self.status != "failed",
            correct=self.status == "ok",
            reason=self.reason,
            measurement=self.measurement,
            memory_bytes=self.memory_bytes,
            portability=int(getattr(type(self.backend), "portability", 5)),
            is_baseline=self.is_baseline,
        )


def evaluate(
    backend: Backend,
    module: torch.nn.Module,
    samples: list[Sample],
    references: list[Any],
    graph: GraphInfo,
    measure_at: int,
    batch_size: int,
    is_baseline: bool = False,
) -> Outcome:
    """Build ``backend`` for ``module``, check it on every sample, and measure it."""
    outcome = Outcome(backend, is_baseline=is_baseline)
    available = type(backend).available()
    if not available:
        return _fail(
            outcome,
            f"unavailable: {available.reason}"
            + (f" (fix: {available.fix})" if available.fix else ""),
        )
    stage = "build"
    _enter("build")
    try:
        if graph.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(graph.device)
        with torch.no_grad():
            started = time.perf_counter()
            fn = backend.build_graph(module, samples, graph)
            if not callable(fn):
                return _fail(outcome, f"build returned {type(fn).__name__}, not a callable")
            first = samples[measure_at]
            fn(*first.args, **first.kwargs)  # a JIT backend compiles here: build time
            _sync(graph.device)
            outcome.build_s = time.perf_counter() - started
            stage = "check"
            outcome.check = _check(fn, samples, references, _reduced_precision(backend))
        if not outcome.check.ok:
            outcome.status, outcome.reason = "rejected", outcome.check.reason
            return outcome
        stage = "measure"
        _enter("measure")
        outcome.fn = fn
        outcome.measurement, outcome.injected = measure(
            fn, samples[measure_at], graph.device, backend, batch_size
        )
        if graph.device.type == "cuda":
            outcome.memory_bytes = int(torch.cuda.max_memory_allocated(graph.device))
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as e:
        log.debug("honed: %s failed during %s", backend.name, stage, exc_info=True)
        outcome.fn = None
        return _fail(outcome, f"{stage} raised {type(e).__name__}: {_first_line(e)}")
    return outcome


def build_for_install(
    outcome: Outcome,
    module: torch.nn.Module,
    samples: list[Sample],
    graph: GraphInfo,
    measure_at: int,
    files: dict[str, bytes] | None,
) -> Callable[..., Any]:
    """The callable of a candidate whose figures came from the cache: load or build, then warm."""
    backend = outcome.backend
    with torch.no_grad():
        if files and backend.saves_payload:
            fn = backend.load_payload(files, module, graph)
        else:
            fn = backend.build_graph(module, samples, graph)
        first = samples[measure_at]
        fn(*first.args, **first.kwargs)
    return fn


def _fail(outcome: Outcome, reason: str) -> Outcome:
    outcome.status, outcome.reason = "failed", reason
    return outcome


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _reduced_precision(backend: Backend) -> bool:
    cfg = getattr(backend, "config", None)
    return bool(getattr(cfg, "autocast_enabled", False))


def _check(
    fn: Callable[..., Any], samples: list[Sample], references: list[Any], reduced: bool
) -> CheckResult:
    result = CheckResult(True)
    for sample, ref in zip(samples, references, strict=True):
        out = fn(*sample.args, **sample.kwargs)
        result = result.merge(compare(ref, out, reduced))
        if not result.ok:
            break
    return result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure_config(batch_size: int) -> Any:
    cfg = _core.MeasureConfig()
    cfg.warmup_calls = config.warmup_calls
    cfg.warmup_ms = config.warmup_ms
    cfg.window_calls = config.window_calls
    cfg.window_ms = config.window_ms
    cfg.stable_windows = config.stable_windows
    cfg.tolerance = config.stability_tolerance
    cfg.max_windows = config.max_windows
    cfg.batch_size = batch_size
    return cfg


def _injected(backend: Backend) -> list[float] | None:
    table = config.injected_latencies
    if not table:
        return None
    return table.get(backend.name) or table.get(type(backend).__name__)


def make_timer(device: torch.device) -> Any:
    """CUDA events on the current stream when on a GPU, else the host clock."""
    if device.type == "cuda":
        ok, _ = _core.cuda_timer_available()
        if ok:
            return _core.CudaEventTimer(int(torch.cuda.current_stream(device).cuda_stream))
        return _core.HostTimer(lambda: torch.cuda.synchronize(device))
    return _core.HostTimer()


def measure(
    fn: Callable[..., Any],
    sample: Sample,
    device: torch.device,
    backend: Backend,
    batch_size: int,
) -> tuple[Any, bool]:
    """Measure ``fn`` on ``sample`` with the engine; returns (measurement, injected?)."""
    injected = _injected(backend)
    timer = _core.InjectedTimer(injected) if injected else make_timer(device)
    args, kwargs = sample.args, sample.kwargs
    with torch.no_grad():
        m = _core.measure(lambda: fn(*args, **kwargs), timer, _measure_config(batch_size))
    return m, injected is not None


def measure_interleaved(
    outcomes: list[Outcome], sample: Sample, device: torch.device, batch_size: int
) -> None:
    """Re-measure the fastest few interleaved (A B C A B C ...) so drift hits all alike."""
    real = [o for o in outcomes if not o.injected and o.fn is not None]
    if len(real) < 2:
        return
    real.sort(key=lambda o: o.measurement.median_ms)
    finalists = real[:_FINALISTS]
    slowest = max(o.measurement.median_ms for o in finalists)
    calls = max(3, int(_INTERLEAVED_ROUND_MS / max(slowest, 1e-3)))
    args, kwargs = sample.args, sample.kwargs
    fns = [_bind(o.fn, args, kwargs) for o in finalists]
    with torch.no_grad():
        results = _core.interleaved(
            fns, make_timer(device), _INTERLEAVED_ROUNDS, min(calls, 200), batch_size
        )
    for o, m in zip(finalists, results, strict=True):
        o.measurement = m


def _bind(fn: Callable[..., Any] | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    assert fn is not None
    return lambda: fn(*args, **kwargs)
