"""src/honed/jit/tuner.py: trying one discovered module: checks, graph breaks, tune, states."""

from __future__ import annotations

import importlib
import logging
import time
from typing import Any

import torch

from honed import _core, guidance
from honed.jit.config import MAX_RETUNES, config
from honed.jit.decisions import cached_graph_breaks, graph_break_key, store_graph_breaks
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
    """Whether torch._dynamo.explain finds a graph break (or cannot trace) on a recorded sample.

    The answer is kept in the persistent cache (decisions.py): a restarted script reuses it.
    """
    module = node.module
    assert module is not None  # a node being tried is called, so alive
    started = time.perf_counter()
    key = graph_break_key(module, node.samples[0])
    found = cached_graph_breaks(key)
    if found is None:
        count, reasons = _explain(module, node.samples[0])
        store_graph_breaks(key, count, reasons)
        how = "Checking"
    else:
        count, reasons = found
        how = "Reusing the cached check"
    took = time.perf_counter() - started
    if count == 0:
        add_step(f"No graph breaks in {node.short()}. {how} took {took:.2f}s")
        return False
    add_step(
        f"{count} graph break(s) in {node.short()}: {'; '.join(reasons)}. "
        f"{how} took {took:.2f}s; trying its children"
    )
    return True


def _explain(
    module: torch.nn.Module, sample: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[int, list[str]]:
    import torch._dynamo

    args, kwargs = sample
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
    return count, reasons


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
    importlib.import_module("torch._dynamo")  # every compile needs it: counts as rebuild time

    import_s = time.perf_counter() - started
    STATE.bypass += 1
    try:
        with guidance.quiet():  # JIT tunes the program's own calls; its steps say the rest
            report = tune(
                func=wrapper,  # each sample is (args, kwargs): honed.calls.split_sample
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
        if node.state is State.TUNED:  # a re-tune failed: the earlier variants stay
            node.new_samples = []
            return
        _eager(node, f"tune failed: {type(e).__name__}")
        return
    finally:
        STATE.bypass -= 1
    took = time.perf_counter() - started
    node.samples, node.new_samples = [], []
    node.tuned_samples = dataset if config.retune_on_new_shapes else []
    add_step(f"Tuning {node.short()} took {took:.2f}s")
    _account(node, report, took, import_s)
    if not wrapper.is_tuned:
        decisions = "; ".join(g.decision for g in report.graphs)
        add_step(f"No variant selected for {node.short()} ({decisions})", logging.WARNING)
        if node.state is not State.TUNED:
            _eager(node, "no variant selected")
        return
    node.tuned = wrapper
    node.backend = ", ".join(sorted({type(v.backend).__name__ for v in wrapper.variants}))
    node.report = report
    add_step(f"Selected {node.backend} for {node.short()}: {report.graphs[0].decision}")
    if node.state is State.TUNED:
        return  # a re-tune: the children are detached already
    node.state = State.TUNED
    for child in node.descendants():
        child.state, child.samples = State.DETACHED, []
        add_step(f"Unpatching child module: {child.describe()}", logging.DEBUG)


def _account(node: Node, report: Any, took: float, import_s: float) -> None:
    """Split the tuning time: deciding (or reusing the cached decision) vs building the winner.

    Rebuilding counts the winner's build in this process and importing torch._dynamo (which a
    process that reused every cached outcome needs for that build alone).
    """
    rows = [c for g in report.graphs for c in g.candidates]
    cached = sum(1 for c in rows if c.cached)
    node.rebuild_s = sum(g.install_s for g in report.graphs) + import_s
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
    """A TUNED module got inputs its variants do not cover (they run eager): maybe re-tune."""
    if why not in node.outside_seen:
        node.outside_seen.add(why)
        then = (
            "re-tuning after min_samples such calls"
            if config.retune_on_new_shapes and node.retunes < MAX_RETUNES
            else "running them eager"
        )
        add_step(
            f"Inputs outside the tuned profile of {node.short()} ({why}); {then}", logging.WARNING
        )
    if not config.retune_on_new_shapes or node.retunes >= MAX_RETUNES:
        return
    node.new_samples.append(_detach((args, kwargs)))
    if len(node.new_samples) < max(1, config.min_samples):
        return
    node.retunes += 1
    node.samples = node.tuned_samples + node.new_samples
    add_step(
        f"Re-tuning {node.short()} (re-tune {node.retunes} of at most {MAX_RETUNES}) for "
        f"{len(node.new_samples)} new sample(s) and {len(node.tuned_samples)} tuned before"
    )
    node.outside_seen = set()
    _tune(node)


def _detach(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


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


__all__ = ["maybe_try", "outside_profile", "try_node"]
