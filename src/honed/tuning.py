"""src/honed/tuning.py: honed.tune(): record, infer shapes, build, check, measure, select.

Shapes, figures and choices all come from the engine (honed._core); this file only runs what
needs PyTorch's Python API and hands the results over.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from honed import _core, buildlog, config, guidance, machine, progress
from honed import figures as fig
from honed.backend.base import Backend, GraphInfo, Sample
from honed.backend.torch_eager import TorchEagerBackend
from honed.cache import TuneCache, inputs_fingerprint, model_fingerprint, open_for_tune
from honed.calls import call_sample
from honed.candidate import (
    Outcome,
    build_for_install,
    evaluate,
    finalists,
    measure_interleaved,
    measurement_record,
    watch_phases,
)
from honed.environment import fingerprint
from honed.errors import InputError, TuneError
from honed.isolation import NotIsolatable, evaluate_isolated, interleave_isolated
from honed.module import RECORDING, GraphRecording, Module, Variant, find_modules
from honed.report import CandidateReport, GraphReport, TuneReport
from honed.shapes import graph_info, overrides_for, tensor_names
from honed.sweep import sweep_graph
from honed.tune_strategy import MaxThroughputStrategy, TuneStrategy

log = logging.getLogger("honed")


def tune(
    func: Callable[..., Any] | None = None,
    dataset: Any = None,
    *,
    strategy: TuneStrategy | None = None,
    backends: list[Backend] | None = None,
    batch_sizes: list[int] | None = None,
    batch_sweep: bool = False,
    max_batch: int = 1024,
    device: str | torch.device | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    clear_cache: bool = False,
    isolation: str | None = None,
    target: str = "python",
) -> TuneReport:
    """Tune every honed.Module that ``func`` calls, on the inputs it really receives.

    Args:
        func: a honed.Module, or an inference function/pipeline that calls honed.Modules.
        dataset: the samples to run ``func`` on: a list (or any iterable) of samples, where a
            ``(tuple, dict)`` pair (or ``honed.backend.Sample``) is ``(args, kwargs)``, any
            other tuple is unpacked as positional arguments, a dict as keyword arguments, and
            anything else (e.g. a tensor) is passed as the single argument (honed.calls).
            Spellings may mix: calls are bound to forward's signature before they are keyed.
        strategy: the strategy for modules that have none (default: MaxThroughputStrategy).
        backends: narrow the candidates to these backends (for modules without a strategy).
        batch_sizes: also run every sample resized along its batch axis to these sizes, so the
            tuned profile covers them (repeat or slice along axis 0).
        batch_sweep: grow each graph's batch by powers of two (up to ``max_batch``) until the
            throughput gain stays under 5 % for two steps or memory runs out, and tune for
            batches up to that knee. Needs a batch axis (samples of at least two batch sizes,
            ``batch_sizes``, or a BatchDim in ``dynamic_shapes``).
        device: the device the model runs on ("cuda", "cpu"); checked, never silently changed.
        cache_dir: where the tuning cache lives (default: ``honed.config.cache_dir``, from
            HONED_CACHE_DIR). A second tune of the same model, inputs, environment and candidates
            reuses earlier outcomes instead of rebuilding and re-measuring. HONED_CACHE=0 (or
            ``honed.config.patch(cache_enabled=False)``) turns the cache off.
        clear_cache: ignore the cached outcomes this tune would use, and overwrite them.
        isolation: "process" (default, from HONED_ISOLATION): each candidate is built, checked
            and measured in a worker process, so a crash, hang or runaway allocation fails only
            that candidate; "none": in this process (faster to start, not crash-proof).
        target: where the tuned model will run. "python" (default): any backend, eager
            included. "cpp": only backends the C++ runtime (honed::Model, honed-run) can run
            (TorchInductorAotBackend); eager is measured as the reference but never selected,
            and the report says so.

    Returns:
        A TuneReport; each module also keeps its own part in ``module.report``.
    """
    started = time.perf_counter()
    if func is None:
        raise InputError("honed.tune needs a honed.Module or an inference function as `func`")
    if not callable(func):
        raise InputError(f"honed.tune: func must be callable, got {type(func).__name__}")
    if strategy is not None and not isinstance(strategy, TuneStrategy):
        raise InputError(
            f"honed.tune: strategy must be a honed strategy such as honed.MaxThroughputStrategy(), "
            f"got {type(strategy).__name__}"
        )
    if strategy is not None and backends is not None:
        raise InputError("honed.tune: pass either strategy= or backends=, not both")
    if target not in TARGETS:
        raise InputError(f"honed.tune: target must be one of {TARGETS}, got {target!r}")
    default_strategy = strategy or MaxThroughputStrategy(backends)
    samples = _normalize_dataset(dataset)
    sizes = _validate_batch_sizes(batch_sizes)
    if max_batch < 1:
        raise InputError(f"honed.tune: max_batch must be positive, got {max_batch}")

    with progress.tracking():  # the live display (progress.py)
        progress.current().phase("record")
        modules = _record(func, samples, sizes)
        if not modules:
            raise InputError(
                "honed.tune: no honed.Module was called while running the dataset; wrap the model "
                "with honed.Module(model, 'name') and call it inside func"
            )
        guidance.at_tune_start(modules, sizes, batch_sweep)  # .eval(), fixed shapes
        run_device = _resolve_device(device, modules)
        machine_section = machine.start_of_tune(run_device)  # names a busy machine
        isolation = isolation or config.isolation
        if isolation not in ("process", "none"):
            raise InputError(
                f"honed.tune: isolation must be 'process' or 'none', got {isolation!r}"
            )
        cache, run_dir = open_for_tune(  # a read-only cache folder: one warning, cache off
            Path(cache_dir) if cache_dir is not None else config.cache_dir, config.cache_enabled
        )
        ctx = _Context(
            isolation=isolation,
            device=run_device,
            sweep_to=max_batch if batch_sweep else 0,
            cache=cache,
            refresh=clear_cache,
            run_dir=run_dir,
            target=target,
        )
        graphs: list[GraphReport] = []
        with _dynamo_limits():
            for module in modules:
                module_strategy = module.strategy or default_strategy
                variants: list[Variant] = []
                module_graphs: list[GraphReport] = []
                for index, recording in enumerate(module.graphs.values()):
                    graph_strategy = module.strategy_for(index, recording.key) or module_strategy
                    progress.current().at_graph(module.name, f"graph {index}")
                    report, variant = _tune_graph(module, recording, graph_strategy, ctx, index)
                    module_graphs.append(report)
                    if variant is not None:
                        variants.append(variant)
                progress.current().candidate("")
                progress.current().phase("install")
                module.install(variants)
                module.graphs = {}
                module.report = TuneReport(
                    module_graphs,
                    str(run_device),
                    module_strategy.describe(),
                    0.0,
                    fingerprint(run_device),
                    ctx.target,
                    machine_section,
                )
                graphs += module_graphs
        overall = TuneReport(
            graphs,
            str(run_device),
            default_strategy.describe(),
            time.perf_counter() - started,
            fingerprint(run_device),
            ctx.target,
            machine_section,
        )
        for module in modules:
            module.report.wall_s = overall.wall_s
        return overall


TARGETS = ("python", "cpp")


def _for_target(backends: list[Backend], target: str, module: str) -> tuple[list[Backend], str]:
    """The candidates a target can run, and the note the report's decision carries."""
    if target == "python":
        return backends, ""
    runnable = [b for b in backends if b.cpp_runnable]
    dropped = sorted({b.name for b in backends if not b.cpp_runnable})
    if not runnable:
        raise InputError(
            f"honed.tune(target='cpp'): module {module!r}: none of the candidates "
            f"({', '.join(dropped) or 'none'}) can run in the C++ runtime; include "
            "honed.backend.TorchInductorAotBackend() (or leave backends unset)"
        )
    note = (
        " · target cpp: only backends the C++ runtime runs were candidates "
        f"({', '.join(sorted({b.name for b in runnable}))}); eager is the reference only"
    )
    if dropped:
        note += f"; left out: {', '.join(dropped)}"
    return runnable, note


# -- dataset and recording ---------------------------------------------------------------------
def _normalize_dataset(dataset: Any) -> list[Any]:
    if dataset is None:
        raise InputError(
            "honed.tune needs a dataset: a list of samples (tensors, tuples of arguments or "
            "dicts of keyword arguments) that the model receives in real use"
        )
    if isinstance(dataset, torch.Tensor | dict | tuple):
        samples = [dataset]
    elif isinstance(dataset, Iterable) and not isinstance(dataset, str | bytes):
        samples = list(dataset)
    else:
        samples = [dataset]
    if not samples:
        raise InputError("honed.tune: the dataset is empty; give at least one sample")
    return samples


def _validate_batch_sizes(batch_sizes: list[int] | None) -> list[int]:
    if batch_sizes is None:
        return []
    sizes = sorted({int(b) for b in batch_sizes})
    if any(b < 1 for b in sizes):
        raise InputError(f"honed.tune: batch_sizes must be positive, got {batch_sizes}")
    return sizes


def _call(func: Callable[..., Any], sample: Any) -> Any:
    return call_sample(func, sample)  # how a sample is read: honed.calls


def _resize_batch(sample: Any, batch: int) -> Any:
    """``sample`` with every tensor that shares the first tensor's axis-0 size resized to batch."""
    leaves = torch.utils._pytree.tree_leaves(sample)
    first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0), None)
    if first is None:
        raise InputError("honed.tune: batch_sizes needs samples with at least one tensor")
    current = int(first.shape[0])
    index = torch.tensor(_core.batch_indices(current, batch), device=first.device)

    def resize(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and int(t.shape[0]) == current:
            return t.index_select(0, index.to(t.device))
        return t

    return torch.utils._pytree.tree_map(resize, sample)


def _record(func: Callable[..., Any], samples: list[Any], sizes: list[int]) -> list[Module]:
    known = find_modules(func)
    for m in known:
        m.reset()
    RECORDING.active = True
    RECORDING.modules = []
    try:
        with torch.no_grad():
            for sample in samples:
                _call(func, sample)
                for b in sizes:
                    _call(func, _resize_batch(sample, b))
        recorded = list(RECORDING.modules)
    except Exception as e:
        raise InputError(
            f"honed.tune: running the dataset through the model failed before any tuning: "
            f"{type(e).__name__}: {e}. Check that each sample matches the model's forward()"
        ) from e
    finally:
        RECORDING.active = False
        RECORDING.modules = []
    return recorded


def _resolve_device(device: str | torch.device | None, modules: list[Module]) -> torch.device:
    found = _module_device(modules[0])
    if device is None:
        return found
    wanted = torch.device(device)
    if wanted.type == "cuda" and not torch.cuda.is_available():
        from honed.doctor import diagnose

        problems = diagnose("cuda").problems or ["torch.cuda.is_available() is False"]
        raise TuneError(
            f"honed.tune: device={str(wanted)!r} was asked for but CUDA cannot start here, and "
            "honed never falls back to the CPU silently:\n  - "
            + "\n  - ".join(problems)
            + "\nRun `honed doctor --device cuda` for the full report, or tune on device='cpu'."
        )
    if wanted.type != found.type:
        raise InputError(
            f"honed.tune: device={str(wanted)!r} but module {modules[0].name!r} is on {found}; "
            f"move the model and its inputs with .to({str(wanted)!r}) before tuning"
        )
    return found


def _module_device(module: Module) -> torch.device:
    for p in module.module.parameters():
        return p.device
    for b in module.module.buffers():
        return b.device
    for recording in module.graphs.values():
        for sample in recording.samples:
            for t in torch.utils._pytree.tree_leaves((sample.args, sample.kwargs)):
                if isinstance(t, torch.Tensor):
                    return t.device
    return torch.device("cpu")


@contextlib.contextmanager
def _dynamo_limits() -> Iterator[None]:
    """Each candidate compiles the same forward again: raise Dynamo's recompile limit."""
    import torch._dynamo

    cfg = torch._dynamo.config
    limits: dict[str, Any] = {}
    for names, value in (
        (("recompile_limit", "cache_size_limit"), 256),
        (("accumulated_recompile_limit", "accumulated_cache_size_limit"), 4096),
    ):
        name = next((n for n in names if hasattr(cfg, n)), None)
        if name is not None:
            limits[name] = max(value, getattr(cfg, name))
    with torch._dynamo.config.patch(limits):
        yield


# -- one graph ---------------------------------------------------------------------------------
@dataclasses.dataclass
class _Context:
    """What every graph of one tune shares."""

    device: torch.device
    sweep_to: int  # 0: no batch sweep
    cache: TuneCache | None
    refresh: bool  # clear_cache: re-evaluate and overwrite instead of reading the cache
    isolation: str = "process"
    run_dir: Path | None = None  # where the candidates' build.log files go (buildlog.py)
    target: str = "python"  # "cpp": only candidates the C++ runtime can run (see tune())
    fingerprints: dict[int, str] = dataclasses.field(default_factory=dict)
    warned: set[str] = dataclasses.field(default_factory=set)

    def model_fingerprint(self, module: torch.nn.Module) -> str:
        if id(module) not in self.fingerprints:
            self.fingerprints[id(module)] = model_fingerprint(module)
        return self.fingerprints[id(module)]


def _graph_profile(module: Module, recording: GraphRecording, ctx: _Context) -> tuple[Any, str]:
    """The engine's shape profile of one graph (after the batch sweep, when asked for)."""
    first = recording.samples[0]
    names = tensor_names(first.args, first.kwargs, module.module.forward)
    overrides = overrides_for(module.dynamic_shapes, recording.signatures[0], names)
    profile = _core.infer_profile(recording.signatures, overrides)
    if not ctx.sweep_to:
        return profile, ""
    result = sweep_graph(module.module, recording, profile, ctx.device, ctx.sweep_to)
    if result is None:
        return profile, "no batch axis: nothing to sweep"
    profile = _core.infer_profile(recording.signatures, overrides)
    points = ", ".join(f"{b}: {t:,.0f}/s" for b, t in result.points)
    return profile, f"knee at batch {result.knee} ({result.stop_reason}; {points})"


def _tune_graph(
    module: Module,
    recording: GraphRecording,
    strategy: TuneStrategy,
    ctx: _Context,
    index: int = 0,
) -> tuple[GraphReport, Variant | None]:
    profile, swept = _graph_profile(module, recording, ctx)
    info = graph_info(profile, ctx.device)
    samples = recording.samples
    inner = module.module
    with torch.no_grad():
        references = [inner(*s.args, **s.kwargs) for s in samples]
    measure_at = _measure_index(profile, recording.signatures)
    batch = _batch_size(profile, recording.signatures[measure_at])
    key_parts = _cache_key_parts(ctx, inner, samples, profile, measure_at) if ctx.cache else None

    def run(backend: Backend, is_baseline: bool = False) -> Outcome:
        progress.current().candidate(backend.name)
        key = None
        if ctx.cache is not None and key_parts is not None:
            key = TuneCache.key(
                **key_parts, candidate=_backend_identity(backend), baseline=is_baseline
            )
            record = None if ctx.refresh else ctx.cache.get(key)
            if record is not None:
                progress.current().finished("cached")
                return Outcome.from_record(backend, record, is_baseline, key)
        outcome = _evaluate(
            ctx,
            backend=backend,
            module=inner,
            samples=samples,
            references=references,
            graph=info,
            measure_at=measure_at,
            batch_size=batch,
            is_baseline=is_baseline,
        )
        if ctx.run_dir is not None:
            outcome.build_log = buildlog.write(
                ctx.run_dir, module.name, index, backend.name, outcome.output
            )
        progress.current().finished(outcome.status, outcome.reason)
        if ctx.cache is not None and key is not None:
            outcome.cache_key = key
            ctx.cache.put(key, outcome.to_record(), _payload(outcome))
        return outcome

    baseline = run(TorchEagerBackend(), is_baseline=True)
    candidates, target_note = _for_target(
        strategy.backends(ctx.device, info), ctx.target, module.name
    )
    # Eager competes (and is the fallback) unless the tuned graph must run from C++.
    uses_baseline = strategy.uses_baseline and ctx.target == "python"
    outcomes: list[Outcome] = []
    for backend in candidates:
        if uses_baseline and backend.name == baseline.backend.name:
            continue  # eager with default config is the baseline itself
        outcomes.append(run(backend))
    competing = ([baseline] if uses_baseline else []) + outcomes
    if not all(o.cached for o in competing):  # all cached: their figures are the final ones
        _interleave(competing, ctx, inner, samples, info, measure_at, batch)
    decision, chosen = _select(strategy, competing, inner, samples, info, measure_at, ctx)
    if chosen is None:
        log.warning(
            "honed: %s: no candidate selected (%s); running eager", module.name, decision.reason
        )
    everything = [baseline, *outcomes]
    figure = str(getattr(decision, "figure", ""))  # what the strategy ranked by
    rows = [_row(o, baseline, o is chosen, figure) for o in everything]
    report = GraphReport(
        module=module.name,
        graph=recording.key,
        samples=len(samples),
        **fig.graph_fields(profile, recording.signatures[measure_at]),
        ranked_by=figure,
        profile=_describe_profile(profile),
        candidates=rows,
        selected=chosen.backend.name if chosen is not None else None,
        decision=decision.reason + target_note,
        sweep=swept,
        install_s=chosen.install_s if chosen is not None else 0.0,
    )
    variant = None
    if chosen is not None and chosen.fn is not None:
        figures = dataclasses.asdict(rows[everything.index(chosen)])
        variant = Variant(profile, chosen.backend, chosen.fn, figures, samples[measure_at])
    for o in everything:
        if o is not chosen:
            o.fn = None  # let the losers' compiled code go
    return report, variant


def _interleave(
    competing: list[Outcome],
    ctx: _Context,
    module: torch.nn.Module,
    samples: list[Sample],
    info: GraphInfo,
    measure_at: int,
    batch: int,
) -> None:
    """Re-measure the finalists side by side; the cache keeps these final figures."""
    progress.current().candidate("finalists")
    progress.current().phase("interleave")
    if ctx.isolation == "process":
        job = dict(
            module=module, samples=samples, graph=info, measure_at=measure_at, batch_size=batch
        )
        interleave_isolated(finalists(competing), job)
    else:
        measure_interleaved(competing, samples[measure_at], ctx.device, batch)
    if ctx.cache is None:
        return
    for o in competing:
        record = ctx.cache.get(o.cache_key) if o.cache_key else None
        if o.cache_key and record is not None and o.measurement is not None:
            ctx.cache.put(o.cache_key, dict(record, measurement=measurement_record(o.measurement)))


def _evaluate(ctx: _Context, **job: Any) -> Outcome:
    """Evaluate one candidate in a worker process, or here when isolation is off or impossible."""
    if ctx.isolation == "process":
        progress.current().phase(progress.WORKER_PHASE)
        try:
            return evaluate_isolated(job)
        except NotIsolatable as e:
            if "isolation" not in ctx.warned:
                ctx.warned.add("isolation")
                log.warning(
                    "honed: %s cannot be sent to a worker process (%s); evaluating candidates in "
                    "this process (a crashing backend would take it down). Pass isolation='none' "
                    "to silence this.",
                    job["backend"].name,
                    e,
                )
    with buildlog.capture() as lines, watch_phases(progress.current().phase):
        outcome = evaluate(**job)
    outcome.output = "\n".join(lines)
    return outcome


def _select(
    strategy: TuneStrategy,
    competing: list[Outcome],
    module: torch.nn.Module,
    samples: list[Sample],
    info: GraphInfo,
    measure_at: int,
    ctx: _Context,
) -> tuple[Any, Outcome | None]:
    """The strategy's pick; a cached winner is built here (if that fails, pick again)."""
    while True:
        decision = strategy.select([o.result() for o in competing])
        if decision.index < 0:
            return decision, None
        chosen = competing[decision.index]
        if chosen.fn is not None:
            return decision, chosen
        files = chosen.payload_files
        if files is None and ctx.cache is not None and chosen.cache_key is not None:
            record = ctx.cache.get(chosen.cache_key)
            files = ctx.cache.files(chosen.cache_key, record) if record else None
        progress.current().candidate(chosen.backend.name)
        progress.current().phase("install")
        started = time.perf_counter()
        try:
            chosen.fn = build_for_install(chosen.backend, module, samples, info, measure_at, files)
            chosen.install_s = time.perf_counter() - started
            return decision, chosen
        except Exception as e:
            log.warning(
                "honed: rebuilding cached winner %s failed (%s: %s); choosing again",
                chosen.backend.name,
                type(e).__name__,
                e,
            )
            chosen.status, chosen.reason = "failed", f"rebuild from cache failed: {e}"


def _cache_key_parts(
    ctx: _Context, module: torch.nn.Module, samples: list[Sample], profile: Any, measure_at: int
) -> dict[str, Any]:
    return {
        "model": ctx.model_fingerprint(module),
        "inputs": inputs_fingerprint(samples),
        "profile": profile.to_json(),
        "measure_at": measure_at,
        "environment": fingerprint(ctx.device),
        "measurement": {
            name: getattr(config, name)
            for name in (
                "warmup_calls",
                "warmup_ms",
                "window_calls",
                "window_ms",
                "stable_windows",
                "stability_tolerance",
                "max_windows",
                "injected_latencies",
            )
        },
    }


def _backend_identity(backend: Backend) -> dict[str, Any]:
    """The recipe plus where the class lives and a hash of its source (custom backends change)."""
    cls = type(backend)
    try:
        source = hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()
    except (OSError, TypeError):
        source = ""
    return {
        "recipe": backend.recipe(),
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "source": source,
    }


def _payload(outcome: Outcome) -> dict[str, bytes] | None:
    if outcome.payload_files is not None:
        return outcome.payload_files
    if outcome.status != "ok" or outcome.fn is None or not outcome.backend.saves_payload:
        return None
    try:
        return outcome.backend.export_payload(outcome.fn)
    except Exception as e:
        log.warning("honed: could not store %s in the cache (%s)", outcome.backend.name, e)
        return None


def _measure_index(profile: Any, signatures: list[Any]) -> int:
    """Measure at the sample whose shapes are the profile's opt shapes (else the last one)."""
    opt = [list(s) for s in profile.opt_shapes()]
    for i, sig in enumerate(signatures):
        if [list(s) for s in sig.tensor_shapes] == opt:
            return i
    return len(signatures) - 1


def _batch_size(profile: Any, signature: Any) -> int:
    return fig.batch_of(profile, signature).size


def _describe_profile(profile: Any) -> str:
    parts = []
    for leaf, axes in enumerate(profile.axes):
        dims = []
        for a in axes:
            dims.append(str(a.opt) if a.kind == "static" else f"{a.name}[{a.min}..{a.max}]")
        parts.append(f"in{leaf}({', '.join(dims)})")
    return " ".join(parts)


def _row(outcome: Outcome, baseline: Outcome, selected: bool, figure: str = "") -> CandidateReport:
    m = outcome.measurement
    speedup = fig.speedup(m, baseline.measurement, figure)
    check = outcome.check
    return CandidateReport(
        name=outcome.backend.name,
        backend=type(outcome.backend).__name__,
        status=outcome.status,
        reason=outcome.reason,
        is_baseline=outcome.is_baseline,
        selected=selected,
        cached=outcome.cached,
        build_s=outcome.build_s,
        median_ms=m.median_ms if m is not None else None,
        p99_ms=m.p99_ms if m is not None else None,
        throughput=m.throughput if m is not None else None,
        cv=m.cv if m is not None else None,
        stable=m.stable if m is not None else None,
        speedup=speedup,
        max_abs_error=check.max_abs_error if check is not None else None,
        max_rel_error=check.max_rel_error if check is not None else None,
        cosine=check.min_cosine if check is not None else None,
        build_log=outcome.build_log,
        samples_ms=_capped(list(m.samples_ms)) if m is not None else None,
    )


def _capped(samples: list[float], cap: int = 2000) -> list[float]:
    """At most ``cap`` samples, taken evenly across the run (the report's distribution plots)."""
    stride = -(-len(samples) // cap)
    return samples[::stride] if stride > 1 else samples


__all__ = ["Sample", "tune"]
