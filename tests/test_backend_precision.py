"""tests/test_backend_precision.py: precision, memory format and Inductor options as candidates.

CPU: configs, names and recipes; the module cast to bf16; channels_last with Inductor; TF32 as
a no-op; freezing and coordinate descent. GPU (marked gpu): a ResNet-like convnet at batch 64
in bf16 + channels_last + reduce-overhead, TF32, and an AOTInductor bf16 package saved and
loaded in a new process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import honed
from honed.backend import (
    CudaGraphsBackendConfig,
    GraphInfo,
    Sample,
    TorchEagerBackend,
    TorchEagerBackendConfig,
    TorchInductorAotBackend,
    TorchInductorAotBackendConfig,
    TorchInductorBackend,
    TorchInductorBackendConfig,
    backend_from_recipe,
)
from honed.backend._precision import TF32, CastModule, tf32_enabled
from honed.pipeline.correctness import REDUCED, compare

from conftest import TinyMLP, batches, load_in_new_process

CPU = torch.device("cpu")


class ConvNet(nn.Module):
    """A small ResNet-like image model: conv stem, two residual blocks, pooled linear head."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
        )
        self.blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
            )
            for _ in range(2)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.stem(x)
        for block in self.blocks:
            y = torch.relu(y + block(y))
        return self.head(y.mean(dim=(2, 3)))


def _images(batch: int, size: int = 16, device: str = "cpu", seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(batch, 3, size, size, device=device, generator=g)


def _convnet(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    model = ConvNet().to(device).eval()
    with torch.no_grad():  # BatchNorm statistics that are not the identity
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


# -- configs, names, recipes -----------------------------------------------------------------------
def test_precision_fields_default_to_what_the_module_is() -> None:
    for cfg in (
        TorchInductorBackendConfig(),
        TorchInductorAotBackendConfig(),
        TorchEagerBackendConfig(),
        CudaGraphsBackendConfig(),
    ):
        assert (cfg.precision, cfg.memory_format) == ("fp32", None)
    inductor = TorchInductorBackendConfig()
    assert (inductor.coordinate_descent_tuning, inductor.freezing) == (False, False)
    assert TorchInductorAotBackendConfig().max_autotune is False


def test_bad_precision_values_are_config_errors() -> None:
    with pytest.raises(honed.ConfigError, match=r"precision='int4' is not one of fp32, tf32"):
        TorchInductorBackendConfig(precision="int4")
    with pytest.raises(honed.ConfigError, match=r"memory_format='nhwc' is not supported"):
        TorchInductorBackendConfig(memory_format="nhwc")
    with pytest.raises(honed.ConfigError, match="choose one of them"):
        TorchEagerBackendConfig(precision="bf16", autocast_enabled=True)
    # The C++ runtime does not set TF32: an AOTInductor package is never a TF32 candidate.
    with pytest.raises(honed.ConfigError, match=r"precision='tf32' is not one of fp32, bf16, fp16"):
        TorchInductorAotBackendConfig(precision="tf32")
    with pytest.raises(honed.ConfigError, match="either mode or options"):
        TorchInductorBackendConfig(mode="default", options={"freezing": True})


def test_candidate_names_say_what_each_is() -> None:
    def name(**kw: Any) -> str:
        return TorchInductorBackend(TorchInductorBackendConfig(**kw)).name

    assert (
        name(mode="reduce-overhead", precision="bf16", memory_format="channels_last")
        == "TorchInductorBackend(mode=reduce-overhead, bf16 weights, channels_last)"
    )
    assert name(precision="tf32") == "TorchInductorBackend(tf32)"
    assert (
        name(mode="max-autotune", coordinate_descent_tuning=True, freezing=True)
        == "TorchInductorBackend(mode=max-autotune, coordinate descent, freezing)"
    )
    aot = TorchInductorAotBackend(
        TorchInductorAotBackendConfig(precision="fp16", max_autotune=True)
    )
    assert aot.name == "TorchInductorAotBackend(fp16 weights, max-autotune)"
    eager = TorchEagerBackend(TorchEagerBackendConfig(precision="bf16"))
    assert eager.name == "TorchEagerBackend(bf16 weights)"


@pytest.mark.parametrize(
    "backend",
    [
        TorchInductorBackend(
            TorchInductorBackendConfig(
                mode="reduce-overhead",
                precision="bf16",
                memory_format="channels_last",
                coordinate_descent_tuning=True,
                freezing=True,
            )
        ),
        TorchInductorBackend(TorchInductorBackendConfig(precision="tf32")),
        TorchInductorAotBackend(TorchInductorAotBackendConfig(precision="fp16", max_autotune=True)),
        TorchEagerBackend(TorchEagerBackendConfig(precision="bf16", memory_format="channels_last")),
        honed.backend.CudaGraphsBackend(CudaGraphsBackendConfig(precision="tf32")),
    ],
    ids=lambda b: b.name,
)
def test_new_fields_round_trip_through_the_json_recipe(backend: honed.backend.Backend) -> None:
    import json

    recipe = json.loads(json.dumps(backend.recipe()))
    rebuilt = backend_from_recipe(recipe)
    assert type(rebuilt) is type(backend)
    assert rebuilt.config == backend.config  # type: ignore[union-attr]
    assert rebuilt.name == backend.name


def test_each_precision_is_checked_with_its_own_tolerance() -> None:
    def tol(**kw: Any) -> Any:
        return TorchInductorBackend(TorchInductorBackendConfig(**kw)).tolerance()

    assert tol() is None
    assert tol(precision="bf16") == tol(precision="fp16") == REDUCED
    assert tol(precision="tf32") == TF32
    assert REDUCED.atol > TF32.atol > 0 and TF32.min_cosine > REDUCED.min_cosine


def test_mode_with_inductor_options_becomes_options() -> None:
    from torch._inductor import list_mode_options

    cfg = TorchInductorBackendConfig(mode="reduce-overhead", coordinate_descent_tuning=True)
    settings = cfg.compile_settings(None)
    assert "mode" not in settings
    assert settings["options"] == {
        **list_mode_options("reduce-overhead"),
        "coordinate_descent_tuning": True,
    }
    assert TorchInductorBackend(cfg).uses_cudagraphs
    frozen = TorchInductorBackendConfig(options={"max_autotune": True}, freezing=True)
    assert frozen.compile_settings(None) == {"options": {"max_autotune": True, "freezing": True}}
    assert TorchInductorBackendConfig(mode="default").compile_settings(None) == {"mode": "default"}
    alone = TorchInductorBackendConfig(freezing=True).compile_settings(None)
    assert alone == {"options": {"freezing": True}}


# -- CPU builds ------------------------------------------------------------------------------------
def test_module_cast_to_bf16_takes_and_returns_what_eager_does() -> None:
    model = _convnet()
    x = _images(4)
    backend = TorchEagerBackend(TorchEagerBackendConfig(precision="bf16"))
    fn = backend.build(model, [Sample((x,), {})])
    with torch.no_grad():
        out, ref = fn(x), model(x)
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert compare(ref, out, tolerance=backend.tolerance()).ok
    assert not torch.equal(out, ref)  # it really ran in bf16
    # The user's module is untouched (eager stays the reference and the fallback).
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert isinstance(fn, CastModule)
    assert all(p.dtype == torch.bfloat16 for p in fn.inner.parameters())


class _Counted(nn.Module):
    """Returns a float32 and an int64 tensor; counts its forward calls."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.calls += 1
        y = self.linear(x)
        return y, y.argmax(dim=-1)


@pytest.mark.parametrize(
    "backend",
    [
        TorchEagerBackend(TorchEagerBackendConfig(precision="bf16")),
        TorchEagerBackend(TorchEagerBackendConfig(precision="fp16")),
    ],
    ids=["bf16", "fp16"],
)
def test_a_candidate_learns_eagers_output_dtypes_from_the_tunes_references(
    backend: honed.backend.Backend,
) -> None:
    # Beside a program on a GPU an eager run in a worker holds the program's calls back: the
    # build learns what eager returns from the outputs the tune already holds.
    from honed.pipeline.candidate import evaluate

    model = _Counted().eval()
    samples = [Sample((torch.randn(4, 8),), {}), Sample((torch.randn(6, 8),), {})]
    with torch.no_grad():
        references = [model(*s.args) for s in samples]
    model.calls = 0
    graph = GraphInfo(device=CPU)
    outcome = evaluate(backend, model, samples, references, graph, 0, 4)
    assert outcome.status == "ok", outcome.reason
    assert model.calls == 0  # the original module never ran: the check compared with references
    out = outcome.fn(*samples[1].args)
    assert [t.dtype for t in out] == [torch.float32, torch.int64]
    assert compare(references[1], out, tolerance=backend.tolerance()).ok
    # Without the tune's outputs (a build on its own) the build runs eager once to learn them.
    backend.build(model, samples[:1])
    assert model.calls == 1


def test_cast_keeps_integer_inputs_and_nested_outputs() -> None:
    class Embed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(50, 8)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
            h = self.emb(ids) * mask.unsqueeze(-1)
            return {"h": h, "n": (ids > 3).sum(), "pooled": (h.sum(1),)}

    model = Embed().eval()
    ids, mask = torch.randint(0, 50, (2, 5)), torch.ones(2, 5)
    fn = TorchEagerBackend(TorchEagerBackendConfig(precision="fp16")).build(
        model, [Sample((ids, mask), {})]
    )
    out, ref = fn(ids, mask), model(ids, mask)
    assert out["h"].dtype == torch.float32 and out["n"].dtype == torch.int64
    assert torch.equal(out["n"], ref["n"])
    assert compare(ref, out, tolerance=REDUCED).ok


class _Layer:
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys, self.values = keys, values


class _Cache:
    """Like a transformers KV cache: an object pytree does not know, holding tensors."""

    def __init__(self) -> None:
        self.layers: list[_Layer] = []
        self._scratch = torch.zeros(1)  # private: neither compared nor cast


class _WithCache(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        cache = _Cache()
        cache.layers.append(_Layer(self.k(x), self.v(x)))
        return {"logits": self.k(x).sum(-1), "past_key_values": cache}


@pytest.mark.parametrize("precision", ["bf16", "autocast"])
def test_tensors_inside_a_returned_cache_object_come_back_in_eagers_dtype(precision: str) -> None:
    model = _WithCache().eval()
    x = torch.randn(2, 4, 8)
    config = (
        TorchEagerBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
        if precision == "autocast"
        else TorchEagerBackendConfig(precision=precision)
    )
    backend = TorchEagerBackend(config)
    fn = backend.build(model, [Sample((x,), {})])
    with torch.no_grad():
        out, ref = fn(x), model(x)
    layer = out["past_key_values"].layers[0]
    assert layer.keys.dtype == layer.values.dtype == out["logits"].dtype == torch.float32
    assert out["past_key_values"]._scratch.dtype == torch.float32
    assert not torch.equal(layer.keys, ref["past_key_values"].layers[0].keys)  # ran reduced
    assert compare(ref, out, tolerance=REDUCED).ok


@pytest.mark.integration  # a real compile
def test_channels_last_with_inductor_on_cpu_matches_eager() -> None:
    model = _convnet()
    samples = [Sample((_images(b),), {}) for b in (2, 4)]
    backend = TorchInductorBackend(TorchInductorBackendConfig(memory_format="channels_last"))
    graph = GraphInfo(CPU, True, ((2, 3, 16, 16),), ((4, 3, 16, 16),), ((4, 3, 16, 16),))
    fn = backend.build_graph(model, samples, graph)
    for b in (2, 3, 4):
        x = _images(b, seed=b)
        with torch.no_grad():
            out, ref = fn(x), model(x)
        assert compare(ref, out).ok  # fp32 tolerance: only the layout changed
        assert out.is_contiguous()
    assert model.stem[0].weight.is_contiguous()  # the user's module keeps its layout


def test_channels_last_outputs_come_back_in_eagers_layout() -> None:
    conv = nn.Conv2d(3, 4, 3, padding=1).eval()
    x = _images(2)
    fn = TorchEagerBackend(TorchEagerBackendConfig(memory_format="channels_last")).build(
        conv, [Sample((x,), {})]
    )
    out = fn(x)
    assert out.is_contiguous() and torch.allclose(out, conv(x), atol=1e-5)


def test_channels_last_is_refused_for_a_model_without_image_inputs() -> None:
    backend = TorchInductorBackend(TorchInductorBackendConfig(memory_format="channels_last"))
    with pytest.raises(honed.TuneError, match="for models with a 4-D image input"):
        backend.build(TinyMLP().eval(), [Sample((batches(4)[0],), {})])


def test_tf32_is_a_no_op_on_cpu_and_leaves_the_process_settings_alone() -> None:
    model = TinyMLP().eval()
    x = batches(4)[0]
    before = torch.get_float32_matmul_precision()
    fn = TorchEagerBackend(TorchEagerBackendConfig(precision="tf32")).build(
        model, [Sample((x,), {})]
    )
    assert fn is model  # nothing to wrap on CPU
    assert torch.equal(fn(x), model(x))
    assert torch.get_float32_matmul_precision() == before


def test_tf32_context_sets_and_restores_both_settings() -> None:
    matmul, conv = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        with tf32_enabled():
            assert torch.get_float32_matmul_precision() == "high"
            assert torch.backends.cudnn.allow_tf32 is True
        assert torch.get_float32_matmul_precision() == matmul
        assert torch.backends.cudnn.allow_tf32 is False
    finally:
        torch.backends.cudnn.allow_tf32 = conv


@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg",
    [
        TorchInductorBackendConfig(freezing=True),
        TorchInductorBackendConfig(coordinate_descent_tuning=True),
    ],
    ids=["freezing", "coordinate-descent"],
)
def test_inductor_options_compile_and_match_eager_on_cpu(cfg: TorchInductorBackendConfig) -> None:
    model = _convnet()
    x = _images(2)
    fn = TorchInductorBackend(cfg).build(model, [Sample((x,), {})])
    with torch.no_grad():
        out = fn(x)
        assert compare(model(x), out).ok
        assert compare(model(_images(2, seed=5)), fn(_images(2, seed=5))).ok


@pytest.mark.slow
def test_tune_picks_among_precisions_and_the_artifact_rebuilds_them(tmp_path: Path) -> None:
    model = honed.Module(_convnet(), "convnet")
    bf16_cl = TorchEagerBackend(
        TorchEagerBackendConfig(precision="bf16", memory_format="channels_last")
    )
    report = honed.tune(model, [_images(2), _images(4)], strategy=honed.OneBackendStrategy(bf16_cl))
    row = next(c for g in report.graphs for c in g.candidates if c.selected)
    assert row.name == "TorchEagerBackend(bf16 weights, channels_last)"
    honed.save(model, tmp_path / "bf16.honed")
    x = _images(3, seed=7)
    loaded = load_in_new_process(
        tmp_path / "bf16.honed",
        [x],
        tmp_path,
        model="ConvNet().eval()",
        name="convnet",
        prelude="from test_backend_precision import ConvNet",
    )
    assert loaded.backend_name == "TorchEagerBackend(bf16 weights, channels_last)"
    assert loaded.outputs[0].dtype == torch.float32


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")
def test_aot_package_in_bf16_channels_last_takes_and_returns_fp32_on_cpu() -> None:
    model = _convnet()
    samples = [Sample((_images(b),), {}) for b in (2, 4)]
    graph = GraphInfo(CPU, True, ((2, 3, 16, 16),), ((4, 3, 16, 16),), ((4, 3, 16, 16),))
    config = TorchInductorAotBackendConfig(precision="bf16", memory_format="channels_last")
    backend = TorchInductorAotBackend(config)
    fn = backend.build_graph(model, samples, graph)
    x = _images(3, seed=3)
    with torch.no_grad():
        out, ref = fn(x), model(x)
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert compare(ref, out, tolerance=backend.tolerance()).ok
    assert not torch.equal(out, ref)  # it really ran in bf16
    files = backend.export_payload(fn)
    # The bf16 constants are the module's weights cast at load (stored once): a module given the
    # saved weights, as honed.load does first, runs exactly what was compiled.
    fresh = ConvNet()
    fresh.load_state_dict(model.state_dict())
    loaded = backend.load_payload(files, fresh, graph)
    assert torch.equal(loaded(x), out)


# -- GPU -------------------------------------------------------------------------------------------
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
@needs_cuda
def test_convnet_batch_64_bf16_channels_last_reduce_overhead_on_cuda() -> None:
    model = honed.Module(_convnet("cuda"), "convnet-cuda")
    candidate = TorchInductorBackend(
        TorchInductorBackendConfig(
            mode="reduce-overhead", precision="bf16", memory_format="channels_last"
        )
    )
    data = [_images(64, size=32, device="cuda"), _images(32, size=32, device="cuda", seed=1)]
    report = honed.tune(model, data, strategy=honed.OneBackendStrategy(candidate), device="cuda")
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "ok", row.reason
    assert row.name == "TorchInductorBackend(mode=reduce-overhead, bf16 weights, channels_last)"
    x = _images(64, size=32, device="cuda", seed=9)
    out = model(x)
    first = out.clone()
    model(_images(64, size=32, device="cuda", seed=10))  # the next replay must not touch `out`
    assert torch.equal(out, first)
    assert out.dtype == torch.float32 and out.is_contiguous()
    assert compare(model.module(x), out, tolerance=REDUCED).ok


@gpu
@needs_cuda
def test_tf32_runs_under_tf32_and_restores_the_setting_on_cuda() -> None:
    model = TinyMLP(dim=256, hidden=512).cuda().eval()
    x = torch.randn(64, 256, device="cuda")
    before = torch.get_float32_matmul_precision()
    backend = TorchEagerBackend(TorchEagerBackendConfig(precision="tf32"))
    fn = backend.build(model, [Sample((x,), {})])
    out = fn(x)
    assert torch.get_float32_matmul_precision() == before
    assert compare(model(x), out, tolerance=TF32).ok


@gpu
@needs_cuda
@pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")
def test_aot_bf16_package_saves_loads_in_a_new_process_and_runs_on_cuda(tmp_path: Path) -> None:
    model = honed.Module(TinyMLP().cuda().eval(), "tiny-aot-bf16")
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(precision="bf16"))
    data = [torch.randn(b, 16, device="cuda") for b in (2, 8)]
    report = honed.tune(model, data, strategy=honed.OneBackendStrategy(backend), device="cuda")
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "ok", row.reason
    honed.save(model, tmp_path / "aot-bf16.honed")
    x = torch.randn(5, 16, device="cuda")
    loaded = load_in_new_process(
        tmp_path / "aot-bf16.honed",
        [x],
        tmp_path,
        model="TinyMLP().cuda().eval()",
        name="tiny-aot-bf16",
    )
    assert loaded.backend_name == "TorchInductorAotBackend(bf16 weights)"
    out = loaded.outputs[0]
    assert out.dtype == torch.float32 and out.device.type == "cuda"
    assert compare(model.module(x), out, tolerance=REDUCED).ok


@gpu
@needs_cuda
def test_cuda_graphs_over_the_bf16_module_return_fp32_on_cuda() -> None:
    model = _convnet("cuda")
    x = _images(8, device="cuda")
    backend = honed.backend.CudaGraphsBackend(CudaGraphsBackendConfig(precision="bf16"))
    fn = backend.build(model, [Sample((x,), {})])
    out = fn(x)
    assert out.dtype == torch.float32
    assert compare(model(x), out, tolerance=backend.tolerance()).ok
