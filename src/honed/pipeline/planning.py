"""src/honed/pipeline/planning.py: the candidates a graph's tune tries, their order, the skips.

Cheap first (docs/tuning.md): candidates run in the order of their expected build cost
(``Backend.expected_build_cost()``: eager and CUDA-graph captures first, they set the bar in
seconds; long compiles last), the strategy's order among equals. Two rules leave a candidate
out, and the report lists it as "not tried" with the rule's reason:

- same build: a candidate whose ``build_identity`` for this graph equals an earlier one's (for
  example Inductor with ``dynamic=None`` and with ``dynamic=False`` on a graph without dynamic
  axes) would build the very same thing;
- precision: a reduced-precision candidate that costs a compile is not tried when a cheap
  candidate (build cost 0 or 1) in the same precision was rejected for its outputs: the compiled
  one computes in that precision too. It waits for those cheap candidates to finish.

The time budget is the third way a candidate ends up "not tried" (honed.pipeline.graph_tuner).
"""

from __future__ import annotations

import dataclasses
import json

from honed.backend.base import Backend, GraphInfo

CHEAP = 1  # build costs up to this one are "cheap" (the precision rule's probes)


@dataclasses.dataclass
class Planned:
    """One candidate of the plan: its place, its expected cost, and why it is skipped if so."""

    backend: Backend
    cost: int
    precision: str
    skip: str = ""  # the reason it is not tried ("" while it is)


def _identity(backend: Backend, graph: GraphInfo) -> str:
    try:
        return json.dumps(backend.build_identity(graph), sort_keys=True, default=str)
    except Exception:  # an identity that cannot be computed is unique: never a duplicate
        return f"unique:{id(backend)}"


def plan(
    backends: list[Backend], graph: GraphInfo, baseline: Backend | None = None
) -> list[Planned]:
    """The candidates in the order they run, duplicates marked; the baseline is left out."""
    seen: dict[str, str] = {}
    if baseline is not None:
        seen[_identity(baseline, graph)] = ""
    out: list[Planned] = []
    for backend in backends:
        identity = _identity(backend, graph)
        item = Planned(backend, _cost(backend), _precision(backend))
        if identity in seen:
            if not seen[identity]:
                continue  # the baseline itself (eager with its default config)
            item.skip = f"same build as {seen[identity]} for this graph"
        else:
            seen[identity] = backend.name
        out.append(item)
    out.sort(key=lambda p: p.cost)  # stable: the strategy's order among equal costs
    return out


def waits_for(item: Planned, items: list[Planned]) -> list[Planned]:
    """The cheap candidates whose outcome decides whether ``item`` runs (the precision rule)."""
    if item.precision == "fp32" or item.cost <= CHEAP:
        return []
    return [p for p in items if p.precision == item.precision and p.cost <= CHEAP and not p.skip]


def precision_skip(item: Planned, probes: list[tuple[Planned, str, str]]) -> str:
    """The precision rule's reason to skip ``item`` given its probes' (planned, status, reason)."""
    for probe, status, reason in probes:
        if status == "rejected":
            why = reason.split(";")[0]
            return (
                f"{item.precision}: {probe.backend.name} in the same precision was rejected ({why})"
            )
    return ""


def _cost(backend: Backend) -> int:
    try:
        return int(backend.expected_build_cost())
    except Exception:
        return int(getattr(type(backend), "build_cost", 2))


def _precision(backend: Backend) -> str:
    try:
        return str(backend.precision())
    except Exception:
        return "fp32"
