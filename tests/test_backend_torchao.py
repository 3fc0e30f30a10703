"""tests/test_backend_torchao.py: TorchAOBackend: schemes, gates, tolerances, save/load.

CPU: the CPU schemes (int8 weight-only, int8 dynamic, fp8 weight-only) are built, checked and
one is tuned, saved and loaded in a new process. GPU (skipped without CUDA; run on the device by
scripts/gpu-test.sh): every scheme the GPU's compute capability supports is built and checked
against eager, the others must say why not; one fp8 tune is saved and loaded.
Availability without torchao, or with one that raises on import, runs everywhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import honed
from honed.backend import GraphInfo, Sample, TorchAOBackend, TorchAOBackendConfig
from honed.backend.base import backend_from_recipe
from honed.backend.torchao import (
    SCHEMES,
    cc_support,
    count_quantized,
    scheme_support,
    torchao_for,
    version_verdict,
)
from honed.pipeline.correctness import compare

from conftest import TinyMLP, batches, load_in_new_process

CPU = torch.device("cpu")
pytestmark = pytest.mark.filterwarnings("ignore:.*_stable_hash_for_caching:UserWarning")
HAVE_TORCHAO = bool(TorchAOBackend.available())
needs_torchao = pytest.mark.skipif(
    not HAVE_TORCHAO, reason=f"torchao unusable here: {TorchAOBackend.available().reason}"
)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CPU_SCHEMES = [name for name, s in SCHEMES.items() if s.cpu]
REGISTER_CONSTANT_ERROR = (
    "AttributeError: module 'torch.utils._pytree' has no attribute 'register_constant'"
)


def _samples(*xs: torch.Tensor) -> list[Sample]:
    return [Sample((x,), {}) for x in xs]


def _graph(device: torch.device, dynamic: bool = False) -> GraphInfo:
    return GraphInfo(device=device, has_dynamic_axes=dynamic)


class Wide(nn.Module):
    """Linear layers whose features are multiples of 16 (fp8 skips the others)."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


# -- config, recipe, pure gates --------------------------------------------------------------
def test_config_defaults_validation_and_recipe() -> None:
    cfg = TorchAOBackendConfig()
    assert (cfg.scheme, cfg.granularity, cfg.dtype, cfg.compile) == (
        "int8_weight_only",
        None,
        None,
        True,
    )
    with pytest.raises(honed.ConfigError, match=r"unknown scheme 'int2'.*int8_weight_only"):
        TorchAOBackendConfig(scheme="int2")
    with pytest.raises(honed.ConfigError, match="per_row, per_tensor"):
        TorchAOBackendConfig(granularity="per_block")
    with pytest.raises(honed.ConfigError, match="nvfp4 takes no granularity"):
        TorchAOBackendConfig(scheme="nvfp4", granularity="per_row")
    with pytest.raises(honed.ConfigError, match="group_size=100"):
        TorchAOBackendConfig(scheme="int4_weight_only", group_size=100)
    with pytest.raises(honed.ConfigError, match="not a compute dtype"):
        TorchAOBackendConfig(dtype=torch.int8)
    backend = TorchAOBackend(
        TorchAOBackendConfig(scheme="fp8_dynamic", granularity="per_tensor", dtype=torch.float16)
    )
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, TorchAOBackend) and rebuilt.config == backend.config
    assert rebuilt.name == (
        "TorchAOBackend(scheme=fp8_dynamic, granularity=per_tensor, dtype=float16)"
    )


def test_compute_dtype_follows_the_scheme() -> None:
    assert TorchAOBackendConfig().compute_dtype() is None
    assert TorchAOBackendConfig(scheme="fp8_dynamic").compute_dtype() == torch.bfloat16
    assert (
        TorchAOBackendConfig(scheme="fp8_dynamic", granularity="per_tensor").compute_dtype() is None
    )
    assert TorchAOBackendConfig(scheme="int4_weight_only").compute_dtype() == torch.bfloat16
    assert TorchAOBackendConfig(dtype=torch.float16).compute_dtype() == torch.float16


def test_quantization_aware_tolerances() -> None:
    int8 = TorchAOBackend().tolerance()
    fp8 = TorchAOBackend(TorchAOBackendConfig(scheme="fp8_dynamic")).tolerance()
    assert int8.min_cosine == 0.999 and fp8.min_cosine == 0.99
    assert fp8.atol > int8.atol > 1e-3  # far looser than full precision
    custom = TorchAOBackend(TorchAOBackendConfig(atol=0.2, min_cosine=0.9)).tolerance()
    assert (custom.atol, custom.rtol, custom.min_cosine) == (0.2, 0.2, 0.9)

    torch.manual_seed(0)
    ref = torch.randn(64, 32)
    near = ref + 0.01 * torch.randn(64, 32)  # what int8 does to a layer's output
    ok = compare(ref, near, tolerance=int8)
    assert ok.ok and 0.0 < ok.max_abs_error < 0.1 and 0.999 < ok.min_cosine < 1.0
    assert not compare(ref, near).ok  # the fp32 gate would reject it
    noise = compare(ref, torch.randn(64, 32), tolerance=fp8)
    assert not noise.ok and "min cosine 0.99" in noise.reason and noise.min_cosine < 0.5


def test_version_verdicts_name_the_compatible_versions() -> None:
    assert version_verdict("0.18.0", "2.13.0+cpu").ok
    assert version_verdict("0.18.0", "2.11.0+cu130").ok
    assert version_verdict("0.19.0", "2.13.0").ok  # newer than the table: as new as its newest
    old_torch = version_verdict("0.18.0", "2.6.0+cu124")  # the seed's downgrade
    assert not old_torch.ok
    assert old_torch.reason == (
        "torchao 0.18.0 is made for torch >= 2.11, but this is torch 2.6.0+cu124"
    )
    assert "upgrade torch" in old_torch.fix
    old_ao = version_verdict("0.10.0", "2.13.0")
    assert not old_ao.ok and "older than 0.13" in old_ao.reason
    assert torchao_for("2.11.0+cu130") == "torchao==0.18.* (made for torch 2.11)"
    assert torchao_for("2.8.0") == "torchao==0.13.* (made for torch 2.8)"
    assert torchao_for("2.6.0").startswith("torch >= 2.8")
    assert "0.18" in version_verdict("0.10.0", "2.13.0").fix


def test_compute_capability_gates() -> None:
    assert cc_support("fp8_dynamic", (9, 0)).ok  # H100
    assert cc_support("fp8_dynamic", (8, 9)).ok  # L4 / RTX 4090
    ampere = cc_support("fp8_dynamic", (8, 6), "NVIDIA GeForce RTX 3090")
    assert not ampere.ok
    assert ampere.reason == (
        "TorchAO scheme fp8_dynamic needs compute capability >= 8.9; NVIDIA GeForce RTX 3090 "
        "has 8.6"
    )
    assert "int8_weight_only, int8_dynamic, int4_weight_only" in ampere.fix
    hopper = cc_support("nvfp4", (9, 0))
    assert not hopper.ok and ">= 10.0" in hopper.reason
    assert cc_support("mxfp8", (10, 0)).ok
    assert not cc_support("int8_dynamic", (7, 5)).ok


def test_cpu_gates() -> None:
    for name in CPU_SCHEMES:
        assert scheme_support(name, CPU).ok
    assert set(CPU_SCHEMES) == {"int8_weight_only", "int8_dynamic", "fp8_weight_only"}
    gpu_only = scheme_support("fp8_dynamic", CPU)
    assert not gpu_only.ok and "CUDA GPUs only" in gpu_only.reason
    assert "int8_weight_only" in gpu_only.fix


def test_not_a_default_candidate_on_cpu() -> None:
    """Measured slower than eager on this project's CPUs (see docs/backends.md)."""
    names = [type(b).__name__ for b in honed.backend.default_backends(CPU)]
    assert "TorchAOBackend" not in names
    assert "TorchAOBackend" in [c.__name__ for c in honed.backend.builtin_backends()]


# -- availability with a missing or broken torchao -------------------------------------------
FAKE_CHECK = """
import sys
sys.path.insert(0, {fake!r})
import honed
from honed.backend import TorchAOBackend, TorchInductorBackend, ONNXRuntimeBackend
avail = TorchAOBackend.available()
print("AO", avail.ok, "|", avail.reason, "|", avail.fix)
print("INDUCTOR", bool(TorchInductorBackend.available()))
print("ORT", bool(ONNXRuntimeBackend.available()))
model = honed.Module(__import__("torch").nn.Linear(4, 2).eval(), "m")
report = honed.tune(
    model,
    [__import__("torch").randn(2, 4)],
    strategy=honed.OneBackendStrategy(TorchAOBackend()),
)
row = [c for g in report.graphs for c in g.candidates if not c.is_baseline][0]
print("ROW", row.status, "|", row.reason)
"""


def _fake_torchao(root: Path, version: str, body: str) -> None:
    (root / "torchao").mkdir()
    (root / "torchao" / "__init__.py").write_text(body)
    info = root / f"torchao-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchao\nVersion: {version}\n")


def _run_fake(root: Path) -> str:
    script = textwrap.dedent(FAKE_CHECK).format(fake=str(root))
    env = {**os.environ, "HONED_ISOLATION": "none", "HONED_CACHE": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.integration
def test_a_torchao_that_raises_on_import_makes_only_this_backend_unavailable(
    tmp_path: Path,
) -> None:
    _fake_torchao(
        tmp_path,
        "0.18.0",
        "raise AttributeError(\"module 'torch.utils._pytree' has no attribute "
        "'register_constant'\")\n",
    )
    out = _run_fake(tmp_path)
    line = next(x for x in out.splitlines() if x.startswith("AO"))
    assert line.startswith(
        f"AO False | torchao 0.18.0 fails to import with torch {torch.__version__}: "
        + REGISTER_CONSTANT_ERROR
    )
    assert "pip install --no-deps 'torchao==0.18.* (made for torch 2.11)'" in line
    assert "INDUCTOR True" in out and "ORT True" in out
    row = next(x for x in out.splitlines() if x.startswith("ROW"))
    assert row.startswith("ROW failed | unavailable: torchao 0.18.0 fails to import")


@pytest.mark.integration
def test_a_torchao_older_than_supported_is_not_imported(tmp_path: Path) -> None:
    _fake_torchao(tmp_path, "0.10.0", "raise SystemExit('imported a torchao known not to fit')\n")
    out = _run_fake(tmp_path)
    line = next(x for x in out.splitlines() if x.startswith("AO"))
    assert "AO False | torchao 0.10.0 is older than 0.13" in line
    assert "INDUCTOR True" in out


def test_available_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> None:
        raise RuntimeError("broken install")

    monkeypatch.setattr("honed.backend.torchao.torchao_available", boom)
    avail = honed.backend.availability(TorchAOBackend)
    assert not avail.ok and "broken install" in avail.reason


# -- CPU: build, check, tune, save, load ------------------------------------------------------
@needs_torchao
@pytest.mark.slow
@pytest.mark.parametrize("scheme", CPU_SCHEMES)
def test_cpu_scheme_builds_and_passes_its_gate(scheme: str) -> None:
    torch.manual_seed(0)
    model = Wide().eval()
    xs = batches(4, 4, dim=64, seed=2)
    backend = TorchAOBackend(TorchAOBackendConfig(scheme=scheme))
    fn = backend.build_graph(model, _samples(*xs), _graph(CPU))
    assert count_quantized(model) == 0  # the module itself is never quantized
    for x in xs:
        with torch.no_grad():
            ref, out = model(x), fn(x)
        check = compare(ref, out, tolerance=backend.tolerance())
        assert check.ok, check.reason
        assert out.dtype == ref.dtype
        assert 0.0 < check.max_abs_error  # quantized: not bit-equal
        assert check.min_cosine >= backend.tolerance().min_cosine


@needs_torchao
def test_a_module_without_linear_layers_fails_clearly() -> None:
    backend = TorchAOBackend(TorchAOBackendConfig(compile=False))
    with pytest.raises(honed.TuneError, match="no layer of ReLU was quantized"):
        backend.build_graph(nn.ReLU(), _samples(torch.randn(2, 4)), _graph(CPU))


@needs_torchao
def test_cpu_tune_reports_gpu_only_schemes_as_unavailable() -> None:
    model = honed.Module(TinyMLP().eval(), "tiny")
    backend = TorchAOBackend(TorchAOBackendConfig(scheme="fp8_dynamic"))
    report = honed.tune(model, batches(4), strategy=honed.OneBackendStrategy(backend))
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "failed"
    assert "unavailable: TorchAO scheme fp8_dynamic runs on CUDA GPUs only" in row.reason


@needs_torchao
@pytest.mark.slow
def test_tune_check_save_load_in_a_new_process(tmp_path: Path) -> None:
    backend = TorchAOBackend(TorchAOBackendConfig(scheme="int8_dynamic"))
    torch.manual_seed(0)
    model = honed.Module(Wide().eval(), "wide", strategy=honed.OneBackendStrategy(backend))
    report = honed.tune(model, batches(4, 8, dim=64))
    assert report.selected() == [backend.name], report.render()
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "ok" and row.cosine is not None and 0.995 <= row.cosine < 1.0

    inside = batches(6, dim=64, seed=1)[0]
    with torch.no_grad():
        tuned, eager = model(inside), model.module(inside)
    assert compare(eager, tuned, tolerance=backend.tolerance()).ok
    artifact = tmp_path / "ao.honed"
    honed.save(model, artifact)
    loaded = load_in_new_process(
        artifact,
        [inside],
        tmp_path,
        model="Wide().eval()",
        name="wide",
        prelude="from test_backend_torchao import Wide",
    )
    assert loaded.backend_name == backend.name
    (got,) = loaded.outputs
    # Same weights quantize to the same tensors: the loaded model matches the tuned one.
    torch.testing.assert_close(got, tuned, atol=1e-5, rtol=1e-5)
    assert compare(eager, got, tolerance=backend.tolerance()).ok


def test_int_mm_row_limit_is_explained_and_other_errors_pass_through() -> None:
    from honed.backend.torchao import _explain_int_mm

    def int_mm(x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= 16:
            raise RuntimeError("self.size(0) needs to be greater than 16, but got 16")
        if x.shape[1] != 8:
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
        return x

    fn = _explain_int_mm(int_mm)
    assert fn(torch.ones(17, 8)).shape == (17, 8)
    with pytest.raises(honed.TuneError, match=r"needs more than 16 rows .*got 16\); serve"):
        fn(torch.ones(16, 8))
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        fn(torch.ones(17, 7))


# -- GPU (the device) ------------------------------------------------------------------------
@needs_cuda
@needs_torchao
@pytest.mark.slow
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_gpu_scheme_runs_where_the_gpu_supports_it(scheme: str) -> None:
    device = torch.device("cuda")
    backend = TorchAOBackend(TorchAOBackendConfig(scheme=scheme))
    support = backend.supports(device)
    cc = torch.cuda.get_device_capability()
    if tuple(cc) < SCHEMES[scheme].min_cc:
        assert not support.ok and f"{cc[0]}.{cc[1]}" in support.reason
        pytest.skip(support.reason)
    assert support.ok, support.reason
    torch.manual_seed(0)
    model = Wide(256, 512).to(device).eval()
    xs = [torch.randn(b, 256, device=device) for b in (32, 64)]  # int8_dynamic: > 16 rows
    fn = backend.build_graph(model, _samples(*xs), _graph(device, dynamic=True))
    for x in xs:
        with torch.no_grad():
            ref, out = model(x), fn(x)
        check = compare(ref, out, tolerance=backend.tolerance())
        print(f"{scheme}: max abs {check.max_abs_error:.4g}, cosine {check.min_cosine:.6f}")
        assert check.ok, check.reason
        assert out.dtype == ref.dtype and out.device == ref.device


@needs_cuda
@needs_torchao
@pytest.mark.slow
def test_gpu_int8_dynamic_at_16_rows_fails_its_candidate_not_the_tune() -> None:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = honed.Module(Wide(256, 512).to(device).eval(), "wide-int8")
    data = [torch.randn(b, 256, device=device) for b in (8, 32)]
    backend = TorchAOBackend(TorchAOBackendConfig(scheme="int8_dynamic"))
    report = honed.tune(model, data, backends=[backend])
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "failed" and "needs more than 16 rows" in row.reason, row.reason
    with torch.no_grad():
        for x in data:
            torch.testing.assert_close(model(x), model.module(x))


@needs_cuda
@needs_torchao
@pytest.mark.slow
def test_gpu_fp8_tune_save_load(tmp_path: Path) -> None:
    device = torch.device("cuda")
    scheme = "fp8_dynamic" if scheme_support("fp8_dynamic", device) else "int8_weight_only"
    backend = TorchAOBackend(TorchAOBackendConfig(scheme=scheme))
    torch.manual_seed(0)
    model = honed.Module(
        Wide(256, 512).to(device).eval(), "wide-gpu", strategy=honed.OneBackendStrategy(backend)
    )
    data = [torch.randn(b, 256, device=device) for b in (16, 32)]
    report = honed.tune(model, data, device="cuda")
    assert report.selected() == [backend.name], report.render()
    x = torch.randn(24, 256, device=device)
    with torch.no_grad():
        tuned = model(x)
    honed.save(model, tmp_path / "ao-gpu.honed")
    fresh = honed.Module(Wide(256, 512).to(device).eval(), "wide-gpu")
    honed.load(fresh, tmp_path / "ao-gpu.honed")
    assert fresh.is_tuned
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), tuned, atol=1e-3, rtol=1e-3)
