"""src/honed/pipeline/candidate.py: builds, checks and measures one candidate for one graph.

A failing candidate never stops the tune: any exception becomes its failure reason. Figures come
from the engine's measure (host clock, CUDA events, or injected samples in tests).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from honed import _core, config
from honed.backend.base import Backend, GraphInfo, Sample, known_outputs
from honed.backend.registry import availability
from honed.pipeline.correctness import (
    FP32,
    CheckResult,
    Tolerance,
    compare,
    eager_tolerance,
    tolerance_for,
)
from honed.pipeline.courtesy import give_way, spaced_benchmarks, spaced_run
from honed.pipeline.machine import measuring_threads

log = logging.getLogger("honed")

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
    measurement: _core.Measurement | None = None
    memory_bytes: int = 0
    injected: bool = False
    cached: bool = False  # figures came from the tuning cache; fn is built only if selected
    cache_key: str | None = None
    isolated: bool = False  # evaluated in a worker process; fn is installed only if selected
    # What the worker shipped so the caller installs the measured variant without building it
    # again (honed.pipeline.shipping): a payload backend's files (e.g. the .pt2), Inductor's cache
    # artifacts of a JIT backend, or the callable itself, pickled.
    payload_files: dict[str, bytes] | None = None
    inductor_artifacts: bytes | None = None
    pickled_fn: bytes | None = None
    device: str = ""  # where a worker measured it (another GPU of the host when spread)
    slot: int = -1  # the pool slot whose worker evaluated it (-1: none, or not this run)
    checked_here: bool = False  # fn was checked against eager in this process
    output: str = ""  # third-party output while it was evaluated (see buildlog.py)
    build_log: str | None = None  # the file that output was written to
    install_s: float = 0.0  # building/loading it in the caller's process once selected
    seconds: float | None = None  # how long its evaluation took, start to end
    # Built and checked, not measured: the program it is tuned for was calling (JIT), and its
    # calls measure it instead (honed.pipeline.graph_tuner: the program's calls).
    deferred: bool = False
    # The quickest of its check's runs on the measured sample's shapes, each timed to its
    # finish (ms): a rough figure, taken beside whatever ran then, that tells a candidate
    # several times slower than another without measuring either.
    check_ms: float | None = None

    @property
    def passed(self) -> bool:
        return self.status == "ok" and self.measurement is not None

    def to_record(self) -> dict[str, Any]:
        """What the tuning cache stores (and a worker replies): everything but the callable."""
        record = {
            "status": self.status,
            "reason": self.reason,
            "build_s": self.build_s,
            "check": dataclasses.asdict(self.check) if self.check is not None else None,
            "measurement": measurement_record(self.measurement),
            "memory_bytes": self.memory_bytes,
            "injected": self.injected,
        }
        if self.deferred:
            record["deferred"] = True
        if self.device:
            record["measured_on"] = self.device
        if self.check_ms is not None:
            record["check_ms"] = self.check_ms
        return record

    @classmethod
    def from_record(cls, backend: Backend, record: Any, is_baseline: bool, key: str) -> Outcome:
        """The outcome a cache record (or a worker's reply) holds; ValueError naming what is
        wrong when the record is not one (the cache is a hint: the caller evaluates again)."""
        problem = record_problem(record)
        if problem:
            raise ValueError(problem)
        m = record.get("measurement")
        try:
            return cls(
                backend,
                is_baseline=is_baseline,
                status=record["status"],
                reason=record["reason"],
                build_s=record["build_s"],
                check=CheckResult(**record["check"]) if record.get("check") else None,
                measurement=measurement_from_record(m),
                memory_bytes=int(record.get("memory_bytes", 0)),
                injected=bool(record.get("injected", False)),
                deferred=bool(record.get("deferred", False)),
                device=str(record.get("measured_on", "")),
                check_ms=record.get("check_ms"),
                cached=True,
                cache_key=key,
            )
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{type(e).__name__}: {e}") from e

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
            tried=self.status != "not tried",
        )


_STATUSES = ("ok", "failed", "rejected")


def record_problem(record: Any) -> str:
    """What makes ``record`` unusable as an Outcome record ("" when nothing)."""
    if not isinstance(record, dict):
        return f"a record must be a JSON object, got {type(record).__name__}"
    missing = [k for k in ("status", "reason", "build_s", "measurement") if k not in record]
    if missing:
        return f"missing field(s) {missing}"
    if record["status"] not in _STATUSES:
        return f"status {record['status']!r} is not one of {_STATUSES}"
    if not isinstance(record["reason"], str):
        return "reason is not a string"
    m = record["measurement"]
    if record["status"] == "ok" and not isinstance(m, dict) and not record.get("deferred"):
        return "an ok record has no measurement"
    if m is not None and not (
        isinstance(m, dict)
        and isinstance(m.get("samples_ms"), list)
        and m["samples_ms"]
        and all(isinstance(x, int | float) and x == x and x > 0 for x in m["samples_ms"])
    ):
        return "measurement.samples_ms must be a non-empty list of positive numbers"
    if m is not None:
        blocks, run = m.get("blocks") or [], m.get("run") or 0
        if not (
            isinstance(blocks, list)
            and all(isinstance(n, int) and n > 0 for n in blocks)
            and (not blocks or sum(blocks) == len(m["samples_ms"]))
        ):
            return "measurement.blocks must be positive counts that sum to the samples"
        if not (isinstance(run, int) and 0 <= run < 2**63):
            return "measurement.run must be a non-negative integer"
    if record.get("check") is not None and not isinstance(record["check"], dict):
        return "check is not an object"
    ms = record.get("check_ms")
    if ms is not None and not (isinstance(ms, int | float) and not isinstance(ms, bool) and ms > 0):
        return "check_ms must be a positive number"
    return ""


def measurement_record(m: _core.Measurement | None) -> dict[str, Any] | None:
    """A Measurement as JSON (its samples and how they were taken)."""
    if m is None:
        return None
    return {
        "samples_ms": list(m.samples_ms),
        "batch_size": int(m.batch_size),
        "wall_ms": float(m.wall_ms),
        "windows": int(m.windows),
        "stable": bool(m.stable),
        "blocks": list(m.blocks),
        "run": int(m.run),
    }


def measurement_from_record(m: dict[str, Any] | None) -> Any:
    if m is None:
        return None
    return _core.Measurement.from_samples(
        m["samples_ms"],
        m["batch_size"],
        m["wall_ms"],
        m["windows"],
        m["stable"],
        blocks=m.get("blocks") or [],  # records written before blocks were kept: single calls
        run=m.get("run") or 0,
    )


class MeasureDeferred(Exception):
    """Raised by ``on_phase("measure")`` when the candidate is not to be measured now: the
    program it is tuned for is calling, and its calls will measure it (JIT)."""


def evaluate(
    backend: Backend,
    module: torch.nn.Module,
    samples: list[Sample],
    references: list[Any],
    graph: GraphInfo,
    measure_at: int,
    batch_size: int,
    is_baseline: bool = False,
    on_phase: Callable[[str], None] | None = None,
) -> Outcome:
    """Build ``backend`` for ``module``, check it on every sample, and measure it.

    ``on_phase(name)`` is called as it enters "build", "check" and "measure" (a worker reports
    them to the pool, and waits there for its turn to measure); raising MeasureDeferred at
    "measure" returns the built, checked candidate unmeasured (``deferred``).
    """
    enter = on_phase or (lambda phase: None)
    outcome = Outcome(backend, is_baseline=is_baseline)
    available = availability(type(backend))
    if not available:
        return _fail(
            outcome,
            f"unavailable: {available.reason}"
            + (f" (fix: {available.fix})" if available.fix else ""),
        )
    supported = backend.supports(graph.device)
    if not supported:
        return _fail(
            outcome,
            f"unavailable: {supported.reason}"
            + (f" (fix: {supported.fix})" if supported.fix else ""),
        )
    stage = "build"
    enter("build")
    try:
        if graph.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(graph.device)
        # Beside a program, the compile's kernel benchmarks (in the build, or in a JIT
        # backend's first run) are spaced like the runs.
        with torch.no_grad(), spaced_benchmarks(graph.device):
            started = time.perf_counter()
            with known_outputs(samples, references):
                fn = backend.build_graph(module, samples, graph)
            if not callable(fn):
                return _fail(outcome, f"build returned {type(fn).__name__}, not a callable")
            first = samples[measure_at]
            with spaced_run(graph.device):
                fn(*first.args, **first.kwargs)  # a JIT backend compiles here: build time
            _sync(graph.device)
            outcome.build_s = time.perf_counter() - started
            stage = "check"
            enter("check")
            runs_ms: list[float] = []
            outcome.check = _check(
                fn,
                samples,
                references,
                *_tolerances(backend, module, graph.device),
                graph.device,
                runs_ms,
            )
            outcome.check_ms = _warm_check_ms(runs_ms, samples, measure_at)
        if not outcome.check.ok:
            outcome.status, outcome.reason = "rejected", outcome.check.reason
            return outcome
        stage = "measure"
        outcome.fn, outcome.checked_here = fn, True
        try:
            enter("measure")
        except MeasureDeferred:
            outcome.deferred = True
            return outcome
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


def _warm_check_ms(runs_ms: list[float], samples: list[Sample], measure_at: int) -> float | None:
    """The quickest check run on a sample of the measured sample's shapes (the build ran that
    one first): a shape's first run pays for its own set-up (a CUDA-graph capture, a CPU
    library's kernels for the shape), which tells nothing of the variant's speed."""
    first = samples[measure_at]
    want = shapes_key(first.args, first.kwargs)
    warm = [
        ms for ms, s in zip(runs_ms, samples, strict=False) if shapes_key(s.args, s.kwargs) == want
    ]
    return min(warm) if warm else None


def shapes_key(args: Any, kwargs: Any) -> tuple[Any, ...]:
    """A call's inputs as their shapes, dtypes and devices (other leaves by type): calls with
    equal keys take the same path through a compiled variant."""
    return tuple(
        (tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t)
        for t in torch.utils._pytree.tree_leaves((args, kwargs))
    )


def _fail(outcome: Outcome, reason: str) -> Outcome:
    outcome.status, outcome.reason = "failed", reason
    return outcome


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:197] + "..."


def reduced_precision(backend: Backend) -> bool:
    return backend.precision() != "fp32"


def to_device(tree: Any, device: torch.device) -> Any:
    """``tree`` with every tensor moved to ``device`` (samples, references)."""
    return torch.utils._pytree.tree_map(
        lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree
    )


def check(
    fn: Callable[..., Any],
    samples: list[Sample],
    references: list[Any],
    backend: Backend,
    module: torch.nn.Module,
    device: torch.device,
) -> CheckResult:
    """``fn``'s outputs on every sample against eager's, with the backend's tolerance."""
    with torch.no_grad():
        return _check(fn, samples, references, *_tolerances(backend, module, device), device)


def _tolerances(
    backend: Backend, module: torch.nn.Module, device: torch.device
) -> tuple[bool, Tolerance | None, Tolerance]:
    """Whether ``backend`` computes in reduced precision, the backend's own tolerance (None:
    per dtype), and the one for float32 outputs (looser where eager is not fp32-exact)."""
    return reduced_precision(backend), backend.tolerance(), eager_tolerance(module, device) or FP32


def float_tolerance(backend: Backend, module: torch.nn.Module, device: torch.device) -> Tolerance:
    """The tolerance a float32 output of ``backend``'s variant was checked with: what a saved
    artifact records, so a later check (``honed-run --check``) holds it to the same bar."""
    reduced, own, fp32 = _tolerances(backend, module, device)
    return own or tolerance_for(torch.float32, reduced, fp32)


def _check(
    fn: Callable[..., Any],
    samples: list[Sample],
    references: list[Any],
    reduced: bool,
    tolerance: Tolerance | None = None,
    fp32: Tolerance = FP32,
    device: torch.device | None = None,
    runs_ms: list[float] | None = None,
) -> CheckResult:
    """``fn`` on every sample against eager's outputs; each run's time to its finish (ms) is
    appended to ``runs_ms`` where given."""
    result = CheckResult(True)
    for sample, ref in zip(samples, references, strict=True):
        give_way()  # beside a JIT program: between its calls
        with spaced_run(device):  # and on its GPU, one run at a time
            started = time.perf_counter()
            out = fn(*sample.args, **sample.kwargs)
            if runs_ms is not None and device is not None:
                _sync(device)
                runs_ms.append((time.perf_counter() - started) * 1e3)
        result = result.merge(compare(ref, out, reduced, tolerance, fp32))
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
) -> tuple[_core.Measurement, bool]:
    """Measure ``fn`` on ``sample`` with the engine; returns (measurement, injected?)."""
    injected = _injected(backend)
    timer = _core.InjectedTimer(injected) if injected else make_timer(device)
    args, kwargs = sample.args, sample.kwargs
    with torch.no_grad(), measuring_threads(device):
        m = _core.measure(lambda: fn(*args, **kwargs), timer, _measure_config(batch_size))
    return m, injected is not None


def finalists(outcomes: list[Outcome]) -> list[Outcome]:
    """The fastest few measured (not injected) candidates, for an interleaved re-measurement."""
    real = [o for o in outcomes if o.passed and not o.injected]
    real.sort(key=_median_ms)
    return real[:_FINALISTS] if len(real) >= 2 else []


def needs_interleave(outcomes: list[Outcome]) -> bool:
    """Whether the finalists are re-measured side by side: unless each of them comes from the
    cache, whose figures are already those of an earlier interleaved run. A candidate measured
    afresh that is no finalist (an unstable eager on a warm re-tune) does not need it."""
    return not all(o.cached for o in finalists(outcomes))


def _median_ms(outcome: Outcome) -> float:
    m = outcome.measurement
    return m.median_ms if m is not None else math.inf


def per_call_ms(m: _core.Measurement | None) -> float:
    """What one call took in a measurement, waits between calls included (the wall time over the
    calls: on a busy machine far more than the median), for sizing the interleaved rounds."""
    assert m is not None, "per_call_ms of a candidate that was never measured"
    return max(m.median_ms, m.wall_ms / max(1, len(m.samples_ms)))


def interleave(
    fns: list[Callable[..., Any]],
    per_call: list[float],
    sample: Sample,
    device: torch.device,
    batch_size: int,
) -> list[Any]:
    """Measure ``fns`` interleaved (A B C A B C ...) on ``sample`` so drift hits all alike.

    ``per_call``: each one's time per call in ms (per_call_ms), so a round takes about
    _INTERLEAVED_ROUND_MS.
    """
    calls = max(3, int(_INTERLEAVED_ROUND_MS / max(max(per_call), 1e-3)))
    args, kwargs = sample.args, sample.kwargs
    bound = [_bind(fn, args, kwargs) for fn in fns]
    with torch.no_grad(), measuring_threads(device):
        results = _core.interleaved(
            bound,
            make_timer(device),
            _INTERLEAVED_ROUNDS,
            min(calls, 200),
            batch_size,
            config.stability_tolerance,
        )
    return results


def measure_interleaved(
    outcomes: list[Outcome], sample: Sample, device: torch.device, batch_size: int
) -> None:
    """Re-measure the finalists built in this process interleaved; replaces their figures."""
    chosen = [o for o in finalists(outcomes) if o.fn is not None]
    if len(chosen) < 2:
        return
    fns = [o.fn for o in chosen if o.fn is not None]
    per_call = [per_call_ms(o.measurement) for o in chosen]
    for o, m in zip(chosen, interleave(fns, per_call, sample, device, batch_size), strict=True):
        o.measurement = m


def _bind(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return lambda: fn(*args, **kwargs)
