"""src/honed/jit/tuner.py: trying one discovered module: checks, graph breaks, tune, states."""

from __future__ import annotations

import logging
import time
from typing import Any

from honed import _core
from honed.jit.config import config
from honed.jit.hierarchy import Node, State
from honed.jit.history import add as add_step
from honed.jit.patcher import STATE

log = logging.getLogger("honed.jit")


def maybe_try(node: Node) -> None:
    """Try ``node`` once it is eligible (a root, or its parent ended EAGER/SKIPPED) and ready."""
    if node.tried or node.state is not State.RECORDING:
        return
    parent = node.parent
    if parent is not None and parent.state not in (State.EAGER, State.SKIPPED):
        return
    if node.level <= config.max_depth_level:
        if node.call_count < max(1, config.min_samples) or not node.samples:
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
    if config.detect_graph_breaks and _breaks(node):
        _eager(node, "graph breaks")
        return
    if config.dry_run:
        node.reason = "dry run"
        add_step(f"Dry run: would tune {node.describe()} on {len(node.samples)} sample(s)")
        return
    _tune(node)


def _skip(node: Node, why: str) -> None:
    node.state, node.reason = State.SKIPPED, why
    node.samples = []
    add_step(f"Skipping {node.short()}: {why}", logging.DEBUG)


def _eager(node: Node, why: str) -> None:
    node.state, node.reason = State.EAGER, why
    node.samples = []
    _try_children(node)


def _try_children(node: Node) -> None:
    for child in node.children:
        maybe_try(child)


def _breaks(node: Node) -> bool:
    """Whether torch._dynamo.explain finds a graph break (or cannot trace) on a recorded sample."""
    import torch._dynamo

    module = node.module
    assert module is not None  # a node being tried is called, so alive
    args, kwargs = node.samples[0]
    started = time.perf_counter()
    STATE.bypass += 1
    try:
        with torch.no_grad():
            explained = torch._dynamo.explain(module)(*args, **kwargs)
        count = int(explained.graph_break_count)
        reasons = sorted({_reason(r) for r in explained.break_reasons})
    except Exception as e:  # dynamo could not trace it at all: as good as a break
        count, reasons = 1, [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    finally:
        STATE.bypass -= 1
        torch._dynamo.reset()
    took = time.perf_counter() - started
    if count == 0:
        add_step(f"No graph breaks in {node.short()}. Checking took {took:.2f}s")
        return False
    add_step(
        f"{count} graph break(s) in {node.short()}: {'; '.join(reasons)}. "
        f"Checking took {took:.2f}s; trying its children"
    )
    return True


def _reason(r: Any) -> str:
    text = str(getattr(r, "reason", r)).strip().splitlines()
    return text[0][:200] if text else "unknown"


def _tune(node: Node) -> None:
    from honed.module import Module
    from honed.tuning import tune

    module = node.module
    assert module is not None
    wrapper = Module(module, node.name, strategy=config.tune_strategy())
    dataset = list(node.samples)
    started = time.perf_counter()
    STATE.bypass += 1
    try:
        report = tune(
            func=lambda a, k: wrapper(*a, **k),
            dataset=dataset,
            device=config.device,
            cache_dir=config.cache_dir,
        )
    except Exception as e:  # the tune failing is JIT's cue to try the children
        took = time.perf_counter() - started
        add_step(
            f"Tuning {node.short()} failed after {took:.2f}s ({type(e).__name__}: {e}); "
            "running it eager and trying its children",
            logging.WARNING,
        )
        _eager(node, f"tune failed: {type(e).__name__}")
        return
    finally:
        STATE.bypass -= 1
    took = time.perf_counter() - started
    node.samples = []
    add_step(f"Tuning {node.short()} took {took:.2f}s")
    rows = [c for g in report.graphs for c in g.candidates]
    cached = sum(1 for c in rows if c.cached)
    if cached:
        add_step(f"Reused {cached} of {len(rows)} cached result(s) for {node.short()}")
    if not wrapper.is_tuned:
        decisions = "; ".join(g.decision for g in report.graphs)
        add_step(f"No variant selected for {node.short()} ({decisions})", logging.WARNING)
        _eager(node, "no variant selected")
        return
    node.tuned = wrapper
    node.backend = ", ".join(sorted({type(v.backend).__name__ for v in wrapper.variants}))
    node.state = State.TUNED
    node.report = report
    add_step(f"Selected {node.backend} for {node.short()}: {report.graphs[0].decision}")
    for child in node.descendants():
        child.state, child.samples = State.DETACHED, []
        add_step(f"Unpatching child module: {child.describe()}", logging.DEBUG)


def _has_batch_axis(node: Node) -> bool:
    groups: dict[str, list[Any]] = {}
    for args, kwargs in node.samples:
        sig = _core.signature(args, kwargs)
        groups.setdefault(sig.graph_key, []).append(sig)
    try:
        return all(
            any(a >= 0 for a in _core.infer_profile(sigs, None).batch_axes)
            for sigs in groups.values()
        )
    except Exception as e:  # the engine could not infer shapes: no batch axis to rely on
        log.debug("honed.jit: no profile for %s: %s", node.name, e)
        return False


__all__ = ["maybe_try", "try_node"]
