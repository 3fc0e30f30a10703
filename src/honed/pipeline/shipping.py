"""src/honed/pipeline/shipping.py: what a worker ships back; the caller installs it, no rebuild.

The variant that was measured is the one installed. A worker that evaluated a candidate sends
back, with its figures, what the caller needs to run that very build:

- a payload backend (AOTInductor, ONNX Runtime, TensorRT): its payload files, loaded as they are;
- a JIT backend (Inductor): Inductor's cache artifacts of the build
  (``torch.compiler.save_cache_artifacts``); the caller loads them and compiles again, which only
  traces and takes every kernel from the cache;
- any other backend whose build costs something: the callable itself, pickled (cloudpickle);
- a backend that builds in no time (eager, a CUDA-graph capture): nothing; the caller builds it.

The finalists' interleaved re-measure (a worker) and the install (the caller) start from these, so
neither compiles again. Whatever still runs in the caller is checked once against eager before it
is installed; a build in the caller runs on a thread with the build timeout, so a backend that
hangs only there fails instead of stopping the tune.
"""

from __future__ import annotations

import contextvars
import importlib
import logging
import pickle
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from honed import config
from honed.backend.base import Backend, GraphInfo, Sample
from honed.errors import TuneError
from honed.pipeline.candidate import (
    Outcome,
    evaluate,
    interleave,
    measurement_record,
)
from honed.pipeline.courtesy import spaced_run

log = logging.getLogger("honed")


# -- in the worker -----------------------------------------------------------------------------
def _inductor_artifacts() -> bytes | None:
    saved = torch.compiler.save_cache_artifacts()
    return saved[0] if saved else None


def _clear_inductor_artifacts() -> None:
    from torch.compiler._cache import CacheArtifactManager

    CacheArtifactManager.clear()


def _pickled(fn: Callable[..., Any]) -> bytes | None:
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps(fn))
    except Exception as e:  # not every callable travels: the caller builds it then
        log.debug("honed: the built callable does not pickle (%s: %s)", type(e).__name__, e)
        return None


def evaluate_for_caller(
    ctx: dict[str, Any],
    request: dict[str, Any],
    on_phase: Callable[[str], None],
    elsewhere: bool = False,
) -> dict[str, Any]:
    """candidate.evaluate on a worker's context, and what the caller needs to install it.

    ``elsewhere``: the job ran on another GPU than the tune's (its measuring was spread). A
    pickled callable would hold that GPU's tensors, so none is shipped and the finalists'
    re-measure and the install build it on the target (spread candidates build cheaply, or
    compile from the Inductor artifacts, which do not depend on the GPU)."""
    backend: Backend = request["backend"]
    _clear_inductor_artifacts()
    _import_for(backend)
    outcome = evaluate(
        backend,
        ctx["module"],
        ctx["samples"],
        ctx["references"],
        ctx["graph"],
        ctx["measure_at"],
        ctx["batch_size"],
        is_baseline=request.get("is_baseline", False),
        on_phase=on_phase,
    )
    reply: dict[str, Any] = {"outcome": outcome.to_record()}
    if outcome.status == "ok" and outcome.fn is not None:
        reply.update(ship(backend, outcome.fn, pickle_it=not elsewhere))
    outcome.fn = None
    if "torch._dynamo" in sys.modules:  # the next job compiles as in a fresh process
        torch._dynamo.reset()  # (disk caches stay)
    return reply


def _import_for(backend: Backend) -> None:
    """Import the modules ``backend``'s builds need, before its build's clock starts; one that
    fails to import is left to the build, whose failure then says why."""
    for name in backend.imports:
        try:
            importlib.import_module(name)
        except Exception:
            log.debug("honed: importing %s for %s failed", name, backend.name, exc_info=True)


def ship(backend: Backend, fn: Callable[..., Any], pickle_it: bool = True) -> dict[str, Any]:
    """What the caller needs to install ``fn`` without building it (see the module docstring);
    ``pickle_it=False``: never the callable itself (the caller builds it then)."""
    if backend.saves_payload:
        return {"files": backend.export_payload(fn)}
    if backend.jit:
        return {"inductor": _inductor_artifacts()}
    if pickle_it and backend.expected_build_cost() >= 1:
        return {"pickled": _pickled(fn)}
    return {}


def interleave_shipped(
    ctx: dict[str, Any], request: dict[str, Any], on_phase: Callable[[str], None]
) -> dict[str, Any]:
    """Load each finalist from what was shipped ("load I" phases), then measure them interleaved."""
    fns = []
    for i, item in enumerate(request["finalists"]):
        on_phase(f"load {i}")
        fns.append(
            install_callable(
                item["backend"],
                ctx["module"],
                ctx["samples"],
                ctx["graph"],
                ctx["measure_at"],
                files=item.get("files"),
                inductor=item.get("inductor"),
                pickled=item.get("pickled"),
            )
        )
    on_phase("measure")
    sample = ctx["samples"][ctx["measure_at"]]
    results = interleave(fns, request["per_call"], sample, ctx["graph"].device, ctx["batch_size"])
    return {"measurements": [measurement_record(m) for m in results]}


# -- in the tuning cache -----------------------------------------------------------------------
INDUCTOR_FILE = "inductor-cache-artifacts.bin"


def to_cache_files(outcome: Outcome) -> dict[str, bytes] | None:
    """What the tuning cache keeps beside the record, so a re-tune installs without a rebuild:
    the payload files, or Inductor's cache artifacts. A pickled callable is never stored: the
    cache folder is not a place to load pickles from."""
    if outcome.status != "ok":
        return None
    if outcome.payload_files:
        return outcome.payload_files
    if outcome.inductor_artifacts:
        return {INDUCTOR_FILE: outcome.inductor_artifacts}
    if outcome.fn is not None and outcome.backend.saves_payload:  # evaluated in this process
        try:
            return outcome.backend.export_payload(outcome.fn)
        except Exception as e:
            log.warning("honed: could not store %s in the cache (%s)", outcome.backend.name, e)
    return None


def from_cache_files(outcome: Outcome, files: dict[str, bytes] | None) -> None:
    """Put the cached files back where install_outcome looks for them."""
    if not files:
        return
    if INDUCTOR_FILE in files and not outcome.backend.saves_payload:
        outcome.inductor_artifacts = files[INDUCTOR_FILE]
    elif outcome.backend.saves_payload:
        outcome.payload_files = files


# -- in the caller -----------------------------------------------------------------------------
def install_callable(
    backend: Backend,
    module: torch.nn.Module,
    samples: list[Sample],
    graph: GraphInfo,
    measure_at: int,
    *,
    files: dict[str, bytes] | None = None,
    inductor: bytes | None = None,
    pickled: bytes | None = None,
    timeout_s: float = 0.0,
) -> Callable[..., Any]:
    """The candidate's callable from what a worker (or the cache) shipped, warmed on one sample.

    Built here only when nothing was shipped; that build runs on a thread and fails after
    ``timeout_s`` (0: no limit) instead of hanging the tune.
    """
    fn: Callable[..., Any]
    if files and backend.saves_payload:
        fn = _timed(lambda: backend.load_payload(files, module, graph), timeout_s, backend)
    elif pickled is not None:
        fn = pickle.loads(pickled)
    else:
        if inductor:
            torch.compiler.load_cache_artifacts(inductor)
        fn = _timed(lambda: backend.build_graph(module, samples, graph), timeout_s, backend)
    first = samples[measure_at]
    with torch.no_grad(), spaced_run(graph.device):
        _timed(lambda: fn(*first.args, **first.kwargs), timeout_s, backend)
    return fn


def install_outcome(
    outcome: Outcome,
    module: torch.nn.Module,
    samples: list[Sample],
    graph: GraphInfo,
    measure_at: int,
) -> Callable[..., Any]:
    """install_callable from an Outcome's shipped parts, with the build timeout."""
    return install_callable(
        outcome.backend,
        module,
        samples,
        graph,
        measure_at,
        files=outcome.payload_files,
        inductor=outcome.inductor_artifacts,
        pickled=outcome.pickled_fn,
        timeout_s=config.build_timeout_s,
    )


def _timed(step: Callable[[], Any], timeout_s: float, backend: Backend) -> Any:
    """Run ``step`` on a thread; a TuneError when it takes more than ``timeout_s``.

    honed's own backends run on the calling thread (a CUDA-graph capture stays on the thread
    that replays it); the guard is for the user's backends.
    """
    if timeout_s <= 0 or type(backend).__module__.startswith("honed.backend."):
        with torch.no_grad():
            return step()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            with torch.no_grad():
                box["value"] = step()
        except BaseException as e:
            box["error"] = e

    # the caller's context goes with it (the eager outputs the tune holds: base.known_outputs)
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(run,), name="honed-install", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TuneError(
            f"{backend.name} did not finish building in this process within {timeout_s:g} s "
            "(HONED_BUILD_TIMEOUT_S); it is left behind and another candidate is chosen"
        )
    if "error" in box:
        raise box["error"]
    return box["value"]
