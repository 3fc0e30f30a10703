"""tests/test_backend_onnxruntime.py: ONNXRuntimeBackend: export, session, payload, availability.

Exports take seconds on CPU (the first one loads the exporter): built results are shared through
module fixtures (two dynamo exports, one TorchScript export and one end-to-end tune).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import honed
from honed.backend import GraphInfo, Sample, availability, backend_from_recipe
from honed.backend.onnxruntime import (
    PAYLOAD_CALLING,
    PAYLOAD_MODEL,
    OnnxCalling,
    OnnxCompiled,
    ONNXRuntimeBackend,
    ONNXRuntimeBackendConfig,
    onnx_available,
    provider_list,
    tensorrt_profiles,
)

from conftest import KwModel, TinyMLP, batches, load_in_new_process

CPU = torch.device("cpu")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not ONNXRuntimeBackend.available(), reason="onnx/onnxruntime missing"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning"),
    pytest.mark.filterwarnings("ignore:.*The axis name:UserWarning"),
    pytest.mark.filterwarnings("ignore:.*legacy TorchScript-based ONNX export:DeprecationWarning"),
]


def _samples(*xs: torch.Tensor) -> list[Sample]:
    return [Sample((x,), {}) for x in xs]


def _profile(lo: int, opt: int, hi: int) -> GraphInfo:
    return GraphInfo(
        device=CPU,
        has_dynamic_axes=lo != hi,
        min_shapes=((lo, 16),),
        opt_shapes=((opt, 16),),
        max_shapes=((hi, 16),),
        axis_names=(("batch", ""),),
    )


def _forbid_exporting(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("torch.onnx.export was called while loading")

    monkeypatch.setattr(torch.onnx, "export", refuse)


@pytest.fixture(scope="module")
def mlp() -> nn.Module:
    torch.manual_seed(0)
    return TinyMLP().eval()


@pytest.fixture(scope="module")
def dynamic_fn(mlp: nn.Module) -> OnnxCompiled:
    fn = ONNXRuntimeBackend().build_graph(mlp, _samples(*batches(2, 4, 8)), _profile(2, 4, 8))
    assert isinstance(fn, OnnxCompiled)
    return fn


@pytest.fixture(scope="module")
def kw_built() -> tuple[nn.Module, OnnxCompiled]:
    torch.manual_seed(1)
    model = KwModel().eval()
    samples = [
        Sample((x,), {"bias": torch.randn(x.shape[0], 8), "scale": 0.5}) for x in batches(3, 6)
    ]
    graph = GraphInfo(
        device=CPU,
        has_dynamic_axes=True,
        min_shapes=((3, 16), (3, 8)),
        opt_shapes=((6, 16), (6, 8)),
        max_shapes=((6, 16), (6, 8)),
        axis_names=(("batch", ""), ("batch", "")),
    )
    fn = ONNXRuntimeBackend().build_graph(model, samples, graph)
    assert isinstance(fn, OnnxCompiled)
    return model, fn


# -- config, recipe, availability ---------------------------------------------------------------
def test_config_defaults_and_validation() -> None:
    cfg = ONNXRuntimeBackendConfig()
    assert (cfg.provider, cfg.opset, cfg.graph_optimization_level) == (
        "CPUExecutionProvider",
        None,
        "all",
    )
    assert (cfg.intra_op_threads, cfg.io_binding, cfg.dynamo, cfg.spinning) == (
        0,
        True,
        True,
        False,
    )
    with pytest.raises(honed.ConfigError, match="provider 'ROCm' is not supported"):
        ONNXRuntimeBackendConfig(provider="ROCm")
    with pytest.raises(honed.ConfigError, match="disabled, basic, extended, all"):
        ONNXRuntimeBackendConfig(graph_optimization_level="max")
    with pytest.raises(honed.ConfigError, match="opset >= 18"):
        ONNXRuntimeBackendConfig(opset=13)
    assert ONNXRuntimeBackendConfig(opset=13, dynamo=False).opset == 13


def test_recipe_round_trip_and_class_attributes() -> None:
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(intra_op_threads=2, opset=20))
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, ONNXRuntimeBackend)
    assert rebuilt.config == backend.config
    assert rebuilt.name == "ONNXRuntimeBackend(opset=20, intra_op_threads=2)"
    assert (ONNXRuntimeBackend.portability, ONNXRuntimeBackend.saves_payload) == (3, True)


def test_available_here_and_cached() -> None:
    assert ONNXRuntimeBackend.available().ok
    assert onnx_available() is onnx_available()


def test_available_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise RuntimeError("broken install")

    monkeypatch.setattr("honed.backend.onnxruntime.onnx_available", boom)
    avail = availability(ONNXRuntimeBackend)
    assert not avail.ok
    assert "broken install" in avail.reason


FAKE_CHECK = """
import sys
sys.path.insert(0, {fake!r})
import honed
from honed.backend import TorchInductorBackend
from honed.backend.onnxruntime import ONNXRuntimeBackend
avail = ONNXRuntimeBackend.available()
print("ORT", avail.ok, "|", avail.reason, "|", avail.fix)
print("INDUCTOR", bool(TorchInductorBackend.available()))
print("NAMES", len(honed.backend.registry.available_backends()))
"""


def test_a_package_that_raises_on_import_makes_only_this_backend_unavailable(
    tmp_path: Path,
) -> None:
    fake = tmp_path / "onnxruntime"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise AttributeError(\"module 'torch' has no attribute 'float4_e2m1fn_x2'\")\n"
    )
    script = textwrap.dedent(FAKE_CHECK).format(fake=str(tmp_path))
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("ORT"))
    assert line.startswith("ORT False")
    assert "onnxruntime" in line and "fails to import" in line
    assert "AttributeError: module 'torch' has no attribute 'float4_e2m1fn_x2'" in line
    assert f"torch {torch.__version__}" in line
    assert "INDUCTOR True" in proc.stdout


def test_an_unavailable_provider_fails_clearly(mlp: nn.Module) -> None:
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(provider="TensorrtExecutionProvider"))
    with pytest.raises(honed.BackendUnavailableError) as e:
        backend.build_graph(mlp, _samples(*batches(4)), _profile(4, 4, 4))
    assert "TensorrtExecutionProvider is not available" in str(e.value)
    assert "CPUExecutionProvider" in str(e.value)  # what it has
    assert "onnxruntime-gpu" in str(e.value)  # the fix


def test_tune_reports_an_unavailable_provider_and_keeps_eager() -> None:
    model = honed.Module(TinyMLP().eval(), "tiny")
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(provider="CUDAExecutionProvider"))
    report = honed.tune(model, batches(4, 4), strategy=honed.OneBackendStrategy(backend))
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "failed"
    assert "CUDAExecutionProvider is not available" in row.reason
    x = batches(4)[0]
    torch.testing.assert_close(model(x), model.module(x))


def test_tensorrt_profiles_come_from_the_tuned_shapes(dynamic_fn: OnnxCompiled) -> None:
    graph = _profile(2, 4, 8)
    assert tensorrt_profiles(graph, dynamic_fn.onnx_calling) == {
        "trt_profile_min_shapes": "input_0:2x16",
        "trt_profile_opt_shapes": "input_0:4x16",
        "trt_profile_max_shapes": "input_0:8x16",
    }
    gpu = dataclass_replace_device(graph, torch.device("cuda", 1))
    providers = provider_list("TensorrtExecutionProvider", gpu, dynamic_fn.onnx_calling)
    assert [p[0] if isinstance(p, tuple) else p for p in providers] == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert providers[0][1]["device_id"] == 1
    assert provider_list("CPUExecutionProvider", graph, dynamic_fn.onnx_calling) == [
        "CPUExecutionProvider"
    ]


def dataclass_replace_device(graph: GraphInfo, device: torch.device) -> GraphInfo:
    import dataclasses

    return dataclasses.replace(graph, device=device)


# -- built sessions -----------------------------------------------------------------------------
def test_dynamic_profile_matches_eager_from_min_to_max(
    mlp: nn.Module, dynamic_fn: OnnxCompiled
) -> None:
    with torch.no_grad():
        for x in batches(2, 5, 8, seed=1):
            got = dynamic_fn(x)
            assert got.dtype == torch.float32 and got.shape == (x.shape[0], 4)
            torch.testing.assert_close(got, mlp(x))


def test_shapes_outside_the_exported_range_are_refused(dynamic_fn: OnnxCompiled) -> None:
    with pytest.raises(
        honed.InputError,
        match=r"ONNX model was compiled for other inputs: .*axis 0 .* is 9, outside .* \[2, 8\]",
    ):
        dynamic_fn(torch.randn(9, 16))
    with pytest.raises(honed.InputError, match=r"float32 of rank 2"):
        dynamic_fn(torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(honed.InputError, match="structured differently"):
        dynamic_fn(torch.randn(4, 16), torch.randn(4, 16))


def test_kwargs_constants_and_nested_outputs(kw_built: tuple[nn.Module, OnnxCompiled]) -> None:
    model, fn = kw_built
    x, bias = torch.randn(4, 16), torch.randn(4, 8)
    got = fn(x, bias=bias, scale=0.5)
    want = model(x, bias=bias, scale=0.5)
    assert set(got) == {"y", "parts"} and isinstance(got["parts"], tuple)
    torch.testing.assert_close(got, want)
    with pytest.raises(honed.InputError, match=r"non-tensor input .* == 0\.5, got 2\.0"):
        fn(x, bias=bias, scale=2.0)
    with pytest.raises(honed.InputError, match="axes named 'batch' must be equal"):
        fn(torch.randn(4, 16), bias=torch.randn(5, 8), scale=0.5)


def test_payload_round_trip_loads_without_exporting(
    mlp: nn.Module, dynamic_fn: OnnxCompiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = ONNXRuntimeBackend()
    files = backend.export_payload(dynamic_fn)
    assert set(files) == {PAYLOAD_MODEL, PAYLOAD_CALLING}
    import onnx  # type: ignore[import-untyped]

    proto = onnx.load_from_string(files[PAYLOAD_MODEL])
    assert [i.name for i in proto.graph.input] == ["input_0"]
    assert OnnxCalling.from_json(files[PAYLOAD_CALLING].decode()) == dynamic_fn.onnx_calling
    _forbid_exporting(monkeypatch)
    loaded = backend.load_payload(files, TinyMLP(), _profile(2, 4, 8))
    with torch.no_grad():
        for x in batches(2, 6, 8, seed=3):
            torch.testing.assert_close(loaded(x), mlp(x))
    with pytest.raises(honed.InputError, match=r"outside the tuned range \[2, 8\]"):
        loaded(torch.randn(10, 16))


def test_sessions_do_not_spin_unless_asked(dynamic_fn: OnnxCompiled) -> None:
    """Spinning intra-op threads take the cores from torch's threads in the same process."""
    key = "session.intra_op.allow_spinning"
    assert dynamic_fn.session.get_session_options().get_session_config_entry(key) == "0"
    spinning = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(spinning=True))
    files = ONNXRuntimeBackend().export_payload(dynamic_fn)
    loaded = spinning.load_payload(files, TinyMLP(), _profile(2, 4, 8))
    assert loaded.session.get_session_options().get_session_config_entry(key) == "1"


def test_incomplete_payload_and_foreign_callables_are_refused() -> None:
    with pytest.raises(honed.InputError, match="payload lacks"):
        ONNXRuntimeBackend().load_payload({PAYLOAD_MODEL: b""}, TinyMLP(), _profile(2, 2, 2))
    with pytest.raises(TypeError, match="takes what its build returned"):
        ONNXRuntimeBackend().export_payload(TinyMLP())


def test_plain_run_and_torchscript_exporter_match_eager(mlp: nn.Module) -> None:
    cfg = ONNXRuntimeBackendConfig(dynamo=False, io_binding=False, graph_optimization_level="basic")
    fn = ONNXRuntimeBackend(cfg).build_graph(mlp, _samples(*batches(2, 8)), _profile(2, 4, 8))
    with torch.no_grad():
        for x in batches(3, 8, seed=4):
            torch.testing.assert_close(fn(x), mlp(x))


# -- end to end --------------------------------------------------------------------------------
NO_EXPORT_WHILE_LOADING = """
import honed.backend.onnxruntime  # makes the class known to load
from conftest import TinyMLP
def refuse(*args, **kwargs):
    raise AssertionError("torch.onnx.export was called while loading")
torch.onnx.export = refuse  # the stored model.onnx must load as it is
"""


def test_tune_save_load_in_a_new_process(tmp_path: Path) -> None:
    backend = ONNXRuntimeBackend()
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny", strategy=honed.OneBackendStrategy(backend))
    report = honed.tune(model, batches(2, 4, 8))
    assert report.selected() == [backend.name], report.render()
    assert isinstance(model.variants[0].fn, OnnxCompiled)

    inside = batches(5, seed=1)[0]
    torch.testing.assert_close(model(inside), model.module(inside))

    artifact = tmp_path / "onnx.honed"
    honed.save(model, artifact)
    loaded = load_in_new_process(artifact, [inside], tmp_path, prelude=NO_EXPORT_WHILE_LOADING)
    assert loaded.backend_class == "ONNXRuntimeBackend"
    (got,) = loaded.outputs
    torch.testing.assert_close(got, model.module(inside))


def test_a_stored_model_loads_with_onnxruntime_alone(
    dynamic_fn: OnnxCompiled, mlp: nn.Module, tmp_path: Path
) -> None:
    """Loading needs onnxruntime only: the exporter's packages (onnx, onnxscript: hundreds of
    modules) stay unimported, in a JIT program's install as in honed.load."""
    import pickle

    files = ONNXRuntimeBackend().export_payload(dynamic_fn)
    (tmp_path / "files.pkl").write_bytes(pickle.dumps(files))
    x = batches(4)[0]
    torch.save(x, tmp_path / "x.pt")
    script = textwrap.dedent(
        f"""
        import pickle, sys, torch
        from torch import nn
        from honed.backend import GraphInfo
        from honed.backend.onnxruntime import ONNXRuntimeBackend
        files = pickle.loads(open({str(tmp_path / "files.pkl")!r}, "rb").read())
        fn = ONNXRuntimeBackend().load_payload(files, nn.Identity(), GraphInfo(
            torch.device("cpu"), True, ((2, 16),), ((4, 16),), ((8, 16),)))
        torch.save(fn(torch.load({str(tmp_path / "x.pt")!r})), {str(tmp_path / "y.pt")!r})
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("onnx", "onnxscript")))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    with torch.no_grad():
        torch.testing.assert_close(torch.load(tmp_path / "y.pt"), mlp(x), rtol=1e-4, atol=1e-5)
