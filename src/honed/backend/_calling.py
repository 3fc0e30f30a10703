"""src/honed/backend/_calling.py: how payload backends are called: one engine guard, flat tensors.

Payload backends (AOTInductor, ONNX Runtime, TensorRT, Torch-TensorRT) compile a wrapper whose
``forward(*tensors)`` takes the tensor inputs in flatten order of ``(args, kwargs)`` (the order
the engine's profile uses); non-tensor inputs are fixed at their recorded values. So a payload
has the plainest signature there is, the one the C++ runtime calls too.

Compiled code does not check its inputs (a size outside its range reads out of bounds), so
every call is checked first by the engine's ``InputGuard`` against the profile the payload was
compiled for: the structure, constant values, dtypes, devices, ranks and every size, with one
reason when it does not fit. That profile is the tuned one, or the example's shapes when the
payload was compiled static. A call the dispatcher routed under that same profile was checked
already and skips the second check (``dispatch_target``).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from honed import _core
from honed.errors import InputError

CALLING_FILE = "calling.json"
_FORMAT = 2


@dataclasses.dataclass(frozen=True)
class Calling:
    """How a call's ``(args, kwargs)`` become a payload's flat tensor inputs, and what it takes."""

    num_leaves: int
    tensor_positions: tuple[int, ...]
    in_spec: str | None  # torch pytree treespec_dumps of (args, kwargs), when serializable
    guard: _core.GraphProfile  # the profile the payload was compiled for

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _FORMAT,
                "num_leaves": self.num_leaves,
                "tensor_positions": list(self.tensor_positions),
                "in_spec": self.in_spec,
                "guard": json.loads(self.guard.to_json()),
            },
            sort_keys=True,
        )

    def min_shapes(self) -> list[tuple[int, ...]]:
        """Per tensor input, the smallest size of each axis the payload takes."""
        return [tuple(int(d) for d in s) for s in self.guard.min_shapes()]

    def max_shapes(self) -> list[tuple[int, ...]]:
        """Per tensor input, the largest size of each axis the payload takes."""
        return [tuple(int(d) for d in s) for s in self.guard.max_shapes()]

    @classmethod
    def from_json(cls, text: str, stored: Any = None) -> Calling:
        """Read ``calling.json``; ``stored`` is the graph's stored profile, the guard of format-1
        files (their payloads were compiled for exactly that profile)."""
        data = json.loads(text)
        version = data.get("format")
        if version == 1 and stored is not None:
            guard = stored
        elif version == _FORMAT:
            guard = _core.GraphProfile.from_json(json.dumps(data["guard"]))
        else:
            raise InputError(
                f"{CALLING_FILE} has format {version!r}; this honed reads format {_FORMAT}: "
                "re-tune and save with this honed version"
            )
        return cls(
            int(data["num_leaves"]),
            tuple(int(i) for i in data["tensor_positions"]),
            data.get("in_spec"),
            guard,
        )


class GuardedPayload:
    """Base of a loaded payload, called like the module it was compiled from.

    ``__call__`` checks the call with the engine's guard, flattens it and hands the tensors to
    ``run``, which each backend implements.
    """

    what = "compiled payload"  # how error messages name it, e.g. "AOTInductor package"

    def __init__(self, calling: Calling, check_inputs: bool = True) -> None:
        from torch.utils._pytree import tree_structure, treespec_loads

        self.calling = calling
        self.check_inputs = check_inputs
        self.guard = _core.InputGuard(calling.guard)
        n = len(calling.tensor_positions)
        self._in_spec = treespec_loads(calling.in_spec) if calling.in_spec is not None else None
        # Plain: the module takes n positional tensors and nothing else (no flattening needed).
        self._plain = calling.num_leaves == n and self._in_spec == tree_structure(((0,) * n, {}))

    def run(self, tensors: list[Any]) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement run(tensors)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.check_inputs and not self.guard.fits(args, kwargs):
            raise InputError(
                f"{self.what} was compiled for other inputs: {self.guard.explain(args, kwargs)}; "
                "call it like the recorded samples, or tune with samples like these inputs"
            )
        return self.run(self.flatten(args, kwargs))

    def unchecked(self, *args: Any, **kwargs: Any) -> Any:
        """Run a call the dispatcher has checked against this payload's guard already."""
        return self.run(self.flatten(args, kwargs))

    def flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        """The call's tensors in the payload's input order."""
        positions = self.calling.tensor_positions
        if self._plain and not kwargs and len(args) == len(positions):
            return list(args)
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        if len(leaves) != self.calling.num_leaves or (
            self._in_spec is not None and spec != self._in_spec
        ):
            raise InputError(
                f"{self.what} called with inputs structured differently from the ones it was "
                f"compiled for (expected {self._in_spec or f'{self.calling.num_leaves} leaves'}, "
                f"got {spec}); call it like the recorded samples"
            )
        return [leaves[i] for i in positions]


def dispatch_target(fn: Callable[..., Any], profile: _core.GraphProfile) -> Callable[..., Any]:
    """What the dispatcher calls for a variant tuned under ``profile``: a payload guarded by that
    very profile runs without checking again, anything else as it is."""
    if isinstance(fn, GuardedPayload) and fn.check_inputs and fn.guard.profile == profile:
        return fn.unchecked
    return fn
