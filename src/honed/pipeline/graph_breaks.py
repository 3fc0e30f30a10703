"""src/honed/pipeline/graph_breaks.py: torch._dynamo.explain on a module and one sample.

JIT asks before tuning a module whether Dynamo traces it whole. The trace is Python that holds
the GIL for long stretches, so JIT runs it in a worker of the pool (``explain_job``) and only in
its own process when isolation is off or the module cannot be sent.

Dynamo runs each graph it traced (the sample's forward pass, eager). In a worker beside a
program on a GPU that run is a neighbour's model run as long as one of the program's calls, so
it is spaced like a build's runs (``courtesy.spaced_run``: started halfway through a call of
the program), through the one place explain hands each graph back to Dynamo.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    import torch._dynamo

    args, kwargs = sample
    try:
        with torch.no_grad(), _graph_runs_spaced(device_of(module, [Sample(args, kwargs)])):
            explained = torch._dynamo.explain(module)(*args, **kwargs)
        count = int(explained.graph_break_count)
        reasons = sorted({_reason(r) for r in explained.break_reasons})
    except Exception as e:  # dynamo could not trace it at all: as good as a break
        count, reasons = 1, [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    return count, reasons


@contextlib.contextmanager
def _graph_runs_spaced(device: torch.device) -> Iterator[None]:
    """While explain runs: each traced graph's run is a ``courtesy.spaced_run`` where runs are
    spaced here. Explain returns each graph's ``forward`` to Dynamo after passing the graph
    through ``torch._dynamo.backends.debugging._explain_graph_detail``; wrapping that forward
    there is the only hook it has. A torch without that function runs the graphs as they are."""
    try:
        from torch._dynamo.backends import debugging

        detail = debugging._explain_graph_detail
    except (ImportError, AttributeError):
        detail = None
    if detail is None or not courtesy.spaces(device):
        yield
        return

    def spaced_detail(gm: Any, *rest: Any) -> Any:
        gm, *more = detail(gm, *rest)

        def run(*args: Any, **kwargs: Any) -> Any:
            with courtesy.spaced_run(device):
                return gm(*args, **kwargs)

        # Explain asks what this returns for its ``forward`` alone (the graph itself is kept
        # in its list already); a forward set on the graph would call itself through a lazy
        # graph module's recompile. Disabled: Dynamo would trace into the wrapper.
        return (SimpleNamespace(forward=torch.compiler.disable(run)), *more)

    debugging._explain_graph_detail = spaced_detail  # type: ignore[assignment]
    try:
        yield
    finally:
        debugging._explain_graph_detail = detail


def _reason(r: Any) -> str:
    text = str(getattr(r, "reason", r)).strip().splitlines()
    return text[0][:200] if text else "unknown"


def explain_job(context: dict[str, Any]) -> dict[str, Any]:
    """In a worker: the check on the context's module and sample."""
    count, reasons = explain(context["module"], context["sample"])
    return {"graph_breaks": count, "reasons": reasons}


__all__ = ["explain", "explain_job"]
