"""tests/test_inspect.py: honed.inspect: tree, parameters, calls, graphs, recommendations, data."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from torch import nn

import honed
from honed import inspecting
from honed.inspecting import InspectReport, human_count, inspect


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)  # 40 parameters
        self.act = nn.ReLU()
        self.scale = nn.Parameter(torch.ones(8))  # 8 own parameters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x)) * self.scale


class Net(nn.Module):
    """embed (16) -> block (48) -> head (18), with head called on a 2-D view of the input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.block = Block()
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.embed(x)).reshape(-1, 8))


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.once = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.once(self.shared(self.shared(x)))


# -- a fake clock: time passes only where a Work module says so ------------------------------------
NOW = [0.0]


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    NOW[0] = 0.0
    monkeypatch.setattr(inspecting, "clock", lambda: NOW[0])
    yield


class Work(nn.Module):
    """A Linear(8, 8) (72 parameters) that takes ``ms`` of fake time."""

    def __init__(self, ms: float) -> None:
        super().__init__()
        self.ms = ms
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        NOW[0] += self.ms / 1e3
        return self.lin(x)


class Router(nn.Module):
    """pre 2 ms, heavy 80 ms (two 40 ms halves), post 3 ms, 15 ms of its own: 100 ms a call.

    ``mode`` is a constant in the input signature: each value is a graph of the root only.
    """

    def __init__(self) -> None:
        super().__init__()
        self.pre = Work(2)
        self.heavy = nn.Sequential(Work(40), Work(40))
        self.post = Work(3)

    def forward(self, x: torch.Tensor, mode: int) -> torch.Tensor:
        NOW[0] += 0.015
        return self.post(self.heavy(self.pre(x)))


def _routed(modes: range) -> list[tuple[torch.Tensor, int]]:
    return [(torch.randn(2, 8), m) for m in modes]


def _hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


# -- the tree --------------------------------------------------------------------------------------
def test_tree_order_depth_and_parents() -> None:
    report = inspect(Net(), [torch.randn(2, 3)])
    rows = [(m.name, m.cls, m.depth, m.parent) for m in report.modules]
    assert rows == [
        ("", "Net", 0, None),
        ("embed", "Linear", 1, ""),
        ("block", "Block", 1, ""),
        ("block.lin", "Linear", 2, "block"),
        ("block.act", "ReLU", 2, "block"),
        ("head", "Linear", 1, ""),
    ]


def test_parameter_counts_own_and_total() -> None:
    report = inspect(Net(), [torch.randn(2, 3)])
    counts = {m.name: (m.own_parameters, m.parameters) for m in report.modules}
    assert counts == {
        "": (0, 16 + 48 + 18),
        "embed": (16, 16),
        "block": (8, 48),
        "block.lin": (40, 40),
        "block.act": (0, 0),
        "head": (18, 18),
    }


def test_call_counts_include_repeated_calls() -> None:
    report = inspect(Twice(), [torch.randn(1, 4), torch.randn(3, 4), torch.randn(2, 4)])
    assert {m.name: m.calls for m in report.modules} == {"": 3, "shared": 6, "once": 3}
    assert report.samples == 3


def test_graphs_counted_per_module() -> None:
    dataset = [torch.randn(2, 3), torch.randn(5, 3), torch.randn(2, 6, 3)]  # ranks 2, 2, 3
    report = inspect(Net(), dataset)
    graphs = {m.name: len(m.graphs) for m in report.modules}
    assert graphs == {"": 2, "embed": 2, "block": 2, "block.lin": 2, "block.act": 2, "head": 1}
    assert report.row("").graphs[0] != report.row("").graphs[1]


def test_max_depth_limits_rows() -> None:
    report = inspect(Net(), [torch.randn(2, 3)], max_depth=1)
    assert [m.name for m in report.modules] == ["", "embed", "block", "head"]
    assert report.row("block").parameters == 48  # totals still count the whole subtree
    assert [m.name for m in inspect(Net(), [torch.randn(2, 3)], max_depth=0).modules] == [""]
    with pytest.raises(honed.InputError, match="max_depth"):
        inspect(Net(), [torch.randn(2, 3)], max_depth=-1)


# -- timing and recommendations --------------------------------------------------------------------
@pytest.mark.usefixtures("fake_clock")
def test_recommends_the_heavy_child_when_the_root_sees_many_graphs() -> None:
    report = inspect(Router(), _routed(range(5)))
    shares = {m.name: m.share for m in report.modules}
    assert shares == pytest.approx(
        {
            "": 1.0,
            "pre": 0.02,
            "pre.lin": 0.0,
            "heavy": 0.8,
            "heavy.0": 0.4,
            "heavy.0.lin": 0.0,
            "heavy.1": 0.4,
            "heavy.1.lin": 0.0,
            "post": 0.03,
            "post.lin": 0.0,
        }
    )
    assert report.total_ms == pytest.approx(500.0)
    assert report.row("heavy").time_ms == pytest.approx(400.0)
    assert report.recommended() == ["heavy"]
    verdicts = {m.name: m.verdict for m in report.modules}
    assert verdicts == {
        "": "many graphs",
        "pre": "too small",
        "pre.lin": "too small",
        "heavy": "tune",
        "heavy.0": "covered",
        "heavy.0.lin": "covered",
        "heavy.1": "covered",
        "heavy.1.lin": "covered",
        "post": "too small",
        "post.lin": "too small",
    }
    assert report.row("").reason == "many graphs (5): shapes or types vary call to call"
    assert report.row("heavy.0").reason == "covered by its parent"
    assert report.row("pre").reason == "too small: 2.0 % of the time"


@pytest.mark.usefixtures("fake_clock")
def test_recommends_the_root_alone_when_it_qualifies() -> None:
    report = inspect(Router(), _routed(range(inspecting.MAX_GRAPHS)))
    assert report.recommended() == [""]
    assert report.row("").reason == "worth tuning: 100.0 % of the time, 4 graphs"
    assert {m.verdict for m in report.modules[1:]} == {"covered"}


@pytest.mark.usefixtures("fake_clock")
def test_min_parameters_rules_out_small_modules() -> None:
    # heavy has 2 x 72 parameters, the root 4 x 72: only the root is big enough.
    report = inspect(Router(), _routed(range(5)), min_parameters=145)
    assert report.recommended() == []
    assert report.row("heavy").reason == "too small: 144 parameters"
    assert report.row("").verdict == "many graphs"


def test_never_called_modules_are_not_recommended() -> None:
    model = Twice()
    model.spare = nn.Linear(4, 4)
    report = inspect(model, [torch.randn(2, 4)], min_parameters=100)  # the root is too small
    assert report.row("").reason == "too small: 60 parameters"
    spare = report.row("spare")
    assert (spare.calls, spare.verdict, spare.recommended) == (0, "never called", False)


# -- hooks and failures ----------------------------------------------------------------------------
def test_hooks_removed_after_success() -> None:
    model = Net()
    inspect(model, [torch.randn(2, 3)])
    assert _hooks(model) == 0


def test_failing_forward_names_the_module_and_removes_hooks() -> None:
    model = Net()
    message = r"sample 1 failed in module 'embed' \(Linear\): RuntimeError"
    with pytest.raises(honed.InputError, match=message):
        inspect(model, [torch.randn(2, 3), torch.randn(2, 5)])
    assert _hooks(model) == 0


def test_no_modules_in_a_function_is_an_input_error() -> None:
    with pytest.raises(honed.InputError, match=r"found no torch\.nn\.Module"):
        inspect(lambda x: x * 2, [torch.randn(2)])


def test_failure_outside_any_module_names_the_sample() -> None:
    model = Net()

    def pipeline(x: torch.Tensor) -> torch.Tensor:
        raise ValueError(f"no good: {model(x).shape[0]}")

    with pytest.raises(honed.InputError, match=r"sample 0 failed: ValueError: no good: 2\."):
        inspect(pipeline, [torch.randn(2, 3)])
    assert _hooks(model) == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without CUDA")
def test_cuda_device_without_cuda_is_an_input_error() -> None:
    with pytest.raises(honed.InputError, match="cannot use CUDA"):
        inspect(Net(), [torch.randn(2, 3)], device="cuda")


# -- what obj may be -------------------------------------------------------------------------------
def test_honed_module_is_inspected_through_to_its_inner_module() -> None:
    inner = Net()
    report = inspect(honed.Module(inner, "net"), [torch.randn(2, 3)])
    assert [m.name for m in report.modules] == [
        "",
        "embed",
        "block",
        "block.lin",
        "block.act",
        "head",
    ]
    assert report.row("").cls == "Net"
    assert report.row("block").calls == 1
    assert _hooks(inner) == 0


def test_nested_honed_module_rows_carry_the_inner_calls() -> None:
    model = Net()
    model.block = honed.Module(model.block, "block")  # type: ignore[assignment]
    report = inspect(model, [torch.randn(2, 3), torch.randn(4, 3)])
    wrapper, inner = report.row("block"), report.row("block.module")
    assert (wrapper.cls, inner.cls) == ("Module", "Block")
    assert wrapper.calls == inner.calls == 2
    assert wrapper.parameters == inner.parameters == 48


@pytest.mark.usefixtures("fake_clock")
def test_pipeline_function_with_two_modules() -> None:
    encoder, decoder = Work(30), Work(70)

    def pipeline(x: torch.Tensor) -> torch.Tensor:
        return decoder(encoder(x))

    report = inspect(pipeline, [torch.randn(2, 8), torch.randn(3, 8)])
    assert [(m.name, m.depth) for m in report.modules] == [
        ("encoder", 0),
        ("encoder.lin", 1),
        ("decoder", 0),
        ("decoder.lin", 1),
    ]
    assert report.total_ms == pytest.approx(200.0)
    assert report.row("encoder").share == pytest.approx(0.3)
    assert report.row("decoder").share == pytest.approx(0.7)
    assert report.recommended() == ["encoder", "decoder"]
    assert _hooks(encoder) == _hooks(decoder) == 0


class Pipeline:
    def __init__(self) -> None:
        self.net = Net()
        self.head = self.net.head  # inside net's tree: not a second root
        self.threshold = 0.5

    def run(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x) > self.threshold


def test_bound_method_of_a_pipeline_object() -> None:
    report = inspect(Pipeline().run, [torch.randn(2, 3)])
    assert [m.name for m in report.modules][:3] == ["net", "net.embed", "net.block"]
    assert report.row("net.head").calls == 1
    assert len(report.modules) == 6


# -- the report as data and as a table -------------------------------------------------------------
def test_json_round_trips() -> None:
    report = inspect(Net(), [torch.randn(2, 3)])
    data = json.loads(report.to_json())
    assert data == report.to_dict()
    assert [m["name"] for m in data["modules"]] == [m.name for m in report.modules]
    assert data["modules"][0]["parameters"] == 82
    assert InspectReport(**{**data, "modules": []}).samples == 1


def test_table_shows_tree_params_and_verdicts() -> None:
    report = inspect(Net(), [torch.randn(2, 3)])
    text = report.render()
    lines = {line.split("│")[1].rstrip(): line for line in text.splitlines() if "│" in line}
    assert " (root)" in lines
    assert "✔ worth tuning: 100.0 % of the time, 1 graph" in lines[" (root)"]
    assert "covered by its parent" in lines["     lin"]  # block.lin, indented twice
    assert "worth wrapping in honed.Module: the whole model (Net)" in text
    assert "''" not in text
    assert str(report) == text


def test_human_counts() -> None:
    assert [human_count(n) for n in (0, 950, 9_408, 11_689_512, 1_200_000_000)] == [
        "0",
        "950",
        "9.4K",
        "11.7M",
        "1.2B",
    ]


# -- CUDA: the clock is read only after the device has finished --------------------------------
def test_cpu_inputs_never_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(device: object = None) -> None:
        raise AssertionError("synchronized for CPU inputs")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    assert inspect(Net(), [torch.randn(2, 3)]).row("head").calls == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_inputs_synchronize_around_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    real, synced = torch.cuda.synchronize, []

    def counting(device: object = None) -> None:
        synced.append(device)
        real(device)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.cuda, "synchronize", counting)
    model = Net().cuda()
    report = inspect(model, [torch.randn(2, 3, device="cuda")] * 2, device="cuda")
    # 4 runs (a warm-up pass and a timed pass of 2 samples) x (the sample + 6 module calls) x
    # (before + after)
    assert len(synced) == 4 * 7 * 2
    assert report.device == "cuda:0"
    assert report.row("").share == 1.0
    assert 0.0 < report.row("block").share < 1.0
    assert _hooks(model) == 0


class ColdPerShape(nn.Module):
    """Like a kernel picked on the first call at each shape: 100 ms cold, 1 ms warm (fake time)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.seen: set[tuple[int, ...]] = set()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        NOW[0] += (1.0 if tuple(x.shape) in self.seen else 100.0) / 1e3
        self.seen.add(tuple(x.shape))
        return self.lin(x)


@pytest.mark.usefixtures("fake_clock")
def test_every_shape_is_warmed_up_before_timing() -> None:
    report = inspect(ColdPerShape(), [torch.randn(b, 8) for b in (1, 2, 4)])
    assert report.total_ms == pytest.approx(3.0)
    assert report.row("").calls == 3
