"""src/honed/pipeline/graph_breaks.py: torch._dynamo.explain on a module and one sample.

JIT asks before tuning a module whether Dynamo traces it whole. The trace is Python that holds
the GIL for long stretches, so JIT runs it in a worker of the pool (``explain_job``) and only in
its own process when isolation is off or the module cannot be sent.
"""

from __future__ import annotations

from typing import Any

import torch


def explain(
    module: torch.nn.Module, sample: tuple[tuple[Any, ...], dict[str, Any]]
) -> tuple[int, list[str]]:
    """(graph breaks, their reasons) of ``module`` on ``sample``; a module Dynamo cannot trace
    at all counts as one break, its error the reason."""
    import torch._dynamo

    args, kwargs = sample
    try:
        with torch.no_grad():
            explained = torch._dynamo.explain(module)(*args, **kwargs)
        count = int(explained.graph_break_count)
        reasons = sorted({_reason(r) for r in explained.break_reasons})
    except Exception as e:  # dynamo could not trace it at all: as good as a break
        count, reasons = 1, [f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"]
    return count, reasons


def _reason(r: Any) -> str:
    text = str(getattr(r, "reason", r)).strip().splitlines()
    return text[0][:200] if text else "unknown"


def explain_job(context: dict[str, Any]) -> dict[str, Any]:
    """In a worker: the check on the context's module and sample."""
    count, reasons = explain(context["module"], context["sample"])
    return {"graph_breaks": count, "reasons": reasons}


__all__ = ["explain", "explain_job"]
