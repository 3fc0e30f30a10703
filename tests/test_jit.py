"""tests/test_jit.py: JIT mode: discovery, states, graph breaks, hierarchy, history, cache."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import honed
import honed.jit
import honed.pipeline.tuner
from honed.jit import State
from honed.jit.patcher import _ORIGINAL_CALL

from conftest import TinyMLP, batches, fast_measurement_env

pytestmark = pytest.mark.integration  # real Inductor compiles and scripts in new interpreters

ROOT = Path(__file__).resolve().parents[1]


class DynamicModule(nn.Module):
    """The seed's graph-break example: forward branches on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.child_a = nn.Linear(10, 20)
        self.child_b = nn.Linear(10, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.child_a(x)
        return self.child_b(x)


class DLPackModule(nn.Module):
    """The dlpack seed: a round trip through DLPack that Dynamo cannot trace."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        capsule = torch.utils.dlpack.to_dlpack(y)
        return torch.utils.dlpack.from_dlpack(capsule) * 2


@pytest.fixture(autouse=True)
def jit(tmp_path: Path) -> Iterator[honed.jit.JitConfig]:
    """JIT on with deterministic settings (Inductor only), a private cache, a clean slate.

    These tests check what JIT decides, so each call that starts a tune waits for it (the wait
    mode); tests/test_jit_background.py checks that by default nothing waits.
    """
    honed.jit.reset()
    honed.jit.config.reset()
    inductor = honed.OneBackendStrategy(honed.backend.TorchInductorBackend())
    with honed.jit.config.patch(
        strategy=inductor, min_parameters=100, cache_dir=str(tmp_path / "jit-cache"), wait=True
    ):
        honed.jit.enable_jit_tuning()
        try:
            yield honed.jit.config
        finally:
            honed.jit.reset()


def node_states() -> list[tuple[str, int, str]]:
    out = []
    for root in honed.jit.roots():
        for node in [root, *root.descendants()]:
            out.append((node.name, node.level, node.state.name))
    return out


def run(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in inputs]


def eager(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad(), honed.jit.paused():
        return [model(x) for x in inputs]


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


# -- config ------------------------------------------------------------------------------------
def test_config_defaults_come_from_honed_config() -> None:
    with honed.config.patch(jit_min_samples=5, jit_skip_modules=["LayerNorm"], jit_dry_run=True):
        fresh = honed.jit.JitConfig()
    assert (fresh.min_samples, fresh.skip_modules, fresh.dry_run) == (5, ["LayerNorm"], True)
    assert honed.jit.JitConfig().min_samples == 2
    assert honed.jit.JitConfig().detect_graph_breaks is True
    with pytest.raises(AttributeError, match="no field"):
        with honed.jit.config.patch(min_sample=3):
            pass


def test_jit_default_candidates_leave_out_inductors_cuda_graph_trees_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """JIT installs on its own thread beside the program's CUDA work: its defaults leave out
    Inductor's modes that record CUDA-graph trees there; honed's own captures (CUDA graphs
    over eager, AOTInductor's) stay, the first as stand-ins that compile nothing. Named
    explicitly, the others are still tried."""
    from honed.backend.base import Availability
    from honed.backend.cuda_graphs import CudaGraphsBackend
    from honed.jit.strategy import records_graph_trees

    # listed as on a machine with CUDA (the list leaves out what cannot run here)
    monkeypatch.setattr(CudaGraphsBackend, "available", classmethod(lambda cls: Availability(True)))
    cuda = torch.device("cuda")
    listed = honed.jit.JitConfig().tune_strategy().backends(cuda)
    names = [b.name for b in listed]
    every = honed.MaxThroughputStrategy().backends(cuda)
    assert any(records_graph_trees(b) for b in every)
    assert sorted(names) == sorted(b.name for b in every if not records_graph_trees(b))
    assert not [n for n in names if "reduce-overhead" in n]
    assert "TorchInductorAotBackend(bf16 weights, CUDA graphs)" in names
    # likeliest winner first: the plan keeps that order among candidates of one build cost,
    # so the bf16 capture stands in before the fp32 one is built, and the bf16 package is the
    # first worker's
    stand_ins = [b.name for b in listed if b.stands_in]
    assert stand_ins == [
        "CudaGraphsBackend(autocast_enabled=True, autocast_dtype=bfloat16)",
        "CudaGraphsBackend",
    ]
    from honed.backend.base import GraphInfo
    from honed.pipeline.planning import plan

    planned = [p.backend.name for p in plan(listed, GraphInfo(cuda), defaults=True)]
    assert planned == [
        "CudaGraphsBackend(autocast_enabled=True, autocast_dtype=bfloat16)",
        "CudaGraphsBackend",
        "TorchInductorBackend",
        "TorchInductorAotBackend(bf16 weights, CUDA graphs)",
        "TorchInductorAotBackend(CUDA graphs)",
    ]
    assert all(isinstance(b, CudaGraphsBackend) for b in listed if b.stands_in)
    cpu = torch.device("cpu")
    assert [b.name for b in honed.jit.JitConfig().tune_strategy().backends(cpu)] == [
        b.name for b in honed.MaxThroughputStrategy().backends(cpu)
    ]
    named = honed.jit.JitConfig(backends=[CudaGraphsBackend()]).tune_strategy()
    assert [type(b) for b in named.backends(cuda)] == [CudaGraphsBackend]


def test_the_tunes_view_of_the_program_offers_stand_ins_as_configured() -> None:
    """honed.jit.config.stand_in (off by default) and promote reach the tune's view of the
    program (honed.jit.live.ProgramCalls), which GraphTuner._promote asks."""
    from honed.jit.hierarchy import Node
    from honed.jit.tuner import _program_calls

    model = TinyMLP().eval()
    node = Node(model, None)
    dataset = [((batches(1, 4)[0],), {})]
    # (this file's tunes wait and the tests turn the live choice off; the figures must outlive
    # the run: the cache on)
    with (
        honed.config.patch(cache_enabled=True),
        honed.jit.config.patch(live_choice=True, wait=False),
    ):
        calls = _program_calls(node, dataset)
        assert (calls.stand_ins, calls.promotes) == (False, False)
        with honed.jit.config.patch(stand_in=True):
            calls = _program_calls(node, dataset)
        assert (calls.stand_ins, calls.promotes) == (True, False)
        with honed.jit.config.patch(stand_in=False, promote=True):
            calls = _program_calls(node, dataset)
        assert (calls.stand_ins, calls.promotes) == (False, True)
        with honed.jit.config.patch(live_choice=False):
            assert _program_calls(node, dataset) is None  # no view: nothing is offered


def test_config_from_environment_variables() -> None:
    env = dict(
        os.environ,
        HONED_JIT_MIN_SAMPLES="4",
        HONED_JIT_SKIP_MODULES="BatchNorm2d, LayerNorm",
        HONED_JIT_DETECT_GRAPH_BREAKS="0",
        HONED_JIT_MAX_DEPTH_LEVEL="1",
        HONED_JIT_MIN_PARAMETERS="7",
        HONED_JIT_BATCH_AXIS_REQUIRED="1",
        HONED_JIT_DRY_RUN="yes",
        HONED_JIT_DEVICE="cpu",
        HONED_JIT_CACHE_DIR="/tmp/x",
        HONED_JIT_BACKENDS="TorchInductorBackend",
        HONED_JIT_RETUNE_ON_NEW_SHAPES="0",
        HONED_JIT_WAIT="1",
        HONED_JIT_TIME_BUDGET_S="30",
        HONED_JIT_BATCH_HEADROOM="4",
        HONED_JIT_STAND_IN="1",
        HONED_JIT_STAND_IN_EARLY="1",
    )
    code = (
        "import json, honed.jit as j; c = j.config; print(json.dumps([c.min_samples, "
        "c.skip_modules, c.detect_graph_breaks, c.max_depth_level, c.min_parameters, "
        "c.batch_axis_required, c.dry_run, c.device, c.cache_dir, "
        "[type(b).__name__ for b in c.backends], c.retune_on_new_shapes, c.wait, "
        "c.time_budget_s, c.batch_headroom, c.stand_in, c.stand_in_early]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        4,
        ["BatchNorm2d", "LayerNorm"],
        False,
        1,
        7,
        True,
        True,
        "cpu",
        "/tmp/x",
        ["TorchInductorBackend"],
        False,
        True,
        30.0,
        4,
        True,
        True,
    ]
    fresh = honed.jit.JitConfig()
    assert fresh.retune_on_new_shapes is True and fresh.wait is False
    assert fresh.stand_in is False and fresh.stand_in_early is False
    assert fresh.time_budget_s == 0.0 and fresh.batch_headroom == 2


def test_pth_hook_waits_for_torch() -> None:
    """HONED_JIT=1 imports neither honed nor torch at start-up (Inductor's helper processes
    never import torch); JIT is on as soon as the program imports torch."""
    code = (
        "import sys; before = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('honed', 'torch')); import torch, honed.jit.patcher as p; "
        "print(before, torch.nn.Module.__call__ is p._patched_call, p.STATE.enabled)"
    )
    env = dict(os.environ, HONED_JIT="1")
    if os.environ.get("HONED_TEST_JIT_LAUNCHER", "pth") != "pth":
        pytest.skip("no .pth hook installed in this environment")
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["[]", "True", "True"], out.stderr[-2000:]


# -- the top module is tuned whole ---------------------------------------------------------------
def test_top_module_tuned_children_detached() -> None:
    torch.manual_seed(0)
    model = TinyMLP().eval()
    inputs = batches(2, 4, 4, 3)
    got = run(model, inputs)
    assert_close(got, eager(model, inputs))
    assert node_states() == [
        ("TinyMLP", 0, "TUNED"),
        ("Linear", 1, "DETACHED"),
        ("Linear", 1, "DETACHED"),
    ]
    root = honed.jit.roots()[0]
    assert root.call_count == 4 and root.backend == "TorchInductorBackend"
    # after tuning the children no longer run: the compiled variant does their work
    assert [c.call_count for c in root.children] == [2, 2]
    steps = honed.jit.history()
    assert steps[0] == "New top module: TinyMLP 📊676 level=0🪜 state=init⏳ call_count=1"
    assert "New child module: Linear 📊544 level=1🪜 state=init⏳ call_count=1" in steps
    assert any(
        re.fullmatch(r"No graph breaks in TinyMLP 📊676\. Checking took \d+\.\d\ds", s)
        for s in steps
    )
    assert any(re.fullmatch(r"Tuning TinyMLP 📊676 took \d+\.\d\ds", s) for s in steps)
    assert "Unpatching child module: Linear 📊544 level=1🪜 state=detached☑️ call_count=2" in steps
    text = honed.jit.hierarchy().splitlines()
    assert text == [
        "JIT Tuning Hierarchy:",
        "├─ TinyMLP 📊676 level=0🪜 state=tuned🎯 (TorchInductorBackend) call_count=4",
        "   ├─ Linear 📊544 level=1🪜 state=detached☑️ call_count=2",
        "   ├─ Linear 📊132 level=1🪜 state=detached☑️ call_count=2",
    ]


def test_shapes_outside_the_tuned_profile_run_eager(jit: honed.jit.JitConfig) -> None:
    jit.retune_on_new_shapes = False  # on by default (tests/test_jit_background.py)
    torch.manual_seed(0)
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    assert honed.jit.roots()[0].state is State.TUNED
    odd = [torch.randn(64, 16), torch.randn(3, 5, 16)] * 2
    assert_close(run(model, odd), eager(model, odd))
    root = honed.jit.roots()[0]
    assert root.state is State.TUNED and root.retunes == 0
    outside = [s for s in honed.jit.history() if s.startswith("Inputs outside")]
    assert len(outside) == 2 and all(s.endswith("; running them eager") for s in outside)
    assert not any(s.startswith("Re-tuning") for s in honed.jit.history())


def test_retune_on_new_shapes(jit: honed.jit.JitConfig) -> None:
    jit.retune_on_new_shapes = True
    torch.manual_seed(0)
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    root = honed.jit.roots()[0]
    first = root.tuned
    odd = [torch.randn(3, 5, 16), torch.randn(2, 7, 16)]  # a new signature (rank 3)
    assert_close(run(model, odd[:1]), eager(model, odd[:1]))  # 1 < min_samples: eager
    assert root.retunes == 0 and root.tuned is first
    assert_close(run(model, odd[1:]), eager(model, odd[1:]))  # the 2nd: re-tune, then eager
    assert root.state is State.TUNED and root.retunes == 1 and root.tuned is not first
    for x in [*batches(2, 4), *odd]:  # old and new shapes now run tuned variants
        assert root.tuned.dispatch((x,), {}) is not honed.module.MISS
    assert_close(run(model, odd), eager(model, odd))
    steps = honed.jit.history()
    assert any(s.endswith("re-tuning after min_samples such calls") for s in steps)
    assert (
        "Re-tuning TinyMLP 📊676 (re-tune 1 of at most 3) for 2 new sample(s) and 2 tuned "
        "before" in steps
    )
    assert sum(s.startswith("Tuning TinyMLP 📊676 took") for s in steps) == 2
    line = honed.jit.hierarchy().splitlines()[1]
    assert "state=tuned🎯 (TorchInductorBackend) retunes=1 call_count=" in line


class PreferInductor(honed.TuneStrategy):
    """Inductor when it is correct, whatever the timings say (on a loaded machine the evidence
    rule may keep eager): what is installed from where is what these tests check."""

    def select(self, candidates: list[honed._core.CandidateResult]) -> honed._core.Decision:
        for c in candidates:  # fresh copies of the results, for this choice only
            c.ok = c.ok and c.backend == "TorchInductorBackend"  # eager too: no timing compared
        return honed._core.select_first_wins(candidates, 1.0)


def test_a_restart_installs_the_cached_winner_then_tries_the_rest(
    jit: honed.jit.JitConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that decided among some candidates (here: a shorter list; in practice a time budget
    that ran out) is replayed from the cache first, and only then are the others tried."""
    inductor = honed.backend.TorchInductorBackend()
    onnx = honed.backend.ONNXRuntimeBackend()
    torch.manual_seed(0)
    model = TinyMLP().eval()
    with jit.patch(strategy=PreferInductor([inductor])):
        run(model, batches(2, 4))
    assert [r.status for r in honed.jit.tunes()] == ["installed"]

    honed.jit.reset()  # the restart: a new JIT state over the same cache
    honed.jit.enable_jit_tuning()
    with jit.patch(strategy=PreferInductor([inductor, onnx])):
        outs = run(model, batches(2, 4))
    assert_close(outs, eager(model, batches(2, 4)))
    cached, tuned = honed.jit.tunes()
    assert (cached.reason, cached.status, cached.evidence) == (
        "cached decision",
        "installed",
        "cache",
    )
    assert cached.selected == "TorchInductorBackend"
    assert cached.tried["TorchInductorBackend"] == "ok (cached)"
    assert cached.tried["ONNXRuntimeBackend"] == "not tried"
    assert tuned.reason == "first tune" and tuned.ran_meanwhile == "the previous variant"
    assert tuned.tried["TorchInductorBackend"] == "ok (cached)"
    assert tuned.tried["ONNXRuntimeBackend"] in ("ok", "failed", "rejected")
    assert any(
        s.startswith("Installed TorchInductorBackend for TinyMLP 📊676 from the cached decision")
        and s.endswith("tuning goes on with 1 candidate(s) not tried before: ONNXRuntimeBackend")
        for s in honed.jit.history()
    )

    honed.jit.reset()  # a third run: every outcome is cached, the plain replay, no extra pass
    honed.jit.enable_jit_tuning()
    starts: list[bool] = []
    start = honed.pipeline.tuner.Tuner.start

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        starts.append(self.cached_only)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(honed.pipeline.tuner.Tuner, "start", counted)
    with jit.patch(strategy=PreferInductor([inductor, onnx])):
        outs = run(model, batches(2, 4))
    assert_close(outs, eager(model, batches(2, 4)))
    (replay,) = honed.jit.tunes()
    assert (replay.reason, replay.status, replay.evidence) == ("first tune", "installed", "cache")
    assert replay.selected == "TorchInductorBackend"
    assert replay.tried == {
        "TorchEagerBackend": "ok (cached)",
        "TorchInductorBackend": "ok (cached)",
        "ONNXRuntimeBackend": replay.tried["ONNXRuntimeBackend"],
    }
    assert replay.tried["ONNXRuntimeBackend"].endswith("(cached)")
    # The cached pass was the tune: the samples recorded and the cache keyed once.
    assert starts == [True]
    assert not [s for s in honed.jit.history() if "from the cached decision" in s]


def test_a_first_run_starts_no_cached_pass_and_a_restart_does(
    jit: honed.jit.JitConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module no earlier run checked for graph breaks has nothing in the cache: its first tune
    goes straight to the candidates, without a cached pass recording the samples beside the
    program's calls first. A restart (the check's answer cached) looks in the cache first."""
    from honed.jit import tuner as jit_tuner

    passes: list[str] = []
    real = jit_tuner._cached_pass

    def counted(node: Any, *args: Any, **kwargs: Any) -> bool:
        passes.append(node.short())
        return bool(real(node, *args, **kwargs))

    monkeypatch.setattr(jit_tuner, "_cached_pass", counted)
    assert jit.detect_graph_breaks
    torch.manual_seed(0)
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    assert [r.status for r in honed.jit.tunes()] == ["installed"]
    assert passes == []

    honed.jit.reset()  # the restart: the same weights, the same cache
    honed.jit.enable_jit_tuning()
    run(model, batches(2, 4))
    assert passes == ["TinyMLP 📊676"]
    assert honed.jit.roots()[0].state is State.TUNED


def test_graph_break_check_is_cached(jit: honed.jit.JitConfig) -> None:
    jit.dry_run = True  # stops right after the check: no compile needed here
    for attempt in range(2):
        honed.jit.reset()
        honed.jit.enable_jit_tuning()
        torch.manual_seed(0)  # the same weights: the same module fingerprint
        run(DynamicModule().eval(), [torch.rand(2, 10)] * 2)
        steps = [s for s in honed.jit.history() if "graph break(s) in DynamicModule" in s]
        assert len(steps) == 1
        how = "Checking took" if attempt == 0 else "Reusing the cached check took"
        assert how in steps[0] and "trying its children" in steps[0]


def test_a_first_tune_hashes_the_weights_once(
    jit: honed.jit.JitConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graph-break check's cache key and the tune's share one hash of the weights: each
    hash reads every weight beside the program's calls."""
    from honed.pipeline import cache

    model = TinyMLP().eval()
    weight = next(model.parameters())
    hashed: list[int] = []
    real = cache.Digest.tensor

    def tensor(self: cache.Digest, t: torch.Tensor) -> None:
        hashed.append(t.data_ptr())
        real(self, t)

    monkeypatch.setattr(cache.Digest, "tensor", tensor)
    run(model, batches(2, 4))
    assert honed.jit.roots()[0].state is State.TUNED
    assert hashed.count(weight.data_ptr()) == 1


def test_min_samples_waits_before_tuning(jit: honed.jit.JitConfig) -> None:
    jit.min_samples = 3
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    assert honed.jit.roots()[0].state is State.RECORDING
    run(model, batches(8))
    assert honed.jit.roots()[0].state is State.TUNED


def test_batch_axis_required_waits_for_two_batch_sizes(jit: honed.jit.JitConfig) -> None:
    jit.batch_axis_required = True
    model = TinyMLP().eval()
    run(model, batches(4, 4, 4))
    assert honed.jit.roots()[0].state is State.RECORDING
    run(model, batches(2))
    assert honed.jit.roots()[0].state is State.TUNED


# -- the seed's failure cases ------------------------------------------------------------------
def test_dynamic_module_ends_eager_with_children_tuned() -> None:
    torch.manual_seed(0)
    model = DynamicModule().eval()
    pos = [torch.rand(2, 10) + 0.1, torch.rand(4, 10) + 0.1, torch.rand(3, 10) + 0.1]
    neg = [-p for p in pos]
    inputs = [pos[0], neg[0], pos[1], neg[1], pos[2], neg[2]]
    assert_close(run(model, inputs), eager(model, inputs))
    assert node_states() == [
        ("DynamicModule", 0, "EAGER"),
        ("Linear", 1, "TUNED"),
        ("Linear", 1, "TUNED"),
    ]
    steps = honed.jit.history()
    assert any(s.startswith("1 graph break(s) in DynamicModule 📊440:") for s in steps)
    assert sum(s.startswith("Tuning Linear 📊220 took") for s in steps) == 2
    line = "   ├─ Linear 📊220 level=1🪜 state=tuned🎯 (TorchInductorBackend) call_count=3"
    assert honed.jit.hierarchy().splitlines()[2] == line


def test_dlpack_round_trip_is_a_graph_break_not_compiled_whole() -> None:
    torch.manual_seed(0)
    model = DLPackModule().eval()
    inputs = batches(2, 4, 4, 2)
    assert_close(run(model, inputs), eager(model, inputs))
    root = honed.jit.roots()[0]
    assert root.state is State.EAGER and root.reason == "graph breaks"
    assert root.tuned is None  # never compiled (with fullgraph or otherwise)
    assert [c.state for c in root.children] == [State.TUNED]
    steps = " | ".join(honed.jit.history())
    assert "graph break(s) in DLPackModule" in steps and "dlpack" in steps.lower()


def test_max_depth_level_zero_leaves_children_alone(jit: honed.jit.JitConfig) -> None:
    jit.max_depth_level = 0
    model = DynamicModule().eval()
    inputs = [torch.rand(2, 10), -torch.rand(2, 10)] * 3
    assert_close(run(model, inputs), eager(model, inputs))
    assert node_states() == [
        ("DynamicModule", 0, "EAGER"),
        ("Linear", 1, "SKIPPED"),
        ("Linear", 1, "SKIPPED"),
    ]
    assert all(not c.samples for c in honed.jit.roots()[0].children)


# -- skipping, dry run ---------------------------------------------------------------------------
def test_skip_modules_skips_the_module_and_tries_its_children(jit: honed.jit.JitConfig) -> None:
    jit.skip_modules = ["TinyMLP"]
    model = TinyMLP().eval()
    inputs = batches(2, 4, 2, 4)
    assert_close(run(model, inputs), eager(model, inputs))
    assert node_states() == [
        ("TinyMLP", 0, "SKIPPED"),
        ("Linear", 1, "TUNED"),
        ("Linear", 1, "TUNED"),
    ]
    assert "Skipping TinyMLP 📊676: listed in skip_modules" in honed.jit.history()


def test_beside_the_program_a_child_records_calls_only_once_it_can_be_tried(
    jit: honed.jit.JitConfig,
) -> None:
    """Beside the program, a child is not recorded before its parent is decided (cloning every
    module's inputs made a program's first calls slow); once the parent is skipped, the child's
    next ``min_samples`` calls are its samples, and then it is tried on them."""
    jit.wait = False
    jit.min_samples = 3
    model = TinyMLP().eval()
    first, second, third, fourth, fifth = batches(2, 4, 3, 5, 6)
    run(model, [first, second])
    root = honed.jit.roots()[0]
    fc1, fc2 = root.children
    assert (len(root.samples), fc1.samples, fc2.samples) == (2, [], [])
    jit.skip_modules = ["TinyMLP"]  # decided at its third call, without tuning
    run(model, [third])
    assert node_states() == [
        ("TinyMLP", 0, "SKIPPED"),
        ("Linear", 1, "RECORDING"),
        ("Linear", 1, "RECORDING"),
    ]
    assert (root.samples, fc1.samples, fc2.samples) == ([], [], [])
    run(model, [fourth, fifth])
    assert [args[0].shape[0] for args, _ in fc1.samples] == [5, 6]
    assert [args[0].shape[0] for args, _ in fc2.samples] == [5, 6]
    assert fc1.state is State.RECORDING and not fc1.tried
    run(model, batches(7))  # their third recorded call: tried, and tuned on batches 5 to 7
    assert honed.jit.wait(timeout_s=300)
    assert node_states() == [
        ("TinyMLP", 0, "SKIPPED"),
        ("Linear", 1, "TUNED"),
        ("Linear", 1, "TUNED"),
    ]
    assert_close(run(model, batches(6)), eager(model, batches(6)))


def test_in_wait_mode_a_module_that_ends_eager_has_its_children_tuned_in_the_same_wait() -> None:
    """The program waits anyway: children record their first calls from the start, so after
    ``min_samples`` (2) calls the root's graph break and its child's tune are both done."""
    torch.manual_seed(0)
    model = DLPackModule().eval()
    inputs = batches(2, 4)
    assert_close(run(model, inputs), eager(model, inputs))
    root = honed.jit.roots()[0]
    assert root.state is State.EAGER and root.reason == "graph breaks"
    assert [c.state for c in root.children] == [State.TUNED]
    assert [args[0].shape[0] for args, _ in root.children[0].tuned_samples] == [2, 4]


def test_min_parameters_skips_small_modules(jit: honed.jit.JitConfig) -> None:
    jit.min_parameters = 600  # TinyMLP has 676, its Linears 544 and 132
    model = DynamicModule().eval()  # 440 parameters: too small, and so are its children
    run(model, [torch.rand(2, 10)] * 3)
    assert node_states() == [("DynamicModule", 0, "SKIPPED"), ("Linear", 1, "SKIPPED")]
    honed.jit.reset()
    honed.jit.enable_jit_tuning()
    run(TinyMLP().eval(), batches(2, 4))
    assert node_states()[0] == ("TinyMLP", 0, "TUNED")


def test_dry_run_logs_without_tuning(jit: honed.jit.JitConfig) -> None:
    jit.dry_run = True
    model = TinyMLP().eval()
    inputs = batches(2, 4, 8)
    assert_close(run(model, inputs), eager(model, inputs))
    root = honed.jit.roots()[0]
    assert root.state is State.RECORDING and root.tuned is None and root.reason == "dry run"
    steps = honed.jit.history()
    assert (
        "Dry run: would tune TinyMLP 📊676 level=0🪜 state=recording🔴 call_count=2 on 2 sample(s)"
        in steps
    )
    assert not any(s.startswith("Tuning ") for s in steps)


# -- activation ------------------------------------------------------------------------------
def test_disable_restores_torch_call() -> None:
    assert torch.nn.Module.__call__ is not _ORIGINAL_CALL
    import honed.jit.disable

    assert torch.nn.Module.__call__ is _ORIGINAL_CALL
    run(TinyMLP().eval(), batches(2, 4, 8))
    assert honed.jit.roots() == []


def test_patch_for_jit_tuning_tunes_only_what_the_function_built() -> None:
    honed.jit.disable_jit_tuning()

    @honed.jit.patch_for_jit_tuning
    def build() -> nn.Module:
        return TinyMLP().eval()

    tuned, plain = build(), TinyMLP().eval()
    assert not honed.jit.patcher.STATE.enabled
    run(plain, batches(2, 4, 8))
    run(tuned, batches(2, 4, 8))
    assert node_states()[0] == ("TinyMLP", 0, "TUNED")
    assert len(honed.jit.roots()) == 1 and honed.jit.roots()[0].module is tuned


def test_autograd_calls_run_eager() -> None:
    model = TinyMLP().eval()
    run(model, batches(2, 4))
    x = batches(4)[0]
    out = model(x)  # grad enabled: the tuned variant (built without autograd) is not used
    assert out.requires_grad
    with honed.jit.paused():
        torch.testing.assert_close(out, model(x))
    assert any("runs eager while autograd is on" in s for s in honed.jit.history())


# -- a plain script, twice, with the tuning cache ------------------------------------------------
SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

        def forward(self, x):
            return self.body(x).softmax(-1)

    torch.manual_seed(0)
    model = Net().eval()
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(b, 32, generator=g) for b in (2, 4, 4, 2, 3)]
    with torch.no_grad():
        outputs = [model(x) for x in inputs]
    torch.save({"inputs": inputs, "outputs": outputs, "state": model.state_dict()}, sys.argv[1])
    """
)


def run_script(tmp_path: Path, cache: Path, tag: str) -> tuple[str, dict[str, object]]:
    script = tmp_path / "plain_script.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"{tag}.pt"
    env = dict(
        os.environ,
        HONED_JIT="1",
        HONED_JIT_REPORT="1",
        HONED_CACHE_DIR=str(cache),
        HONED_ISOLATION="none",
        HONED_JIT_BACKENDS="TorchInductorBackend",
        HONED_JIT_WAIT="1",  # the script's five calls end before a tune beside them would
        **fast_measurement_env(),
        # Every measurement counts as stable: this is about reuse, and an unstable measurement
        # is never reused (tests/test_figures.py), which a loaded test machine would make likely.
        HONED_STABILITY_TOLERANCE="1e9",
    )
    launcher = os.environ.get("HONED_TEST_JIT_LAUNCHER", "pth")
    cmd = [sys.executable, str(script), str(out)]
    if launcher != "pth":  # no .pth hook installed: the same thing, started by hand
        cmd = [
            sys.executable,
            "-c",
            "import honed.jit; honed.jit._autoload(); import runpy, sys; "
            "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
            str(script),
            str(out),
        ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr, torch.load(out)


def tuning_seconds(report: str, name: str) -> float:
    found = re.search(rf"Tuning {name} 📊\S+ took (\d+\.\d+)s", report)
    assert found, report[-3000:]
    return float(found.group(1))


def test_plain_script_is_tuned_and_the_second_run_reuses_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    first, saved = run_script(tmp_path, cache, "first")
    second, _ = run_script(tmp_path, cache, "second")
    assert "JIT Tuning Hierarchy:" in first
    assert re.search(
        r"├─ Net 📊2\.6K level=0🪜 state=tuned🎯 \(Torch\w+Backend\) call_count=5", first
    )
    assert re.search(r"├─ Sequential 📊2\.6K level=1🪜 state=detached☑️ call_count=2", first)
    assert "Reused" not in first and "from cache" not in first
    assert re.search(r"No graph breaks in Net \S+\. Checking took", first)
    # the second run takes the graph-break check and every candidate's outcome from the cache:
    # nothing is traced or measured; what remains is building the winner in the new process
    assert re.search(r"No graph breaks in Net \S+\. Reusing the cached check took", second)
    reused = re.search(
        r"Decision for Net \S+ reused from the cache in (\d+\.\d+)s \((\d+) of \2 candidates "
        r"cached, none measured\); rebuilding the winner took (\d+\.\d+)s",
        second,
    )
    assert reused, second[-3000:]
    assert re.search(r"state=tuned🎯 \(Torch\w+Backend, from cache\) call_count=5", second)
    for report in (first, second):
        tuning_seconds(report, "Net")  # each run reports how long its tuning took
    # outputs equal eager
    net = {}
    exec(compile(SCRIPT.split("torch.manual_seed(0)")[0], "plain", "exec"), net)
    model = net["Net"]().eval()
    model.load_state_dict(saved["state"])
    with torch.no_grad():
        for x, y in zip(saved["inputs"], saved["outputs"], strict=True):
            torch.testing.assert_close(y, _ORIGINAL_CALL(model, x), rtol=1e-4, atol=1e-5)


def test_a_tune_record_names_the_selected_candidate_with_its_config() -> None:
    """The history says which candidate won (bf16 weights, CUDA graphs...), not only its class."""
    from types import SimpleNamespace

    from honed.jit.tuner import _backends

    aot = honed.backend.TorchInductorAotBackend(
        honed.backend.TorchInductorAotBackendConfig(precision="bf16", cuda_graphs=True)
    )
    wrapper = SimpleNamespace(variants=[SimpleNamespace(backend=aot)])
    assert _backends(wrapper) == "TorchInductorAotBackend(bf16 weights, CUDA graphs)"
