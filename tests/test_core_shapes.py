"""tests/test_core_shapes.py: the shapes and dispatch bindings of honed._core, on torch tensors."""

import collections

import pytest
import torch

from honed import _core

_core.set_tensor_type(torch.Tensor)


def sig(*args, **kwargs):
    return _core.signature(args, kwargs)


def test_signature_of_nested_inputs():
    x = torch.zeros(2, 3)
    y = torch.ones(4, dtype=torch.int64)
    s = sig(x, {"a": [None, 3], "b": y}, scale=1.5, mode="fast")
    assert s.structure == "((*,{'a':[*,*],'b':*}),{'scale':*,'mode':*})"
    assert s.num_tensors == 2
    assert s.tensor_shapes == [[2, 3], [4]]
    assert s.tensor_dtypes == ["float32", "int64"]
    assert s.tensor_devices == ["cpu", "cpu"]
    assert s.graph_key == (
        "((*,{'a':[*,*],'b':*}),{'scale':*,'mode':*})"
        "|float32,cpu,2|=None|=3|int64,cpu,1|=1.5|='fast'"
    )
    assert repr(s) == (
        "Signature(((*,{'a':[*,*],'b':*}),{'scale':*,'mode':*}): "
        "float32[2, 3] cpu, =None, =3, int64[4] cpu, =1.5, ='fast')"
    )


def test_signature_keeps_dict_order_and_odd_values():
    x = torch.zeros(1)
    assert sig({"b": x, "a": x}).structure != sig({"a": x, "b": x}).structure
    assert sig((x,), [x]).structure == "(((*),[*]),{})"
    assert sig(object()).graph_key.endswith("|=<object>")
    assert sig(2**80).graph_key.endswith("|=" + repr(2**80))
    point = collections.namedtuple("Point", "x y")
    assert sig(point(x, x)).structure == "((Point(*,*)),{})"
    param = torch.nn.Parameter(torch.zeros(3))  # a tensor subclass is still a tensor
    assert sig(param).tensor_shapes == [[3]]


def test_dtype_and_device_strings_match_torch():
    for dtype in (torch.float16, torch.bfloat16, torch.bool, torch.complex64):
        x = torch.zeros(2, dtype=dtype)
        assert sig(x).tensor_dtypes == [str(dtype).removeprefix("torch.")]
    assert sig(torch.zeros(1)).tensor_devices == [str(torch.zeros(1).device)]
    assert sig(torch.zeros(1, device="meta")).tensor_devices == ["meta"]
    if torch.cuda.is_available():
        x = torch.zeros(1, device="cuda")
        assert sig(x).tensor_devices == [str(x.device)]


def test_graph_key_equal_across_batch_sizes_different_across_dtype():
    a = sig(torch.zeros(8, 3))
    assert a.graph_key == sig(torch.zeros(1, 3)).graph_key
    assert a.graph_key != sig(torch.zeros(8, 3, dtype=torch.float16)).graph_key
    assert a.graph_key != sig(torch.zeros(8, 3, 1)).graph_key
    assert a.graph_key != sig(torch.zeros(8, 3), flag=True).graph_key
    assert (
        sig(torch.zeros(8, 3), flag=True).graph_key != sig(torch.zeros(8, 3), flag=False).graph_key
    )


def test_infer_profile_batch_and_shared_sequence():
    samples = [
        sig(torch.zeros(b, s, dtype=torch.int64), mask=torch.ones(b, s))
        for b, s in [(1, 10), (4, 20), (4, 30)]
    ]
    p = _core.infer_profile(samples)
    assert [[a.kind for a in axes] for axes in p.axes] == [["batch", "dynamic"]] * 2
    assert p.axes[0][1].name == p.axes[1][1].name == "dim0"
    assert (p.min_batch, p.opt_batch, p.max_batch) == (1, 4, 4)
    assert p.batch_axes == [0, 0]
    assert p.min_shapes() == [[1, 10], [1, 10]]
    assert p.opt_shapes() == [[4, 30], [4, 30]]
    assert p.max_shapes() == [[4, 30], [4, 30]]
    assert p.has_dynamic


def test_infer_profile_overrides_from_python():
    one = [sig(torch.zeros(4, 16), torch.zeros(4, 16, 8))]
    assert not _core.infer_profile(one).has_dynamic
    p = _core.infer_profile(
        one,
        {
            (0, 0): _core.BatchDim(max=32),
            (0, 1): _core.DynamicDim("seq", 1, 128),
            (1, 1): _core.DynamicDim("seq", 1, 128, opt=64),
            (1, 2): 8,
        },
    )
    seq = p.axes[0][1]
    assert (seq.kind, seq.name, seq.min, seq.opt, seq.max) == ("dynamic", "seq", 1, 64, 128)
    assert p.axes[1][1] == seq
    assert (p.min_batch, p.opt_batch, p.max_batch) == (1, 4, 32)
    assert p.axes[1][2].kind == "static"
    assert p.max_shapes() == [[32, 128], [4, 128, 8]]
    assert _core.DynamicDim("s", 1, 2) == _core.DynamicDim("s", 1, 2, None)
    assert repr(_core.BatchDim()) == "BatchDim(min=1, max=None)"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({(0, 1): _core.DynamicDim("seq", 64, 8)}, "input 0 axis 1 has min 64 and max 8"),
        ({(0, 5): 3}, "input 0 axis 5, but input 0 has rank 2"),
        (
            {(0, 1): _core.DynamicDim("s", 1, 64), (1, 1): _core.DynamicDim("s", 1, 32)},
            "declares the same name",
        ),
        ({(0, 1): "dynamic"}, "use an int (fixed size), DynamicDim(name, min, max) or BatchDim()"),
        ({0: 3}, "must be a tuple (tensor input index, axis)"),
    ],
)
def test_bad_overrides_raise_value_error(overrides, message):
    one = [sig(torch.zeros(4, 16), torch.zeros(4, 16, 8))]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _core.infer_profile(one, overrides)


def test_infer_profile_rejects_empty_and_mixed_samples():
    with pytest.raises(ValueError, match="at least one sample"):
        _core.infer_profile([])
    with pytest.raises(ValueError, match="sample 1 belongs to graph"):
        _core.infer_profile([sig(torch.zeros(2)), sig(torch.zeros(2, dtype=torch.float64))])


def test_check_reason_and_json_round_trip():
    p = _core.infer_profile([sig(torch.zeros(b, 3)) for b in (1, 16, 8)])
    assert p.check(sig(torch.zeros(5, 3))) == (True, "")
    assert p.check(sig(torch.zeros(64, 3))) == (
        False,
        "input 0 axis 0 (batch) is 64, outside the tuned range [1, 16]",
    )
    ok, reason = p.check(sig(torch.zeros(5, 3, dtype=torch.float16)))
    assert not ok and "is not the tuned graph" in reason
    q = _core.GraphProfile.from_json(p.to_json())
    assert q == p and q.graph_key == p.graph_key
    with pytest.raises(ValueError, match="bad shape profile JSON"):
        _core.GraphProfile.from_json("{}")


def test_batch_indices():
    assert _core.batch_indices(8, 3) == [0, 1, 2]
    assert _core.batch_indices(3, 7) == [0, 1, 2, 0, 1, 2, 0]
    with pytest.raises(ValueError):
        _core.batch_indices(0, 2)


def test_dispatcher_lookup_and_explain():
    small = _core.infer_profile([sig(torch.zeros(b, 3)) for b in (1, 8)])
    large = _core.infer_profile([sig(torch.zeros(16, 3))], {(0, 0): _core.BatchDim(min=9, max=64)})
    d = _core.Dispatcher()
    d.add(small, 0)
    d.add(large, 1)
    assert len(d) == 2
    assert d.lookup((torch.zeros(4, 3),), {}) == 0
    assert d.lookup((torch.zeros(32, 3),), {}) == 1
    assert d.explain((torch.zeros(32, 3),), {}) == ""
    assert d.lookup((torch.zeros(100, 3),), {}) == -2
    reason = d.explain((torch.zeros(100, 3),), {})
    assert "variant 0: input 0 axis 0 (batch) is 100, outside the tuned range [1, 8]" in reason
    assert "variant 1: input 0 axis 0 (batch) is 100, outside the tuned range [9, 64]" in reason
    assert d.lookup((torch.zeros(4, 3, dtype=torch.float64),), {}) == -1
    assert d.explain((torch.zeros(4, 3, dtype=torch.float64),), {}).startswith(
        "no tuned graph has the input signature ((*),{})|float64,cpu,2"
    )
    assert d.lookup((torch.zeros(4, 3),), {"flag": True}) == -1
    with pytest.raises(ValueError):
        d.add(small, -1)
    d.clear()
    assert len(d) == 0
    assert d.lookup((torch.zeros(4, 3),), {}) == -1


def test_dispatcher_constant_flag_selects_graph():
    d = _core.Dispatcher()
    d.add(_core.infer_profile([sig(torch.zeros(2, 3), flag=True)]), 3)
    d.add(_core.infer_profile([sig(torch.zeros(2, 3), flag=False)]), 4)
    assert d.lookup((torch.zeros(2, 3),), {"flag": True}) == 3
    assert d.lookup((torch.zeros(2, 3),), {"flag": False}) == 4
