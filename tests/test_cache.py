"""tests/test_cache.py: the persistent tuning cache: reuse, invalidation, refresh, failures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import torch

import honed
from honed.backend import Backend, Sample

from conftest import TinyMLP, batches


class Counting(Backend):
    builds: ClassVar[int] = 0

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Counting.builds += 1
        return module


class CountingLoser(Counting):
    pass


class Broken(Backend):
    builds: ClassVar[int] = 0

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        Broken.builds += 1
        raise RuntimeError("no luck")


TIMINGS = {"TorchEagerBackend": [3.0], "Counting": [1.0], "CountingLoser": [2.0]}


def _tune(model: honed.Module, **kwargs: Any) -> honed.TuneReport:
    strategy = honed.MaxThroughputStrategy([Counting(), CountingLoser(), Broken()])
    with honed.config.patch(injected_latencies=TIMINGS):
        return honed.tune(model, batches(2, 4), strategy=strategy, **kwargs)


def _reset() -> None:
    Counting.builds = 0
    Broken.builds = 0


def test_second_tune_reuses_outcomes_and_builds_only_the_winner() -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    _reset()
    first = _tune(model)
    assert (Counting.builds, Broken.builds) == (2, 1)  # Counting + CountingLoser, Broken
    assert not any(c.cached for g in first.graphs for c in g.candidates)

    _reset()
    second = _tune(model)
    assert (Counting.builds, Broken.builds) == (1, 0)  # only the winner, to install it
    rows = {c.name: c for c in second.graphs[0].candidates}
    assert all(c.cached for c in rows.values())
    assert second.selected() == first.selected() == ["Counting"]
    assert rows["Broken"].status == "failed" and "no luck" in rows["Broken"].reason
    assert rows["CountingLoser"].median_ms == 2.0
    x = batches(3, seed=4)[0]
    torch.testing.assert_close(model(x), model.module(x))


def test_changed_weights_or_inputs_miss_the_cache() -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    _tune(model)
    with torch.no_grad():
        model.module.fc1.weight.add_(0.01)
    _reset()
    _tune(model)
    assert Counting.builds == 2  # weights changed: evaluated again
    _reset()
    strategy = honed.MaxThroughputStrategy([Counting(), CountingLoser(), Broken()])
    with honed.config.patch(injected_latencies=TIMINGS):
        honed.tune(model, batches(2, 4, seed=1), strategy=strategy)
    assert Counting.builds == 2  # other input values: evaluated again


def test_clear_cache_re_evaluates(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    _tune(model, cache_dir=tmp_path)
    assert any((tmp_path / "tune").rglob("*.json"))
    _reset()
    report = _tune(model, cache_dir=tmp_path, clear_cache=True)
    assert (Counting.builds, Broken.builds) == (2, 1)
    assert not any(c.cached for g in report.graphs for c in g.candidates)


def test_cache_can_be_turned_off() -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    with honed.config.patch(cache_enabled=False):
        _tune(model)
        _reset()
        _tune(model)
    assert Counting.builds == 2
