"""src/honed/cli/shape_flags.py: `honed tune --batch-sizes` and `--shapes`, trtexec-style.

``--batch-sizes 1,8,32`` is ``honed.tune(batch_sizes=[1, 8, 32])``: every sample is also run
resized to those batch sizes, so the tuned profile covers them.

``--shapes NAME:MIN/OPT/MAX[,NAME:MIN/OPT/MAX...]`` follows trtexec's ``--minShapes``,
``--optShapes`` and ``--maxShapes`` in one flag: each shape is dims joined by ``x``, e.g.
``--shapes x:1x3x224x224/8x3x224x224/32x3x224x224``. NAME is a forward() argument that is one
tensor, or a tensor input's index (0, 1, ...) in the bound call. It maps onto honed's
``dynamic_shapes`` of the module:

- an axis equal in MIN, OPT and MAX is static at that size;
- axis 0, when it varies, is the batch axis: ``BatchDim(min, max)``, and MIN, OPT and MAX batch
  sizes are added to ``batch_sizes`` so the tune records and measures them (every input whose
  axis 0 varies must give it the same range: one batch);
- any other axis that varies is ``DynamicDim("NAME.AXIS", min, max, opt)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from honed.errors import ConfigError

SHAPES_FORM = "NAME:MIN/OPT/MAX with dims joined by x, e.g. x:1x3x224x224/8x3x224x224/32x3x224x224"


def parse_batch_sizes(text: str) -> list[int]:
    """``"1,8,32"`` -> ``[1, 8, 32]`` (sorted, unique); anything else is a ConfigError."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        sizes = []
    if not sizes or sizes[0] < 1:
        raise ConfigError(f"--batch-sizes {text!r}: give positive whole numbers, e.g. 1,8,32")
    return sizes


@dataclasses.dataclass(frozen=True)
class ShapeRange:
    """One input's min/opt/max shapes, as given to --shapes."""

    name: str
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @property
    def key(self) -> str | int:
        """How dynamic_shapes names this input: its argument name, or its tensor index."""
        return int(self.name) if self.name.isdigit() else self.name


def _dims(text: str, spec: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--shapes {spec}: {text!r} is not a shape; give {SHAPES_FORM}") from None
    if any(d < 1 for d in dims):
        raise ConfigError(f"--shapes {spec}: dims must be positive; give {SHAPES_FORM}")
    return dims


def parse_shapes(texts: list[str]) -> list[ShapeRange]:
    """Each ``NAME:MIN/OPT/MAX`` of the --shapes flags (comma-separated or repeated)."""
    ranges: list[ShapeRange] = []
    for spec in (part.strip() for text in texts for part in text.split(",") if part.strip()):
        name, sep, body = spec.partition(":")
        shapes = body.split("/")
        if not sep or not name.strip() or len(shapes) != 3:
            raise ConfigError(f"--shapes {spec}: give {SHAPES_FORM}")
        low, opt, high = (_dims(s, spec) for s in shapes)
        if not len(low) == len(opt) == len(high):
            raise ConfigError(f"--shapes {spec}: MIN, OPT and MAX must have the same rank")
        if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
            raise ConfigError(f"--shapes {spec}: each axis needs MIN <= OPT <= MAX")
        if any(r.name == name.strip() for r in ranges):
            raise ConfigError(f"--shapes names {name.strip()!r} twice")
        ranges.append(ShapeRange(name.strip(), low, opt, high))
    return ranges


def to_dynamic_shapes(ranges: list[ShapeRange]) -> tuple[dict[str | int, Any], list[int]]:
    """``dynamic_shapes`` for honed.Module, and the batch sizes the tune must add."""
    from honed.shapes import BatchDim, DynamicDim

    spec: dict[str | int, Any] = {}
    batch: tuple[int, int, int] | None = None
    for r in ranges:
        axes: dict[int, Any] = {}
        for axis, (low, opt, high) in enumerate(zip(r.min, r.opt, r.max, strict=True)):
            if low == high:
                axes[axis] = low
            elif axis == 0:
                if batch is not None and batch != (low, opt, high):
                    raise ConfigError(
                        f"--shapes: axis 0 of {r.name} ranges {low}/{opt}/{high} but another "
                        f"input's ranges {batch[0]}/{batch[1]}/{batch[2]}; axis 0 is the batch "
                        "axis, shared by every input"
                    )
                batch = (low, opt, high)
                axes[axis] = BatchDim(low, high)
            else:
                axes[axis] = DynamicDim(f"{r.name}.{axis}", low, high, opt)
        spec[r.key] = axes
    return spec, sorted(set(batch)) if batch else []
