"""tests/test_shape_flags.py: `honed tune --batch-sizes / --shapes` onto batch_sizes and
dynamic_shapes."""

from __future__ import annotations

import pytest

import honed
from honed.cli.shape_flags import parse_batch_sizes, parse_shapes, to_dynamic_shapes
from honed.errors import ConfigError


def test_batch_sizes() -> None:
    assert parse_batch_sizes("32,1,8,8") == [1, 8, 32]
    for bad in ("", "0,8", "a,b", "-1"):
        with pytest.raises(ConfigError, match="--batch-sizes"):
            parse_batch_sizes(bad)


def test_min_opt_max_map_onto_batch_dim_dynamic_dim_and_static_axes() -> None:
    ranges = parse_shapes(["x:1x128x64/8x256x64/32x512x64", "mask:1x128/8x256/32x512"])
    spec, batch = to_dynamic_shapes(ranges)
    assert batch == [1, 8, 32]
    x = spec["x"]
    assert isinstance(x[0], honed.BatchDim) and (x[0].min, x[0].max) == (1, 32)
    assert isinstance(x[1], honed.DynamicDim)
    assert (x[1].name, x[1].min, x[1].opt, x[1].max) == ("x.1", 128, 256, 512)
    assert x[2] == 64
    assert isinstance(spec["mask"][0], honed.BatchDim)


def test_index_names_and_repeated_flags() -> None:
    spec, batch = to_dynamic_shapes(parse_shapes(["0:4x8/4x8/4x8", "1:2x3/2x3/2x3"]))
    assert spec == {0: {0: 4, 1: 8}, 1: {0: 2, 1: 3}} and batch == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("x:1x8/4x8", "MIN/OPT/MAX"),
        ("1x8/4x8/8x8", "MIN/OPT/MAX"),
        ("x:1x8/4/8x8", "same rank"),
        ("x:8x8/4x8/16x8", "MIN <= OPT <= MAX"),
        ("x:0x8/4x8/8x8", "positive"),
        ("x:ax8/4x8/8x8", "is not a shape"),
        ("x:1x8/2x8/4x8,x:1x8/2x8/4x8", "twice"),
    ],
)
def test_bad_shapes_name_the_form(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        parse_shapes([text])


def test_inputs_must_share_the_batch_range() -> None:
    with pytest.raises(ConfigError, match="axis 0 is the batch axis"):
        to_dynamic_shapes(parse_shapes(["x:1x8/2x8/4x8,y:1x8/2x8/8x8"]))
