"""tests/test_backend_calling.py: the payload calling convention and its one guard (the engine's).

No compiling: a payload here is a GuardedPayload whose ``run`` records the flat tensors it got.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import honed
from honed import _core
from honed.backend import GraphInfo, Sample, TorchEagerBackend
from honed.backend._calling import Calling, GuardedPayload, dispatch_target
from honed.backend._export import plan
from honed.module import Variant
from honed.shapes import graph_info

from conftest import batches

CPU = torch.device("cpu")


class Recording(GuardedPayload):
    what = "test payload"

    def __init__(self, calling: Calling) -> None:
        super().__init__(calling)
        self.runs: list[list[Any]] = []
        self.checked = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.checked += 1
        return super().__call__(*args, **kwargs)

    def run(self, tensors: list[Any]) -> Any:
        self.runs.append(tensors)
        return tensors[0] * 2


def _kw_samples(*sizes: int) -> list[Sample]:
    return [Sample((x,), {"bias": torch.randn(len(x), 8), "scale": 0.5}) for x in batches(*sizes)]


def _profile(samples: list[Sample]) -> Any:
    return _core.infer_profile([_core.signature(s.args, s.kwargs) for s in samples])


def test_calls_are_checked_by_the_engine_then_flattened() -> None:
    samples = _kw_samples(2, 8)
    profile = _profile(samples)
    fn = Recording(plan(samples, graph_info(profile, CPU), None, "T").calling)
    assert fn.guard.profile == profile  # compiled for the tuned profile itself
    x, bias = torch.randn(5, 16), torch.randn(5, 8)
    fn(x, bias=bias, scale=0.5)
    assert len(fn.runs) == 1 and fn.runs[0][0] is x and fn.runs[0][1] is bias
    refused = {
        "outside the tuned range [2, 8]": (
            (torch.randn(9, 16),),
            {"bias": torch.randn(9, 8), "scale": 0.5},
        ),
        "compiled for == 0.5, got 2.0": ((x,), {"bias": bias, "scale": 2.0}),
        "tensor input 0 is float64 of rank 2 on cpu": ((x.double(),), {"bias": bias, "scale": 0.5}),
        "axes named 'batch' must be equal": ((x,), {"bias": torch.randn(4, 8), "scale": 0.5}),
        "structured differently": ((x, bias), {}),
    }
    for why, (args, kwargs) in refused.items():
        with pytest.raises(honed.InputError, match="test payload was compiled for other inputs"):
            fn(*args, **kwargs)
        assert why in fn.guard.explain(args, kwargs), (why, fn.guard.explain(args, kwargs))
    assert len(fn.runs) == 1  # nothing refused reached the payload


def test_a_static_build_on_a_dynamic_profile_is_guarded_at_its_shapes() -> None:
    samples = [Sample((x,), {}) for x in batches(2, 4, 8)]
    profile = _profile(samples)
    static = plan(samples, graph_info(profile, CPU), False, "T")
    assert static.calling.guard != profile
    assert static.calling.min_shapes() == static.calling.max_shapes() == [(8, 16)]
    fn = Recording(static.calling)
    fn(torch.randn(8, 16))
    with pytest.raises(
        honed.InputError, match="input 0 axis 0 is 4, the tuned graph fixes it at 8"
    ):
        fn(torch.randn(4, 16))
    # The dispatcher's profile is wider than this guard: dispatch keeps the check.
    assert dispatch_target(fn, profile) == fn


def test_the_dispatcher_skips_the_second_check_of_a_payload_it_routed() -> None:
    samples = [Sample((x,), {}) for x in batches(2, 8)]
    profile = _profile(samples)
    fn = Recording(plan(samples, graph_info(profile, CPU), None, "T").calling)
    assert dispatch_target(fn, profile) == fn.unchecked
    assert dispatch_target(len, profile) is len  # anything else runs as it is
    model = honed.Module(torch.nn.Linear(16, 4).eval(), "guarded")
    model.install([Variant(profile, TorchEagerBackend(), fn, {})])
    x = torch.randn(3, 16)
    assert torch.equal(model(x), x * 2)
    assert (fn.checked, len(fn.runs)) == (0, 1)
    assert torch.equal(fn(x), x * 2)  # called directly, it checks
    assert fn.checked == 1


def test_without_a_profile_the_guard_comes_from_the_samples() -> None:
    graph = GraphInfo(CPU, True, ((2, 16), (2, 8)), ((8, 16), (8, 8)), ((8, 16), (8, 8)))
    samples = [Sample((x,), {"bias": torch.randn(len(x), 8), "scale": 0.5}) for x in batches(2, 8)]
    calling = plan(samples, graph, None, "T").calling
    assert calling.min_shapes() == [(2, 16), (2, 8)] and calling.max_shapes() == [(8, 16), (8, 8)]
    fn = Recording(calling)
    fn(torch.randn(3, 16), bias=torch.randn(3, 8), scale=0.5)
    with pytest.raises(honed.InputError, match="must be equal"):
        fn(torch.randn(3, 16), bias=torch.randn(4, 8), scale=0.5)


def test_what_the_tuner_knows_of_a_graph_pickles_for_worker_processes() -> None:
    import pickle

    samples = [Sample((x,), {}) for x in batches(2, 8)]
    graph = graph_info(_profile(samples), CPU)
    back = pickle.loads(pickle.dumps(graph))
    assert back == graph and back.profile == graph.profile
    assert back.profile.max_shapes() == [[8, 16]]
