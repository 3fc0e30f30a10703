"""src/honed/pipeline/sweep.py: grow a graph's batch by powers of two up to the throughput knee.

The engine decides (``_core.batch_sweep``: stop when gains stay under 5 % for two steps or a
batch fails) and says how to extrapolate a sample (``_core.batch_indices``: slice or repeat);
this file only runs the model at each size and resizes tensors along the profile's batch axes.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from honed import _core, config
from honed.backend.base import Sample
from honed.module import GraphRecording
from honed.pipeline.machine import measuring_threads

log = logging.getLogger("honed")

# A quick measurement per batch size: the sweep ranks sizes, it does not publish figures.
_SWEEP_WARMUP_MS = 20.0
_SWEEP_WINDOW_MS = 20.0


def resize_sample(sample: Sample, batch_axes: list[int], batch: int) -> Sample:
    """``sample`` resized to ``batch`` along each tensor's batch axis (-1: left as it is)."""
    index_cache: dict[tuple[int, str], torch.Tensor] = {}
    leaf = 0

    def resize(t: Any) -> Any:
        nonlocal leaf
        if not isinstance(t, torch.Tensor):
            return t
        axis = batch_axes[leaf] if leaf < len(batch_axes) else -1
        leaf += 1
        if axis < 0:
            return t
        current = int(t.shape[axis])
        key = (current, str(t.device))
        if key not in index_cache:
            index_cache[key] = torch.tensor(_core.batch_indices(current, batch), device=t.device)
        return t.index_select(axis, index_cache[key])

    args, kwargs = torch.utils._pytree.tree_map(resize, (sample.args, sample.kwargs))
    return Sample(tuple(args), dict(kwargs))


def sweep_graph(
    module: torch.nn.Module,
    recording: GraphRecording,
    profile: _core.GraphProfile,
    device: torch.device,
    max_batch: int,
) -> _core.SweepResult | None:
    """Sweep eager throughput over batch sizes; add a sample per size up to the knee.

    Returns the engine's SweepResult, or None when the graph has no batch axis.
    """
    if not any(a >= 0 for a in profile.batch_axes):
        return None
    base = recording.samples[-1]
    batch_axes = list(profile.batch_axes)
    cfg = _core.MeasureConfig()
    cfg.warmup_ms, cfg.window_ms = _SWEEP_WARMUP_MS, _SWEEP_WINDOW_MS
    cfg.warmup_calls, cfg.window_calls = config.warmup_calls, config.window_calls
    cfg.max_windows = min(config.max_windows, 5)
    timer = _core.HostTimer(
        (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    )
    sized: dict[int, Sample] = {}

    def throughput_at(batch: int) -> float | None:
        try:
            sample = resize_sample(base, batch_axes, batch)
            cfg.batch_size = batch
            with torch.no_grad(), measuring_threads(device):
                m = _core.measure(lambda: module(*sample.args, **sample.kwargs), timer, cfg)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return None
        except RuntimeError as e:
            if "out of memory" not in str(e).lower():
                raise
            return None
        sized[batch] = sample
        return float(m.throughput)

    start = max(1, int(profile.min_batch))
    result = _core.batch_sweep(throughput_at, start=start, max_batch=max_batch)
    log.info("honed: batch sweep: %s; knee at %d", result.stop_reason, result.knee)
    for batch, sample in sorted(sized.items()):
        if batch <= result.knee:
            recording.add(_core.signature(sample.args, sample.kwargs), sample)
    return result
