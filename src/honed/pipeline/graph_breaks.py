"""src/honed/pipeline/graph_breaks.py: torch._dynamo.explain on a module and one sample.

JIT asks before tuning a module whether Dynamo traces it whole. The trace is Python that holds
the GIL for long stretches, so JIT runs it in a worker of the pool (``explain_job``) and only in
its own process when isolation is off or the module cannot be sent.

Dynamo runs each graph it traced (the sample's forward pass, eager). In a worker beside a
program on a GPU that run is a neighbour's model run as long as one of the program's calls, and
even started halfway through one of them (``courtesy.spaced_run``) it can hold that call up to
twice its time (docs/jit.md). So the check first traces without running: each graph hands back empty
tensors shaped as its outputs (``_dry``). Where that finds one graph and no break, the answer is
exact: a break is found while tracing, before any graph runs, and with one graph nothing of the
program's runs on the outputs but the return. Where it finds breaks (the code after a break ran
on those empty outputs, whose values are garbage) or fails, the check is made again with every
graph run, spaced, which is the answer. Both go through the one place explain hands each graph
back to Dynamo.

Since no graph runs in that first trace, the module's weights are not needed for it: a worker
first gets the module as shapes only (``traced_whole`` on ``sharing.dumps_shapes``), and the
weights only where that trace cannot answer (``explain_job``'s ``"weights_needed"``). Handing a
CUDA model's weights over exports an IPC handle per storage in the program's process; a CPU
model's are copied.
"""

from __future__ import annotations

import contextlib
import pickle
import traceback
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from honed.backend.base import Sample, device_of
from honed.pipeline import courtesy


def explain(
    module: torch.nn.Module, sample: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[int, list[str]]:
    """(graph breaks, their reasons) of ``module`` on ``sample``; a module Dynamo cannot trace
    at all counts as one break, its error the reason."""
    device = device_of(module, [Sample(*sample)])
    found = _traced_whole(module, sample, device, strict=False)
    if found is not None:
        return found
    return _run_through(module, sample, device)


def traced_whole(
    module: torch.nn.Module, sample: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[int, list[str]] | None:
    """(0, []) where Dynamo traces ``module`` on ``sample`` into one graph without running any
    graph; None where only the real runs can tell (a break, a graph whose outputs are not
    tensors of fixed shapes, a failure). Nothing of the module runs but Python between graphs,
    so its weights' values do not matter: a module of uninitialised tensors shaped as the
    caller's answers for it (``sharing.dumps_shapes``)."""
    return _traced_whole(module, sample, device_of(module, [Sample(*sample)]), strict=True)


def _traced_whole(
    module: torch.nn.Module,
    sample: tuple[tuple[Any, ...], dict[str, Any]],
    device: torch.device,
    strict: bool,
) -> tuple[int, list[str]] | None:
    refused: list[str] = []  # a strict trace's refusals, also where Dynamo let one pass
    runs = _graph_runs(device, dry=True, refused=refused if strict else None)
    try:
        count, reasons = _explained(module, sample, runs)
    except Exception:  # the code after a break, on empty outputs: decided by the real runs
        return None
    return (count, reasons) if count == 0 and not reasons and not refused else None


def _run_through(
    module: torch.nn.Module, sample: tuple[tuple[Any, ...], dict[str, Any]], device: torch.device
) -> tuple[int, list[str]]:
    """The check with every traced graph run (spaced where runs are): Dynamo's own answer."""
    try:
        return _explained(module, sample, _graph_runs(device, dry=False))
    except Exception as e:  # dynamo could not trace it at all: as good as a break
        return 1, [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]


def _explained(
    module: torch.nn.Module,
    sample: tuple[tuple[Any, ...], dict[str, Any]],
    runs: contextlib.AbstractContextManager[None],
) -> tuple[int, list[str]]:
    import torch._dynamo

    args, kwargs = sample
    with torch.no_grad(), runs:
        explained = torch._dynamo.explain(module)(*args, **kwargs)
    return int(explained.graph_break_count), sorted({_reason(r) for r in explained.break_reasons})


class _WouldRun(Exception):
    """A strict dry trace met a graph it cannot stand in for with empty outputs."""


@contextlib.contextmanager
def _graph_runs(
    device: torch.device, dry: bool, refused: list[str] | None = None
) -> Iterator[None]:
    """While explain runs: each traced graph's run is, with ``dry``, empty tensors shaped as its
    outputs (``_dry``; given ``refused``, a graph whose outputs cannot be made so is noted there
    and raises instead of running), else a ``courtesy.spaced_run`` where runs are spaced here.
    Explain returns each graph's ``forward`` to Dynamo after passing the graph through
    ``torch._dynamo.backends.debugging._explain_graph_detail``; wrapping that forward there is
    the only hook it has. A torch without that function runs the graphs as they are."""
    try:
        from torch._dynamo.backends import debugging

        detail = debugging._explain_graph_detail
    except (ImportError, AttributeError):
        detail = None
    if detail is None and refused is not None:
        refused.append("this torch has no hook to keep its graphs from running")
        raise _WouldRun(refused[-1])
    spaced = courtesy.spaces(device)
    if detail is None or not (dry or spaced):
        yield
        return

    def wrapped_detail(gm: Any, *rest: Any) -> Any:
        gm, *more = detail(gm, *rest)
        empty = _dry(gm) if dry else None
        if refused is not None and empty is None:
            refused.append("a graph's outputs are not tensors of fixed shapes")
            raise _WouldRun(refused[-1])

        def run(*args: Any, **kwargs: Any) -> Any:
            if empty is not None:
                return empty()
            if not spaced:
                return gm(*args, **kwargs)
            with courtesy.spaced_run(device):
                return gm(*args, **kwargs)

        # Explain asks what this returns for its ``forward`` alone (the graph itself is kept
        # in its list already); a forward set on the graph would call itself through a lazy
        # graph module's recompile. Disabled: Dynamo would trace into the wrapper.
        return (SimpleNamespace(forward=torch.compiler.disable(run)), *more)

    debugging._explain_graph_detail = wrapped_detail  # type: ignore[assignment]
    try:
        yield
    finally:
        debugging._explain_graph_detail = detail


def _dry(gm: Any) -> Callable[[], Any] | None:
    """A function making empty tensors shaped as ``gm``'s outputs (from the fake values Dynamo
    traced them with), so the graph need not run; None where an output is anything else (a
    symbolic size, a value that is not a tensor): that graph runs."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten(gm.graph.output_node().args[0])
    values: list[Any] = [
        leaf.meta.get("example_value", leaf.meta.get("val"))
        if isinstance(leaf, torch.fx.Node)
        else None
        for leaf in leaves
    ]
    if not all(_fixed(v) for v in values):
        return None
    shapes = [(tuple(v.size()), tuple(v.stride()), v.dtype, v.device) for v in values]
    return lambda: tree_unflatten(
        [torch.empty_strided(size, stride, dtype=t, device=d) for size, stride, t, d in shapes],
        spec,
    )


def _fixed(value: Any) -> bool:
    """A strided tensor of fixed sizes and strides (no symbolic ones)."""
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and all(isinstance(d, int) for d in (*value.size(), *value.stride()))
    )


def _reason(r: Any) -> str:
    text = str(getattr(r, "reason", r)).strip().splitlines()
    return text[0][:200] if text else "unknown"


def explain_job(context: dict[str, Any]) -> dict[str, Any]:
    """In a worker: the check on the context's module and sample. A context whose module came
    as shapes only (``module_shapes``) answers only where the module traces whole without a
    graph run; elsewhere, or where those shapes do not load here, the reply asks for the module
    itself (``"weights_needed"``)."""
    if "module_shapes" in context:
        try:
            module = pickle.loads(context["module_shapes"])
        except Exception:  # e.g. a device this worker lacks: the module itself may still load
            traceback.print_exc()
            return {"weights_needed": True}
        found = traced_whole(module, context["sample"])
        if found is None:
            return {"weights_needed": True}
        count, reasons = found
    else:
        count, reasons = explain(context["module"], context["sample"])
    return {"graph_breaks": count, "reasons": reasons}


__all__ = ["explain", "explain_job", "traced_whole"]
