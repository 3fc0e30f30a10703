"""src/honed/shapes.py: user-stated dynamic shapes, converted to the engine's overrides.

``dynamic_shapes`` may be given as:
  * a list aligned with the tensor inputs (flatten order): ``[{0: BatchDim()}, {0: BatchDim(),
    1: DynamicDim("seq", 8, 512)}]``;
  * a dict keyed by tensor index: ``{0: {0: BatchDim()}}``;
  * a dict keyed by ``(tensor_index, axis)``: ``{(0, 0): BatchDim()}``;
  * a dict keyed by forward() argument name, for arguments that are single tensors:
    ``{"input_ids": {0: BatchDim(), 1: DynamicDim("seq", 1, 512)}}``.
Values are an int (that axis is static at that size), DynamicDim or BatchDim.
"""

from __future__ import annotations

from typing import Any

import torch

from honed import _core
from honed.backend.base import GraphInfo
from honed.errors import ConfigError

DynamicDim = _core.DynamicDim
BatchDim = _core.BatchDim


def overrides_for(
    spec: Any, signature: _core.Signature, names: dict[str, int] | None = None
) -> dict[tuple[int, int], Any] | None:
    """The engine's ``{(tensor_index, axis): int | DynamicDim | BatchDim}`` for ``spec``.

    ``names`` maps forward() argument names to tensor indices (see ``tensor_names``).
    """
    if spec is None:
        return None
    out: dict[tuple[int, int], Any] = {}
    if isinstance(spec, list | tuple):
        for leaf, axes in enumerate(spec):
            _add_axes(out, leaf, axes, signature)
        return out
    if not isinstance(spec, dict):
        raise ConfigError(
            f"dynamic_shapes must be a list or dict, got {type(spec).__name__}; see "
            "honed.shapes for the accepted forms"
        )
    names = names or {}
    for key, value in spec.items():
        if isinstance(key, tuple) and len(key) == 2:
            _add(out, int(key[0]), int(key[1]), value, signature)
        elif isinstance(key, int):
            _add_axes(out, key, value, signature)
        elif isinstance(key, str):
            if key not in names:
                raise ConfigError(
                    f"dynamic_shapes names argument {key!r}, but the recorded inputs have tensor "
                    f"arguments {sorted(names)}; use one of those names or tensor indices"
                )
            _add_axes(out, names[key], value, signature)
        else:
            raise ConfigError(f"dynamic_shapes key {key!r} is not an index, (index, axis) or name")
    return out


def _add_axes(
    out: dict[tuple[int, int], Any], leaf: int, axes: Any, signature: _core.Signature
) -> None:
    if axes is None:
        return
    if not isinstance(axes, dict):
        raise ConfigError(
            f"dynamic_shapes for tensor {leaf} must be a dict {{axis: DynamicDim | BatchDim | int}}"
            f", got {axes!r}"
        )
    for axis, value in axes.items():
        _add(out, leaf, int(axis), value, signature)


def _add(
    out: dict[tuple[int, int], Any], leaf: int, axis: int, value: Any, signature: _core.Signature
) -> None:
    if not 0 <= leaf < signature.num_tensors:
        raise ConfigError(
            f"dynamic_shapes refers to tensor input {leaf}, but the module receives "
            f"{signature.num_tensors} tensor input(s)"
        )
    if not isinstance(value, int | _core.DynamicDim | _core.BatchDim):
        raise ConfigError(
            f"dynamic_shapes value for tensor {leaf} axis {axis} must be an int, DynamicDim or "
            f"BatchDim, got {value!r}"
        )
    out[(leaf, axis)] = value


def tensor_names(
    sample_args: tuple[Any, ...], sample_kwargs: dict[str, Any], forward: Any
) -> dict[str, int]:
    """forward() argument name -> tensor index, for arguments that are single tensors."""
    import inspect

    import torch
    from torch.utils import _pytree as pytree

    try:
        params = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        params = []
    names: dict[str, int] = {}
    index = 0
    for i, value in enumerate(sample_args):
        if isinstance(value, torch.Tensor) and i < len(params):
            names[params[i]] = index
        index += sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(value))
    for key, value in sample_kwargs.items():
        if isinstance(value, torch.Tensor):
            names[key] = index
        index += sum(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(value))
    return names


def graph_info(profile: _core.GraphProfile, device: torch.device) -> GraphInfo:
    """What a backend gets to know about a graph, from the engine's profile."""

    def shapes(raw: list[list[int]]) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(int(d) for d in s) for s in raw)

    return GraphInfo(
        device=device,
        has_dynamic_axes=bool(profile.has_dynamic),
        min_shapes=shapes(profile.min_shapes()),
        opt_shapes=shapes(profile.opt_shapes()),
        max_shapes=shapes(profile.max_shapes()),
        axis_names=tuple(tuple(str(a.name) for a in axes) for axes in profile.axes),
        profile=profile,
    )
