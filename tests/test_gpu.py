"""tests/test_gpu.py: the CUDA path (run on the device by `make gpu-test`; skipped on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import honed
from honed import _core

from conftest import TinyMLP

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _data(*sizes: int) -> list[torch.Tensor]:
    return [torch.randn(b, 16, device="cuda") for b in sizes]


def test_cuda_event_timer_is_available_and_measures() -> None:
    ok, reason = _core.cuda_timer_available()
    assert ok, reason
    x = torch.randn(1024, 1024, device="cuda")
    timer = _core.CudaEventTimer(int(torch.cuda.current_stream().cuda_stream))
    cfg = _core.MeasureConfig()
    cfg.warmup_ms, cfg.window_ms, cfg.max_windows = 5.0, 5.0, 4
    m = _core.measure(lambda: x @ x, timer, cfg)
    assert 0 < m.median_ms <= m.p99_ms
    assert m.calls >= cfg.window_calls


def test_tune_on_cuda_with_inductor_and_round_trip(tmp_path: Path) -> None:
    model = honed.Module(TinyMLP().cuda().eval(), "tiny-cuda")
    strategy = honed.MaxThroughputStrategy(
        [
            honed.backend.TorchInductorBackend(),
            honed.backend.TorchInductorBackend(
                honed.backend.TorchInductorBackendConfig(mode="max-autotune-no-cudagraphs")
            ),
        ]
    )
    report = honed.tune(model, _data(2, 8), strategy=strategy, device="cuda")
    assert report.environment["gpu"] == torch.cuda.get_device_name()
    rows = [c for g in report.graphs for c in g.candidates]
    assert all(c.status == "ok" for c in rows), [(c.name, c.reason) for c in rows]
    x = torch.randn(5, 16, device="cuda")
    torch.testing.assert_close(model(x), model.module(x))
    honed.save(model, tmp_path / "cuda.honed")
    fresh = honed.Module(TinyMLP().cuda().eval(), "tiny-cuda")
    honed.load(fresh, tmp_path / "cuda.honed")
    torch.testing.assert_close(fresh(x), model(x))


def test_asking_for_cuda_on_a_cpu_model_is_an_input_error() -> None:
    model = honed.Module(TinyMLP().eval(), "cpu-model")
    with pytest.raises(honed.InputError, match="move the model"):
        honed.tune(model, [torch.randn(2, 16)], device="cuda")


def test_cudagraph_variant_outputs_survive_the_next_call() -> None:
    model = honed.Module(TinyMLP().cuda().eval(), "tiny-graphs")
    backend = honed.backend.TorchInductorBackend(
        honed.backend.TorchInductorBackendConfig(mode="reduce-overhead")
    )
    honed.tune(model, _data(4, 4), strategy=honed.OneBackendStrategy(backend), device="cuda")
    assert model.report.selected() == ["TorchInductorBackend(mode=reduce-overhead)"]
    x1, x2 = torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")
    out1 = model(x1)
    out2 = model(x2)  # a replay: must not overwrite out1
    torch.testing.assert_close(out1, model.module(x1))
    torch.testing.assert_close(out2, model.module(x2))


def test_batch_sweep_on_cuda_finds_a_knee() -> None:
    model = honed.Module(TinyMLP().cuda().eval(), "tiny-sweep")
    report = honed.tune(
        model,
        _data(2, 4),
        batch_sweep=True,
        max_batch=4096,
        device="cuda",
        strategy=honed.OneBackendStrategy(honed.backend.TorchEagerBackend()),
    )
    sweep = report.graphs[0].sweep
    assert sweep.startswith("knee at batch "), sweep
    knee = int(sweep.split()[3])
    x = torch.randn(knee, 16, device="cuda")
    torch.testing.assert_close(model(x), model.module(x))


class _DeviceAssert(honed.backend.Backend):
    """Trips a device-side assert: in-process this would poison the CUDA context for good."""

    def build(self, module: torch.nn.Module, example_inputs: list) -> object:
        def run(x: torch.Tensor) -> torch.Tensor:
            index = torch.tensor([10**9], device=x.device)
            return x[index] + module(x)

        return run


class _Good(honed.backend.Backend):
    def build(self, module: torch.nn.Module, example_inputs: list) -> object:
        return module


def test_isolated_cuda_crash_fails_only_that_candidate() -> None:
    model = honed.Module(TinyMLP().cuda().eval(), "tiny-crash")
    strategy = honed.MaxThroughputStrategy([_DeviceAssert(), _Good()])
    with honed.config.patch(isolation="process"):
        report = honed.tune(model, _data(2, 4), strategy=strategy, device="cuda")
    rows = {c.name: c for c in report.graphs[0].candidates}
    assert rows["_DeviceAssert"].status == "failed"
    assert (
        "assert" in rows["_DeviceAssert"].reason.lower() or "CUDA" in rows["_DeviceAssert"].reason
    ), rows["_DeviceAssert"].reason
    assert rows["_Good"].status == "ok"
    x = torch.randn(3, 16, device="cuda")
    torch.testing.assert_close(model(x), model.module(x))  # this process's CUDA is healthy
    print("\n" + report.render())


def _gpu_backends() -> list[honed.backend.Backend]:
    b = honed.backend
    bf16 = {"autocast_enabled": True, "autocast_dtype": torch.bfloat16}
    return [
        b.TorchEagerBackend(b.TorchEagerBackendConfig(**bf16)),
        b.TorchInductorBackend(),
        b.TorchInductorBackend(b.TorchInductorBackendConfig(mode="reduce-overhead", **bf16)),
        b.TorchInductorAotBackend(),
        b.TorchInductorAotBackend(
            b.TorchInductorAotBackendConfig(precision="bf16", cuda_graphs=True)
        ),
        b.CudaGraphsBackend(),
        b.CudaGraphsBackend(b.CudaGraphsBackendConfig(**bf16)),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("backend", _gpu_backends(), ids=lambda b: b.name)
def test_every_backend_tunes_saves_and_loads_in_a_new_process_on_cuda(
    backend: honed.backend.Backend, tmp_path: Path
) -> None:
    from honed.pipeline.correctness import compare

    from conftest import load_in_new_process

    reduced = bool(getattr(backend.config, "autocast_enabled", False))  # bf16: looser gate
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().cuda().eval(), "tiny")
    report = honed.tune(model, _data(2, 4, 8), strategy=honed.OneBackendStrategy(backend))
    (graph,) = report.graphs
    row = next(c for c in graph.candidates if c.name == backend.name)
    assert row.status == "ok", row.reason
    assert graph.selected == backend.name
    # 5 was never recorded but lies inside the batch profile [2, 8]; 32 lies outside (eager).
    xs = _data(2, 5, 8, 32)
    with torch.no_grad():
        eager = [model.module(x) for x in xs]
        for x, ref in zip(xs, eager, strict=True):
            assert compare(ref, model(x), reduced, backend.tolerance()).ok
    honed.trust.keygen()  # native payloads (TensorRT, AOTInductor) load only when signed
    honed.save(model, tmp_path / "tiny.honed")
    loaded = load_in_new_process(
        tmp_path / "tiny.honed", xs, tmp_path, model="TinyMLP().cuda().eval()"
    )
    assert loaded.backend_name == backend.name
    for got, ref in zip(loaded.outputs, eager, strict=True):
        assert got.device.type == "cuda" and got.dtype == ref.dtype
        check = compare(ref, got, reduced, backend.tolerance())
        assert check.ok, check.reason
