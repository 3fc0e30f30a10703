"""src/honed/pipeline/tuner.py: honed.tune(): record, infer shapes, build, check, measure, select.

Shapes, figures and choices all come from the engine (honed._core); this file only runs what
needs PyTorch's Python API and hands the results over.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from honed import _core, config
from honed.backend.base import Backend, Sample
from honed.calls import call_sample
from honed.environment import fingerprint
from honed.errors import InputError, TuneError
from honed.module import Module, Variant, find_modules, observed_output
from honed.module import recording as recording_modules
from honed.pipeline import guidance, machine, progress, signals
from honed.pipeline.cache import open_for_tune
from honed.pipeline.courtesy import beside_program, give_way
from honed.pipeline.graph_tuner import TARGETS, GraphTuner, ProgramCalls, TuneContext, capped
from honed.pipeline.isolation import new_pool
from honed.pipeline.pool import WorkerPool
from honed.report import GraphReport, TuneReport
from honed.tune_strategy import MaxThroughputStrategy, TuneStrategy

log = logging.getLogger("honed")

# Of a time budget, what is kept for the finish after the last candidate (at most _FINISH_MAX_S).
_FINISH_SHARE = 0.05
_FINISH_MAX_S = 10.0


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
    time_budget_s: float | None = None,
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
        isolation: "process" (default, from HONED_ISOLATION): candidates are built, checked
            and measured in a pool of worker processes (several builds at once, one measurement
            per device at a time), so a crash, hang or runaway allocation fails only that
            candidate; "none": one by one in this process (no start-up, not crash-proof).
        target: where the tuned model will run. "python" (default): any backend, eager
            included. "cpp": only backends the C++ runtime (honed::Model, honed-run) can run
            (TorchInductorAotBackend); eager is measured as the reference but never selected,
            and the report says so.
        time_budget_s: the tune's wall time, from its start: candidates stop early enough
            (5 % of the budget, at most 10 s) for the finish to fit; the best correct candidate
            so far wins and the others are reported as "not tried" (budget). The eager baseline
            and the re-measure of the finalists always run.

    Returns:
        A TuneReport; each module also keeps its own part in ``module.report``.
    """
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
    isolation = isolation or config.isolation
    if isolation not in ("process", "none"):
        raise InputError(f"honed.tune: isolation must be 'process' or 'none', got {isolation!r}")
    if max_batch < 1:
        raise InputError(f"honed.tune: max_batch must be positive, got {max_batch}")
    if time_budget_s is not None and not (
        isinstance(time_budget_s, int | float) and 0 < time_budget_s < math.inf
    ):
        raise InputError(
            f"honed.tune: time_budget_s must be a positive number of seconds, got {time_budget_s!r}"
        )
    samples = _normalize_dataset(dataset)
    tuner = Tuner(
        strategy or MaxThroughputStrategy(backends),
        device=device,
        cache_dir=Path(cache_dir) if cache_dir is not None else config.cache_dir,
        clear_cache=clear_cache,
        isolation=isolation,
        target=target,
        sweep_to=max_batch if batch_sweep else 0,
        time_budget_s=time_budget_s,
    )
    return tuner.run(func, samples, _validate_batch_sizes(batch_sizes))


class Tuner:
    """One tune: its settings, its progress display, its worker pool and its time budget.

    ``run`` records the modules ``func`` calls, tunes each recorded graph with a GraphTuner
    (graph_tuner.py) and installs the winners. Nothing of a tune lives in module globals, so
    tunes in several threads (a JIT tune beside the program) do not see each other.
    """

    # Whether recording runs the dataset through the model (a sample that does not fit it fails
    # there, with one clear line); a tune whose samples are the model's own calls (JIT) records
    # their signatures only.
    record_runs = True

    def __init__(
        self,
        strategy: TuneStrategy,
        *,
        device: str | torch.device | None = None,
        cache_dir: Path | None = None,
        clear_cache: bool = False,
        isolation: str = "process",
        target: str = "python",
        sweep_to: int = 0,
        time_budget_s: float | None = None,
        tracker: progress.Tracker | None = None,
        reuse_unstable: bool = False,
        inputs_by_value: bool = True,
        cached_only: bool = False,
        fingerprints: dict[int, str] | None = None,
        live: ProgramCalls | None = None,
        pool: Callable[[int], WorkerPool] | None = None,
    ) -> None:
        """``live``: the program this tune runs beside (JIT): while it calls, its calls measure
        the candidates instead of the workers (graph_tuner.py). ``pool``: where the candidates
        run, given how many jobs there are: a pool the caller owns and closes (JIT: the workers
        its graph-break check started); None, a pool of the tune's own."""
        self.strategy = strategy
        self.live = live
        self.given_pool = pool
        self.reuse_unstable = reuse_unstable
        self.inputs_by_value = inputs_by_value
        self.cached_only = cached_only
        # Model fingerprints (a hash of the weights) by id(module), shared with another tune of
        # the same modules in the same moment (JIT's cached pass and the tune after it).
        self.fingerprints = fingerprints if fingerprints is not None else {}
        self.device = device
        self.cache_dir = Path(cache_dir) if cache_dir is not None else config.cache_dir
        self.clear_cache = clear_cache
        self.isolation = isolation
        self.target = target
        self.sweep_to = sweep_to
        self.time_budget_s = time_budget_s
        self.tracker = tracker or progress.requested() or progress.Tracker()
        self.pool: WorkerPool | None = None
        self.ctx: TuneContext | None = None
        self._cancelled = False
        self._abandoned = False
        self.cancel_reason = ""  # why cancel() was called ("" when it was not)
        self.machine_section: dict[str, Any] = {}

    def start(
        self,
        func: Callable[..., Any],
        samples: list[Any],
        sizes: list[int] | None = None,
        outputs: list[Any] | None = None,
    ) -> concurrent.futures.Future[TuneReport]:
        """Run the tune on a thread of its own and return at once (JIT tunes beside the program).

        The future's result is the TuneReport (or the tune's exception); ``cancel()`` stops it
        early, the best candidate so far winning as when a time budget runs out. ``outputs``:
        eager's output for each sample where the caller saw it (run's).
        """
        future: concurrent.futures.Future[TuneReport] = concurrent.futures.Future()

        def work() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(self.run(func, samples, list(sizes or []), outputs))
            except BaseException as e:
                future.set_exception(e)

        threading.Thread(target=work, name="honed-tune", daemon=True).start()
        return future

    def cancel(self, abandon: bool = False, reason: str = "cancelled") -> None:
        """Stop trying candidates: queued ones are dropped, running ones ended ("not tried"),
        and the best one so far wins.

        abandon: select and install nothing either (JIT when its program ends): eager's own
        measurement is ended too, and the tune raises TuneCancelled within a poll (half a
        second) of the running jobs' ends, whatever stage it is in.
        """
        self._cancelled = True
        self._abandoned = self._abandoned or abandon
        self.cancel_reason = reason
        if self.ctx is not None:
            self.ctx.stop(reason, abandon)

    def run(
        self,
        func: Callable[..., Any],
        samples: list[Any],
        sizes: list[int],
        outputs: list[Any] | None = None,
    ) -> TuneReport:
        """Record, tune every graph, install; the pool is closed whatever happens.
        ``outputs``: eager's output for each sample (None where unknown) where the samples are
        calls the caller ran eagerly (JIT: the program's); the check compares with them instead
        of running eager again. Used only where recording does not run the model."""
        started = time.perf_counter()
        with signals.terminate_like_interrupt(), self.tracker, contextlib.ExitStack() as stack:
            stack.push(self._close_pool)
            self.tracker.phase("record")
            modules = _record(func, samples, sizes, self.record_runs, outputs)
            if not modules:
                raise InputError(
                    "honed.tune: no honed.Module was called while running the dataset; wrap the "
                    "model with honed.Module(model, 'name') and call it inside func"
                )
            guidance.at_tune_start(modules, sizes, self.sweep_to > 0)  # .eval(), fixed shapes
            device = _resolve_device(self.device, modules)
            self.machine_section = machine.start_of_tune(device)  # names a busy machine
            ctx = self.ctx = self._context(device, started)
            if self._cancelled:
                ctx.stop(self.cancel_reason, self._abandoned)
            graphs: list[GraphReport] = []
            with _dynamo_limits():
                for module in modules:
                    graphs += self._tune_module(module, ctx)
            wall_s = time.perf_counter() - started
            for module in modules:
                module.report.wall_s = wall_s
            return TuneReport(
                graphs,
                str(ctx.device),
                self.strategy.describe(),
                wall_s,
                fingerprint(ctx.device),
                self.target,
                self.machine_section,
            )

    def _context(self, device: torch.device, started: float) -> TuneContext:
        deadline = None
        if self.time_budget_s is not None:
            # Candidates stop early enough for the finish (the finalists' re-measure, the
            # install) to end inside the budget too.
            finish_s = min(_FINISH_SHARE * self.time_budget_s, _FINISH_MAX_S)
            deadline = started + self.time_budget_s - finish_s
        self.tracker.budget_end = deadline
        # a read-only cache folder: one warning, cache off, build logs in a temporary folder
        cache, run_dir = open_for_tune(self.cache_dir, config.cache_enabled)
        return TuneContext(
            device=device,
            tracker=self.tracker,
            sweep_to=self.sweep_to,
            cache=cache,
            refresh=self.clear_cache,
            isolation=self.isolation,
            run_dir=run_dir,
            target=self.target,
            deadline=deadline,
            budget_s=self.time_budget_s,
            pool=(self.given_pool or (lambda jobs: self._pool(jobs, device)))
            if self.isolation == "process"
            else None,
            reuse_unstable=self.reuse_unstable,
            inputs_by_value=self.inputs_by_value,
            cached_only=self.cached_only,
            fingerprints=self.fingerprints,
            live=self.live,
        )

    def _pool(self, jobs: int, device: torch.device) -> WorkerPool:
        """The tune's worker pool, started on first use and kept for every graph."""
        if self.pool is None:
            self.pool = new_pool(jobs, measuring_gpus(device), str(device))
        return self.pool

    def _close_pool(self, exc_type: object, *rest: object) -> None:
        if self.pool is not None:
            # An exception (Ctrl-C, SIGTERM) ends running jobs at once; otherwise they are done.
            self.pool.close(cancel=exc_type is not None)
            self.pool = None

    def _tune_module(self, module: Module, ctx: TuneContext) -> list[GraphReport]:
        module_strategy = module.strategy or self.strategy
        variants: list[Variant] = []
        reports: list[GraphReport] = []
        for index, recording in enumerate(module.graphs.values()):
            ctx.check_abandoned(module.name)
            graph_strategy = module.strategy_for(index, recording.key) or module_strategy
            report, variant = GraphTuner(ctx, module, recording, graph_strategy, index).run()
            reports.append(report)
            if variant is not None:
                variants.append(variant)
        self.tracker.candidate("")
        self.tracker.phase("install")
        module.install(variants)
        module.graphs = {}
        module.report = TuneReport(
            reports,
            str(ctx.device),
            module_strategy.describe(),
            0.0,
            fingerprint(ctx.device),
            ctx.target,
            self.machine_section,
        )
        return reports


def measuring_gpus(device: torch.device) -> list[str]:
    """GPUs of the target's model on this host, the target first (config.spread_gpus)."""
    if device.type != "cuda" or not config.spread_gpus or torch.cuda.device_count() < 2:
        return []
    index = device.index if device.index is not None else torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    same = [i for i in range(torch.cuda.device_count()) if torch.cuda.get_device_name(i) == name]
    ordered = [index] + [i for i in same if i != index]
    return [f"cuda:{i}" for i in ordered] if len(ordered) > 1 else []


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


def _record(
    func: Callable[..., Any],
    samples: list[Any],
    sizes: list[int],
    runs: bool = True,
    outputs: list[Any] | None = None,
) -> list[Module]:
    """The modules ``func`` calls on the samples, each with what it received. ``runs=False``
    with ``func`` a honed.Module holding no other: only its calls' signatures are noted, the
    module not run (Tuner.record_runs), and ``outputs`` (per sample, None where unknown) are
    eager's outputs for them as the caller saw them."""
    known = find_modules(func)
    for m in known:
        m.reset()
    runs = (
        runs
        or not isinstance(func, Module)
        or any(isinstance(m, Module) for m in func.module.modules())
    )
    try:
        with torch.no_grad(), recording_modules(runs) as recorded:
            for i, sample in enumerate(samples):
                give_way()  # beside a JIT program: a sample's recording between its calls
                seen = outputs[i] if outputs is not None and not runs else None
                with observed_output(seen):
                    _call(func, sample)
                for b in sizes:
                    give_way()
                    _call(func, _resize_batch(sample, b))
    except Exception as e:
        raise InputError(
            f"honed.tune: running the dataset through the model failed before any tuning: "
            f"{type(e).__name__}: {e}. Check that each sample matches the model's forward()"
        ) from e
    return list(recorded)


def _resolve_device(device: str | torch.device | None, modules: list[Module]) -> torch.device:
    found = _module_device(modules[0])
    if device is None:
        return found
    wanted = torch.device(device)
    if wanted.type == "cuda" and not torch.cuda.is_available():
        from honed.cli.doctor import cuda_problems

        problems = cuda_problems() or ["torch.cuda.is_available() is False"]
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
    """Each candidate compiles the same forward again: raise Dynamo's recompile limit. Beside a
    program (JIT) the candidates build in workers and at most the winner and a trial's rival
    compile in its process, within Dynamo's own limit: where Dynamo is not imported yet it is
    not imported for this (seconds of imports holding the GIL beside the program's calls)."""
    if beside_program() and "torch._dynamo" not in sys.modules:
        yield
        return
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


def _capped(samples: list[float], cap: int = 2000) -> list[float]:
    return capped(samples, cap)


__all__ = ["Sample", "tune"]
