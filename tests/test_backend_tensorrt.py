"""tests/test_backend_tensorrt.py: TensorRT and Torch-TensorRT without TensorRT.

TensorRT cannot be installed on this project's machines: these tests cover what needs no
TensorRT (optimization profiles, config -> builder flags/settings on TensorRT 10 and 11, the
calls made on a recording stand-in of the tensorrt module, compile_config translation, and the
availability verdicts), plus how the tuner and the doctor report the backends as unavailable.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import honed
from honed.backend import (
    TensorRTBackend,
    TensorRTBackendConfig,
    TorchTensorRTAotBackend,
    TorchTensorRTAotBackendConfig,
    TorchTensorRTJitBackend,
    TorchTensorRTJitBackendConfig,
    backend_from_recipe,
)
from honed.backend.tensorrt import (
    Profile,
    add_profiles,
    apply_settings,
    build_settings,
    cc_verdict,
    choose_profile,
    engine_profile,
    network_flags,
    optimization_profiles,
    split_range,
    tensorrt_verdict,
)
from honed.backend.torch_tensorrt import (
    compile_kwargs,
    reduced_precision,
    settings_dict,
    torch_tensorrt_verdict,
    trt_inputs,
)
from honed.pipeline.correctness import REDUCED

from conftest import TinyMLP, batches

TRT_HERE = TensorRTBackend.available().ok
no_trt = pytest.mark.skipif(TRT_HERE, reason="TensorRT is installed here")


# -- TensorRTBackend: config and profiles -----------------------------------------------------
def test_config_defaults_validation_and_recipe() -> None:
    cfg = TensorRTBackendConfig()
    assert (cfg.use_dynamo, cfg.precision, cfg.optimization_level, cfg.num_profiles) == (
        True,
        "fp32",
        3,
        1,
    )
    assert (cfg.hardware_compatibility_level, cfg.timing_cache, cfg.cuda_graphs) == (
        "none",
        None,
        False,
    )
    for bad, match in [
        ({"precision": "int4"}, "precision 'int4' is not one of fp32, tf32, fp16"),
        ({"hardware_compatibility_level": "all"}, "ampere_plus, same_compute_capability"),
        ({"optimization_level": 6}, "optimization_level=6 not in 0-5"),
        ({"workspace_size": 0}, "workspace_size=0 must be > 0"),
        ({"num_profiles": 0}, "num_profiles=0 not in 1-8"),
    ]:
        with pytest.raises(honed.ConfigError, match=match):
            TensorRTBackendConfig(**bad)
    backend = TensorRTBackend(
        TensorRTBackendConfig(precision="fp16", workspace_size=1 << 30, num_profiles=3)
    )
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, TensorRTBackend) and rebuilt.config == backend.config
    assert rebuilt.name == (
        "TensorRTBackend(precision=fp16, workspace_size=1073741824, num_profiles=3)"
    )
    # the seed's JIT snippet
    assert TensorRTBackend(config=TensorRTBackendConfig(use_dynamo=True)).config.use_dynamo


def test_split_range_uses_power_of_two_ends() -> None:
    assert split_range(1, 64, 3) == [(1, 4), (5, 16), (17, 64)]
    assert split_range(2, 8, 2) == [(2, 4), (5, 8)]
    assert split_range(4, 4, 3) == [(4, 4)]
    assert split_range(1, 64, 1) == [(1, 64)]
    assert split_range(3, 6, 4) == [(3, 4), (5, 6)]  # never more ranges than sizes allow


def test_one_profile_is_the_tuned_min_opt_max() -> None:
    lo, opt, hi = [(1, 16)], [(8, 16)], [(64, 16)]
    assert optimization_profiles(lo, opt, hi, [("batch", "")], 1) == [
        Profile(((1, 16),), ((8, 16),), ((64, 16),))
    ]
    static = optimization_profiles([(4, 16)], [(4, 16)], [(4, 16)], [("", "")], 3)
    assert static == [Profile(((4, 16),), ((4, 16),), ((4, 16),))]


def test_several_profiles_split_the_shared_batch_dimension() -> None:
    # Two inputs share the batch; the second has its own dynamic sequence axis (kept whole).
    lo = [(1, 16), (1, 8)]
    opt = [(8, 16), (8, 12)]
    hi = [(64, 16), (64, 32)]
    groups = [("batch", ""), ("batch", "seq")]
    profiles = optimization_profiles(lo, opt, hi, groups, 3)
    assert [(p.min[0][0], p.max[0][0]) for p in profiles] == [(1, 4), (5, 16), (17, 64)]
    for p in profiles:
        assert p.min[0][0] == p.min[1][0] and p.max[0][0] == p.max[1][0]  # shared: equal
        assert (p.min[1][1], p.opt[1][1], p.max[1][1]) == (8, 12, 32)  # seq untouched
        assert p.min[0][1] == p.max[0][1] == 16
    # opt: the tuned 8 where it falls inside, else the range's top
    assert [p.opt[0][0] for p in profiles] == [4, 8, 64]


def test_the_narrowest_fitting_profile_is_chosen() -> None:
    profiles = optimization_profiles([(1, 16)], [(8, 16)], [(64, 16)], [("batch", "")], 3)
    assert choose_profile(profiles, [(2, 16)]) == 0
    assert choose_profile(profiles, [(16, 16)]) == 1
    assert choose_profile(profiles, [(64, 16)]) == 2
    assert choose_profile(profiles, [(65, 16)]) is None
    overlapping = [Profile(((1,),), ((8,),), ((64,),)), Profile(((1,),), ((2,),), ((4,),))]
    assert choose_profile(overlapping, [(3,)]) == 1
    assert engine_profile([[(1, 16), (8, 16), (64, 16)]]) == Profile(
        ((1, 16),), ((8, 16),), ((64, 16),)
    )


# -- TensorRTBackend: config -> builder settings ----------------------------------------------
def test_fp16_and_bf16_are_strongly_typed_graphs_on_10_and_11() -> None:
    for major in (10, 11):
        for precision, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            s = build_settings(TensorRTBackendConfig(precision=precision), major, has_qdq=False)
            assert s.export_dtype == dtype and s.builder_flags == ()
            assert s.network_flags == (("STRONGLY_TYPED",) if major == 10 else ())
            assert not s.calibrate_int8 and not s.needs_qdq


def test_weak_typing_flags_on_tensorrt_10() -> None:
    weak = {"strongly_typed": False}
    for precision, flag in (("fp16", "FP16"), ("bf16", "BF16"), ("tf32", "TF32")):
        s = build_settings(TensorRTBackendConfig(precision=precision, **weak), 10, False)
        assert s.builder_flags == (flag,) and s.network_flags == () and s.export_dtype is None
    int8 = build_settings(TensorRTBackendConfig(precision="int8", **weak), 10, has_qdq=False)
    assert int8.builder_flags == ("INT8",) and int8.calibrate_int8
    with pytest.raises(honed.ConfigError, match="TensorRT 11 builds strongly typed"):
        build_settings(TensorRTBackendConfig(precision="fp16", **weak), 11, False)


def test_int8_and_fp8_need_qdq_nodes_unless_calibrated() -> None:
    for major in (10, 11):
        for precision in ("int8", "fp8"):
            cfg = TensorRTBackendConfig(precision=precision)
            with pytest.raises(honed.ConfigError, match=f"builds {precision} only from Q/DQ"):
                build_settings(cfg, major, has_qdq=False)
            s = build_settings(cfg, major, has_qdq=True)
            assert s.needs_qdq and not s.calibrate_int8 and s.builder_flags == ()
    with pytest.raises(honed.ConfigError, match="strongly_typed=False to calibrate int8"):
        build_settings(TensorRTBackendConfig(precision="int8"), 10, has_qdq=False)
    with pytest.raises(honed.ConfigError, match="fp8 only from Q/DQ"):
        build_settings(TensorRTBackendConfig(precision="fp8", strongly_typed=False), 10, False)
    fp8 = build_settings(TensorRTBackendConfig(precision="fp8", strongly_typed=False), 10, True)
    assert fp8.builder_flags == ("FP8",)


class _Recorder:
    """Stands in for IBuilder / IBuilderConfig / IOptimizationProfile: records every call."""

    def __init__(self, log: list[Any], name: str) -> None:
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> Any:
        def call(*args: Any) -> Any:
            self._log.append((self._name, attr, args))
            if attr == "create_optimization_profile":
                return _Recorder(self._log, "profile")
            return None

        return call

    def __setattr__(self, attr: str, value: Any) -> None:
        self._log.append((self._name, "set " + attr, value))


def _fake_trt() -> Any:
    def enum_ns(*names: str) -> Any:
        return SimpleNamespace(**{n: f"{n}" for n in names})

    class Flag(enum.IntEnum):
        EXPLICIT_BATCH = 0
        STRONGLY_TYPED = 5

    return SimpleNamespace(
        BuilderFlag=enum_ns("FP16", "BF16", "INT8", "FP8", "TF32"),
        MemoryPoolType=enum_ns("WORKSPACE"),
        HardwareCompatibilityLevel=enum_ns("NONE", "AMPERE_PLUS", "SAME_COMPUTE_CAPABILITY"),
        NetworkDefinitionCreationFlag=Flag,
    )


def test_settings_become_builder_config_calls() -> None:
    trt = _fake_trt()
    cfg = TensorRTBackendConfig(
        precision="fp16",
        strongly_typed=False,
        workspace_size=1 << 30,
        optimization_level=5,
        hardware_compatibility_level="ampere_plus",
    )
    settings = build_settings(cfg, 10, has_qdq=False)
    log: list[Any] = []
    apply_settings(trt, _Recorder(log, "builder"), _Recorder(log, "config"), settings)
    assert log == [
        ("config", "set_flag", ("FP16",)),
        ("config", "set_memory_pool_limit", ("WORKSPACE", 1 << 30)),
        ("config", "set builder_optimization_level", 5),
        ("config", "set hardware_compatibility_level", "AMPERE_PLUS"),
    ]
    strong = build_settings(TensorRTBackendConfig(), 10, has_qdq=False)
    assert network_flags(trt, strong) == 1 << 5
    assert network_flags(trt, build_settings(TensorRTBackendConfig(), 11, False)) == 0


def test_profiles_become_optimization_profile_calls() -> None:
    log: list[Any] = []
    builder, config = _Recorder(log, "builder"), _Recorder(log, "config")
    profiles = optimization_profiles([(1, 16)], [(8, 16)], [(64, 16)], [("batch", "")], 2)
    made = add_profiles(_fake_trt(), builder, config, ["input_0"], profiles)
    assert len(made) == 2
    sets = [entry for entry in log if entry[1] == "set_shape"]
    assert sets == [
        ("profile", "set_shape", ("input_0", (1, 16), (8, 16), (8, 16))),
        ("profile", "set_shape", ("input_0", (9, 16), (64, 16), (64, 16))),
    ]
    assert [e[1] for e in log].count("add_optimization_profile") == 2


def test_tolerances_follow_the_precision() -> None:
    assert TensorRTBackend().tolerance() is None
    assert TensorRTBackend(TensorRTBackendConfig(precision="bf16")).tolerance() == REDUCED
    quant = TensorRTBackend(TensorRTBackendConfig(precision="int8")).tolerance()
    assert quant is not None and quant.min_cosine == 0.99


# -- availability verdicts --------------------------------------------------------------------
def test_tensorrt_verdicts() -> None:
    missing = tensorrt_verdict(None, None, "13.0", True)
    assert (missing.ok, missing.reason) == (False, "TensorRT is not installed")
    assert "pip install tensorrt" in missing.fix
    broken = tensorrt_verdict("10.3.0", "ImportError: libnvinfer.so.10: cannot open", "12.4", True)
    assert not broken.ok
    assert (
        broken.reason
        == "tensorrt 10.3.0 fails to import: ImportError: libnvinfer.so.10: cannot open"
    )
    assert not tensorrt_verdict("8.6.1", None, "12.4", True).ok
    cpu = tensorrt_verdict("10.3.0", None, None, False)
    assert not cpu.ok and "CPU-only build" in cpu.reason
    assert not tensorrt_verdict("10.3.0", None, "12.4", False).ok
    assert tensorrt_verdict("11.4.0", None, "13.0", True).ok
    assert cc_verdict((9, 0), "none").ok
    old = cc_verdict((7, 0), "none")
    assert not old.ok and ">= 7.5" in old.reason and "7.0" in old.reason
    turing = cc_verdict((7, 5), "ampere_plus")
    assert not turing.ok and "Ampere or newer" in turing.reason


def test_torch_tensorrt_verdicts() -> None:
    missing = torch_tensorrt_verdict(None, None, "2.11.0+cu130", "13.0", True)
    assert not missing.ok
    assert missing.fix == "pip install torch-tensorrt==2.11.* (the release made for torch 2.11)"
    mismatch = torch_tensorrt_verdict("2.14.0", None, "2.11.0+cu130", "13.0", True)
    assert not mismatch.ok
    assert mismatch.reason == (
        "torch_tensorrt 2.14.0 is built for torch 2.14, but this is torch 2.11.0+cu130"
    )
    broken = torch_tensorrt_verdict("2.11.0", "OSError: libtorchtrt.so", "2.11.0", "13.0", True)
    assert not broken.ok and "fails to import with torch 2.11.0: OSError" in broken.reason
    assert torch_tensorrt_verdict("2.11.0", None, "2.11.0+cu130", "13.0", True).ok
    assert not torch_tensorrt_verdict("2.13.0", None, "2.13.0+cpu", None, False).ok


@no_trt
def test_unavailable_here_with_reason_and_fix() -> None:
    for cls in (TensorRTBackend, TorchTensorRTJitBackend, TorchTensorRTAotBackend):
        avail = cls.available()
        assert not avail.ok and avail.reason and avail.fix
    reason = TensorRTBackend.available().reason
    if importlib.util.find_spec("tensorrt") is None:
        assert reason == "TensorRT is not installed"
    else:  # present but unusable here (CPU-only torch, a broken import): never called missing
        assert "not installed" not in reason


@no_trt
def test_tune_reports_tensorrt_unavailable_and_keeps_eager() -> None:
    model = honed.Module(TinyMLP().eval(), "tiny")
    strategy = honed.FirstWinsStrategy(
        [TensorRTBackend(), TorchTensorRTAotBackend(), TorchTensorRTJitBackend()]
    )
    report = honed.tune(model, batches(4), strategy=strategy)
    rows = [c for g in report.graphs for c in g.candidates if not c.is_baseline]
    assert len(rows) == 3 and all(r.status == "failed" for r in rows)
    assert all(r.reason.startswith("unavailable: ") and "(fix: " in r.reason for r in rows)
    x = batches(4)[0]
    torch.testing.assert_close(model(x), model.module(x))


FAKE = """
import sys
sys.path.insert(0, {root!r})
import honed
from honed.backend import TensorRTBackend, TorchInductorBackend
a = TensorRTBackend.available()
print("TRT", a.ok, "|", a.reason)
print("INDUCTOR", bool(TorchInductorBackend.available()))
"""


@pytest.mark.integration
def test_a_tensorrt_that_raises_on_import_is_a_reason(tmp_path: Path) -> None:
    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.py").write_text(
        "raise ImportError('libnvinfer.so.10: cannot open shared object file')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FAKE).format(root=str(tmp_path))],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRT False | tensorrt fails to import: ImportError: libnvinfer.so.10" in proc.stdout
    assert "INDUCTOR True" in proc.stdout


# -- Torch-TensorRT: config translation --------------------------------------------------------
class _Dtype(enum.Enum):
    """Stands in for torch_tensorrt.dtype (an enum that converts to torch dtypes)."""

    f16 = "f16"

    def to(self, kind: Any) -> Any:
        assert kind is torch.dtype
        return torch.float16


@dataclasses.dataclass
class _Settings:
    """Stands in for torch_tensorrt.dynamo.CompilationSettings."""

    enabled_precisions: set[Any] = dataclasses.field(default_factory=lambda: {torch.float32})
    workspace_size: int = 0
    min_block_size: int = 5
    truncate_double: bool = False
    device: Any = None


def test_compilation_settings_become_a_json_dict_of_the_changed_fields() -> None:
    settings = _Settings(enabled_precisions={_Dtype.f16, torch.float32}, workspace_size=1 << 30)
    as_dict = settings_dict(settings)
    assert as_dict == {
        "enabled_precisions": [torch.float16, torch.float32],
        "workspace_size": 1 << 30,
    }
    assert compile_kwargs(as_dict) == {
        "enabled_precisions": {torch.float16, torch.float32},
        "workspace_size": 1 << 30,
    }
    assert reduced_precision(as_dict) and not reduced_precision({})
    with pytest.raises(honed.ConfigError, match=r"device=.*cannot be stored"):
        settings_dict(_Settings(device=object()))
    with pytest.raises(honed.ConfigError, match="CompilationSettings or a dict"):
        settings_dict(42)


def test_aot_config_like_the_seed_and_its_recipe() -> None:
    cfg = TorchTensorRTAotBackendConfig(
        ir="dynamo",
        compile_config=_Settings(enabled_precisions={torch.float16}),
        pickle_protocol=4,  # accepted, ignored: nothing is pickled
    )
    assert cfg.compile_config == {"enabled_precisions": [torch.float16]}
    backend = TorchTensorRTAotBackend(cfg)
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, TorchTensorRTAotBackend) and rebuilt.config == cfg
    assert backend.tolerance() == REDUCED
    for ir in ("ts", "fx"):
        assert TorchTensorRTAotBackendConfig(ir=ir).ir == ir
    with pytest.raises(honed.ConfigError, match="ir 'onnx' is not one of dynamo, ts, fx"):
        TorchTensorRTAotBackendConfig(ir="onnx")
    jit = TorchTensorRTJitBackend(TorchTensorRTJitBackendConfig(compile_config={"debug": True}))
    assert backend_from_recipe(jit.recipe()).config == jit.config  # type: ignore[union-attr]
    assert jit.tolerance() is None


def test_input_specs_come_from_the_tuned_profile() -> None:
    lo, hi = [(1, 16), (1, 8)], [(64, 16), (64, 8)]
    dtypes = [torch.float32, torch.int64]
    specs = trt_inputs(lo, hi, dtypes, ((8, 16), (8, 8)))
    assert specs[0] == {
        "min_shape": (1, 16),
        "opt_shape": (8, 16),
        "max_shape": (64, 16),
        "dtype": torch.float32,
    }
    assert specs[1]["dtype"] == torch.int64
    assert trt_inputs(lo, hi, dtypes, ())[0]["opt_shape"] == (64, 16)  # no opt: the max
