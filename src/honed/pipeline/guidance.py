"""src/honed/pipeline/guidance.py: what honed.tune tells the user at its start about the call.

A model left in training mode, or a dataset whose samples all have one shape, tunes fine but
not for what the user meant: one warning line each says so and names the fix.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from honed.module import Module

log = logging.getLogger("honed")

_QUIET = [0]  # > 0 while a caller (JIT) gives its own guidance


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """No tune-start guidance inside this block (JIT tunes what the program calls, as it is)."""
    _QUIET[0] += 1
    try:
        yield
    finally:
        _QUIET[0] -= 1


def at_tune_start(modules: list[Module], batch_sizes: list[int], batch_sweep: bool) -> None:
    """One warning per module for training mode and for fixed shapes."""
    if _QUIET[0]:
        return
    for module in modules:
        if module.module.training:
            log.warning(
                "honed.tune: module %r is in training mode; call .eval() on the model before "
                "tuning and serving (tuned variants run only in eval mode; in training mode it "
                "runs eager).",
                module.name,
            )
        shapes = _one_shape(module)
        if shapes and not batch_sizes and not batch_sweep and module.dynamic_shapes is None:
            log.warning(
                "honed.tune: every sample of module %r has the same shapes %s, so the tuned "
                "graph fixes them and other shapes will run eager; to widen them pass "
                "batch_sizes=[...] to honed.tune (`honed tune --batch-sizes 1,8,32`), mark the "
                "batch axis with honed.Module(..., dynamic_shapes=[{0: honed.BatchDim()}]), or "
                "give samples of several shapes.",
                module.name,
                shapes,
            )


def _one_shape(module: Module) -> str:
    """The single input shape set every recorded graph of ``module`` saw ("" when several, or
    when no input has an axis that could vary)."""
    seen: list[tuple[tuple[int, ...], ...]] = []
    for recording in module.graphs.values():
        if len(recording.shapes_seen) != 1:
            return ""
        seen.extend(recording.shapes_seen)
    if not seen or not any(len(shape) > 0 for shapes in seen for shape in shapes):
        return ""
    return ", ".join(str(tuple(shape)) for shapes in seen for shape in shapes)
