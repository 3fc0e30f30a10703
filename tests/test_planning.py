"""tests/test_planning.py: the cheap-first plan: order by cost, same-build and precision rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

import honed
from honed.backend import Backend, GraphInfo, Sample
from honed.backend.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig
from honed.pipeline import planning, progress

from conftest import TinyMLP, batches


class Costly(Backend):
    build_cost = 3

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class Cheap(Backend):
    build_cost = 1

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class Middling(Backend):
    build_cost = 2

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class CheapHalf(Backend):
    """A capture in bf16 whose outputs are far off (as a model that bf16 breaks)."""

    build_cost = 1

    def precision(self) -> str:
        return "bf16"

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) + 1.0


class CompiledHalf(Backend):
    build_cost = 2
    builds: ClassVar[int] = 0

    def precision(self) -> str:
        return "bf16"

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        CompiledHalf.builds += 1
        return module


def _tune(backends: list[Backend]) -> tuple[honed.TuneReport, progress.Tracker]:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "m")
    tracker = progress.Tracker(show=False)
    with progress.tracking(tracker):
        report = honed.tune(model, batches(2, 4), strategy=honed.MaxThroughputStrategy(backends))
    return report, tracker


def test_candidates_run_cheapest_first() -> None:
    _, tracker = _tune([Costly(), Middling(), Cheap()])
    built = [e.candidate for e in tracker.events if e.phase == "build"]
    assert built == ["TorchEagerBackend", "Cheap", "Middling", "Costly"]


def test_inductor_default_and_static_are_one_build_on_a_static_graph() -> None:
    static = GraphInfo(device=torch.device("cpu"), has_dynamic_axes=False)
    dynamic = GraphInfo(device=torch.device("cpu"), has_dynamic_axes=True)
    default = TorchInductorBackend()
    specialized = TorchInductorBackend(TorchInductorBackendConfig(dynamic=False))
    items = planning.plan([default, specialized], static)
    assert [p.skip for p in items] == ["", "same build as TorchInductorBackend for this graph"]
    assert [p.skip for p in planning.plan([default, specialized], dynamic)] == ["", ""]


def test_a_same_build_candidate_is_reported_not_tried() -> None:
    report, tracker = _tune([Middling(), Middling()])
    rows = [(c.name, c.status, c.reason) for c in report.graphs[0].candidates]
    assert ("Middling", "not tried", "same build as Middling for this graph") in rows
    assert [c.status for c in report.graphs[0].candidates].count("ok") == 2  # eager, Middling
    assert ("m", "graph 0", "Middling", "not tried") in {
        (f.module, f.graph, f.candidate, f.status) for f in tracker.done
    }


def test_precision_rule_skips_compiling_a_precision_its_cheap_probe_failed() -> None:
    CompiledHalf.builds = 0
    report, _ = _tune([CompiledHalf(), CheapHalf()])
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["CheapHalf"].status == "rejected"
    assert rows["CompiledHalf"].status == "not tried"
    assert rows["CompiledHalf"].reason.startswith(
        "bf16: CheapHalf in the same precision was rejected (wrong outputs"
    ), rows["CompiledHalf"].reason
    assert CompiledHalf.builds == 0


def test_precision_rule_lets_the_compile_run_when_the_probe_passes() -> None:
    class CheapHalfFine(CheapHalf):
        def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Any:
            return module

    CompiledHalf.builds = 0
    report, _ = _tune([CompiledHalf(), CheapHalfFine()])
    assert {c.name: c.status for c in report.graphs[0].candidates}["CompiledHalf"] == "ok"
    assert CompiledHalf.builds == 1


@pytest.mark.parametrize(
    ("backend", "cost", "precision"),
    [
        (honed.backend.TorchEagerBackend(), 0, "fp32"),
        (honed.backend.CudaGraphsBackend(), 1, "fp32"),
        (TorchInductorBackend(), 2, "fp32"),
        (
            TorchInductorBackend(TorchInductorBackendConfig(mode="max-autotune-no-cudagraphs")),
            3,
            "fp32",
        ),
        (
            TorchInductorBackend(
                TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
            ),
            2,
            "bf16",
        ),
        (honed.backend.TorchInductorAotBackend(), 3, "fp32"),
    ],
)
def test_builtin_backends_declare_cost_and_precision(
    backend: Backend, cost: int, precision: str
) -> None:
    assert (backend.expected_build_cost(), backend.precision()) == (cost, precision)


# -- the AOT-covers-JIT rule (CPU, default candidates) -----------------------------------------
def _cpu_defaults() -> list[Backend]:
    from honed.backend._defaults import default_candidates

    return default_candidates(torch.device("cpu"), None)


def test_on_cpu_aot_covers_the_jit_inductor_variants_of_the_defaults() -> None:
    from honed.backend.torch_inductor_aot import TorchInductorAotBackend

    cpu = GraphInfo(torch.device("cpu"), True, ((2, 16),), ((8, 16),), ((4, 16),))
    items = planning.plan(_cpu_defaults(), cpu, defaults=True)
    names = [p.backend.name for p in items]
    aot = next(p for p in items if isinstance(p.backend, TorchInductorAotBackend))
    jit = [p for p in items if type(p.backend) is TorchInductorBackend]
    assert len(jit) == 2 and all(p.covered_by == [aot] for p in jit)
    assert all(names.index(p.backend.name) > names.index(aot.backend.name) for p in jit)
    assert all(planning.waits_for(p, items) == [aot] for p in jit)
    # AOTInductor passed: the JIT variants are not tried, with the rule's reason.
    why = planning.skip_reason(jit[0], [(aot, "ok", "")])
    assert why.startswith("on CPU TorchInductorAotBackend built and passed")
    # It failed or was rejected: they run.
    assert planning.skip_reason(jit[0], [(aot, "failed", "export failed")]) == ""
    assert planning.skip_reason(jit[0], [(aot, "rejected", "wrong outputs")]) == ""


def test_the_aot_rule_leaves_given_lists_and_gpus_alone() -> None:
    cpu = GraphInfo(torch.device("cpu"), True, ((2, 16),), ((8, 16),), ((4, 16),))
    given = planning.plan(_cpu_defaults(), cpu, defaults=False)
    assert all(not p.covered_by for p in given)
    from honed.backend._defaults import default_candidates

    cuda = GraphInfo(torch.device("cuda"), True, ((2, 16),), ((8, 16),), ((4, 16),))
    on_gpu = planning.plan(default_candidates(torch.device("cuda"), None), cuda, defaults=True)
    assert all(not p.covered_by for p in on_gpu)
    assert honed.MaxThroughputStrategy().uses_defaults
    assert not honed.MaxThroughputStrategy([TorchInductorBackend()]).uses_defaults


def _gpu_defaults_planned(
    graph: GraphInfo, fitted_to: GraphInfo | None
) -> tuple[list[Backend], list[planning.Planned], dict[str, planning.Planned]]:
    """honed's CUDA defaults (fitted to ``fitted_to``'s inputs), their plan for ``graph`` beside
    a calling program (captures_wait), and that plan by candidate name."""
    from honed.backend._defaults import default_candidates

    listed = default_candidates(torch.device("cuda"), fitted_to)
    items = planning.plan(listed, graph, captures_wait=True)
    return listed, items, {p.backend.name: p for p in items}


def test_beside_a_program_on_a_gpu_packages_cover_the_captures_of_eager() -> None:
    """With captures_wait (JIT beside a calling program on a GPU, no stand-ins), a capture of
    eager's kernels waits for the packages of at least its expected gain, runs after them, and
    is not tried where one passed; where none did, it is built."""
    cuda = GraphInfo(torch.device("cuda"), True, ((2, 16),), ((8, 16),), ((4, 16),))
    listed, items, by_name = _gpu_defaults_planned(cuda, None)
    fp32_capture = by_name["CudaGraphsBackend"]
    bf16_capture = by_name["CudaGraphsBackend(autocast_enabled=True, autocast_dtype=bfloat16)"]
    fp32_package = by_name["TorchInductorAotBackend(CUDA graphs)"]
    bf16_package = by_name["TorchInductorAotBackend(bf16 weights, CUDA graphs)"]
    # the fp32 capture's expected gain is below both packages'; the bf16 capture's equals the
    # bf16 package's only
    assert fp32_capture.covered_by == [fp32_package, bf16_package]
    assert bf16_capture.covered_by == [bf16_package]
    assert planning.waits_for(fp32_capture, items) == [fp32_package, bf16_package]
    names = [p.backend.name for p in items]
    assert names.index(fp32_capture.backend.name) > names.index(bf16_package.backend.name)
    assert names.index(bf16_capture.backend.name) > names.index(bf16_package.backend.name)
    # of the packages, the fp32 one waits for the one with bf16 weights (the next rule)
    assert fp32_package.covered_by == [bf16_package] and not bf16_package.covered_by
    assert all(
        not p.covered_by for p in items if not (p.backend.stands_in or p.backend.saves_payload)
    )

    why = planning.skip_reason(bf16_capture, [(bf16_package, "ok", "")])
    assert why.startswith("not built beside the calling program: TorchInductorAotBackend(bf16")
    assert "a capture of eager's kernels is not installed" in why
    # the package failed or was rejected: the capture is built
    assert planning.skip_reason(bf16_capture, [(bf16_package, "failed", "export failed")]) == ""
    assert planning.skip_reason(bf16_capture, [(bf16_package, "rejected", "outputs")]) == ""
    # the fp32 package passing leaves the bf16 capture, of a higher expected gain, to be built
    assert planning.skip_reason(bf16_capture, [(fp32_package, "ok", "")]) == ""

    # without captures_wait (an AOT tune, stand-ins on, a CPU): the captures wait for nothing
    plain = planning.plan(listed, cuda)
    assert all(not p.covered_by for p in plain)
    assert [p.backend.name for p in plain][:2] == [
        "CudaGraphsBackend",
        "CudaGraphsBackend(autocast_enabled=True, autocast_dtype=bfloat16)",
    ]


def test_beside_a_program_on_a_gpu_a_package_waits_for_those_of_a_higher_expected_gain() -> None:
    """With captures_wait, of the candidates that install from a package one waits for those
    with a strictly higher expected gain, runs after them, and is not tried where one passed;
    where none did (failed, rejected), it is built. Equal gains wait for neither; without the
    setting every package is built."""
    image = GraphInfo(torch.device("cuda"), False, ((8, 3, 32, 32),), ((8, 3, 32, 32),))
    listed, items, by_name = _gpu_defaults_planned(image, image)
    fp32 = by_name["TorchInductorAotBackend(CUDA graphs)"]
    bf16 = by_name["TorchInductorAotBackend(bf16 weights, CUDA graphs)"]
    bf16_cl = by_name["TorchInductorAotBackend(bf16 weights, channels_last, CUDA graphs)"]
    assert [p for p in items if p.backend.saves_payload and not p.backend.stands_in] == [
        bf16,
        bf16_cl,
        fp32,
    ]
    # the two layouts in bf16 are a choice to measure: equal gains, built side by side
    assert bf16.backend.expected_gain == bf16_cl.backend.expected_gain
    assert not bf16.covered_by and not bf16_cl.covered_by
    assert fp32.covered_by == [bf16, bf16_cl]
    assert planning.waits_for(fp32, items) == [bf16, bf16_cl]

    why = planning.skip_reason(fp32, [(bf16, "failed", "export failed"), (bf16_cl, "ok", "")])
    assert why.startswith(f"not built beside the calling program: {bf16_cl.backend.name} passed")
    assert "a package of a lower one is built only where none of those passes" in why
    assert planning.skip_reason(fp32, [(bf16, "failed", "x"), (bf16_cl, "rejected", "y")]) == ""

    # without captures_wait (an AOT tune, stand-ins on, a CPU): every package is built
    plain = planning.plan(listed, image)
    assert all(not p.covered_by for p in plain if p.backend.saves_payload)
