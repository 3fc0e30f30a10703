"""src/honed/jit/decisions.py: JIT's own decisions in the persistent cache (graph-break checks,
whether a script's next run needs workers).

The tuning cache (honed/pipeline/cache.py) already keeps every candidate's outcome, so a second
run of a script re-measures nothing. What it does not keep is JIT's check before tuning, a
``torch._dynamo.explain`` trace of the module (a second or more on big models): its result is
stored here, keyed by the module's fingerprint (class, forward source, weights), the input
signature it was traced with, and the environment, so a restarted script goes straight to the
cached decision.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from honed import _core
from honed import config as _flags
from honed.environment import fingerprint
from honed.jit.config import config
from honed.pipeline.cache import TuneCache, model_fingerprint

log = logging.getLogger("honed.jit")


def _cache() -> TuneCache | None:
    if not _flags.cache_enabled:
        return None
    return TuneCache(Path(config.cache_dir) if config.cache_dir else _flags.cache_dir)


def graph_break_key(
    module: torch.nn.Module,
    sample: tuple[tuple[Any, ...], dict[str, Any]],
    fingerprints: dict[int, str] | None = None,
) -> str:
    """The cache key of ``module``'s graph-break answer on ``sample``'s signature.
    ``fingerprints``: model fingerprints by id(module), filled here, which the module's tune
    then reuses (hashing the weights beside the program's calls once, not twice)."""
    args, kwargs = sample
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    fingerprints = {} if fingerprints is None else fingerprints
    if id(module) not in fingerprints:
        fingerprints[id(module)] = model_fingerprint(module)
    return TuneCache.key(
        jit="graph_breaks",
        model=fingerprints[id(module)],
        signature=_core.signature(args, kwargs).graph_key,
        environment=fingerprint(device),
    )


def cached_graph_breaks(key: str) -> tuple[int, list[str]] | None:
    """(break count, reasons) found for ``key`` by an earlier run, or None."""
    cache = _cache()
    record = cache.get(key) if cache is not None else None
    if record is None or "graph_breaks" not in record:
        return None
    return int(record["graph_breaks"]), [str(r) for r in record.get("reasons", [])]


def store_graph_breaks(key: str, count: int, reasons: list[str]) -> None:
    cache = _cache()
    if cache is not None:
        cache.put(key, {"graph_breaks": count, "reasons": reasons})


def _program_key(program: str) -> str:
    return TuneCache.key(jit="workers_needed", program=program)


def workers_needed(program: str) -> bool | None:
    """Whether the next run of the script at ``program`` needs a worker for its first tunes,
    as its last run left it (None: unknown)."""
    cache = _cache()
    record = cache.get(_program_key(program)) if cache is not None else None
    if record is None or "workers_needed" not in record:
        return None
    return bool(record["workers_needed"])


def store_workers_needed(program: str, needed: bool) -> None:
    cache = _cache()
    if cache is not None:
        cache.put(_program_key(program), {"workers_needed": needed, "program": program})


__all__ = [
    "cached_graph_breaks",
    "graph_break_key",
    "store_graph_breaks",
    "store_workers_needed",
    "workers_needed",
]
