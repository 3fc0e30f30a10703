"""src/honed/pipeline/isolation.py: a tune's side of the pool: candidates as jobs, results back.

The graph's module, samples and eager references travel once per worker as the job context
(cloudpickle, so modules and backends defined in the user's ``__main__`` script or inside
functions work; CUDA tensors as IPC handles the worker copies from, honed.pipeline.sharing); each
candidate is one job. A crash, hang, out-of-memory or an exit without a
result fails that candidate with a one-line reason and the tune goes on (honed.pipeline.pool). What
cannot be pickled is evaluated in the tune's process instead (the caller warns once).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import json
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any, cast

from honed import config
from honed.backend.base import Backend
from honed.pipeline.candidate import Outcome, measurement_from_record, per_call_ms
from honed.pipeline.courtesy import beside_program
from honed.pipeline.pool import Context, Job, JobResult, WorkerPool, request_frames, wait_all
from honed.pipeline.sharing import Shared, dumps_shapes

log = logging.getLogger("honed")


class NotIsolatable(Exception):
    """The job cannot be sent to a worker (something in it does not pickle)."""


def memory_ceiling_bytes() -> int:
    """Each worker's ceiling: HONED_WORKER_MEMORY_GB, else 80 % of this machine's memory."""
    if config.worker_memory_gb > 0:
        return int(config.worker_memory_gb * (1 << 30))
    try:
        pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return int(pages * page * 0.8)
    except (ValueError, OSError, AttributeError):
        return 0


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pool_size(jobs: int) -> int:
    """Workers for ``jobs`` jobs: HONED_WORKERS, else one per core (at most 8), jobs at most."""
    wanted = config.workers if config.workers > 0 else min(cpu_cores(), 8)
    return max(1, min(wanted, jobs))


def worker_config() -> dict[str, Any]:
    """The flags a worker runs with: this process's, JSON-able ones, isolation off."""
    out = {}
    for name, value in config.snapshot().items():
        try:
            json.dumps(value)
        except TypeError:
            continue  # paths and the like: the worker does not need them
        out[name] = value
    out["isolation"] = "none"
    return out


def worker_env(size: int, cores: int | None = None) -> dict[str, str]:
    """The workers' environment: Inductor's compile threads as the user's own
    ``TORCHINDUCTOR_COMPILE_THREADS`` sets them (a whole number from 1), else
    ``config.worker_compile_threads`` where set, else the cores (``cores``, else all of this
    process's) shared among the workers; and every worker (and this process) uses one Inductor
    cache, so candidates of one graph share its FX-graph and autotune entries."""
    from honed.backend._inductor_env import inductor_cache_dir

    return {
        "PYTHONUNBUFFERED": "1",
        "HONED_JIT": "0",  # workers never JIT-tune
        "TORCHINDUCTOR_COMPILE_THREADS": _users_compile_threads()
        or str(config.worker_compile_threads or max(1, (cores or cpu_cores()) // size)),
        "TORCHINDUCTOR_CACHE_DIR": os.path.abspath(inductor_cache_dir()),
    }


def _users_compile_threads() -> str:
    """Inductor's compile threads as the user's environment sets them ("" where unset or not
    a whole number from 1: the workers then share the cores)."""
    value = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "").strip()
    if not value:
        return ""
    if value.isdigit() and int(value) >= 1:
        return str(int(value))
    if value not in _WARNED:
        _WARNED.add(value)
        log.warning(
            "TORCHINDUCTOR_COMPILE_THREADS=%r is not a whole number from 1; honed's workers share "
            "the cores instead (set it to 1 or more, or unset it)",
            value,
        )
    return ""


_WARNED: set[str] = set()  # values warned of, once each per process


def new_pool(
    jobs: int,
    gpus: list[str] | None = None,
    device: str = "",
    stagger: bool = False,
    preload: tuple[str, ...] = (),
) -> WorkerPool:
    """A pool for ``jobs`` jobs of a model on ``device`` (a CUDA model's JIT workers leave
    the program cores: worker_cpus); ``stagger``: its workers start one after another;
    ``preload``: modules each worker imports before it is ready (else a job imports what its
    backend needs, Backend.imports)."""
    settings = pool_settings(jobs, device, preload)
    return WorkerPool(
        settings.pop("size"),
        memory_limit_bytes=memory_ceiling_bytes(),
        gpus=gpus,
        stagger=stagger,
        **settings,
    )


def pool_settings(jobs: int, device: str = "", preload: tuple[str, ...] = ()) -> dict[str, Any]:
    """What new_pool gives its workers under the flags in force now: their number ("size"),
    environment, flags, niceness, CPUs and preloaded modules. Two pools with the same settings
    run a job alike (JIT's early workers are taken for a tune's only then)."""
    size = pool_size(jobs)
    cpus = worker_cpus() if device.startswith("cuda") else None
    return {
        "size": size,
        "env": worker_env(size, len(cpus) if cpus else None),
        "worker_config": worker_config(),
        "nice": config.worker_nice,
        "cpus": cpus,
        "preload": preload,
    }


def worker_cpus() -> list[int] | None:
    """The logical CPUs of this process that workers may run on: all but the physical cores
    ``config.worker_spare_cores`` (a share, at least one, never all) leaves to the program,
    with their hyperthreads; None where none is left out.

    A program that launches a GPU model runs as fast as its launching thread, and niceness does
    not keep a compiler off that thread's hyperthread sibling or the clocks they share: while a
    JIT tune's builds compiled on every CPU, BERT's calls on the H100's host ran slower with
    their thread's own CPU time per call rising as much (docs/jit.md)."""
    share = config.worker_spare_cores
    if share <= 0:
        return None
    cores = physical_cores()
    if len(cores) < 2:
        return None
    spare = min(len(cores) - 1, max(1, round(share * len(cores))))
    ordered = sorted(cores.values())  # the program keeps the lowest-numbered cores
    return sorted(cpu for cpus in ordered[spare:] for cpu in cpus)


def physical_cores() -> dict[Any, list[int]]:
    """This process's allowed CPUs by physical core (empty where the affinity is unknown)."""
    try:
        allowed = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return {}
    return {core: list(cpus) for core, cpus in _cores(allowed).items()}  # the kept one unchanged


@functools.lru_cache(maxsize=4)
def _cores(cpus: tuple[int, ...]) -> dict[Any, list[int]]:
    """``cpus`` by physical core, read from sysfs once per set: the topology does not change,
    and a JIT program reads it in its first call rather than beside a later one."""
    cores: dict[Any, list[int]] = {}
    for cpu in cpus:
        cores.setdefault(_physical_core(cpu), []).append(cpu)
    return cores


def _physical_core(cpu: int) -> Any:
    """``cpu``'s physical core (package, core), or the CPU itself where sysfs does not say."""
    topology = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
    try:
        with open(topology + "physical_package_id") as a, open(topology + "core_id") as b:
            return int(a.read()), int(b.read())
    except (OSError, ValueError):
        return -1, cpu


def _check_pickles(value: Any, what: str) -> None:
    """Raise NotIsolatable unless ``value`` pickles as a job's request does."""
    try:
        request_frames(value)
    except Exception as e:
        raise NotIsolatable(f"{what}: {type(e).__name__}: {e}") from e


def _call_clock(device: str) -> str:
    """The calling program's call clock for a job beside it on a GPU (its runs start mid-call,
    honed.pipeline.courtesy); "" elsewhere."""
    if not device.startswith("cuda"):
        return ""
    from honed.pipeline.courtesy import open_call_clock

    return open_call_clock()


def spreads(backend: Backend) -> bool:
    """Whether the candidate may be measured on another GPU of the host: only when what its
    worker ships back does not depend on the device (nothing, or Inductor's cache artifacts)."""
    return not backend.saves_payload and (backend.jit or backend.expected_build_cost() <= 1)


def shared_context(fields: dict[str, Any], what: str) -> Context:
    """``fields`` as a job context: CUDA tensors go as IPC handles, copied by the worker as it
    loads them (honed.pipeline.sharing), everything else by value; raises NotIsolatable."""
    try:
        shared = Shared(fields)
    except Exception as e:
        raise NotIsolatable(f"{what}: {type(e).__name__}: {e}") from e
    if not shared.cuda_tensors:
        blob = shared.blob()
        digest = hashlib.sha256()
        for frame in blob:  # hashlib lets the GIL go for large buffers
            digest.update(frame)
        return Context(digest.hexdigest(), blob)
    return Context(uuid.uuid4().hex, [], fresh=shared.blob)


class GraphJobs:
    """One graph's jobs: the shared context (sent once per worker) and a job per candidate."""

    def __init__(self, fields: dict[str, Any], device: str) -> None:
        self.context = shared_context(fields, "the module, its samples or outputs")
        self.device = device

    def limits(self) -> dict[str, float]:
        return {"build": config.build_timeout_s, "measure": config.measure_timeout_s}

    def evaluate(
        self,
        pool: WorkerPool,
        backend: Backend,
        is_baseline: bool,
        priority: float = 0.0,
        on_phase: Callable[[str], None] | None = None,
        measure_if: Callable[[], bool] | None = None,
    ) -> concurrent.futures.Future[JobResult]:
        """Submit ``backend``'s evaluation; raises NotIsolatable when it does not pickle.
        ``measure_if``: asked at its turn to measure; False: built and checked only. Given (a
        tune beside a program), the worker also spaces its runs (courtesy.spaced_run)."""
        _check_pickles(backend, backend.name)
        job = Job(
            kind="evaluate",
            # beside a program (measure_if): its runs leave the program's GPU room between them
            request={
                "backend": backend,
                "is_baseline": is_baseline,
                "beside_program": measure_if is not None,
                "call_clock": _call_clock(self.device) if measure_if is not None else "",
            },
            context=self.context,
            device=self.device,
            limits=self.limits(),
            priority=priority,
            spread=spreads(backend),
            on_phase=on_phase,
            label=backend.name,
            measure_if=measure_if,
        )
        return pool.submit(job)

    @staticmethod
    def outcome(backend: Backend, is_baseline: bool, result: JobResult) -> Outcome:
        """The candidate's Outcome from its job's result (a failure when the worker failed)."""
        if not result.ok:
            outcome = Outcome(
                backend, is_baseline, status="failed", reason=result.failure, isolated=True
            )
        else:
            reply = result.reply
            outcome = Outcome.from_record(backend, reply["outcome"], is_baseline, key="")
            outcome.cached, outcome.cache_key = False, None
            if outcome.build_s is not None:  # the worker's clock ran while it was paused
                outcome.build_s = max(0.0, outcome.build_s - result.paused_build_s)
            outcome.payload_files = reply.get("files") or None
            outcome.inductor_artifacts = reply.get("inductor")
            outcome.pickled_fn = reply.get("pickled")
            outcome.isolated = True
        outcome.output, outcome.seconds, outcome.device = (
            result.output,
            result.seconds,
            result.device,
        )
        outcome.slot = result.slot
        return outcome

    def interleave(
        self,
        pool: WorkerPool,
        finalists: list[Outcome],
        on_phase: Callable[[str], None] | None = None,
    ) -> None:
        """Re-measure ``finalists`` interleaved in one worker on the tune's device, each loaded
        from what its worker shipped; replaces their figures on success. The worker that built
        what costs the most to load again (_loads_best_on) takes the job where it is idle
        (``Job.prefer_slot``): loading what it compiled itself finds its traces and kernels in
        place, where another worker would trace and load them first.

        A finalist whose loading ends the worker (crash, hang) fails with that reason and the
        others go again; any other failure only logs, each keeping its own figures.
        """
        remaining = list(finalists)
        while len(remaining) >= 2:
            request = {
                "finalists": [
                    {
                        "backend": o.backend,
                        "files": o.payload_files,
                        "inductor": o.inductor_artifacts,
                        "pickled": o.pickled_fn,
                    }
                    for o in remaining
                ],
                "per_call": [per_call_ms(o.measurement) for o in remaining],
            }
            try:
                _check_pickles(request, "a finalist")
            except NotIsolatable as e:
                log.info("honed: finalists not re-measured interleaved (%s)", e)
                return
            limits = {
                "build": config.build_timeout_s,
                "measure": config.measure_timeout_s,
            }
            limits.update({f"load {i}": config.build_timeout_s for i in range(len(remaining))})
            job = Job(
                "interleave",
                request,
                self.context,
                self.device,
                limits,
                -1.0,
                False,
                on_phase,
                prefer_slot=_loads_best_on(remaining),
            )
            result = next(iter(wait_all([pool.submit(job)]))).result()
            if result.ok:
                for outcome, record in zip(remaining, result.reply["measurements"], strict=True):
                    outcome.measurement = measurement_from_record(record)
                    outcome.device = result.device  # the figures now come from the target
                return
            if not result.phase.startswith("load "):
                log.warning(
                    "honed: interleaved re-measurement of the finalists failed (%s); keeping "
                    "their separate figures",
                    result.failure,
                )
                return
            broken = remaining.pop(int(result.phase.split()[1]))
            broken.status = "failed"
            broken.reason = f"loading it in a fresh worker for the re-measure: {result.failure}"
            log.warning("honed: finalist %s: %s", broken.backend.name, broken.reason)


def _loads_best_on(outcomes: list[Outcome]) -> int:
    """The pool slot whose worker built what costs the most to load again in another: first
    the JIT compiles (``Backend.jit``: loading Inductor's artifacts traces the module and loads
    its kernels, seconds, where the worker that built them has both in place) by build cost,
    then the count of the others (a package or a pickle loads alike anywhere); eager loads
    nothing. The first such among ties; -1 where none was built in this pool."""
    weight: dict[int, tuple[int, int]] = {}
    for o in outcomes:
        if o.slot < 0 or o.is_baseline:
            continue
        compiles, others = weight.get(o.slot, (0, 0))
        if o.backend.jit:
            compiles += max(1, o.backend.expected_build_cost())
        else:
            others += 1
        weight[o.slot] = (compiles, others)
    return max(weight, key=lambda slot: weight[slot]) if weight else -1


class IsolatedCheck:
    """JIT's graph-break check (honed.pipeline.graph_breaks) in a worker process of its own:
    the trace holds no lock of the program's, a crash or hang ends only the worker.

    The worker first gets the module as shapes only (``sharing.dumps_shapes``: its tensors
    uninitialised, nothing of the program's memory exported or copied), which answers for a
    module Dynamo traces whole without running a graph; the module itself follows only where
    that cannot answer. Raises NotIsolatable when the module or sample does not pickle (for
    the module itself, from ``run``)."""

    def __init__(
        self,
        module: Any,
        sample: Any,
        device: str,
        pool: Callable[[int], WorkerPool] | None = None,
    ) -> None:
        """``pool``: a pool the caller owns to run the check in (given one job); None: a
        worker of its own."""
        self.module, self.sample = module, sample
        try:
            shapes = dumps_shapes(module)
        except Exception as e:  # a tensor without an empty stand-in: the module itself goes
            log.debug("honed: the check sends the module itself (%s: %s)", type(e).__name__, e)
            self.context = self._whole()
        else:
            self.context = shared_context({"module_shapes": shapes, "sample": sample}, "the sample")
        self.device = device
        self.given_pool = pool
        self.pool: WorkerPool | None = None
        self.future: concurrent.futures.Future[JobResult] | None = None
        self.cancelled = ""

    def _whole(self) -> Context:
        return shared_context(
            {"module": self.module, "sample": self.sample}, "the module or sample"
        )

    def cancel(self, abandon: bool = False, reason: str = "cancelled") -> None:
        """End the check (the program is ending): its result is the failure "cancelled"."""
        self.cancelled = reason
        pool, future = self.pool, self.future
        if pool is not None and future is not None:
            pool.cancel(future)

    def run(self) -> tuple[int, list[str]] | str:
        """(graph breaks, reasons), or why the worker gave no answer."""
        with contextlib.ExitStack() as stack:
            if self.given_pool is not None:
                pool = self.given_pool(1)
            else:
                pool = stack.enter_context(new_pool(1, device=self.device))
            reply = self._ask(pool, self.context)
            if isinstance(reply, dict) and reply.get("weights_needed"):
                self.context = self._whole()  # raises NotIsolatable
                reply = self._ask(pool, self.context)
        if isinstance(reply, str):
            return reply
        return int(reply["graph_breaks"]), [str(r) for r in reply["reasons"]]

    def _ask(self, pool: WorkerPool, context: Context) -> dict[str, Any] | str:
        """The worker's reply to one check job on ``context``, or why it gave none."""
        if self.cancelled:
            return self.cancelled
        beside = beside_program()  # the trace's graph runs are spaced on the program's GPU
        job = Job(
            "explain",
            {"beside_program": beside, "call_clock": _call_clock(self.device) if beside else ""},
            context,
            self.device,
            {"build": config.build_timeout_s},
            label="graph-break check",
        )
        self.pool = pool
        self.future = pool.submit(job)
        if self.cancelled:
            pool.cancel(self.future)
        result = next(iter(wait_all([self.future]))).result()
        self.pool = self.future = None
        if not result.ok:
            return self.cancelled or result.failure
        return cast(dict[str, Any], result.reply)
