"""tests/test_cache.py: the persistent tuning cache: reuse, invalidation, refresh, failures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
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


class NaNs(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) * float("nan")


def _records(root: Path) -> list[Path]:
    return sorted((root / "tune").rglob("*.json"))


def test_a_malformed_cache_record_is_a_warning_and_a_re_evaluation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    _tune(model, cache_dir=tmp_path)
    for record in _records(tmp_path):
        record.write_text("{}")  # valid JSON of the wrong shape
    _reset()
    with caplog.at_level("WARNING", logger="honed"):
        report = _tune(model, cache_dir=tmp_path)
    assert "malformed tuning-cache entry" in caplog.text
    assert (Counting.builds, Broken.builds) == (2, 1)  # evaluated again
    assert report.selected() == ["Counting"]
    assert not any(c.cached for c in report.graphs[0].candidates)


def test_a_cached_winner_edited_to_ok_is_checked_before_it_is_installed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    timings = {"TorchEagerBackend": [3.0], "NaNs": [0.5]}
    strategy = honed.MaxThroughputStrategy([NaNs()])
    with honed.config.patch(injected_latencies=timings):
        first = honed.tune(model, batches(2, 4), strategy=strategy, cache_dir=tmp_path)
    assert {c.name: c.status for c in first.graphs[0].candidates}["NaNs"] == "rejected"
    records = {p: json.loads(p.read_text()) for p in _records(tmp_path)}
    eager = next(r for r in records.values() if r["status"] == "ok")
    fast = dict(eager["measurement"], samples_ms=[0.01] * 9, wall_ms=0.09)
    for path, record in records.items():  # mark the NaN candidate "ok" and fast, as an attacker
        if record["status"] == "rejected":
            path.write_text(json.dumps(dict(eager, measurement=fast)))
    with caplog.at_level("WARNING", logger="honed"), honed.config.patch(injected_latencies=timings):
        second = honed.tune(model, batches(2, 4), strategy=strategy, cache_dir=tmp_path)
    rows = {c.name: c for c in second.graphs[0].candidates}
    assert rows["NaNs"].status == "rejected", rows["NaNs"]
    assert "checked in this process before installing" in rows["NaNs"].reason
    assert second.selected() == ["TorchEagerBackend"]
    x = batches(3, seed=2)[0]
    assert not torch.isnan(model(x)).any()
    torch.testing.assert_close(model(x), model.module(x))


def test_a_class_source_is_its_whole_file_read_without_parsing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Finding a class in its file takes a parse (one C call holding the GIL beside a JIT
    program): the class's source is its file's text, which holds the class."""
    import ast
    import inspect

    from honed.pipeline import cache

    def no_parse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the file was parsed")

    monkeypatch.setattr(ast, "parse", no_parse)
    monkeypatch.setattr(cache, "_SOURCES", {})  # read afresh, whatever other tests read
    text = cache.source_text(Counting)
    assert text == Path(__file__).read_text()
    assert "class Counting" in text
    assert cache.source_text(Counting) is text  # read once
    monkeypatch.undo()
    assert inspect.getsource(Counting) in text
    assert cache.source_text(len) == ""


def _decorated(fn: Any) -> Any:
    return fn


@_decorated
def _forward_a(x: Any) -> Any:
    def inner(y: Any) -> Any:
        return y + 1

    return inner(x)


def _forward_b(x: Any) -> Any:
    return x + 2


def test_a_functions_source_is_its_lines_read_without_tokenizing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import inspect

    from honed.pipeline import cache

    lines, _ = inspect.getsourcelines(_forward_a)  # decorator to the nested function's end
    monkeypatch.setattr(cache, "_SOURCES", {})

    real = inspect.getsource

    def no_tokenizing(obj: Any) -> str:
        if inspect.isfunction(obj) or inspect.ismethod(obj):
            raise AssertionError("a function's source is read from its code's lines")
        return real(obj)

    monkeypatch.setattr(inspect, "getsource", no_tokenizing)
    assert cache.source_text(_forward_a) == "".join(lines)
    assert cache.source_text(_forward_a).startswith("@_decorated")
    assert cache.source_text(_forward_b) == "def _forward_b(x: Any) -> Any:\n    return x + 2\n"
    # what a module's forward is: a bound method reads as its function
    model = torch.nn.Linear(2, 2)
    assert cache.source_text(type(model).forward) == cache.source_text(model.forward)
    assert "def forward" in cache.source_text(model.forward)
    # a function with no file (built in C, or typed at a prompt) has none
    namespace: dict[str, Any] = {}
    exec("def typed(x):\n    return x\n", namespace)
    assert cache.source_text(namespace["typed"]) == "" and cache.source_text(len) == ""


def _hashlib_digest(items: list[Any]) -> str:
    """What Digest must equal: hashlib over each bytes item, and each tensor's header and bytes."""
    import hashlib

    h = hashlib.sha256()
    for item in items:
        if isinstance(item, torch.Tensor):
            h.update(f"{tuple(item.shape)}:{item.dtype}:".encode())
            h.update(item.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(item)
    return h.hexdigest()


def _digest(items: list[Any]) -> str:
    from honed.pipeline import cache

    h = cache.Digest()
    for item in items:
        if isinstance(item, torch.Tensor):
            h.tensor(item)
        else:
            h.update(item)
    return h.hexdigest()


def _hash_cases() -> list[Any]:
    from honed.pipeline import cache

    g = torch.Generator().manual_seed(0)
    return [
        b"name",
        # more than both staging halves, so that they are reused
        torch.randn(3 * cache._STAGING_BYTES // 4 + 5, generator=g),
        torch.randn(64, 48, generator=g).t(),  # not contiguous
        torch.randn(1000, generator=g).to(torch.bfloat16),
        torch.arange(7),
        torch.zeros(0, 3),  # no bytes: its header only
        torch.randn(5, generator=g, requires_grad=True),
        torch.arange(40)[10:30],  # a view at an offset into its storage
        b"",
        b"last",
    ]


def test_the_digest_of_tensors_is_sha256_of_their_headers_and_bytes() -> None:
    items = _hash_cases()
    assert _digest(items) == _hashlib_digest(items)
    # one byte changed anywhere changes it
    changed = [t.clone() if isinstance(t, torch.Tensor) else t for t in items]
    changed[4][3] += 1
    assert _digest(changed) != _digest(items)
    assert _digest([torch.zeros(2, 3)]) != _digest([torch.zeros(3, 2)])  # the shape counts
    assert _digest([torch.zeros(4)]) != _digest([torch.zeros(4, dtype=torch.int32)])


def test_the_digest_is_the_same_hashed_in_small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    from honed.pipeline import cache

    items = _hash_cases()
    monkeypatch.setattr(cache, "_GROUP_BYTES", 1000)  # regions split across many engine calls
    assert _digest(items) == _hashlib_digest(items)
    groups = list(cache._groups([b"a", (0, 2500, False), b"b", (5000, 10, False)], 1000))
    sizes = [sum(p[1] for p in g if not isinstance(p, bytes)) for g in groups]
    assert sizes == [1000, 1000, 510]
    assert groups[0][0] == b"a" and groups[2] == [(2000, 500, False), b"b", (5000, 10, False)]


def test_the_engine_hash_matches_hashlib_and_refuses_misuse() -> None:
    import hashlib

    from honed import _core

    h = _core.Sha256()
    h.update([b"ab", b"c"])
    assert h.hexdigest() == hashlib.sha256(b"abc").hexdigest()
    with pytest.raises(Exception, match="after hexdigest"):
        h.update([b"d"])
    data = torch.arange(100, dtype=torch.uint8)
    h = _core.Sha256()
    h.update([(data.data_ptr(), 60, False), b"x", (data.data_ptr() + 60, 40, False)])
    assert (
        h.hexdigest() == hashlib.sha256(bytes(range(60)) + b"x" + bytes(range(60, 100))).hexdigest()
    )
    with pytest.raises(ValueError, match="staging"):
        _core.Sha256().update([(data.data_ptr(), 4, True)])  # GPU bytes need a staging buffer


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_gpu_tensor_hashes_as_its_cpu_copy_does_across_pieces() -> None:
    from honed.pipeline import cache

    items = _hash_cases()
    on_gpu = [t.cuda() if isinstance(t, torch.Tensor) else t for t in items]
    assert _digest(on_gpu) == _hashlib_digest(items)
    # the CPU and the GPU interleaved: each device's run of tensors hashed in turn
    mixed = [t.cuda() if isinstance(t, torch.Tensor) and i % 2 else t for i, t in enumerate(items)]
    assert _digest(mixed) == _hashlib_digest(items)
    # the bytes as the caller's stream left them: written there just before the hashing
    late = torch.zeros(1 << 20, device="cuda")
    late.add_(3)
    assert _digest([late]) == _hashlib_digest([torch.full((1 << 20,), 3.0)])
    model = TinyMLP()
    assert cache.model_fingerprint(model.cuda()) == cache.model_fingerprint(model.cpu())


def test_the_weights_fingerprint_gives_way_between_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside a JIT program the fingerprint's Python, tensor by tensor, waits for the program's
    call to end (courtesy.give_way) between tensors, not only between modules."""
    from honed.pipeline import cache

    model = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(3)))
    before = cache.model_fingerprint(model)
    asked = []
    monkeypatch.setattr(cache, "give_way", lambda: asked.append(1) or 0.0)
    assert cache.model_fingerprint(model) == before
    modules, tensors = len(list(model.modules())), len(model.state_dict())
    assert len(asked) >= modules + tensors
