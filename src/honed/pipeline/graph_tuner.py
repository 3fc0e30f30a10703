"""src/honed/pipeline/graph_tuner.py: one graph's tune: cache, plan, evaluate, select, install.

A GraphTuner is made per recorded graph by the tune loop (tuner.Tuner) and holds only
what it was given: the tune's TuneContext (device, cache, tracker, worker pool, time budget)
and the graph's recording. ``run()`` returns the graph's report and the variant to install.

Candidates are evaluated in the pool's worker processes (several at once, pool.py), or here
one by one (``isolation="none"``, or when the graph cannot be pickled). The baseline (eager)
always runs; then the plan (planning.py) cheapest first; when the time budget runs out the
rest are "not tried". The finalists are re-measured side by side in one worker, from what
their workers shipped (shipping.py), and the winner is installed from the same, checked once
against eager here first.

Beside a program (JIT, ``TuneContext.live``), a worker measures only while the program is idle:
while it calls, a candidate is built and checked only, and every checked candidate is then
installed here and measured on the program's own calls, in turns (ProgramCalls.measure). The
figures go through the same statistics and the same rule as any others, and the cache keeps
them (a restart replays the decision). Eager is then neither built nor checked in a worker:
it is the reference, and the program's own calls are its measure (``_eager_beside_program``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import torch

from honed import _core, config
from honed.backend.base import Backend, Sample, known_outputs
from honed.backend.torch_eager import TorchEagerBackend
from honed.environment import fingerprint
from honed.errors import CachedPassDeclined, InputError, TuneCancelled
from honed.module import GraphRecording, Module, Variant
from honed.pipeline import buildlog
from honed.pipeline import figures as fig
from honed.pipeline.cache import TuneCache, inputs_fingerprint, model_fingerprint, source_text
from honed.pipeline.candidate import (
    MeasureDeferred,
    Outcome,
    check,
    evaluate,
    finalists,
    measure,
    measure_interleaved,
    measurement_record,
    needs_interleave,
)
from honed.pipeline.correctness import CheckResult
from honed.pipeline.courtesy import beside_program, give_way, own_stream
from honed.pipeline.isolation import GraphJobs, NotIsolatable, pool_size
from honed.pipeline.openmp import release_team
from honed.pipeline.planning import Planned, plan, skip_reason, waits_for
from honed.pipeline.pool import JobResult, WorkerPool, wait_all
from honed.pipeline.progress import Tracker
from honed.pipeline.shipping import from_cache_files, install_outcome, to_cache_files
from honed.pipeline.sweep import sweep_graph
from honed.report import CandidateReport, GraphReport
from honed.shapes import graph_info, overrides_for, tensor_names
from honed.tune_strategy import TuneStrategy

log = logging.getLogger("honed")

# Why a cached-only tune left a candidate out (its outcome is not cached yet).
CACHED_ONLY_REASON = "cached pass: no outcome in the cache yet"

TARGETS = ("python", "cpp")

# Where the figures of candidates measured on the program's calls come from (CandidateReport).
ON_PROGRAM = "the program's calls"
# ... and of those measured by the tune itself once the program stopped calling.
ON_IDLE_PROGRAM = "this process, the program having stopped calling"
# A candidate measured on the program's calls needs this many of them to count, or this many
# rounds of turns (the unit the evidence rule draws): calls of a second each (BERT-base on two
# CPU cores) give three counted calls a round, and 20 of them took longer than a tune's budget.
_MIN_PROGRAM_CALLS = 20
MIN_PROGRAM_ROUNDS = 5
# Rounds of the program's calls at most, while a candidate's figures from them are unstable (a
# busy machine's moment); the last round's figures decide, under the tune's evidence rule.
_PROGRAM_ROUNDS = 3


class ProgramCalls(Protocol):
    """The program a tune runs beside (JIT): is it calling now, and its calls as a measure."""

    def idle(self) -> bool:
        """Whether the program makes no calls now (a worker may measure on its device)."""
        ...

    def measure(
        self, arms: list[tuple[str, Module | None]], sample: Sample, until: float | None = None
    ) -> list[list[float]] | list[Turns] | None:
        """Route the program's calls with ``sample``'s shapes to each arm in turn (a honed.Module
        with one candidate installed; None: the program's own eager call) and return each one's
        call times (ms), as Turns where the rounds are known; None when the program stopped
        calling before they were measured. ``until``: the tune's deadline (perf_counter), which
        long calls may measure up to."""
        ...

    promotes: bool  # whether the tune offers candidates to the calls as they pass (promote)
    stand_ins: bool  # whether it offers those that compile nothing (Backend.stands_in) anyway

    def worth_a_stand_in(self, label: str, quickest_ms: float | None) -> bool:
        """Whether a candidate that compiles nothing, its quickest check run ``quickest_ms``,
        is worth offering as a stand-in (``promotes`` off)."""
        ...

    def answering(self) -> str | None:
        """The label of the candidate promoted to answer the program's calls now (None:
        eager answers them)."""
        ...

    def promote(self, label: str, arm: Module, sample: Sample) -> None:
        """Judge ``arm`` (one checked candidate installed) against what answers the program's
        calls with ``sample``'s shapes now, on those calls; where it wins, it answers them
        while the tune goes on."""
        ...


@dataclasses.dataclass
class Turns:
    """An arm's call times on the program's calls (ms, in order) and how many fell in each of
    its turns; turn i of every arm was taken in round i, beside the others' (compare_paired)."""

    samples_ms: list[float]
    blocks: list[int]


@dataclasses.dataclass
class TuneContext:
    """What every graph of one tune shares; owned by the Tuner."""

    device: torch.device
    tracker: Tracker
    sweep_to: int = 0  # 0: no batch sweep
    cache: TuneCache | None = None
    refresh: bool = False  # clear_cache: re-evaluate and overwrite instead of reading the cache
    isolation: str = "process"
    run_dir: Path | None = None  # where the candidates' build.log files go (buildlog.py)
    target: str = "python"  # "cpp": only candidates the C++ runtime can run
    deadline: float | None = None  # perf_counter time the time budget runs out
    budget_s: float | None = None
    pool: Callable[[int], WorkerPool] | None = None  # the tune's pool, started on first use
    fingerprints: dict[int, str] = dataclasses.field(default_factory=dict)
    warned: set[str] = dataclasses.field(default_factory=set)
    stopped: str = ""  # why the tune stopped trying candidates early (Tuner.cancel)
    abandoned: bool = False  # Tuner.cancel(abandon=True): nothing is selected or installed
    reuse_unstable: bool = False  # cached outcomes count even when their figures were unstable
    # False: the cache keys the samples by structure, shapes and dtypes, not values (JIT)
    inputs_by_value: bool = True
    # Decide from cached outcomes alone, candidates without one not tried; a graph with an
    # uncached eager or no cached candidate raises CachedPassDeclined.
    cached_only: bool = False
    live: ProgramCalls | None = None  # the program the tune runs beside (JIT)

    def model_fingerprint(self, module: torch.nn.Module) -> str:
        if id(module) not in self.fingerprints:
            self.fingerprints[id(module)] = model_fingerprint(module)
        return self.fingerprints[id(module)]

    def out_of_time(self) -> bool:
        """Whether candidates not evaluated yet are left out (budget spent, or stopped)."""
        if self.stopped:
            return True
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def budget_reason(self) -> str:
        if self.stopped:
            return self.stopped
        return f"budget: the {self.budget_s:g} s time budget was spent"

    def stop(self, reason: str, abandon: bool = False) -> None:
        """Leave every candidate not evaluated yet out, with ``reason`` (from any thread);
        ``abandon``: also end the running ones, eager included, and select nothing."""
        self.stopped = reason
        self.abandoned = self.abandoned or abandon

    def check_abandoned(self, module: str) -> None:
        """Raise TuneCancelled once the tune was abandoned: no install, no re-measure."""
        if self.abandoned:
            raise TuneCancelled(f"honed.tune: {module}: the tune was abandoned ({self.stopped})")


def for_target(backends: list[Backend], target: str, module: str) -> tuple[list[Backend], str]:
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


class GraphTuner:
    """Tunes one recorded graph of one module (see the module docstring)."""

    def __init__(
        self,
        ctx: TuneContext,
        module: Module,
        recording: GraphRecording,
        strategy: TuneStrategy,
        index: int,
    ) -> None:
        self.ctx = ctx
        self.module = module
        self.recording = recording
        self.strategy = strategy
        self.index = index
        self.inner = module.module
        self.samples: list[Sample] = recording.samples
        self.tracker = ctx.tracker
        self.jobs: GraphJobs | None = None
        self.key_parts: dict[str, Any] | None = None
        self.not_tried: list[Outcome] = []

    @functools.cached_property
    def references(self) -> list[Any]:
        """Eager's outputs for the samples: those the recording observed (JIT: the program's
        own calls returned them), the others computed where first needed: a pass that decides
        from the cache alone (a restart) runs no eager call for them (beside a JIT program each
        one holds the GIL and the program's GPU)."""
        references = []
        with torch.no_grad(), own_stream(self.ctx.device):
            for i, s in enumerate(self.samples):
                seen = self.recording.observed_output(i)
                if seen is not None:  # None: unknown, or a module that returns nothing
                    references.append(seen)
                    continue
                give_way()  # beside a JIT program: between its calls
                references.append(self.inner(*s.args, **s.kwargs))
        return references

    # -- the whole graph -----------------------------------------------------------------------
    def run(self) -> tuple[GraphReport, Variant | None]:
        profile, swept = self._profile()
        self.profile = profile
        self.info = graph_info(profile, self.ctx.device)
        self.measure_at = _measure_index(profile, self.recording.signatures)
        self.batch = _batch_size(profile, self.recording.signatures[self.measure_at])
        if self.ctx.cache is not None:
            self.key_parts = self._cache_key_parts()
        candidates, target_note = for_target(
            self.strategy.backends(self.ctx.device, self.info), self.ctx.target, self.module.name
        )
        # Eager competes (and is the fallback) unless the tuned graph must run from C++.
        uses_baseline = self.strategy.uses_baseline and self.ctx.target == "python"
        baseline_backend = TorchEagerBackend()
        items = plan(
            candidates,
            self.info,
            baseline_backend if uses_baseline else None,
            defaults=bool(getattr(self.strategy, "uses_defaults", False)),
            captures_wait=self._captures_wait(),
        )
        costs = [0] + [p.cost for p in items]
        self.tracker.at_graph(
            self.module.name, f"graph {self.index}", costs, self._parallel(len(costs))
        )
        baseline, outcomes = self._evaluate_all(baseline_backend, items)
        self.ctx.check_abandoned(self.module.name)
        competing = ([baseline] if uses_baseline else []) + outcomes
        measured_on = ""
        if any(o.deferred for o in competing):
            measured_on = self._measure_on_program(competing)
        elif needs_interleave(competing):
            self._interleave(competing)
        self.ctx.check_abandoned(self.module.name)
        decision, chosen = self._select(competing)
        if chosen is None:
            log.warning(
                "honed: %s: no candidate selected (%s); running eager",
                self.module.name,
                decision.reason,
            )
        everything = [baseline, *outcomes, *self.not_tried]
        figure = str(getattr(decision, "figure", ""))  # what the strategy ranked by
        rows = [_row(o, baseline, o is chosen, figure) for o in everything]
        report = GraphReport(
            module=self.module.name,
            graph=self.recording.key,
            samples=len(self.samples),
            **fig.graph_fields(profile, self.recording.signatures[self.measure_at]),
            ranked_by=figure,
            profile=_describe_profile(profile),
            candidates=rows,
            selected=chosen.backend.name if chosen is not None else None,
            decision=decision.reason + target_note + (f"; {measured_on}" if measured_on else ""),
            sweep=swept,
            install_s=chosen.install_s if chosen is not None else 0.0,
        )
        variant = None
        if chosen is not None and chosen.fn is not None:
            figures = dataclasses.asdict(rows[everything.index(chosen)])
            variant = Variant(
                profile, chosen.backend, chosen.fn, figures, self.samples[self.measure_at]
            )
        for o in everything:
            if o is not chosen:
                o.fn = None  # let the losers' compiled code go
        return report, variant

    def _profile(self) -> tuple[Any, str]:
        """The engine's shape profile of the graph (after the batch sweep, when asked for)."""
        first = self.samples[0]
        names = tensor_names(first.args, first.kwargs, self.inner.forward)
        overrides = overrides_for(self.module.dynamic_shapes, self.recording.signatures[0], names)
        profile = _core.infer_profile(self.recording.signatures, overrides)
        if not self.ctx.sweep_to:
            return profile, ""
        result = sweep_graph(
            self.inner, self.recording, profile, self.ctx.device, self.ctx.sweep_to
        )
        if result is None:
            return profile, "no batch axis: nothing to sweep"
        profile = _core.infer_profile(self.recording.signatures, overrides)
        points = ", ".join(f"{b}: {t:,.0f}/s" for b, t in result.points)
        return profile, f"knee at batch {result.knee} ({result.stop_reason}; {points})"

    # -- evaluating the candidates ---------------------------------------------------------------
    def _parallel(self, jobs: int) -> int:
        """How many candidates run at once (for the progress estimate)."""
        if self.ctx.isolation != "process" or self.ctx.pool is None:
            return 1
        return pool_size(jobs)

    def _evaluate_all(self, baseline_backend: Backend, items: list[Planned]) -> Any:
        """The baseline's outcome and each planned candidate's (skipped ones go to not_tried)."""
        outcomes: dict[int, Outcome] = {}
        baseline = self._cached(baseline_backend, True)
        pending = []
        unsure: dict[int, Outcome] = {}
        for i, item in enumerate(items):
            if item.skip:
                self._skip(item, item.skip)
                continue
            cached = self._cached(item.backend, False, unstable_too=True)
            if cached is not None and cached.deferred:  # left out beside a program before
                self._skip(item, cached.reason)
            elif cached is None:
                pending.append(i)
            elif self.ctx.reuse_unstable or reusable_outcome(cached):
                outcomes[i] = cached
            else:
                unsure[i] = cached
        bar = _bar([baseline, *outcomes.values()])
        for i, cached in unsure.items():
            if outranked(cached, bar):
                outcomes[i] = cached
            else:  # it might win: measured again
                pending.append(i)
        pending.sort()
        last = self._last(items, pending)
        if last and _installs_without_compiling(outcomes.values()):  # decided by the cache
            self._still_wanted(items, last, outcomes)
            pending = [i for i in pending if i not in last]
        for o in [baseline, *outcomes.values()]:
            if o is not None:
                self.tracker.finished(
                    "cached",
                    candidate=o.backend.name,
                    seconds=0.0,
                    cost=o.backend.expected_build_cost(),
                )
        # A candidate whose probes are all cached is decided now: a warm re-tune then starts no
        # worker for a candidate a rule leaves out, and a cached pass counts it as decided (not
        # left for the tune, which would install the same winner a second time).
        for i in list(pending):
            if waits_for(items[i], items) and self._probes_done(items[i], items, outcomes):
                why = self._rule_skip(items[i], items, outcomes)
                if why:
                    self._skip(items[i], why)
                    pending.remove(i)
        if self.ctx.cached_only:
            # With every outcome cached the pass decides as the tune would: JIT takes it as the
            # tune (jit.tuner._cached_pass).
            if baseline is None or not outcomes:
                what = "no cached outcome of eager" if baseline is None else (
                    "no cached candidate outcome"
                )  # fmt: skip
                raise CachedPassDeclined(f"honed.tune: {self.module.name}: {what}")
            for i in pending:
                self._skip(items[i], CACHED_ONLY_REASON)
            return baseline, [outcomes[i] for i in sorted(outcomes)]
        if baseline is None and self.ctx.live is not None:
            baseline = self._eager_beside_program(baseline_backend)
        if (baseline is None or pending) and self._use_pool():
            baseline = self._run_in_pool(baseline, baseline_backend, items, pending, outcomes)
        else:
            if baseline is None:
                baseline = self._evaluate_here(baseline_backend, True)
            self._run_here(items, pending, outcomes)
        return baseline, [outcomes[i] for i in sorted(outcomes)]

    def _cached(
        self, backend: Backend, is_baseline: bool, unstable_too: bool = False
    ) -> Outcome | None:
        """The cached outcome of ``backend``, or None (no cache, a miss, or a malformed entry);
        one measured unstable only with ``unstable_too`` (or the context's reuse_unstable)."""
        key = self._key_of(backend, is_baseline)
        if self.ctx.cache is None or key is None or self.ctx.refresh:
            return None
        record = self.ctx.cache.get(key, unstable_too=unstable_too or self.ctx.reuse_unstable)
        if record is None:
            return None
        try:
            outcome = Outcome.from_record(backend, record, is_baseline, key)
        except ValueError as e:
            log.warning(
                "honed: malformed tuning-cache entry for %s (%s); evaluating it again",
                backend.name,
                e,
            )
            return None
        if outcome.deferred and self.ctx.live is None:  # left out beside a program: measure now
            return None
        from_cache_files(outcome, self.ctx.cache.files(key, record))
        return outcome

    def _eager_beside_program(self, backend: Backend) -> Outcome:
        """Eager's outcome beside a program, nothing run: its figures are the program's own
        calls (ProgramCalls.measure), it builds nothing, and a check would compare eager with
        the references eager made. Elsewhere a worker (or this process) runs it nine times on
        the samples; beside a program on a GPU those runs, each as long as one of the program's
        calls, share the GPU with them (docs/jit.md)."""
        outcome = Outcome(backend, is_baseline=True, build_s=0.0, deferred=True)
        outcome.check, outcome.seconds = CheckResult(True), 0.0
        return self._finish(outcome, self._key_of(backend, True))

    def _skip(self, item: Planned, reason: str) -> None:
        outcome = Outcome(item.backend, status="not tried", reason=reason)
        self.not_tried.append(outcome)
        self.tracker.skipped(item.backend.name, reason, item.cost)

    def _finish(self, outcome: Outcome, key: str | None) -> Outcome:
        """Log, report and cache one evaluated candidate."""
        if self.ctx.run_dir is not None:
            outcome.build_log = buildlog.write(
                self.ctx.run_dir, self.module.name, self.index, outcome.backend.name, outcome.output
            )
        self.tracker.finished(
            outcome.status,
            outcome.reason,
            candidate=outcome.backend.name,
            cost=outcome.backend.expected_build_cost(),
            seconds=outcome.seconds,
        )
        if self.ctx.cache is not None and key is not None:
            outcome.cache_key = key
            if not outcome.deferred:  # stored once the program's calls measured it
                self.ctx.cache.put(key, outcome.to_record(), to_cache_files(outcome))
        return outcome

    def _job_fields(self) -> dict[str, Any]:
        return dict(
            module=self.inner,
            samples=self.samples,
            references=self.references,
            graph=self.info,
            measure_at=self.measure_at,
            batch_size=self.batch,
        )

    def _evaluate_here(self, backend: Backend, is_baseline: bool) -> Outcome:
        """Evaluate one candidate in this process, its compiler output kept for its build.log."""
        name = backend.name
        self.tracker.candidate(name)
        started = time.perf_counter()
        live = self.ctx.live

        def on_phase(phase: str) -> None:
            self.tracker.phase(phase, name)
            if phase == "measure" and live is not None and not live.idle():
                raise MeasureDeferred

        with buildlog.capture() as lines:
            outcome = evaluate(
                backend, is_baseline=is_baseline, on_phase=on_phase, **self._job_fields()
            )
        outcome.output = "\n".join(lines)
        outcome.seconds = time.perf_counter() - started
        return self._finish(outcome, self._key_of(backend, is_baseline))

    def _run_here(
        self, items: list[Planned], pending: list[int], outcomes: dict[int, Outcome]
    ) -> None:
        last = self._last(items, pending)
        self._evaluate_each(items, [i for i in pending if i not in last], outcomes)
        if last:
            self._evaluate_each(items, self._still_wanted(items, last, outcomes), outcomes)

    def _evaluate_each(
        self, items: list[Planned], which: list[int], outcomes: dict[int, Outcome]
    ) -> None:
        """Evaluate ``which`` here in turn; beside a program each but the last is promoted as
        it passes (_promote). The compiling ones (``last``) are built only where none that
        installs without compiling passed, so none of those is promoted before them."""
        for i in which:
            item = items[i]
            if self.ctx.out_of_time():
                self._skip(item, self.ctx.budget_reason())
                continue
            why = self._rule_skip(item, items, outcomes)
            if why:
                self._skip(item, why)
                continue
            outcomes[i] = self._evaluate_here(item.backend, False)
            if i != which[-1]:
                self._promote(outcomes[i])

    def _captures_wait(self) -> bool:
        """Whether captures of eager wait for the packages (planning's rule): beside a calling
        program on a GPU that neither takes stand-ins nor promotes candidates as they pass."""
        live = self.ctx.live
        if live is None or getattr(self.ctx.device, "type", "") not in _CHECK_RUNS_COMPARED_ON:
            return False
        return not (live.stand_ins or live.promotes)

    def _last(self, items: list[Planned], pending: list[int]) -> list[int]:
        """Beside a calling program, the pending candidates whose install compiles in its
        process: built last, and only where no candidate that installs without compiling
        passes (_measure_on_program would leave them out; their builds share the program's
        GPU and cores for nothing)."""
        if self.ctx.live is None:
            return []
        return [i for i in pending if _compiles_here(items[i].backend)]

    def _still_wanted(
        self, items: list[Planned], last: list[int], known: dict[int, Outcome]
    ) -> list[int]:
        """Of ``last``, those to build now; the others are left out, with the reason."""
        light = _installs_without_compiling(known.values())
        if not light:
            return last
        for i in last:
            self._skip(items[i], "not built, " + _left_out_beside_program(light))
        return []

    def _key_of(self, backend: Backend, is_baseline: bool = False) -> str | None:
        if self.key_parts is None:
            return None
        return TuneCache.key(
            **self.key_parts, candidate=_backend_identity(backend), baseline=is_baseline
        )

    def _probes_done(self, item: Planned, items: list[Planned], known: dict[int, Outcome]) -> bool:
        """Whether every candidate ``item`` waits for has an outcome or was left out (a probe not
        tried decides nothing)."""
        skipped = {id(o.backend) for o in self.not_tried}
        return all(
            items.index(p) in known or id(p.backend) in skipped for p in waits_for(item, items)
        )

    def _rule_skip(self, item: Planned, items: list[Planned], outcomes: dict[int, Outcome]) -> str:
        """The planning rules' reason to leave ``item`` out, from its probes' outcomes so far."""
        probes = []
        for probe in waits_for(item, items):
            j = items.index(probe)
            if j in outcomes:
                probes.append((probe, outcomes[j].status, outcomes[j].reason))
        return skip_reason(item, probes)

    def _use_pool(self) -> bool:
        if self.ctx.isolation != "process" or self.ctx.pool is None:
            return False
        if self.jobs is None:
            try:
                self.jobs = GraphJobs(self._job_fields(), str(self.ctx.device))
            except NotIsolatable as e:
                self._warn_not_isolatable(self.module.name, e)
                return False
        return True

    def _warn_not_isolatable(self, what: str, e: Exception) -> None:
        if "isolation" in self.ctx.warned:
            return
        self.ctx.warned.add("isolation")
        log.warning(
            "honed: %s cannot be sent to a worker process (%s); evaluating candidates in this "
            "process (a crashing backend would take it down). Pass isolation='none' to silence "
            "this.",
            what,
            e,
        )

    def _run_in_pool(
        self,
        baseline: Outcome | None,
        baseline_backend: Backend,
        items: list[Planned],
        pending: list[int],
        outcomes: dict[int, Outcome],
    ) -> Outcome:
        """Evaluate the baseline (unless cached) and the pending candidates in the pool."""
        assert self.ctx.pool is not None and self.jobs is not None
        pool = self.ctx.pool(len(pending) + (baseline is None))
        running: dict[concurrent.futures.Future[Any], tuple[int, Backend, bool]] = {}
        results: dict[int, Outcome] = {}

        def submit(i: int, backend: Backend, is_baseline: bool, cost: int) -> None:
            name = backend.name
            try:
                future = self.jobs.evaluate(  # type: ignore[union-attr]
                    pool,
                    backend,
                    is_baseline,
                    priority=float(cost),
                    on_phase=lambda phase: self.tracker.phase(phase, name),
                    measure_if=self.ctx.live.idle if self.ctx.live is not None else None,
                )
            except NotIsolatable as e:
                self._warn_not_isolatable(name, e)
                results[i] = self._evaluate_here(backend, is_baseline)
                return
            running[future] = (i, backend, is_baseline)

        if baseline is None:
            submit(-1, baseline_backend, True, -1)
        held, last = [], self._last(items, pending)
        for i in pending:
            if i in last:
                continue
            if waits_for(items[i], items):
                held.append(i)
            else:
                submit(i, items[i].backend, False, items[i].cost)
        if beside_program():  # this thread waits now: its OpenMP team would slow the program
            release_team()
        while running or held or last:
            held = self._release_held(items, held, {**outcomes, **results}, submit)
            if not running and last:  # the rest is decided: build these, or leave them out
                held += self._still_wanted(items, last, {**outcomes, **results})
                last = []
                continue
            if not running:
                continue
            for future in wait_all(list(running), 0.5):  # back here twice a second: budget, stop
                i, backend, is_baseline = running.pop(future)
                results[i] = self._pool_outcome(backend, is_baseline, _result_of(future))
                if results[i].status == "not tried":
                    self.not_tried.append(results.pop(i))
                elif running or held:  # (the compiling ones, ``last``, wait for no pass)
                    self._promote(results[i])
                held = self._release_held(items, held, {**outcomes, **results}, submit)
            if self.ctx.out_of_time():
                for future, (_, _, is_baseline) in running.items():
                    if self.ctx.abandoned or not is_baseline:
                        pool.cancel(future)
                for i in held:
                    self._skip(items[i], self.ctx.budget_reason())
                held = []
        outcomes.update(results)
        baseline = baseline or outcomes.pop(-1, None)
        if baseline is None:  # its job was cancelled (the tune cancelled, or the pool closed)
            self.ctx.check_abandoned(self.module.name)
            raise TuneCancelled(
                f"honed.tune: {self.module.name}: the tune was {self.ctx.stopped or 'cancelled'} "
                "before eager, the reference every candidate is compared with, was measured; "
                "nothing was selected"
            )
        return baseline

    def _release_held(
        self,
        items: list[Planned],
        held: list[int],
        known: dict[int, Outcome],
        submit: Callable[[int, Backend, bool, int], None],
    ) -> list[int]:
        """Submit (or skip) the held candidates whose probes have all finished."""
        still = []
        for i in held:
            if not self._probes_done(items[i], items, known):
                still.append(i)
                continue
            why = self._rule_skip(items[i], items, known)
            if why:
                self._skip(items[i], why)
            elif self.ctx.out_of_time():
                self._skip(items[i], self.ctx.budget_reason())
            else:
                submit(i, items[i].backend, False, items[i].cost)
        return still

    def _pool_outcome(self, backend: Backend, is_baseline: bool, result: Any) -> Outcome:
        assert self.jobs is not None
        if result.cancelled:
            outcome = Outcome(backend, is_baseline, status="not tried")
            outcome.reason = self.ctx.budget_reason() if self.ctx.out_of_time() else "cancelled"
            self.tracker.skipped(backend.name, outcome.reason, backend.expected_build_cost())
            return outcome
        outcome = self.jobs.outcome(backend, is_baseline, result)
        return self._finish(outcome, self._key_of(backend, is_baseline))

    # -- the finalists and the winner ------------------------------------------------------------
    def _interleave(self, competing: list[Outcome]) -> None:
        """Re-measure the finalists side by side; the cache keeps these final figures."""
        self.tracker.candidate("finalists")
        self.tracker.phase("interleave")
        chosen = finalists(competing)
        if self.jobs is not None and any(o.fn is None for o in chosen):
            assert self.ctx.pool is not None
            pool = self.ctx.pool(1)
            self.jobs.interleave(pool, chosen, on_phase=self.tracker.phase)
        else:
            # A finalist from the cache has figures of another time (another load on the
            # machine): it is installed here so that all are measured side by side now.
            for _ in competing:  # one that fails to install leaves room for the next
                missing = [o for o in finalists(competing) if o.fn is None]
                if not missing:
                    break
                for o in missing:
                    problem = self._install(o)
                    if problem:
                        log.warning("honed: %s: %s %s", self.module.name, o.backend.name, problem)
            sample = self.samples[self.measure_at]
            measure_interleaved(competing, sample, self.ctx.device, self.batch)
        if self.ctx.cache is None:
            return
        for o in competing:
            # the record only gains the figures: its payload is not read (nor hashed) here
            record = (
                self.ctx.cache.get(o.cache_key, unstable_too=True, payload=False)
                if o.cache_key
                else None
            )
            if o.cache_key and record is not None and o.measurement is not None:
                self.ctx.cache.put(
                    o.cache_key, dict(record, measurement=measurement_record(o.measurement))
                )

    def _measure_on_program(self, competing: list[Outcome]) -> str:
        """Measure every checked candidate on the program's calls (``ctx.live``), each installed
        here and checked against eager first; where the program stopped calling, each here
        instead. Their figures replace any a worker took (one measure for all), and the
        cache keeps them. Returns how they were measured, for the decision.

        A candidate whose install compiles in this process (torch.compile: imports, tracing,
        a compile from Inductor's cache, all holding the GIL) stops the program's calls for
        seconds; while one that installs without compiling (an AOTInductor package) passed, it
        is left out, and so it stays on restarts beside a calling program (the cache says so).
        So is one whose check, on a GPU, ran more than CHECK_RUNS_WITHIN times slower than that
        of one installed here (_much_slower_check), and, on a GPU, a capture of eager's own
        kernels once a package installed here, unless its check ran CHECK_RUNS_WITHIN times
        quicker than the package's (_eager_recording_left_out); such captures come last.
        """
        live = self.ctx.live
        assert live is not None
        ok = [o for o in competing if o.status == "ok"]
        light = _installs_without_compiling(ok)
        installed: list[Outcome] = []
        # Quickest check first: a candidate whose check ran several times slower than one
        # installed here is not worth its install's stalls (below). Captures of eager's
        # forward last: they wait for the packages' installs.
        device = self.ctx.device
        for o in sorted(ok, key=lambda o: (_records_eager_here(o, device), _check_order(o))):
            o.deferred = False  # measured below, or left out
            if light and _compiles_here(o.backend) and not (o.fn is not None and o.checked_here):
                self._leave_out(o, "built and checked, " + _left_out_beside_program(light))
                continue
            slower = _much_slower_check(o, installed, device) or _eager_recording_left_out(
                o, installed, device
            )
            if slower:
                self._leave_out(o, slower)
                continue
            if not o.is_baseline and not self._installed_here(o):
                continue
            installed.append(o)
        arms = [o for o in ok if any(o is i for i in installed)]  # in the tune's order
        self.ctx.check_abandoned(self.module.name)
        self.tracker.candidate("finalists")
        self.tracker.phase("on the program's calls")
        sample = self.samples[self.measure_at]
        fns = [None if o.is_baseline else o.fn for o in arms]
        turns = [(o.backend.name, self._arm(o)) for o in arms]
        figures: Any = None
        measurements: list[Any] = []
        noisy, steady = 0, True
        for _ in range(_PROGRAM_ROUNDS):  # figures too noisy to decide on: the calls again
            got = live.measure(turns, sample, self.ctx.deadline)
            if got is None:
                figures = None
                break
            run = secrets.randbits(52) | 1  # one id for the arms measured together
            this = [program_measurement(f, self.batch, run) for f in got]
            if measurements and any(m is None for m in this):
                break  # too few calls this time (long calls, the deadline): the last round stands
            figures, measurements = got, this
            steady = all(m is not None and m.stable for m in measurements)
            if steady:
                break
            noisy += 1
        if figures is None:  # the program is idle now: each measured here, as a worker would
            how = f"measured in {ON_IDLE_PROGRAM}"
            self.tracker.phase("measure")
            measurements = []
            for o, fn in zip(arms, fns, strict=True):
                fn = self.inner if fn is None else fn
                m, o.injected = measure(fn, sample, self.ctx.device, o.backend, self.batch)
                measurements.append(m)
        else:
            how = f"measured on {ON_PROGRAM}" + (
                ""
                if not noisy
                else f", after {noisy} round(s) too noisy to decide on"
                if steady
                else f", {noisy} rounds, each too noisy to decide on"
            )
        for o, m in zip(arms, measurements, strict=True):
            if m is None:
                o.status = "not tried"
                o.reason = (
                    f"under {_MIN_PROGRAM_CALLS} of the program's calls, in under "
                    f"{MIN_PROGRAM_ROUNDS} rounds"
                )
                continue
            o.measurement, o.device = m, ON_PROGRAM if figures is not None else ON_IDLE_PROGRAM
            if self.ctx.cache is not None and o.cache_key:
                self.ctx.cache.put(o.cache_key, o.to_record(), to_cache_files(o))
        return how

    def _leave_out(self, outcome: Outcome, reason: str) -> None:
        """Beside a calling program: ``outcome`` built and checked, but not installed in the
        program's process, nor measured; the cache says so, and a restart beside a program
        leaves it out without building it (``_evaluate_all``)."""
        outcome.status, outcome.reason = "not tried", reason
        if self.ctx.cache is not None and outcome.cache_key:
            record = dict(outcome.to_record(), status="ok", deferred=True)
            self.ctx.cache.put(outcome.cache_key, record)

    def _promote(self, outcome: Outcome) -> None:
        """Beside a calling program (JIT), a candidate built while others still build: installed
        here and checked against eager now, then judged on the program's calls against what
        answers them (eager, or a candidate promoted before); a faster one answers them until
        the tune ends (ProgramCalls.promote). The program then runs at its speed while the rest
        build and install, and their installs' stalls fall on calls that much shorter. One
        whose install compiles here (torch.compile) waits for the end, as there
        (_measure_on_program). Only where the program's view asks for it (``promotes``:
        honed.jit.config.promote), or, for a candidate that compiles nothing
        (``Backend.stands_in``), ``stand_ins`` (honed.jit.config.stand_in) where its check ran
        quicker than the program's calls (ProgramCalls.worth_a_stand_in)."""
        live = self.ctx.live
        if live is None or not (live.promotes or (outcome.backend.stands_in and live.stand_ins)):
            return
        if (
            outcome.is_baseline
            or outcome.status != "ok"
            or not outcome.deferred
            or _compiles_here(outcome.backend)
            or self.ctx.out_of_time()
        ):
            return
        if live.answering() == outcome.backend.name:  # promoted before the tune began (JIT)
            return
        if not live.promotes and not live.worth_a_stand_in(outcome.backend.name, outcome.check_ms):
            return
        if not self._installed_here(outcome):
            return
        arm = self._arm(outcome)
        assert arm is not None
        self.tracker.candidate(outcome.backend.name)
        self.tracker.phase("on the program's calls")
        live.promote(outcome.backend.name, arm, self.samples[self.measure_at])

    def _installed_here(self, outcome: Outcome, then: str = "") -> bool:
        """``outcome`` installed in this process and checked against eager there (at once
        where it was built and checked here); False, with a warning (ending ``then``), where
        that failed."""
        if outcome.fn is not None and outcome.checked_here:
            return True
        self.tracker.candidate(outcome.backend.name)
        self.tracker.phase("install")
        started = time.perf_counter()
        problem = self._install(outcome)
        if problem:
            log.warning("honed: %s: %s %s%s", self.module.name, outcome.backend.name, problem, then)
            return False
        outcome.install_s = time.perf_counter() - started
        return True

    def _arm(self, outcome: Outcome) -> Module | None:
        """``outcome``'s installed callable as a honed.Module of its own (calls bound to the
        module's signature, eager answering where it raises), None for eager."""
        if outcome.is_baseline or outcome.fn is None:
            return None
        arm = Module(self.inner, self.module.name)
        arm.install([Variant(self.profile, outcome.backend, outcome.fn, {}, None)])
        return arm

    def _select(self, competing: list[Outcome]) -> tuple[Any, Outcome | None]:
        """The strategy's pick, installed here from what was shipped and checked against eager;
        a pick that fails either is marked so and the strategy picks again."""
        while True:
            decision = self.strategy.select([o.result() for o in competing])
            if decision.index < 0:
                return decision, None
            chosen = competing[decision.index]
            if self._installed_here(chosen, then="; choosing again"):
                return decision, chosen

    def _install(self, chosen: Outcome) -> str:
        """Install ``chosen`` here and check it against eager; "" or what went wrong."""
        references = self.references  # on honed's stream too, where it is beside a program
        try:
            # a build here learns what eager returns from the references, not from an eager
            # run of its own (beside a JIT program: a call's length of its GIL and GPU)
            with own_stream(self.ctx.device), known_outputs(self.samples, references):
                # Eager itself (the default TorchEagerBackend builds the module as it is) needs
                # no install nor warm run; its check still tells a module that does not answer
                # as the program's calls did (JIT's references) from one that does.
                fn = (
                    self.inner
                    if chosen.is_baseline
                    else install_outcome(
                        chosen, self.inner, self.samples, self.info, self.measure_at
                    )
                )
                result = check(
                    fn, self.samples, references, chosen.backend, self.inner, self.info.device
                )
        except Exception as e:
            log.debug("honed: installing %s failed", chosen.backend.name, exc_info=True)
            chosen.status = "failed"
            chosen.reason = f"installing it in this process failed: {type(e).__name__}: {e}"
            return f"could not be installed here ({type(e).__name__}: {e})"
        if not result.ok:
            chosen.status = "rejected"
            chosen.reason = f"{result.reason} (checked in this process before installing)"
            if self.ctx.cache is not None and chosen.cache_key:
                self.ctx.cache.put(chosen.cache_key, chosen.to_record())
            return f"failed the check against eager before installing ({result.reason})"
        chosen.fn, chosen.checked_here = fn, True
        return ""

    def _cache_key_parts(self) -> dict[str, Any]:
        return {
            "model": self.ctx.model_fingerprint(self.inner),
            "inputs": inputs_fingerprint(self.samples, values=self.ctx.inputs_by_value),
            "profile": self.profile.to_json(),
            "measure_at": self.measure_at,
            "environment": fingerprint(self.ctx.device),
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


def _result_of(future: concurrent.futures.Future[Any]) -> JobResult:
    """A job's result; a job cancelled before it started is a cancelled result too."""
    if future.cancelled():
        return JobResult(failure="cancelled", cancelled=True)
    result: JobResult = future.result()
    return result


def reusable_outcome(outcome: Outcome) -> bool:
    """Whether a cached outcome decides by itself: no measurement (a failure) or a stable one."""
    m = outcome.measurement
    return m is None or bool(m.stable)


def _bar(outcomes: list[Outcome | None]) -> float | None:
    """The best median among cached outcomes that passed with stable figures (None: none did)."""
    medians = [
        float(o.measurement.median_ms)
        for o in outcomes
        if o is not None and o.passed and o.measurement is not None and o.measurement.stable
    ]
    return min(medians) if medians else None


def outranked(outcome: Outcome, bar: float | None) -> bool:
    """Whether a cached outcome measured unstable is decided all the same: even its fastest call
    was slower than the typical call (median) of a candidate measured stable. Noise only adds
    time to a call, so its true figure lies above that fastest call, and it cannot win; a warm
    re-tune then measures it no more. Anything closer is measured again."""
    m = outcome.measurement
    if bar is None or m is None or not outcome.passed:
        return False
    samples = list(m.samples_ms)
    return bool(samples) and min(samples) > bar


def _backend_identity(backend: Backend) -> dict[str, Any]:
    """The recipe plus where the class lives and a hash of its source (custom backends change)."""
    cls = type(backend)
    text = source_text(cls)
    source = hashlib.sha256(text.encode()).hexdigest() if text else ""
    return {
        "recipe": backend.recipe(),
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "source": source,
    }


def _measure_index(profile: _core.GraphProfile, signatures: list[_core.Signature]) -> int:
    """Measure at the sample whose shapes are the profile's opt shapes (else the last one)."""
    opt = [list(s) for s in profile.opt_shapes()]
    for i, sig in enumerate(signatures):
        if [list(s) for s in sig.tensor_shapes] == opt:
            return i
    return len(signatures) - 1


def _batch_size(profile: _core.GraphProfile, signature: _core.Signature) -> int:
    return fig.batch_of(profile, signature).size


def _describe_profile(profile: _core.GraphProfile) -> str:
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
    c = outcome.check
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
        max_abs_error=c.max_abs_error if c is not None else None,
        max_rel_error=c.max_rel_error if c is not None else None,
        cosine=c.min_cosine if c is not None else None,
        build_log=outcome.build_log,
        samples_ms=capped(list(m.samples_ms)) if m is not None else None,
        measured_on=outcome.device if m is not None else "",
    )


def capped(samples: list[float], cap: int = 2000) -> list[float]:
    """At most ``cap`` samples, taken evenly across the run (the report's distribution plots)."""
    stride = -(-len(samples) // cap)
    return samples[::stride] if stride > 1 else samples


def _compiles_here(backend: Backend) -> bool:
    """Whether installing ``backend``'s build in this process compiles (torch.compile); a
    capture of eager's kernels (CUDA graphs) compiles nothing."""
    return bool(backend.jit) and backend.expected_build_cost() >= 1 and not backend.stands_in


def _installs_without_compiling(outcomes: Iterable[Outcome]) -> list[str]:
    """The candidates among ``outcomes`` that passed and install without compiling."""
    return [
        o.backend.name
        for o in outcomes
        if o.status == "ok" and not o.is_baseline and not _compiles_here(o.backend)
    ]


# A candidate checked beside a program on a GPU whose quickest check run took more than this
# many times another's is left out of the program's process (the live trial's bar for rivals:
# honed.jit.tuner).
CHECK_RUNS_WITHIN = 2.0
# The devices whose check runs are compared so (see _much_slower_check).
_CHECK_RUNS_COMPARED_ON = ("cuda",)


def _check_order(outcome: Outcome) -> tuple[bool, float]:
    """Eager first (it installs nothing), then by quickest check run, unknown last."""
    if outcome.is_baseline:
        return (False, 0.0)
    return (True, outcome.check_ms if outcome.check_ms is not None else float("inf"))


def _much_slower_check(outcome: Outcome, installed: list[Outcome], device: Any) -> str:
    """Why ``outcome`` is not worth installing beside a program on a GPU: its quickest check run
    took more than CHECK_RUNS_WITHIN times that of a candidate already installed ("" when not).

    Installing a variant in the program's process runs it there first (a package's first run,
    a CUDA-graph capture's warm-up) beside the program's calls on its GPU, and a slow variant's
    runs hold those calls up the longest (docs/jit.md), only for the program's calls to rank it
    last. Both were checked on the same GPU beside the same program, so a gap that wide is not
    the moment's noise. On the CPU a worker's runs share the program's cores (a short sleep
    ends many milliseconds late), and its figures are not trusted this far."""
    on = getattr(device, "type", "") in _CHECK_RUNS_COMPARED_ON
    if not on or outcome.is_baseline or outcome.check_ms is None:
        return ""
    if outcome.fn is not None and outcome.checked_here:  # here already (promoted, or built here)
        return ""
    timed = [o for o in installed if not o.is_baseline and o.check_ms is not None]
    if not timed:
        return ""
    best = min(timed, key=lambda o: o.check_ms or 0.0)
    assert best.check_ms is not None
    ratio = outcome.check_ms / best.check_ms
    if ratio <= CHECK_RUNS_WITHIN:
        return ""
    return (
        f"built and checked, not installed beside the calling program: its check ran "
        f"{ratio:.1f}x {best.backend.name}'s time ({outcome.check_ms:.2f} ms against "
        f"{best.check_ms:.2f} ms, the quickest of each's runs on the samples)"
    )


def _records_eager_here(outcome: Outcome, device: Any) -> bool:
    """Whether installing ``outcome`` in the program's process, on a GPU, records eager's
    forward there (``Backend.stands_in``: CUDA graphs over the eager module), where it is not
    installed yet."""
    on = getattr(device, "type", "") in _CHECK_RUNS_COMPARED_ON
    here = outcome.fn is not None and outcome.checked_here
    return on and not outcome.is_baseline and outcome.backend.stands_in and not here


def _eager_recording_left_out(outcome: Outcome, installed: list[Outcome], device: Any) -> str:
    """Why ``outcome``, a capture of eager's kernels (``_records_eager_here``), is not worth
    installing beside a program on a GPU: another candidate is installed here (a package, whose
    capture records one call), and ``outcome``'s quickest check run was not CHECK_RUNS_WITHIN
    times quicker than that one's ("" when it is worth trying on the program's calls).

    Its capture records eager's forward in Python in the program's process, the process's first
    run of the path a capture takes (a mask's branch, cuDNN's plans for its attention), and the
    program's synchronize waits for the whole recording: on the GPU host that held one call many
    times its length (docs/jit.md). A package's capture records one call. Check runs within a
    factor of two of each other are the moment's noise beside the program (such a capture's
    check once ran quicker than the package's it then lost to on the program's calls)."""
    if not _records_eager_here(outcome, device):
        return ""
    packages = [
        o
        for o in installed
        if not o.is_baseline and not o.backend.stands_in and o.check_ms is not None
    ]
    if not packages:
        return ""
    best = min(packages, key=lambda o: o.check_ms or 0.0)
    assert best.check_ms is not None
    if outcome.check_ms is not None and outcome.check_ms * CHECK_RUNS_WITHIN < best.check_ms:
        return ""
    ran = f"{outcome.check_ms:.2f} ms" if outcome.check_ms is not None else "an unknown time"
    return (
        "built and checked, not installed beside the calling program: its install records "
        f"eager's forward in the program's process, which the program's synchronize waits for, "
        f"and {best.backend.name} is installed here already (checks: {ran} against "
        f"{best.check_ms:.2f} ms, not {CHECK_RUNS_WITHIN:g}x quicker)"
    )


def _left_out_beside_program(light: list[str]) -> str:
    return (
        "not installed beside the calling program: its install compiles in the program's "
        f"process, and {', '.join(light)} installs without compiling"
    )


def program_measurement(figures: list[float] | Turns, batch_size: int, run: int = 0) -> Any:
    """A Measurement of calls the program made (ProgramCalls.measure), or None for too few.
    Stable when the median of the first half of the calls and of the second agree within
    config.stability_tolerance, as consecutive windows do in the engine's measure. Turns keep
    their rounds, with ``run`` (one id for the arms measured together)."""
    samples_ms = figures.samples_ms if isinstance(figures, Turns) else figures
    blocks = figures.blocks if isinstance(figures, Turns) else []
    if len(samples_ms) < _MIN_PROGRAM_CALLS and len(blocks) < MIN_PROGRAM_ROUNDS:
        return None
    half = len(samples_ms) // 2
    first, second = sorted(samples_ms[:half]), sorted(samples_ms[half:])
    a, b = first[len(first) // 2], second[len(second) // 2]
    stable = abs(a - b) <= config.stability_tolerance * max(min(a, b), 1e-9)
    return _core.Measurement.from_samples(
        samples_ms,
        batch_size,
        float(sum(samples_ms)),
        2,
        stable,
        blocks=blocks,
        run=run if blocks else 0,
    )
