"""src/honed/backend/_export.py: the export plan shared by the backends that use torch.export.

From the recorded samples and the tuned profile, the plan picks the example to trace, the
``torch.export.Dim``s of the dynamic axes (axes named alike share one), and the ``Calling``
(see _calling.py) with the profile the result will accept. ``FlatForward`` is the module that
is exported: ``forward(*tensors)`` rebuilds ``(args, kwargs)`` around the recorded non-tensor
values and calls the module, optionally under autocast.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from typing import Any

import torch

from honed import _core
from honed.backend._calling import Calling
from honed.backend.base import GraphInfo, Sample
from honed.errors import ConfigError, InputError, TuneError

log = logging.getLogger("honed")


@dataclasses.dataclass
class Plan:
    example: Sample
    spec: Any  # pytree spec of the example's (args, kwargs)
    template: list[Any]  # its leaves, tensors replaced by None
    tensors: list[torch.Tensor]  # the example's tensor inputs (resized where needed)
    lo: list[tuple[int, ...]]  # per tensor input, the smallest size of each axis compiled for
    hi: list[tuple[int, ...]]  # ... and the largest
    groups: list[tuple[str, ...]]  # per tensor input, per axis: its shared Dim's name or ""
    dims: list[dict[int, Any] | None]  # dynamic_shapes entry per tensor input
    calling: Calling


def plan(samples: list[Sample], graph: GraphInfo, dynamic: bool | None, who: str) -> Plan:
    """The export plan for ``samples`` of one graph; ``who`` names the backend in errors."""
    from torch.utils._pytree import tree_flatten

    per_sample = [tree_flatten((s.args, s.kwargs)) for s in samples]
    leaves, spec = per_sample[0]
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    shapes = [[tuple(leaves_i[p].shape) for p in positions] for leaves_i, _ in per_sample]
    lo, hi = _bounds(graph, shapes)
    has_dynamic = lo != hi
    if dynamic is True and not has_dynamic:
        raise ConfigError(
            f"{who}(dynamic=True): the tuned profile has no dynamic axis; tune with samples of "
            "several sizes (or honed.tune(batch_sizes=...)), or leave dynamic=None"
        )
    index = _example_index(graph, shapes)
    example_leaves = per_sample[index][0]
    tensors = [example_leaves[p] for p in positions]
    static = dynamic is False or not has_dynamic
    if static:
        lo = hi = [tuple(t.shape) for t in tensors]
    groups = _groups(graph, lo, hi, shapes)
    template = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in example_leaves]
    example = samples[index]
    guard = _guard_profile(graph, example, lo, hi, groups, narrowed=static and has_dynamic)
    calling = Calling(len(template), positions, _dumps(spec), guard)
    tensors = _avoid_zero_one(tensors, hi, groups)
    return Plan(example, spec, template, tensors, lo, hi, groups, _dims(lo, hi, groups), calling)


def _guard_profile(
    graph: GraphInfo,
    example: Sample,
    lo: list[tuple[int, ...]],
    hi: list[tuple[int, ...]],
    groups: list[tuple[str, ...]],
    narrowed: bool,
) -> Any:
    """The engine profile a payload compiled by this plan accepts: the tuned profile itself,
    unless there is none or the payload is static where the profile is not."""
    if graph.profile is not None and not narrowed:
        return graph.profile
    axes = [
        [
            {"kind": "dynamic", "name": g, "min": low, "opt": low, "max": high}
            if g
            else {"kind": "static", "name": "", "min": low, "opt": low, "max": low}
            for low, high, g in zip(lo_t, hi_t, row, strict=True)
        ]
        for lo_t, hi_t, row in zip(lo, hi, groups, strict=True)
    ]
    key = _core.signature(example.args, example.kwargs).graph_key
    text = {
        "graph_key": key,
        "axes": axes,
        "batch_axes": [-1] * len(axes),
        "min_batch": 0,
        "opt_batch": 0,
        "max_batch": 0,
    }
    return _core.GraphProfile.from_json(json.dumps(text))


def _bounds(
    graph: GraphInfo, shapes: list[list[tuple[int, ...]]]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Per tensor input, the per-axis min and max: the profile's, else the samples'."""
    n = len(shapes[0])
    if graph.min_shapes and graph.max_shapes:
        if len(graph.min_shapes) != n or len(graph.max_shapes) != n:
            raise InputError(
                f"the tuned profile has {len(graph.min_shapes)} tensor inputs but the samples "
                f"have {n} (in flatten order of (args, kwargs)); this is a honed bug: report it"
            )
        return list(graph.min_shapes), list(graph.max_shapes)
    lo = [tuple(min(s[i][a] for s in shapes) for a in range(len(shapes[0][i]))) for i in range(n)]
    hi = [tuple(max(s[i][a] for s in shapes) for a in range(len(shapes[0][i]))) for i in range(n)]
    return lo, hi


def _example_index(graph: GraphInfo, shapes: list[list[tuple[int, ...]]]) -> int:
    """Trace on the sample at the profile's opt shapes, else the largest one."""
    opt = [tuple(s) for s in graph.opt_shapes]
    for i, s in enumerate(shapes):
        if s == opt:
            return i
    sizes = [sum(_numel(t) for t in s) for s in shapes]
    return sizes.index(max(sizes))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _groups(
    graph: GraphInfo,
    lo: list[tuple[int, ...]],
    hi: list[tuple[int, ...]],
    shapes: list[list[tuple[int, ...]]],
) -> list[tuple[str, ...]]:
    """A shared-dimension name per dynamic axis ("" for static ones).

    With the profile's axis names, axes named alike share one Dim. Without them, dynamic axes
    with the same range and the same size in every sample share one (torch.export refuses
    separate Dims for axes the model makes equal, e.g. the batch axes of two added inputs).
    """
    seen: dict[tuple[Any, ...], str] = {}
    out: list[tuple[str, ...]] = []
    for i, (lo_t, hi_t) in enumerate(zip(lo, hi, strict=True)):
        row = []
        for a, (low, high) in enumerate(zip(lo_t, hi_t, strict=True)):
            if low == high:
                row.append("")
            elif _axis_name(graph, i, a):
                row.append(_identifier(_axis_name(graph, i, a)))
            else:
                key = (low, high, tuple(s[i][a] for s in shapes))
                row.append(seen.setdefault(key, f"in{i}_axis{a}"))
        out.append(tuple(row))
    return out


def _axis_name(graph: GraphInfo, leaf: int, axis: int) -> str:
    names = graph.axis_names
    return names[leaf][axis] if leaf < len(names) and axis < len(names[leaf]) else ""


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    return ident if ident and not ident[0].isdigit() else f"d_{ident}"


def _avoid_zero_one(
    tensors: list[torch.Tensor],
    hi: list[tuple[int, ...]],
    groups: list[tuple[str, ...]],
) -> list[torch.Tensor]:
    """torch.export specializes a dynamic axis traced at size 0 or 1: trace such axes at 2.

    The compiled code still serves the profile's min (Dim(min=1) stays a valid range); only the
    example is enlarged, by repeating its rows, so integer inputs such as token ids stay valid.
    """
    target: dict[str, int] = {}
    for i, t in enumerate(tensors):
        for a, size in enumerate(t.shape):
            if groups[i][a] and size < 2 and hi[i][a] >= 2:
                target[groups[i][a]] = 2
    if not target:
        return tensors
    out = []
    for i, t in enumerate(tensors):
        for a in range(t.dim()):
            group = groups[i][a]
            if group in target and t.shape[a] != target[group]:
                if t.shape[a] == 0:
                    raise InputError(
                        f"tensor input {i} has an empty axis {a}; torch.export needs an example "
                        "with at least one element there: record a non-empty sample"
                    )
                index = torch.arange(target[group], device=t.device) % t.shape[a]
                t = t.index_select(a, index)
        out.append(t)
    return out


def _dims(
    lo: list[tuple[int, ...]], hi: list[tuple[int, ...]], groups: list[tuple[str, ...]]
) -> list[dict[int, Any] | None]:
    """torch.export dynamic_shapes per tensor input: one Dim object per shared dimension."""
    from torch.export import Dim

    ranges: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(groups):
        for a, group in enumerate(row):
            if group:
                low, high = ranges.get(group, (lo[i][a], hi[i][a]))
                # Axes of one name with different ranges: the shared Dim takes the common range.
                ranges[group] = (max(low, lo[i][a]), min(high, hi[i][a]))
    made = {group: Dim(group, min=low, max=high) for group, (low, high) in ranges.items()}
    return [{a: made[g] for a, g in enumerate(row) if g} or None for row in groups]


def _dumps(spec: Any) -> str | None:
    from torch.utils._pytree import treespec_dumps

    try:
        return str(treespec_dumps(spec))
    except Exception:  # a custom pytree node without a serializable name: check leaves only
        log.debug("honed: input treespec %s is not serializable", spec, exc_info=True)
        return None


class FlatForward(torch.nn.Module):
    """``forward(*tensors)`` -> ``module(*args, **kwargs)``, optionally under autocast."""

    def __init__(self, module: torch.nn.Module, plan: Plan) -> None:
        super().__init__()
        self.inner = module
        self._positions = plan.calling.tensor_positions
        self._spec = plan.spec
        self._template = plan.template
        self._autocast: tuple[str, torch.dtype] | None = None
        self._out_dtypes: list[torch.dtype | None] = []

    def set_autocast(self, device_type: str, dtype: torch.dtype, eager_out: Any) -> None:
        from torch.utils._pytree import tree_leaves

        self._autocast = (device_type, dtype)
        self._out_dtypes = [
            t.dtype if isinstance(t, torch.Tensor) else None for t in tree_leaves(eager_out)
        ]

    def forward(self, *tensors: torch.Tensor) -> Any:
        from torch.utils._pytree import tree_flatten, tree_unflatten

        leaves = list(self._template)
        for pos, t in zip(self._positions, tensors, strict=True):
            leaves[pos] = t
        args, kwargs = tree_unflatten(leaves, self._spec)
        if self._autocast is None:
            return self.inner(*args, **kwargs)
        device_type, dtype = self._autocast
        with torch.autocast(device_type=device_type, dtype=dtype):
            out = self.inner(*args, **kwargs)
        flat, out_spec = tree_flatten(out)
        cast = [
            t.to(want)
            if isinstance(t, torch.Tensor) and want is not None and t.dtype != want
            else t
            for t, want in zip(flat, self._out_dtypes, strict=False)
        ]
        return tree_unflatten(cast, out_spec)


def export_program(wrapper: FlatForward, plan: Plan, strict: bool, model: str, who: str) -> Any:
    """torch.export of ``wrapper`` with the plan's Dims; ``who`` (the backend) names the fix."""
    import torch.export

    try:
        with torch.no_grad():
            return torch.export.export(
                wrapper, tuple(plan.tensors), dynamic_shapes=(tuple(plan.dims),), strict=strict
            )
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TuneError(
            f"torch.export could not capture {model} as one graph ({type(e).__name__}: {first}); "
            f"{who} needs a single graph: replace data-dependent Python control flow with "
            "torch.cond or tensor ops, or use TorchInductorBackend, which allows graph breaks"
        ) from e
