"""src/honed/jit/tuner.py: trying one discovered module: checks, graph breaks, tune, states.

The cheap checks (depth, skip list, size) run in the call that makes a module eligible; the
graph-break check and the tune run on JIT's background thread (background.py), while the
program's calls run eager, or the module's earlier variant during a widen. A finished tune swaps
the node's tuned wrapper in with one assignment: the next call uses it, and a call already
running finishes on what it started with.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from honed import _core
from honed import config as _flags
from honed.errors import TuneCancelled
from honed.jit import background, early, pacing
from honed.jit.background import TuneRecord
from honed.jit.config import MAX_RETUNES, config
from honed.jit.decisions import cached_graph_breaks, graph_break_key, store_graph_breaks
from honed.jit.hierarchy import Node, State
from honed.jit.history import add as add_step
from honed.jit.patcher import STATE, paused
from honed.pipeline import guidance
from honed.pipeline.courtesy import give_way
from honed.pipeline.openmp import release_team

log = logging.getLogger("honed.jit")


def maybe_try(node: Node) -> None:
    """Try ``node`` once it is eligible (a root, or its parent ended EAGER/SKIPPED) and ready."""
    if node.tried or node.state is not State.RECORDING:
        return
    parent = node.parent
    if parent is not None and parent.state not in (State.EAGER, State.SKIPPED):
        return
    would_tune = (
        node.level <= config.max_depth_level
        and node.name not in config.skip_modules
        and node.parameters >= config.min_parameters
    )
    if would_tune:  # a module try_node skips needs no samples
        # calls recorded since it could be tried (a child's since its parent ended eager)
        if len(node.samples) < max(1, config.min_samples):
            return
        if config.batch_axis_required and not _has_batch_axis(node):
            return
    try_node(node)


def try_node(node: Node) -> None:
    """Decide about ``node``: SKIPPED, EAGER (then its children), TUNED (children DETACHED)."""
    node.tried = True
    if node.level > config.max_depth_level:
        _skip(node, f"deeper than max_depth_level={config.max_depth_level}")
        return
    if node.name in config.skip_modules:
        _skip(node, "listed in skip_modules")
        _try_children(node)
        return
    if node.parameters < config.min_parameters:
        _skip(node, f"fewer parameters than min_parameters={config.min_parameters}")
        return
    job = functools.partial(_first_tune, outputs=list(node.outputs))
    _start(node, job, list(node.samples))


def _start(node: Node, job: Any, dataset: list[Any]) -> None:
    """Queue ``job(node, dataset)`` beside the program; in wait mode, block until JIT is idle."""
    node.busy, node.queued_at_call = True, node.call_count
    if not background.submit(_run_job, job, node, dataset):
        node.busy = False  # the program is ending: nothing new starts
        return
    if config.wait:
        background.wait()


def _run_job(job: Any, node: Node, dataset: list[Any]) -> None:
    try:
        job(node, dataset)
    finally:
        node.busy = False


def _first_tune(node: Node, dataset: list[Any], outputs: list[Any] | None = None) -> None:
    """On JIT's thread: the graph-break check, then the module's first tune, in one pool.
    ``outputs``: the program's output for each sample (the check compares with them)."""
    if node.module is None:
        return  # the program dropped the module meanwhile
    workers = _Workers(_device_of(node.module, dataset[0]))
    fingerprints: dict[int, str] = {}  # the weights are hashed once for the check and the tune
    calls = None if config.dry_run else _program_calls(node, dataset)
    try:
        seen_before = True  # unknown without the check: the cached pass looks
        if config.detect_graph_breaks:
            meanwhile = "its graph-break check and tune go on"
            stand_in = functools.partial(
                _stand_in_early, node, dataset, outputs, calls, workers, meanwhile
            )
            breaks, seen_before = _breaks(node, dataset[0], workers, fingerprints, stand_in)
            if breaks:
                if calls is not None:
                    calls.end_route()  # its children are tried now
                _eager(node, "graph breaks")
                return
        if config.dry_run:
            node.reason = "dry run"
            add_step(f"Dry run: would tune {node.describe()} on {len(dataset)} sample(s)")
            return
        _tune(node, dataset, "first tune", workers, fingerprints, outputs, seen_before, calls)
    finally:
        if calls is not None:
            calls.end_route()
        workers.close()


def _stand_in_early(
    node: Node,
    dataset: list[Any],
    outputs: list[Any] | None,
    calls: Any,  # the tune's view of the program (_program_calls; None: no view, nothing to do)
    workers: _Workers | None,
    meanwhile: str,
) -> None:
    """Before a first tune's workers are up: the strategy's candidates that compile nothing
    (``Backend.stands_in``: CUDA graphs over eager), in its order, built on this thread, checked
    against the program's own outputs for the recorded calls (``outputs``) and judged on the
    program's calls against eager (ProgramCalls.promote): the first that builds and answers as
    eager did is judged, and answers the calls until the tune ends where it wins. A worker's
    first job waits seconds for it to import torch and map the model, beside eager calls; a
    capture here takes a fraction of a second. Where a build fails or its check does, the
    history says so and the next is tried. The tune itself still builds, checks and measures
    each of them as any candidate (the promoted one is not promoted twice)."""
    from honed.backend.base import Sample, known_outputs
    from honed.module import Module, Variant
    from honed.pipeline.candidate import check
    from honed.pipeline.courtesy import first_build, own_stream
    from honed.shapes import graph_info

    module = node.module
    if calls is None or not (calls.stand_ins and config.stand_in_early) or module is None:
        return
    if calls.answering():
        return
    if not outputs or len(outputs) != len(dataset) or any(o is None for o in outputs):
        return  # no eager outputs to check against: eager would have to run here
    device = torch.device(_device_of(module, dataset[0]))
    wrapper = Module(module, node.name)
    bound = [wrapper.bind(a, k) for a, k in dataset]
    samples = [Sample(a, k) for a, k in bound]
    profile = _core.infer_profile([_core.signature(a, k) for a, k in bound])
    info = graph_info(profile, device)
    stand_ins = [b for b in config.tune_strategy().backends(device, info) if b.stands_in]
    if not stand_ins:
        return
    if workers is not None and _flags.isolation == "process":
        workers(1)  # its workers start (on their own threads) while this one captures
    for backend in stand_ins:
        started = time.perf_counter()
        try:
            with own_stream(device), known_outputs(samples, outputs), first_build():
                fn = backend.build_graph(module, samples, info)
                result = check(fn, samples, outputs, backend, module, device)
        except Exception as e:  # a capture the module does not allow: the tune goes on without
            add_step(
                f"{backend.name} cannot stand in for {node.short()}'s calls: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
            continue
        if not result.ok:
            add_step(
                f"{backend.name} does not stand in for {node.short()}'s calls: it failed the "
                f"check against the program's outputs ({result.reason})"
            )
            continue
        add_step(
            f"{backend.name} was built for {node.short()} in the program's process in "
            f"{time.perf_counter() - started:.2f}s and answers as eager did; trying it on the "
            "program's calls",
            logging.DEBUG,
        )
        wrapper.install([Variant(profile, backend, fn, {}, None)])
        calls.promote(backend.name, wrapper, samples[0], meanwhile)
        return  # judged: the next would not do better against eager than this one did


class _Workers:
    """The worker processes of a first tune, started where its graph-break check first needs
    one, as many as its tune will want: the tune then finds them running (each imports torch,
    Dynamo and what its candidates' builds import first, seconds of a core). They start one
    after another while the check runs on the first: interpreters importing torch all at once
    slowed the program's calls. Where nothing needs a worker (both cached), none starts. Where
    workers started as JIT turned on suit the tune, those are taken instead (honed.jit.early).
    Closed when the job ends."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.pool: Any = None
        self.pacer: Any = None

    def __call__(self, jobs: int) -> Any:
        if self.pool is None:
            from honed.pipeline.tuner import measuring_gpus

            device = torch.device(self.device)
            # the workers started as JIT turned on, where they suit this tune
            self.pool = early.pool(self.device, jobs, measuring_gpus(device))
            if device.type == "cuda" and not config.wait:
                self.pacer = pacing.pacer()  # the program's calls pace the workers
                if self.pacer is not None:
                    self.pacer.watch(self.pool)
        return self.pool

    def close(self) -> None:
        early.close()  # a first tune that ended without them: no later one will take them
        if self.pacer is not None:
            said = self.pacer.unwatch(self.pool)
            self.pacer = None
            if said:
                add_step(f"Beside the program, {said}")
        if self.pool is not None:
            self.pool.close(cancel=True)  # a job still running is one the tune left
            self.pool = None


def _jit_flags() -> Any:
    """The flags JIT's tunes and their workers run with: fewer workers and compile threads,
    below the program's priority, off the cores left to it, and the stability JIT asks of
    figures taken beside its calls."""
    tolerance = max(_flags.stability_tolerance, config.stability_tolerance)
    return _flags.patch(
        stability_tolerance=tolerance,
        # HONED_WORKERS, where set, decides; a program waiting for JIT gets honed.tune's count
        workers=_flags.workers or (0 if config.wait else _flags.jit_workers),
        worker_nice=_flags.jit_worker_nice,
        worker_spare_cores=_flags.jit_spare_cores,
        worker_compile_threads=(
            _flags.worker_compile_threads
            if config.wait
            else _flags.jit_compile_threads or _flags.worker_compile_threads
        ),
    )


def _skip(node: Node, why: str) -> None:
    node.state, node.reason = State.SKIPPED, why
    node.samples, node.outputs = [], []
    add_step(f"Skipping {node.short()}: {why}", logging.DEBUG)


def _eager(node: Node, why: str, children: bool = True) -> None:
    node.state, node.reason = State.EAGER, why
    node.samples, node.outputs = [], []
    if children:
        _try_children(node)


def _try_children(node: Node) -> None:
    for child in node.children:
        maybe_try(child)


def _breaks(
    node: Node,
    sample: tuple[tuple[Any, ...], dict[str, Any]],
    workers: _Workers | None = None,
    fingerprints: dict[int, str] | None = None,
    first: Any = None,
) -> tuple[bool, bool]:
    """Whether torch._dynamo.explain finds a graph break (or cannot trace) on a recorded sample,
    and whether an earlier run had answered that already (from the cache). ``first``: called
    before a check that is not cached.

    The trace runs in a worker process (isolation "process"): in this process it would hold the
    GIL beside the program's calls. A worker that ends without an answer (crash, hang) counts as
    a break, not cached. The answer is kept in the persistent cache (decisions.py): a restarted
    script reuses it.
    """
    module = node.module
    assert module is not None  # checked by the caller
    started = time.perf_counter()
    key = graph_break_key(module, sample, fingerprints)
    found = cached_graph_breaks(key)
    if found is None:
        if first is not None:
            first()
            started = time.perf_counter()  # the check's own time
        count, reasons, how, keep = _check(node, module, sample, workers)
        if keep:
            store_graph_breaks(key, count, reasons)
    else:
        count, reasons = found
        how = "Reusing the cached check"
    took = time.perf_counter() - started
    if count == 0:
        add_step(f"No graph breaks in {node.short()}. {how} took {took:.2f}s")
        return False, found is not None
    add_step(
        f"{count} graph break(s) in {node.short()}: {'; '.join(reasons)}. "
        f"{how} took {took:.2f}s; trying its children"
    )
    return True, found is not None


def _check(
    node: Node,
    module: torch.nn.Module,
    sample: tuple[tuple[Any, ...], dict[str, Any]],
    workers: _Workers | None = None,
) -> tuple[int, list[str], str, bool]:
    """(breaks, reasons, how the history says it was found, whether it is an answer to keep)."""
    if _flags.isolation != "process":
        return (*_explain(module, sample), "Checking", True)
    from honed.pipeline.isolation import IsolatedCheck, NotIsolatable

    try:
        check = IsolatedCheck(module, sample, _device_of(module, sample), workers)
        if not background.set_current(check):
            return 1, ["the program ended before the check"], "Checking", False
        try:
            with _jit_flags():
                answer = check.run()  # sends the module itself only where it must
        finally:
            background.set_current(None)
    except NotIsolatable as e:
        add_step(
            f"{node.short()} cannot be sent to a worker process ({e}); checking its graph "
            "breaks in this process",
            logging.WARNING,
        )
        return (*_explain(module, sample), "Checking", True)
    if isinstance(answer, str):
        add_step(f"The graph-break check of {node.short()} failed: {answer}", logging.WARNING)
        return 1, [f"the check failed in a worker: {answer}"], "Checking", False
    return (*answer, "Checking in a worker", True)


def _device_of(module: torch.nn.Module, sample: Any) -> str:
    """Where the check runs: the first CUDA tensor's device among the weights and the sample.
    Looked through lazily: on JIT's thread beside the program's calls, a GPU model's answer
    is its first weight, not a walk over all of them."""
    leaves = itertools.chain(
        module.parameters(), module.buffers(), torch.utils._pytree.tree_leaves(sample)
    )
    cuda = next((t for t in leaves if isinstance(t, torch.Tensor) and t.is_cuda), None)
    return str(cuda.device) if cuda is not None else "cpu"


def _explain(
    module: torch.nn.Module, sample: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[int, list[str]]:
    """The check in this process, JIT's patch bypassed while Dynamo traces."""
    import torch._dynamo

    from honed.pipeline.graph_breaks import explain

    STATE.bypass += 1
    try:
        return explain(module, sample)
    finally:
        STATE.bypass -= 1
        if not any(n.state is State.TUNED for n in STATE.nodes.values()):
            # a reset would also drop the compiled code of variants the program runs now
            torch._dynamo.reset()


def _jit_tuner(**settings: Any) -> Any:
    """A Tuner whose thread (Tuner.start) bypasses JIT and keeps tune-start guidance quiet.

    honed.pipeline.tuner is imported here, on JIT's thread: importing it in the call that queues the
    first tune would hold that call up.
    """
    from honed.pipeline import progress
    from honed.pipeline.tuner import Tuner

    background.register_exit()  # JIT's exit runs before the pool's, now that it is imported

    class JitTuner(Tuner):
        # The samples are the program's own calls: each would run the model again beside them
        record_runs = False

        def run(self, func: Any, samples: list[Any], sizes: list[int], outputs: Any = None) -> Any:
            # JIT tunes the program's own calls as they are, measured beside them.
            with paused(), guidance.quiet(), _jit_flags():
                return super().run(func, samples, sizes, outputs)

    return JitTuner(tracker=progress.Tracker(show=False), **settings)  # the program owns stderr


def _tune(
    node: Node,
    dataset: list[Any],
    reason: str,
    workers: _Workers | None = None,
    fingerprints: dict[int, str] | None = None,
    outputs: list[Any] | None = None,
    seen_before: bool = True,
    calls: Any = None,
) -> None:
    """On JIT's thread: tune ``node`` on ``dataset`` with Tuner.start, then swap the winner in.
    ``fingerprints``: model fingerprints by id(module) already made (the graph-break check's);
    ``outputs``: the program's output for each sample, where known; ``seen_before``: False when
    no earlier run got this far with the module (its graph-break check was not cached), so the
    cached pass is left out: it would record the samples and start a tune beside the program's
    calls only to find nothing cached; ``calls``: the first tune's view of the program
    (_program_calls), where a stand-in may answer its calls already."""
    from honed.module import Module

    module = node.module
    if module is None:
        return
    strategy = config.tune_strategy()
    sizes = headroom_sizes(dataset)
    budget = config.time_budget_s or None
    fingerprints = {} if fingerprints is None else fingerprints  # hashed once for both passes
    calls_before = node.queued_at_call
    started = time.perf_counter()
    replayed: _Replayed | None = None
    if reason == "first tune" and _flags.cache_enabled and seen_before:
        # The program's calls (live) tell the cached pass which candidates stay out beside it.
        cached = _new_tuner(
            strategy, fingerprints, None, True, _program_calls(node, dataset), workers
        )
        went = _cached_pass(node, dataset, sizes, cached, outputs)
        if went is False:
            return
        if isinstance(went, _Replayed):
            replayed = went
        else:  # the cached decision's record has the time and calls before
            started, calls_before = time.perf_counter(), node.queued_at_call
    record = TuneRecord(node.short(), reason, len(dataset), _batches(dataset, sizes), budget)
    record.ran_meanwhile = "the previous variant" if node.state is State.TUNED else "eager"
    background.add_record(record)
    isolation = _flags.isolation
    if replayed is not None:  # every outcome was cached: that pass was the tune
        early.close()  # where they have not been taken: this tune needs none
        wrapper, tuner = replayed.wrapper, replayed.tuner
        calls = tuner.live
    else:
        wrapper = Module(module, node.name, strategy=strategy)
        if calls is None:
            calls = _program_calls(node, dataset)
        if reason == "first tune":
            _stand_in_early(node, dataset, outputs, calls, workers, "the tune goes on")
        tuner = _new_tuner(strategy, fingerprints, budget, False, calls, workers)
    node.tuner = tuner
    record.progress = lambda: (node.call_count - calls_before, _tried_so_far(tuner))
    if not background.set_current(tuner):
        _cancelled(node, record, "the program ended", time.perf_counter() - started)
        return
    error: Exception | None = None
    try:
        try:
            if replayed is not None:
                report = replayed.report
            else:
                future = tuner.start(wrapper, dataset, sizes, outputs)
                release_team()  # this thread waits now: its OpenMP team would slow the calls
                report = future.result()
        except Exception as e:  # the tune failing is JIT's cue to try the children
            error = e
        finally:
            background.set_current(None)
            record.progress = None
            record.calls_meanwhile = node.call_count - calls_before
            record.tried = _tried_so_far(tuner)
            if calls is not None and calls.routed:
                label, at = calls.routed[-1]
                record.ran_meanwhile += f" until call {at}, then {label}"
        if isinstance(error, TuneCancelled):
            took = time.perf_counter() - started
            _cancelled(node, record, tuner.cancel_reason or str(error), took)
            return
        if error is not None:
            _failed(node, record, error, time.perf_counter() - started)
            return
        took = time.perf_counter() - started
        record.took_s = took
        rows = [c for g in report.graphs for c in g.candidates]
        record.tried = _tried(rows)
        from honed.pipeline.graph_tuner import ON_IDLE_PROGRAM, ON_PROGRAM

        on_program = any(c.measured_on == ON_PROGRAM for c in rows)
        tried = [c for c in rows if c.status != "not tried"]
        record.evidence = (
            "cache"
            if tried and all(c.cached for c in tried)
            else "the program's calls"
            if on_program
            else "in-process measurement, the program having stopped calling"
            if any(c.measured_on == ON_IDLE_PROGRAM for c in rows)
            else "worker measurement"
            if isolation == "process"
            else "in-process measurement"
        )
        node.samples, node.outputs, node.new_samples = [], [], []
        node.tuned_samples = dataset if config.retune_on_new_shapes else []
        node.tuned_keys = {_core.signature(a, k).graph_key for a, k in dataset}
        add_step(f"Tuning {node.short()} took {took:.2f}s")
        _account(node, report, took)
        if not wrapper.is_tuned:
            decisions = "; ".join(g.decision for g in report.graphs)
            add_step(f"No variant selected for {node.short()} ({decisions})", logging.WARNING)
            retune = node.state is State.TUNED  # the earlier variants stay
            with background.settling:
                if not retune:
                    _eager(node, "no variant selected", children=False)
                record.status = "eager"
            if reason == "first tune":
                early.remember(next_run_needs=False)
            add_step(record.line())
            if not retune:
                _try_children(node)
            return
        backend = _backends(wrapper)
        with background.settling:
            _install(node, wrapper, backend, report)
            record.status, record.selected = "installed", backend
        if reason == "first tune":
            early.remember(next_run_needs=False)
        add_step(f"Selected {backend} for {node.short()}: {report.graphs[0].decision}")
        add_step(record.line())
        if not on_program:  # else the program's calls chose already
            _start_trial(
                node, wrapper, report, dataset, sizes, strategy, fingerprints, record, outputs
            )
    finally:
        if calls is not None:  # the promoted variant answers until the outcome is in place
            calls.end_route()


_CUDA_RIVALS_WITHIN = 2.0


def _start_trial(
    node: Node,
    wrapper: Any,
    report: Any,
    dataset: list[Any],
    sizes: list[int],
    strategy: Any,
    fingerprints: dict[int, str],
    record: TuneRecord,
    outputs: list[Any] | None = None,
) -> None:
    """Let the pick and its best rivals take turns on the program's calls (live.py), timed with
    the host clock on the CPU and with CUDA events on CUDA; each rival is installed from the
    tuning cache first, so nothing is rebuilt, and checked against the program's own outputs
    (``outputs``, as the tune was: eager does not run again on the recorded samples)."""
    from honed.jit import live

    if not config.live_choice or not _flags.cache_enabled or node.module is None:
        return
    device = torch.device(_device_of(node.module, dataset[0]))
    if device.type not in ("cpu", "cuda"):
        return
    pick_row = next((c for c in report.graphs[0].candidates if c.selected), None)
    if pick_row is None or not pick_row.median_ms:
        return
    # The candidates as the tune listed them for this graph (an image model's channels_last
    # variants are listed only for a graph of images).
    from honed.shapes import graph_info

    graph = graph_info(wrapper.variants[0].profile, device) if wrapper.variants else None
    by_name = {b.name: b for b in strategy.backends(device, graph)}
    arms = []
    # On CUDA the tune's worker measured on the program's GPU, and a rival's install in this
    # process holds the GIL (a package's first run, a compile from Inductor's cache): a rival it
    # put below half the pick's throughput is not worth those stalls (on the H100 BERT's trial
    # confirmed such gaps). On the CPU the workers shared the program's cores and their figures
    # were off by more than that, so every runner-up may be tried.
    within = _CUDA_RIVALS_WITHIN if device.type == "cuda" else None
    for row in live.rivals(report, within=within):
        arm = _rival_arm(node, row, by_name, dataset, sizes, fingerprints, outputs)
        if arm is not None:
            arms.append(arm)
    if not arms:
        return
    pick = pick_row.name

    def done(verdict: live.Verdict | None) -> None:  # brief: it may run on the program's thread
        assert verdict is not None  # a judging trial
        node.trial = None
        add_step(f"Live trial for {node.short()}: {verdict.describe()}")
        if verdict.adopted is None:
            record.evidence += "; the program's calls did not decide against it"
            return
        arm = next(a for a in arms if a.label == verdict.adopted)
        with background.settling:
            record.selected, record.evidence = arm.label, "the program's calls"
            if arm.wrapper is None:
                node.tuned, node.backend, node.state = None, None, State.EAGER
                node.reason = "eager was faster on the program's calls"
            else:
                _install(node, arm.wrapper, arm.label, report)

    names = ", ".join(a.label for a in arms)
    add_step(f"Live trial for {node.short()}: {pick} against {names} on the program's calls")
    timer = live.CudaEvents() if device.type == "cuda" else None
    node.trial = live.Trial(live.Arm(pick, wrapper), arms, pick_row.median_ms, done, timer=timer)


def _rival_arm(
    node: Node,
    row: Any,
    by_name: dict[str, Any],
    dataset: list[Any],
    sizes: list[int],
    fingerprints: dict[int, str],
    outputs: list[Any] | None = None,
) -> Any:
    """A rival of the trial: eager as it is, another candidate installed through a tune of it
    alone (its outcome is in the cache); None when it cannot be had."""
    from honed.backend.torch_eager import TorchEagerBackend
    from honed.jit import live
    from honed.module import Module
    from honed.tune_strategy import OneBackendStrategy

    if row.is_baseline or row.backend == TorchEagerBackend.__name__:
        return live.Arm(row.name, None)
    backend = by_name.get(row.name)
    if backend is None or node.module is None:
        return None
    one = OneBackendStrategy(backend)
    other = Module(node.module, node.name, strategy=one)
    tuner = _new_tuner(one, fingerprints, None, False)
    node.tuner = tuner
    if not background.set_current(tuner):
        return None
    try:
        tuner.start(other, dataset, sizes, outputs).result()
    except Exception as e:  # this rival sits the trial out
        add_step(f"No live trial of {row.name} for {node.short()}: {e}", logging.DEBUG)
        return None
    finally:
        background.set_current(None)
    return live.Arm(row.name, other) if other.is_tuned else None


def _program_calls(node: Node, dataset: list[Any]) -> Any:
    """The tune's view of the program (honed.jit.live.ProgramCalls): while the program calls,
    its calls measure the candidates; None when live_choice is off, in wait mode (the program
    waits: workers measure) or without the tuning cache (the figures must outlive the run)."""
    from honed.jit import live
    from honed.jit.patcher import program_idle

    if not config.live_choice or config.wait or not _flags.cache_enabled or node.module is None:
        return None
    device = _device_of(node.module, dataset[0])
    if device.split(":")[0] not in ("cpu", "cuda"):
        return None
    return live.ProgramCalls(
        node,
        device.split(":")[0],
        program_idle,
        background.exiting,
        background.waited_on,
        promotes=config.promote,
        stand_ins=config.stand_in,
    )


def _new_tuner(
    strategy: Any,
    fingerprints: dict[int, str],
    budget: float | None,
    cached: bool,
    live: Any = None,
    workers: _Workers | None = None,
) -> Any:
    """JIT's Tuner: a restart replays the cached decision instead of measuring beside calls
    (reuse_unstable), also when the program's first calls got other values than last time
    (inputs_by_value: the install's check runs on this run's calls); ``cached``: the
    cached-only pass; ``live``: the program's calls (_program_calls); ``workers``: the first
    tune's pool (_Workers)."""
    return _jit_tuner(
        strategy=strategy,
        device=config.device,
        cache_dir=Path(config.cache_dir) if config.cache_dir else None,
        isolation=_flags.isolation,
        time_budget_s=budget,
        reuse_unstable=True,
        inputs_by_value=False,
        cached_only=cached,
        fingerprints=fingerprints,
        live=live,
        pool=workers,
    )


def _tried(rows: list[Any]) -> dict[str, str]:
    return {c.name: c.status + (" (cached)" if c.cached else "") for c in rows}


def _backends(wrapper: Any) -> str:
    return ", ".join(sorted({v.backend.name for v in wrapper.variants}))


@dataclasses.dataclass
class _Replayed:
    """A cached pass that found every outcome cached: its tune is the tune, nothing installed
    by it yet (``_tune`` installs and records it as a first tune's)."""

    wrapper: Any
    tuner: Any
    report: Any


def _cached_pass(
    node: Node, dataset: list[Any], sizes: list[int], tuner: Any, outputs: list[Any] | None = None
) -> _Replayed | bool:
    """A restart's first step: when an earlier run's tune stopped before every candidate (its
    time budget), install the winner among the candidates it decided, from the cache, before
    anything is built or measured; the tune then goes on with the rest. Returns whether the
    tune should still run (False: the program is ending), or, when every outcome was cached,
    the replayed tune itself: recording the samples and keying the cache once more beside the
    program's calls would only repeat what this pass did."""
    from honed.errors import CachedPassDeclined
    from honed.module import Module
    from honed.pipeline.graph_tuner import CACHED_ONLY_REASON

    assert node.module is not None  # checked by the caller
    wrapper = Module(node.module, node.name, strategy=tuner.strategy)
    node.tuner = tuner
    if not background.set_current(tuner):
        return False
    started = time.perf_counter()
    try:
        report = tuner.start(wrapper, dataset, sizes, outputs).result()
    except CachedPassDeclined:
        return True  # nothing cached (a first run), or all of it: the tune decides or replays
    except Exception as e:  # the tune proper says what is wrong, if anything
        add_step(f"Cached pass for {node.short()}: {type(e).__name__}: {e}", logging.DEBUG)
        return True
    finally:
        background.set_current(None)
    rows = [c for g in report.graphs for c in g.candidates]
    left = [c.name for c in rows if c.status == "not tried" and c.reason == CACHED_ONLY_REASON]
    if not left:
        return _Replayed(wrapper, tuner, report)
    if not wrapper.is_tuned:
        return True  # eager leads among the cached outcomes
    took = time.perf_counter() - started
    backend = _backends(wrapper)
    record = TuneRecord(node.short(), "cached decision", len(dataset), _batches(dataset, sizes))
    record.tried = _tried(rows)
    record.status, record.selected, record.evidence, record.took_s = (
        "installed",
        backend,
        "cache",
        took,
    )
    with background.settling:
        _install(node, wrapper, backend, report)
        background.add_record(record)
    add_step(
        f"Installed {backend} for {node.short()} from the cached decision in {took:.2f}s; "
        f"tuning goes on with {len(left)} candidate(s) not tried before: {', '.join(left)}"
    )
    return True


def _install(node: Node, wrapper: Any, backend: str, report: Any) -> None:
    """Swap the tuned wrapper in: one assignment each, read once per call by the patcher."""
    node.tuned = wrapper
    node.backend = backend
    node.report = report
    if node.state is State.TUNED:
        return  # a re-tune: the children are detached already
    node.state = State.TUNED
    for child in node.descendants():  # hundreds in a transformer, beside the program's calls
        give_way()
        child.state, child.samples, child.outputs = State.DETACHED, [], []
        add_step(f"Unpatching child module: {child.describe()}", logging.DEBUG)


def _tried_so_far(tuner: Any) -> dict[str, str]:
    """Each candidate's status from the tune's progress: finished, or "running" when it ended
    before the candidate did (a tune that failed or was cancelled has no report)."""
    tried = {f.candidate: f.status for f in tuner.tracker.done if f.candidate}
    for event in tuner.tracker.events:
        if event.candidate and event.candidate != "finalists":
            tried.setdefault(event.candidate, "running")
    return tried


def _cancelled(node: Node, record: TuneRecord, why: str, took: float) -> None:
    """The tune was abandoned (the program is ending): nothing installed, no child tried."""
    with background.settling:
        if node.state is not State.TUNED:
            node.state, node.reason = State.EAGER, "tune cancelled"
        record.took_s, record.status, record.error = took, "cancelled", why
    add_step(record.line(), logging.WARNING)
    if record.reason == "first tune":
        early.remember(next_run_needs=True)


def _failed(node: Node, record: TuneRecord, e: Exception, took: float) -> None:
    log.debug("honed.jit: the tune of %s failed", node.short(), exc_info=e)
    retune = node.state is State.TUNED  # a re-tune failed: the earlier variants stay
    with background.settling:
        if retune:
            node.new_samples = []
        else:
            _eager(node, f"tune failed: {type(e).__name__}", children=False)
        record.took_s, record.error = took, f"{type(e).__name__}: {e}"
        record.status = "failed"
    if record.reason == "first tune":
        early.remember(next_run_needs=True)
    add_step(
        f"Tuning {node.short()} failed after {took:.2f}s ({type(e).__name__}: {e}); "
        + ("its earlier variants stay" if retune else "running it eager and trying its children"),
        logging.WARNING,
    )
    if not retune:
        _try_children(node)


def headroom_sizes(dataset: list[Any]) -> list[int]:
    """Extra batch sizes to tune for: up to batch_headroom times the largest batch recorded.

    Only when the samples show a batch axis (two batch sizes, the engine's inference): a fixed
    batch may be fixed on purpose, and a model whose first axis is not a batch would be fed
    nonsense.
    """
    if config.batch_headroom <= 1 or not _samples_have_batch_axis(dataset):
        return []
    largest = max(_batches(dataset, []))
    top = 2 ** math.ceil(math.log2(largest * config.batch_headroom))
    return [top] if top > largest else []


def _batches(dataset: list[Any], sizes: list[int]) -> list[int]:
    """The axis-0 sizes of the samples' first tensors, and ``sizes``, sorted."""
    found = set(sizes)
    for sample in dataset:
        leaves = torch.utils._pytree.tree_leaves(sample)
        first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim() > 0), None)
        if first is not None:
            found.add(int(first.shape[0]))
    return sorted(found)


def _account(node: Node, report: Any, took: float) -> None:
    """Split the tuning time: deciding (or reusing the cached decision) vs building the winner.

    Rebuilding counts the winner's install in this process, with the imports its build needs
    there (TorchDynamo for a torch.compile winner: nothing imports it for the tune's sake, its
    seconds of imports holding the GIL beside the program's calls).
    """
    rows = [c for g in report.graphs for c in g.candidates]
    cached = sum(1 for c in rows if c.cached)
    node.rebuild_s = sum(g.install_s for g in report.graphs)
    node.decision_s = max(0.0, took - node.rebuild_s)
    node.from_cache = bool(rows) and cached == len(rows)
    if node.from_cache:
        add_step(
            f"Decision for {node.short()} reused from the cache in {node.decision_s:.2f}s "
            f"({cached} of {len(rows)} candidates cached, none measured); rebuilding the "
            f"winner took {node.rebuild_s:.2f}s"
        )
    elif cached:
        add_step(f"Reused {cached} of {len(rows)} cached result(s) for {node.short()}")


def outside_profile(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any], why: str) -> None:
    """A TUNED module got inputs its variants do not cover (they run eager): maybe re-tune.

    Inputs of a tuned signature at new sizes (a new batch size) widen the tuned range at once;
    a new signature (another rank or dtype) waits for ``min_samples`` such calls. Either re-tune
    runs beside the program; the calls meanwhile run eager, the covered ones tuned.
    """
    same_graph = _core.signature(args, kwargs).graph_key in node.tuned_keys
    retune = config.retune_on_new_shapes and node.retunes < MAX_RETUNES
    # While a re-tune runs, the misses it may cover were said when it started; what it leaves
    # uncovered is said again after it (outside_seen starts afresh with each re-tune).
    if why not in node.outside_seen and not (retune and node.busy):
        node.outside_seen.add(why)
        then = "running them eager"
        if retune:
            then = (
                "widening the tuned range in the background"
                if same_graph
                else "re-tuning after min_samples such calls"
            )
        add_step(
            f"Inputs outside the tuned profile of {node.short()} ({why}); {then}", logging.WARNING
        )
    if not retune or node.busy:
        return  # a re-tune in flight may cover them; later misses start the next one
    if len(node.new_samples) < max(config.max_samples, config.min_samples):
        node.new_samples.append(_detach((args, kwargs)))
    if len(node.new_samples) < (1 if same_graph else max(1, config.min_samples)):
        return
    node.retunes += 1
    new, node.new_samples = node.new_samples, []
    add_step(
        f"Re-tuning {node.short()} (re-tune {node.retunes} of at most {MAX_RETUNES}) for "
        f"{len(new)} new sample(s) and {len(node.tuned_samples)} tuned before"
    )
    node.outside_seen = set()
    reason = "widen for new shapes" if same_graph else "re-tune for a new signature"
    _start(node, lambda n, d: _tune(n, d, reason), node.tuned_samples + new)


def _detach(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


def _has_batch_axis(node: Node) -> bool:
    return _samples_have_batch_axis(node.samples)


def _samples_have_batch_axis(samples: list[Any]) -> bool:
    groups: dict[str, list[Any]] = {}
    for args, kwargs in samples:
        sig = _core.signature(args, kwargs)
        groups.setdefault(sig.graph_key, []).append(sig)
    try:
        return all(
            any(a >= 0 for a in _core.infer_profile(sigs, None).batch_axes)
            for sigs in groups.values()
        )
    except Exception as e:  # the engine could not infer shapes: no batch axis to rely on
        log.debug("honed.jit: no profile for these samples: %s", e)
        return False


__all__ = ["headroom_sizes", "maybe_try", "outside_profile", "try_node"]
