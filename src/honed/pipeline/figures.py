"""src/honed/pipeline/figures.py: what a graph's figures mean: batch, label, speed-ups, reuse.

Throughput is samples per second, a sample being one row of the batch axis; where the engine
inferred no batch axis, the leading axis of the first tensor input stands in for it, and the
report says so. Graphs are labelled by their real input shapes. A cached measurement is reused
only when it was stable: an unstable one never stands in for a decision.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from honed import _core

log = logging.getLogger("honed")

INFERRED = "batch axis inferred"
LEADING = "no batch axis inferred: the leading axis of the first input"
NO_AXIS = "no input with an axis: one sample per call"


@dataclasses.dataclass(frozen=True)
class Batch:
    """The samples one call processes, and where that number comes from."""

    size: int
    axis: str  # INFERRED, LEADING or NO_AXIS


def batch_of(profile: _core.GraphProfile, signature: _core.Signature) -> Batch:
    """The batch of one graph's measured call, by the engine's rule (_core.batch_of: the inferred
    batch axis of the first input that has one, else the leading axis of the first input)."""
    shapes = [[int(d) for d in s] for s in signature.tensor_shapes]
    size, axis = _core.batch_of([int(a) for a in profile.batch_axes], shapes)
    return Batch(int(size), str(axis))


def shapes_label(signature: _core.Signature, limit: int = 4) -> str:
    """The tensor inputs' shapes, e.g. "8x128, 8x128" ("scalar" for 0-d), at most ``limit``."""
    shapes = [list(s) for s in signature.tensor_shapes]
    parts = ["x".join(str(d) for d in s) if s else "scalar" for s in shapes[:limit]]
    if len(shapes) > limit:
        parts.append(f"+{len(shapes) - limit} more")
    return ", ".join(parts) or "no tensor inputs"


def graph_fields(profile: _core.GraphProfile, signature: _core.Signature) -> dict[str, Any]:
    """The GraphReport fields that describe what was measured: batch size, its axis, shapes."""
    batch = batch_of(profile, signature)
    return {
        "batch_size": batch.size,
        "batch_axis": batch.axis,
        "input_shapes": shapes_label(signature),
    }


def speedup(
    m: _core.Measurement | None, baseline: _core.Measurement | None, figure: str
) -> float | None:
    """How much better than the baseline ``m`` is on the figure the decision ranked by:
    throughput over the baseline's for "throughput", the latency ratio for the latencies."""
    if m is None or baseline is None:
        return None
    if figure == "throughput":
        return m.throughput / baseline.throughput if baseline.throughput > 0 else None
    attr = "p95_ms" if figure == "p95 latency" else "median_ms"
    mine, theirs = getattr(m, attr), getattr(baseline, attr)
    return theirs / mine if mine > 0 else None


def reusable(record: dict[str, Any] | None) -> bool:
    """Whether a cached candidate record may stand in for measuring again: not when its
    measurement was unstable (records without a measurement, e.g. failures, are reusable)."""
    if record is None:
        return False
    m = record.get("measurement")
    if isinstance(m, dict) and not m.get("stable", True):
        log.debug("honed: a cached measurement was unstable; measuring again")
        return False
    return True


__all__ = ["Batch", "batch_of", "graph_fields", "reusable", "shapes_label", "speedup"]
