"""tests/test_backend_aot.py: TorchInductorAotBackend: export, AOT compile, payload, tune.

AOT compiles take seconds each on CPU: the built results are shared through module fixtures
(three compiles in all: a dynamic profile, a static autocast one, and one end-to-end tune).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import honed
from honed import _core
from honed.backend import GraphInfo, Sample, availability, backend_from_recipe
from honed.backend._aoti_constants import CONSTANTS_JSON
from honed.backend._aoti_env import link_options
from honed.backend._calling import Calling
from honed.backend._export import plan
from honed.backend.torch_inductor_aot import (
    PAYLOAD_CALLING,
    PAYLOAD_PACKAGE,
    AotCompiled,
    TorchInductorAotBackend,
    TorchInductorAotBackendConfig,
)

from conftest import KwModel, TinyMLP, batches

CPU = torch.device("cpu")

# The FutureWarning comes from inside torch's AOT compile (a deprecated LeafSpec check).
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")]


class Branchy(nn.Module):
    """Python control flow on a tensor value: torch.export cannot capture it as one graph."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


def _samples(*xs: torch.Tensor) -> list[Sample]:
    return [Sample((x,), {}) for x in xs]


def _profile(lo: int, opt: int, hi: int, names: tuple[str, ...] = ()) -> GraphInfo:
    return GraphInfo(
        device=CPU,
        has_dynamic_axes=lo != hi,
        min_shapes=((lo, 16),),
        opt_shapes=((opt, 16),),
        max_shapes=((hi, 16),),
        axis_names=(names,) if names else (),
    )


@pytest.fixture(scope="module")
def mlp() -> nn.Module:
    torch.manual_seed(0)
    return TinyMLP().eval()


def _copy(mlp: nn.Module) -> nn.Module:
    """A new TinyMLP with ``mlp``'s weights, as honed.load gives a payload its module."""
    module = TinyMLP().eval()
    module.load_state_dict(mlp.state_dict())
    return module


@pytest.fixture(scope="module")
def dynamic_fn(mlp: nn.Module) -> AotCompiled:
    """Batch profile [1..8] traced at opt batch 1 (the example is enlarged to dodge 0/1)."""
    backend = TorchInductorAotBackend()
    fn = backend.build_graph(mlp, _samples(*batches(1, 5, 8)), _profile(1, 1, 8, ("batch", "")))
    assert isinstance(fn, AotCompiled)
    return fn


@pytest.fixture(scope="module")
def kw_static() -> tuple[nn.Module, AotCompiled, dict[str, Any]]:
    torch.manual_seed(0)
    model = KwModel().eval()
    x = batches(4)[0]
    kwargs = {"bias": torch.randn(4, 8), "scale": 0.5}
    backend = TorchInductorAotBackend(
        TorchInductorAotBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
    )
    graph = GraphInfo(CPU, False, ((4, 16), (4, 8)), ((4, 16), (4, 8)), ((4, 16), (4, 8)))
    fn = backend.build_graph(model, [Sample((x,), kwargs)], graph)
    assert isinstance(fn, AotCompiled)
    return model, fn, {"x": x, **kwargs}


# -- config, availability, plan (no compiling) --------------------------------------------------
def test_config_defaults_and_validation() -> None:
    cfg = TorchInductorAotBackendConfig()
    assert (cfg.options, cfg.dynamic, cfg.strict, cfg.check_inputs) == (None, None, False, True)
    assert (cfg.autocast_enabled, cfg.autocast_dtype) == (False, None)
    with pytest.raises(honed.ConfigError, match=r"float16 or torch\.bfloat16"):
        TorchInductorAotBackendConfig(autocast_enabled=True, autocast_dtype=torch.int8)
    with pytest.raises(honed.ConfigError, match="options must be a dict"):
        TorchInductorAotBackendConfig(options=["max_autotune"])  # type: ignore[arg-type]


def test_recipe_round_trip_and_class_attributes() -> None:
    backend = TorchInductorAotBackend(
        TorchInductorAotBackendConfig(options={"max_autotune": True}, strict=True)
    )
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, TorchInductorAotBackend)
    assert rebuilt.config == backend.config
    assert rebuilt.name == "TorchInductorAotBackend(options={'max_autotune': True}, strict=True)"
    assert (TorchInductorAotBackend.portability, TorchInductorAotBackend.saves_payload) == (2, True)


def test_available_here_and_names_a_missing_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TorchInductorAotBackend.available().ok
    monkeypatch.setattr("honed.backend._inductor_env.cpu_compiler", lambda: None)
    avail = TorchInductorAotBackend.available()
    assert not avail.ok
    assert "no C++ compiler" in avail.reason
    assert "g++" in avail.fix


def test_available_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise RuntimeError("broken install")

    monkeypatch.setattr("honed.backend.torch_inductor_aot.cpu_available", boom)
    avail = availability(TorchInductorAotBackend)
    assert not avail.ok
    assert "broken install" in avail.reason


def test_plan_shares_one_dim_between_axes_named_alike() -> None:
    xs = batches(3, 6)
    samples = [Sample((x, x.clone()), {}) for x in xs]
    shapes = ((3, 16), (3, 16)), ((6, 16), (6, 16))
    named = GraphInfo(CPU, True, shapes[0], shapes[1], shapes[1], (("b", ""), ("b", "")))
    dims = plan(samples, named, None, "T").dims
    assert dims[0] is not None and dims[1] is not None
    assert dims[0][0] is dims[1][0]
    assert (dims[0][0].min, dims[0][0].max) == (3, 6)
    apart = GraphInfo(CPU, True, shapes[0], shapes[1], shapes[1], (("b", ""), ("c", "")))
    dims = plan(samples, apart, None, "T").dims
    assert dims[0] is not None and dims[1] is not None
    assert dims[0][0] is not dims[1][0]
    # Without names: axes equal in every sample (and of one range) share a Dim.
    unnamed = GraphInfo(CPU, True, shapes[0], shapes[1], shapes[1])
    unnamed_plan = plan(samples, unnamed, None, "T")
    assert unnamed_plan.dims[0] is not None and unnamed_plan.dims[1] is not None
    assert unnamed_plan.dims[0][0] is unnamed_plan.dims[1][0]
    assert unnamed_plan.groups[0] == unnamed_plan.groups[1] == ("in0_axis0", "")


def test_unnamed_equal_batch_axes_export_as_one_dim() -> None:
    # torch.export refuses two separate Dims for axes that x + y makes equal; the plan's shared
    # Dim makes the export succeed (export only: no AOT compile).
    from honed.backend._export import FlatForward, export_program

    samples = [Sample((x, x * 2), {}) for x in batches(3, 6)]
    graph = GraphInfo(CPU, True, ((3, 16),) * 2, ((6, 16),) * 2, ((6, 16),) * 2)
    two = plan(samples, graph, None, "T")
    exported = export_program(FlatForward(TwoInputs(), two), two, False, "TwoInputs", "T")
    ranges = sorted((int(r.lower), int(r.upper)) for r in exported.range_constraints.values())
    assert ranges == [(3, 6)]


def test_plan_enlarges_a_batch_one_example_and_keeps_min_one() -> None:
    one = plan(_samples(*batches(1)), _profile(1, 1, 8, ("batch", "")), None, "T")
    assert tuple(one.tensors[0].shape) == (2, 16)
    torch.testing.assert_close(one.tensors[0][1], one.tensors[0][0])  # repeated rows
    dim = one.dims[0][0] if one.dims[0] else None
    assert dim is not None and (dim.min, dim.max) == (1, 8)


def test_dynamic_true_without_a_dynamic_axis_is_a_config_error(mlp: nn.Module) -> None:
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(dynamic=True))
    with pytest.raises(honed.ConfigError, match="no dynamic axis"):
        backend.build_graph(mlp, _samples(*batches(4)), _profile(4, 4, 4))


def test_calling_json_round_trip() -> None:
    samples = [Sample((x, 0.5, x.clone()), {}) for x in batches(1, 8)]
    profile = _core.infer_profile([_core.signature(s.args, s.kwargs) for s in samples])
    calling = Calling(3, (0, 2), None, profile)
    back = Calling.from_json(calling.to_json())
    assert back == calling
    assert back.min_shapes() == [(1, 16), (1, 16)] and back.max_shapes() == [(8, 16), (8, 16)]
    with pytest.raises(honed.InputError, match="format"):
        Calling.from_json('{"format": 99}')
    # Files of format 1 (before the guard was the engine's) take the graph's stored profile.
    old = '{"format": 1, "num_leaves": 3, "tensor_positions": [0, 2], "in_spec": null}'
    assert Calling.from_json(old, profile) == calling


def test_data_dependent_control_flow_fails_clearly() -> None:
    model = Branchy().eval()
    with pytest.raises(honed.TuneError, match=r"torch\.export could not capture Branchy") as e:
        TorchInductorAotBackend().build_graph(model, _samples(*batches(4)), _profile(4, 4, 4))
    assert "torch.cond" in str(e.value)


def test_tune_reports_the_export_failure_and_keeps_eager() -> None:
    model = honed.Module(Branchy().eval(), "branchy")
    strategy = honed.OneBackendStrategy(TorchInductorAotBackend())
    report = honed.tune(model, batches(4, 4), strategy=strategy)
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "failed"
    assert "torch.export could not capture Branchy" in row.reason
    x = batches(4)[0]
    torch.testing.assert_close(model(x), model.module(x))


def test_relative_cache_folders_are_made_absolute_before_compiling(
    mlp: nn.Module, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from honed.backend import torch_inductor_aot as aot

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "rel/inductor")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    seen = {}

    def compile_stub(exported: Any, package_path: str, inductor_configs: Any) -> str:
        seen.update({k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")})
        Path(package_path).write_bytes(b"package")
        return package_path

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_stub)
    assert aot._compile(object(), {}) == b"package"
    assert seen == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "rel" / "inductor"),
        "TRITON_CACHE_DIR": None,
    }


# -- built packages -----------------------------------------------------------------------------
def test_dynamic_profile_matches_eager_from_min_to_max(
    mlp: nn.Module, dynamic_fn: AotCompiled
) -> None:
    with torch.no_grad():
        for x in batches(1, 2, 5, 8, seed=1):
            torch.testing.assert_close(dynamic_fn(x), mlp(x))


def test_shapes_outside_the_compiled_range_are_refused(dynamic_fn: AotCompiled) -> None:
    with pytest.raises(
        honed.InputError, match=r"axis 0 \(batch\) is 9, outside the tuned range \[1, 8\]"
    ):
        dynamic_fn(torch.randn(9, 16))
    with pytest.raises(honed.InputError, match=r"compiled for float32 of rank 2 on cpu"):
        dynamic_fn(torch.randn(4, 16, dtype=torch.float64))
    with pytest.raises(honed.InputError, match="axis 1 is 17, the tuned graph fixes it at 16"):
        dynamic_fn(torch.randn(4, 17))


def test_new_shapes_never_recompile(
    mlp: nn.Module, dynamic_fn: AotCompiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    _forbid_compiling(monkeypatch)
    with torch.no_grad():
        for x in batches(3, 7, seed=2):
            torch.testing.assert_close(dynamic_fn(x), mlp(x))


def test_payload_round_trip_loads_without_compiling(
    mlp: nn.Module, dynamic_fn: AotCompiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = TorchInductorAotBackend()
    files = backend.export_payload(dynamic_fn)
    assert set(files) == {PAYLOAD_PACKAGE, PAYLOAD_CALLING, CONSTANTS_JSON}
    assert files[PAYLOAD_PACKAGE][:2] == b"PK"  # a .pt2 is a zip archive
    _forbid_compiling(monkeypatch)
    # As honed.load does: the module gets the artifact's weights before the payload is loaded.
    loaded = backend.load_payload(files, _copy(mlp), _profile(1, 1, 8, ("batch", "")))
    with torch.no_grad():
        for x in batches(1, 6, 8, seed=3):
            torch.testing.assert_close(loaded(x), mlp(x))
    with pytest.raises(honed.InputError, match=r"outside the tuned range \[1, 8\]"):
        loaded(torch.randn(10, 16))


def test_constants_the_direct_loader_cannot_take_go_through_torchs_loader(
    mlp: nn.Module, dynamic_fn: AotCompiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A candidate is never lost to the GIL-free loader: where it fails to hand the package its
    constants, torch's loader loads the package again and the variant computes right."""
    from honed.backend import _aoti_direct

    monkeypatch.setattr(honed.config, "aoti_loader", "direct")

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("AOTInductor container could not take its constants")

    monkeypatch.setattr(_aoti_direct.DirectLoader, "load_constants", refuse)
    backend = TorchInductorAotBackend()
    before = _aoti_direct.LOADS.copy()
    loaded = backend.load_payload(
        backend.export_payload(dynamic_fn), _copy(mlp), _profile(1, 1, 8, ("batch", ""))
    )
    assert not isinstance(loaded.runner, _aoti_direct.DirectRunner)
    assert _aoti_direct.LOADS - before == {
        "direct": 1,
        "torch: constants: AOTInductor container could not take its constants": 1,
    }
    with torch.no_grad():
        x = torch.randn(3, 16)
        torch.testing.assert_close(loaded(x), mlp(x))


def test_the_package_holds_code_and_takes_the_module_weights(
    mlp: nn.Module, dynamic_fn: AotCompiled
) -> None:
    """The weights are stored once (the module's weights entry), not again inside the package."""
    backend = TorchInductorAotBackend()
    files = backend.export_payload(dynamic_fn)
    listing = json.loads(files[CONSTANTS_JSON])
    assert listing["format"] == 1
    assert {(c["fqn"], c["source"], c["key"]) for c in listing["constants"]} <= {
        (f"inner.{name}", "weights", name) for name in mlp.state_dict()
    }
    with zipfile.ZipFile(io.BytesIO(files[PAYLOAD_PACKAGE])) as z:
        inside = b"".join(z.read(n) for n in z.namelist())
    assert mlp.state_dict()["fc1.weight"].numpy().tobytes() not in inside
    # Inductor inlines tiny tensors (fc2's 4 biases) into the code; the rest come from the module.
    other = _copy(mlp)
    listed = {c["key"] for c in listing["constants"]}
    assert {"fc1.weight", "fc2.weight"} <= listed
    with torch.no_grad():
        for name, p in other.named_parameters():
            if name in listed:
                p.copy_(torch.randn_like(p))
    loaded = backend.load_payload(files, other, _profile(1, 1, 8, ("batch", "")))
    with torch.no_grad():
        x = batches(5, seed=4)[0]
        torch.testing.assert_close(loaded(x), other(x))
    bad = {**files, CONSTANTS_JSON: json.dumps({"format": 9, "constants": []}).encode()}
    with pytest.raises(honed.InputError, match=r"constants\.json has format 9"):
        backend.load_payload(bad, other, _profile(1, 1, 8, ("batch", "")))
    missing = r"constant 'inner\.fc1\.bias' should be float32 \[32\].*found nothing"
    with pytest.raises(honed.InputError, match=missing):
        backend.load_payload(files, nn.Linear(3, 3), _profile(1, 1, 8, ("batch", "")))


def test_the_modules_own_weights_are_handed_over_as_they_are_and_the_package_copies_them(
    mlp: nn.Module, dynamic_fn: AotCompiled
) -> None:
    """A weight with the layout compiled for goes to the package without a copy of ours first
    (a copy as large as the module, in a JIT program's process); one that is a view of a larger
    block is laid out anew. The package keeps copies: the module's weights changed afterwards
    leave the loaded variant as it was loaded."""
    from honed.backend import _aoti_constants

    backend = TorchInductorAotBackend()
    files = backend.export_payload(dynamic_fn)
    listing = json.loads(files[CONSTANTS_JSON])["constants"]
    other = _copy(mlp)
    with torch.no_grad():  # fc2's weight: the first rows of a larger block
        block = torch.randn(8, 32)
        block[:4] = other.fc2.weight
        other.fc2.weight = nn.Parameter(block[:4])
    own = other.state_dict()
    handed = _aoti_constants.tensors(files, other, CPU)
    assert handed is not None
    shared = {c["key"] for c in listing if handed[c["fqn"]].data_ptr() == own[c["key"]].data_ptr()}
    assert "fc1.weight" in shared
    assert "fc2.weight" in {c["key"] for c in listing} - shared
    torch.testing.assert_close(handed["inner.fc2.weight"], own["fc2.weight"])
    loaded = backend.load_payload(files, other, _profile(1, 1, 8, ("batch", "")))
    x = batches(5, seed=6)[0]
    with torch.no_grad():
        expected = other(x)
        torch.testing.assert_close(loaded(x), expected)
        for p in other.parameters():
            p.add_(1.0)
        torch.testing.assert_close(loaded(x), expected)


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs binutils' readelf")
def test_the_wrapper_links_the_shared_cxx_runtime(dynamic_fn: AotCompiled, tmp_path: Path) -> None:
    """A wrapper.so with a private static libstdc++ can segfault on load: two C++ runtimes in one
    process disagree about their shared state."""
    assert ":libstdc++.so.6" in link_options(None)["aot_inductor.custom_op_libs"]
    assert link_options({"aot_inductor.custom_op_libs": ["x"]})["aot_inductor.custom_op_libs"] == [
        "x",
        ":libstdc++.so.6",
    ]
    with zipfile.ZipFile(io.BytesIO(dynamic_fn.package)) as z:
        wrappers = [n for n in z.namelist() if n.endswith(".so")]
        assert wrappers, z.namelist()
        z.extractall(tmp_path)
    for name in wrappers:
        dynamic = subprocess.run(
            ["readelf", "-d", str(tmp_path / name)], capture_output=True, text=True, check=True
        ).stdout
        assert "[libstdc++.so.6]" in dynamic, dynamic
        symbols = subprocess.run(
            ["readelf", "--dyn-syms", "-W", str(tmp_path / name)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        # A static copy of libstdc++ would export its locale machinery from the wrapper itself.
        defined = [ln for ln in symbols.splitlines() if "codecvt" in ln and " UND " not in ln]
        assert not defined, defined[:3]


def test_incomplete_payload_is_refused() -> None:
    with pytest.raises(honed.InputError, match=r"lacks \['calling.json'\]"):
        TorchInductorAotBackend().load_payload({PAYLOAD_PACKAGE: b""}, TinyMLP(), _profile(1, 1, 1))


def test_cuda_graphs_on_a_cpu_graph_are_refused_before_anything_compiles(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("exported or compiled before the config was checked")

    monkeypatch.setattr(torch.export, "export", refuse)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", refuse)
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(cuda_graphs=True))
    assert backend.name == "TorchInductorAotBackend(CUDA graphs)"
    with pytest.raises(honed.InputError, match="set cuda_graphs=False, or move the model"):
        backend.build_graph(TinyMLP(), _samples(torch.randn(2, 16)), _profile(2, 2, 2))
    with pytest.raises(honed.InputError, match="runs on cpu"):
        backend.load_payload(
            {PAYLOAD_PACKAGE: b"", PAYLOAD_CALLING: b"{}"}, TinyMLP(), _profile(2, 2, 2)
        )


def test_export_payload_refuses_foreign_callables() -> None:
    with pytest.raises(TypeError, match="takes what its build returned"):
        TorchInductorAotBackend().export_payload(TinyMLP())


def test_kwargs_constants_and_autocast(kw_static: tuple[nn.Module, AotCompiled, Any]) -> None:
    model, fn, inputs = kw_static
    x, bias, scale = inputs["x"], inputs["bias"], inputs["scale"]
    out = fn(x, bias=bias, scale=scale)
    with torch.no_grad():
        ref = model(x, bias=bias, scale=scale)
    assert set(out) == {"y", "parts"}
    assert out["y"].dtype == torch.float32  # cast back to what eager returns
    assert out["parts"][1].dtype == torch.float32
    torch.testing.assert_close(out["y"], ref["y"], atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(out["parts"][0], ref["parts"][0], atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(out["parts"][1], ref["parts"][1], atol=2e-1, rtol=5e-2)
    assert not torch.equal(out["y"], ref["y"])  # it really ran in bfloat16


def test_static_build_refuses_other_shapes_and_constants(
    kw_static: tuple[nn.Module, AotCompiled, Any],
) -> None:
    _, fn, inputs = kw_static
    x, bias = inputs["x"], inputs["bias"]
    with pytest.raises(honed.InputError, match=r"non-tensor input .* == 0\.5, got 2\.0"):
        fn(x, bias=bias, scale=2.0)
    with pytest.raises(honed.InputError, match=r"axis 0 is 5, the tuned graph fixes it at 4"):
        fn(torch.randn(5, 16), bias=torch.randn(5, 8), scale=0.5)
    with pytest.raises(honed.InputError, match="structured differently"):
        fn(x, bias)


def test_tune_selects_aot_and_the_tuned_module_matches_eager() -> None:
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny-aot")
    strategy = honed.OneBackendStrategy(TorchInductorAotBackend())
    report = honed.tune(model, batches(2, 4, 8), strategy=strategy)
    assert report.selected() == ["TorchInductorAotBackend"]
    assert isinstance(model.variants[0].fn, AotCompiled)
    with torch.no_grad():
        for x in batches(2, 3, 8, seed=4):
            assert model._dispatcher.lookup((x,), {}) == 0  # served by the AOT variant
            torch.testing.assert_close(model(x), model.module(x))


def _forbid_compiling(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._inductor
    import torch.export

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("compiled or exported where only loading was allowed")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", refuse)
    monkeypatch.setattr(torch.export, "export", refuse)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dynamic_profile_on_cuda_matches_eager_and_round_trips() -> None:
    torch.manual_seed(0)
    model = TinyMLP().cuda().eval()
    cuda = torch.device("cuda")
    xs = [x.cuda() for x in batches(1, 4, 16)]
    graph = GraphInfo(cuda, True, ((1, 16),), ((4, 16),), ((16, 16),), (("batch", ""),))
    backend = TorchInductorAotBackend()
    fn = backend.build_graph(model, _samples(*xs), graph)
    loaded = backend.load_payload(backend.export_payload(fn), model, graph)
    with torch.no_grad():
        for x in batches(1, 3, 16, seed=5):
            x = x.cuda()
            torch.testing.assert_close(fn(x), model(x))
            torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_constants_laid_out_beside_a_busy_program_outlive_the_packages_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The package copies its constants on the legacy default stream (cudaMemcpy returns before
    a device-to-device copy runs). Beside a program whose calls keep that stream busy, the bf16
    constants laid out on honed's own stream must be laid out before those copies read them
    (their memory held NaN before), and not handed out again, and overwritten by honed's next
    allocations there, before the copies ran."""
    from honed.pipeline import courtesy

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)).cuda().eval()
    x = torch.randn(8, 256, device="cuda")
    cuda = torch.device("cuda", torch.cuda.current_device())
    graph = GraphInfo(cuda)
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(precision="bf16"))
    files = backend.export_payload(backend.build_graph(model, _samples(x), graph))
    monkeypatch.setattr(courtesy, "_probe", [lambda: False])  # beside a program: honed's stream

    def nan_blocks() -> list[torch.Tensor]:
        return [
            torch.full_like(p, float("nan"), dtype=torch.bfloat16)
            for p in model.parameters()
            for _ in range(3)
        ]

    with torch.no_grad():
        want = model(x)
        for _ in range(4):  # the copies and the layout race: one load may pass by luck
            torch.cuda.synchronize()
            torch.cuda._sleep(200_000_000)  # the program's stream busy for a while
            with courtesy.own_stream(cuda):
                nan_blocks()  # made and freed on honed's stream: the layout reuses them
                loaded = backend.load_payload(files, model, graph)
                litter = nan_blocks()
            torch.cuda.synchronize()
            out = loaded(x)
            del litter, loaded
            assert torch.isfinite(out).all()
            torch.testing.assert_close(out.float(), want, atol=0.05, rtol=0.05)


def test_a_loader_crash_in_the_probe_becomes_an_error(
    dynamic_fn: AotCompiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    from honed.backend import _aoti_env as aot

    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(aot, "PROBE_CODE", crash)
    monkeypatch.setattr(aot, "PROBED", {})
    backend = TorchInductorAotBackend()
    files = backend.export_payload(dynamic_fn)
    with pytest.raises(honed.TuneError, match=r"package crashed with signal 11 in a probe process"):
        backend.load_payload(files, TinyMLP(), _profile(1, 1, 8, ("batch", "")))
    _forbid_compiling(monkeypatch)  # known broken: a build fails before exporting or compiling
    with pytest.raises(honed.TuneError, match="cannot run AOTInductor packages on this machine"):
        backend.build_graph(TinyMLP(), _samples(*batches(4)), _profile(4, 4, 4))


@pytest.fixture
def probes(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command lines of the child processes started from here on (the load probes)."""
    started: list[list[str]] = []
    real_run = subprocess.run

    def counting_run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        started.append(cmd)
        return real_run(cmd, **kw)

    monkeypatch.setattr(subprocess, "run", counting_run)
    return started


def test_a_successful_probe_is_remembered_across_processes(
    mlp: nn.Module,
    dynamic_fn: AotCompiled,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    probes: list[list[str]],
) -> None:
    from honed.backend import _aoti_env as aot

    backend = TorchInductorAotBackend()
    files = backend.export_payload(dynamic_fn)
    graph = _profile(1, 1, 8, ("batch", ""))
    with honed.config.patch(cache_dir=tmp_path):
        monkeypatch.setattr(aot, "PROBED", {})  # a new process: nothing known
        backend.load_payload(files, _copy(mlp), graph)
        assert len(probes) == 1 and list((tmp_path / "aoti-probe").glob("cpu-*.ok"))
        monkeypatch.setattr(aot, "PROBED", {})  # another new process: the verdict is on disk
        x = batches(3)[0]
        torch.testing.assert_close(backend.load_payload(files, _copy(mlp), graph)(x), dynamic_fn(x))
        assert len(probes) == 1
        with honed.config.patch(cache_enabled=False):  # no cache: probe again
            monkeypatch.setattr(aot, "PROBED", {})
            backend.load_payload(files, _copy(mlp), graph)
        assert len(probes) == 2


def test_a_tunes_worker_loads_without_the_probe_and_spares_later_processes_it(
    mlp: nn.Module,
    dynamic_fn: AotCompiled,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    probes: list[list[str]],
) -> None:
    """A worker is itself isolated: its load is the probe, and its verdict serves the caller."""
    from honed.backend import _aoti_env as aot

    backend = TorchInductorAotBackend()
    files = backend.export_payload(dynamic_fn)
    graph = _profile(1, 1, 8, ("batch", ""))
    with honed.config.patch(cache_dir=tmp_path):
        monkeypatch.setattr(aot, "PROBED", {})
        monkeypatch.setattr(aot, "IN_WORKER", True)
        x = batches(3)[0]
        torch.testing.assert_close(backend.load_payload(files, _copy(mlp), graph)(x), dynamic_fn(x))
        assert probes == []
        assert list((tmp_path / "aoti-probe").glob("cpu-*.ok"))
        monkeypatch.setattr(aot, "PROBED", {})  # the caller, after the worker's load
        monkeypatch.setattr(aot, "IN_WORKER", False)
        backend.load_payload(files, _copy(mlp), graph)
        assert probes == []


def test_cpu_packages_build_without_a_precompiled_header_unless_it_pays(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Off for a process's first CPU package with no header made before (a tune's worker);
    on once this process compiled one, or when a made header is there; the user's word wins."""
    from torch._inductor import codecache

    from honed.backend import _aoti_env as aot

    key = "aot_inductor.precompile_headers"
    monkeypatch.setattr(aot, "_COMPILES", 0)
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(tmp_path / "headers"))
    assert TorchInductorAotBackendConfig().inductor_configs("cpu")[key] is False
    assert key not in TorchInductorAotBackendConfig().inductor_configs("cuda")
    mine = TorchInductorAotBackendConfig(options={key: True})
    assert mine.inductor_configs("cpu")[key] is True
    (tmp_path / "headers").mkdir()
    (tmp_path / "headers" / "abc.h.gch").write_bytes(b"made earlier")
    assert key not in TorchInductorAotBackendConfig().inductor_configs("cpu")
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(tmp_path / "none"))
    aot.compiled_here()
    assert key not in TorchInductorAotBackendConfig().inductor_configs("cpu")


def test_loading_skips_torchs_device_information_probe(
    mlp: nn.Module, dynamic_fn: AotCompiled, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's aoti_load_package probes the CPU's vector ISA by compiling and loading test
    programs in child processes, which dominates a load; honed checks the environment itself and
    loads without it."""
    import torch._inductor.codecache

    def probing(device_type: str) -> dict[str, str]:
        raise AssertionError(f"device information probed for {device_type}")

    monkeypatch.setattr(torch._inductor.codecache, "get_device_information", probing)
    backend = TorchInductorAotBackend()
    loaded = backend.load_payload(
        backend.export_payload(dynamic_fn), _copy(mlp), _profile(1, 1, 8, ("batch", ""))
    )
    x = batches(6)[0]
    torch.testing.assert_close(loaded(x), dynamic_fn(x))


def _vec_isa_seen_inside(aot: Any) -> Any:
    """torch's cpp.vec_isa_ok as a compile inside honed's ISA context would see it."""
    from torch._inductor import config as inductor_config

    with aot.vec_isa_known():
        return inductor_config.cpp.vec_isa_ok


def test_a_passed_vector_isa_check_is_remembered_and_a_failed_one_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """torch's CPU vector-ISA check builds and imports a test program per ISA in every new
    process, a large part of an AOTInductor build; once every ISA the CPU names has passed, later
    compiles tell torch so instead."""
    from honed.backend import _aoti_env as aot

    flagged = ["avx512 avx512_vnni", "avx512", "avx2"]
    monkeypatch.setattr(aot, "flagged_vec_isas", lambda: flagged)
    checks: list[str] = []

    def answers(passed: list[str]) -> Any:
        def check() -> list[str]:
            checks.append("checked")
            return passed

        return check

    with honed.config.patch(cache_dir=tmp_path):
        # One ISA failed: nothing kept, torch decides (and goes on checking in later processes).
        monkeypatch.setattr(aot, "check_vec_isas_side_by_side", answers(flagged[1:]))
        assert _vec_isa_seen_inside(aot) is None and checks == ["checked"]
        assert not list((tmp_path / "aoti-probe").glob("vec-isa-*.ok"))

        # Every ISA passed: torch is told so at once, and later processes do not check.
        monkeypatch.setattr(aot, "check_vec_isas_side_by_side", answers(flagged))
        assert _vec_isa_seen_inside(aot) is True
        assert len(list((tmp_path / "aoti-probe").glob("vec-isa-*.ok"))) == 1
        checks.clear()
        assert _vec_isa_seen_inside(aot) is True and checks == []

        # Another CPU (other flags) or no cache: checked again.
        monkeypatch.setattr(aot, "flagged_vec_isas", lambda: ["avx2"])
        monkeypatch.setattr(aot, "check_vec_isas_side_by_side", answers(["avx2"]))
        assert _vec_isa_seen_inside(aot) is True and checks == ["checked"]
        monkeypatch.setattr(aot, "flagged_vec_isas", lambda: flagged)
        with honed.config.patch(cache_enabled=False, cache_dir=tmp_path / "off"):
            # No cache: the checks still run side by side, every time, and nothing is kept.
            monkeypatch.setattr(aot, "check_vec_isas_side_by_side", answers(flagged))
            checks.clear()
            assert _vec_isa_seen_inside(aot) is True and _vec_isa_seen_inside(aot) is True
            assert checks == ["checked", "checked"]
            assert not (tmp_path / "off").exists()
            monkeypatch.setattr(aot, "check_vec_isas_side_by_side", answers(flagged[1:]))
            assert _vec_isa_seen_inside(aot) is None

        # The user's own setting always wins.
        from torch._inductor import config as inductor_config

        with inductor_config.patch({"cpp.vec_isa_ok": False}):
            assert _vec_isa_seen_inside(aot) is False


@pytest.mark.skipif(
    __import__("honed.backend._aoti_env", fromlist=["x"]).flagged_vec_isas() is None,
    reason="torch checks vector ISAs on x86-64 Linux only",
)
def test_the_side_by_side_isa_check_is_torchs_own_answer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Run in a fresh process with an empty Inductor cache: honed's threads answer first, then
    torch's own list comes from the answers they left (and agrees with them)."""
    script = (
        "import time; from honed.backend import _aoti_env as aot\n"
        "from torch._inductor import cpu_vec_isa\n"
        "ours = aot.check_vec_isas_side_by_side()\n"
        "t = time.perf_counter(); torchs = [str(i) for i in cpu_vec_isa.valid_vec_isa_list()]\n"
        "assert ours == torchs, (ours, torchs)\n"
        "assert time.perf_counter() - t < 0.5, 'torch checked again'\n"
        "print(ours)\n"
    )
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("[")


def test_compiling_twice_in_new_processes_skips_the_isa_check_the_second_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """End to end on this CPU: two compiles, the second as a new process would run it (honed's
    cache of the verdict is on disk; torch's own answer of this process is not used)."""
    from honed.backend import _aoti_env as aot

    flagged = aot.flagged_vec_isas()
    if not flagged:
        pytest.skip("torch checks vector ISAs only on x86-64 Linux")
    from torch._inductor import cpu_vec_isa

    if [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] != flagged:
        pytest.skip("an ISA this CPU names does not build here: torch keeps checking")
    seen: list[Any] = []
    real = torch._inductor.aoti_compile_and_package

    def compile_and_note(*args: Any, **kw: Any) -> Any:
        from torch._inductor import config as inductor_config

        seen.append(inductor_config.cpp.vec_isa_ok)
        return real(*args, **kw)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_and_note)
    checks: list[list[str] | None] = []
    real_check = aot.check_vec_isas_side_by_side

    def check_and_note() -> list[str] | None:
        checks.append(real_check())
        return checks[-1]

    monkeypatch.setattr(aot, "check_vec_isas_side_by_side", check_and_note)
    with honed.config.patch(cache_dir=tmp_path):
        for _ in range(2):
            module = honed.Module(TinyMLP(), "isa")
            honed.tune(
                module,
                batches(2),
                strategy=honed.OneBackendStrategy(TorchInductorAotBackend()),
                isolation="none",
            )
            x = batches(5)[0]
            torch.testing.assert_close(module(x), module.module(x))
    # The first compile checked (side by side) and told torch; the second only read the verdict.
    assert checks == [flagged]
    assert seen == [True, True]


def _cuda_static(batch: int) -> GraphInfo:
    shapes = ((batch, 16),)
    return GraphInfo(torch.device("cuda"), False, shapes, shapes, shapes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_replay_the_package_and_outputs_survive_the_next_call() -> None:
    torch.manual_seed(0)
    model = TinyMLP().cuda().eval()
    graph = _cuda_static(4)
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(cuda_graphs=True))
    fn = backend.build_graph(model, _samples(torch.randn(4, 16, device="cuda")), graph)
    assert fn.graphed is not None and fn.graphed.captures == 1  # captured at build
    loaded = backend.load_payload(backend.export_payload(fn), model, graph)
    assert loaded.graphed is not None and loaded.graphed.captures == 0  # on first sight
    x1, x2 = torch.randn(4, 16, device="cuda"), torch.randn(4, 16, device="cuda")
    with torch.no_grad():
        for f in (fn, loaded):
            out1 = f(x1)
            out2 = f(x2)  # a replay: must not overwrite out1
            torch.testing.assert_close(out1, model(x1))
            torch.testing.assert_close(out2, model(x2))
            assert f.graphed is not None and f.graphed.captures == 1
        with pytest.raises(honed.InputError, match="compiled for other inputs"):
            fn(torch.randn(5, 16, device="cuda"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("loader", ["torch", "direct"])
def test_a_capture_on_another_thread_leaves_the_programs_cuda_work_alone(
    loader: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JIT loads and captures a winner on its own thread while the program's thread keeps
    running CUDA work and synchronizing: neither may fail, and both compute right. With the
    direct loader (JIT's) the load, the first runs and the capture hold no GIL, so the program's
    work truly runs meanwhile."""
    import threading

    from honed.backend import _aoti_direct

    monkeypatch.setattr(honed.config, "aoti_loader", loader)

    torch.manual_seed(0)
    model = TinyMLP().cuda().eval()
    graph = _cuda_static(8)
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(cuda_graphs=True))
    files = backend.export_payload(
        backend.build_graph(model, _samples(torch.randn(8, 16, device="cuda")), graph)
    )
    x = torch.randn(8, 16, device="cuda")
    a = torch.randn(512, 512, device="cuda")
    errors: list[BaseException] = []
    done = threading.Event()
    captured: list[AotCompiled] = []
    loads_before = _aoti_direct.LOADS["direct"]  # the build above loaded once already

    def install() -> None:
        try:
            for _ in range(5):
                fn = backend.load_payload(files, model, graph)
                fn.capture(Sample((x,), {}))
                captured.append(fn)
        except BaseException as e:
            errors.append(e)
        finally:
            done.set()

    from honed.backend.cuda_graphs import guard_synchronize

    # As under JIT: the program's device-wide syncs wait for the capture (a sync during another
    # thread's capture breaks both, whichever loader ran the package).
    guard_synchronize(True)
    thread = threading.Thread(target=install)
    thread.start()
    program = 0
    try:
        with torch.no_grad():
            while not done.is_set() or program < 50:
                b = a @ a  # the program's own work, allocations and host syncs included
                torch.cuda.synchronize()
                assert torch.isfinite(b).all().item()
                program += 1
    finally:
        thread.join()
        guard_synchronize(False)
    assert not errors, errors
    assert len(captured) == 5
    assert _aoti_direct.LOADS["direct"] - loads_before == (5 if loader == "direct" else 0)
    with torch.no_grad():
        for fn in captured:
            torch.testing.assert_close(fn(x), model(x))
