"""tests/test_core_errors.py: engine errors reach Python as honed.errors classes, translated once
(cpp/bindings/bind_errors.cpp); Python errors raised inside callbacks pass through unchanged."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import torch

import honed
from honed import _core
from honed.backend import TorchEagerBackend


def test_bad_dynamic_shapes_through_tune_is_an_input_error() -> None:
    model = honed.Module(torch.nn.Linear(4, 4).eval(), "m", dynamic_shapes=[{5: honed.BatchDim()}])
    data = [torch.randn(2, 4), torch.randn(3, 4)]
    with pytest.raises(honed.InputError, match="input 0 has rank 2") as caught:
        honed.tune(model, data, strategy=honed.OneBackendStrategy(TorchEagerBackend()))
    assert isinstance(caught.value, honed.HonedError) and isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "call",
    [
        lambda: _core.batch_indices(0, 2),  # std::invalid_argument in the engine
        lambda: _core.GraphProfile.from_json("{}"),  # a parse failure rethrown as one
        lambda: _core.InjectedTimer([]),
        # thrown by the bindings themselves, not the engine
        lambda: _core.infer_profile([_core.signature((torch.zeros(2, 3),), {})], [1]),
    ],
)
def test_bad_values_are_input_errors(call: object) -> None:
    with pytest.raises(honed.InputError):
        call()  # type: ignore[operator]


def test_engine_failures_are_engine_errors() -> None:
    ok, why = _core.cuda_timer_available()
    if ok:
        pytest.skip(f"CUDA available: {why}")
    with pytest.raises(honed.EngineError, match="CudaEventTimer") as caught:
        _core.CudaEventTimer(0)
    assert isinstance(caught.value, RuntimeError)


def test_artifact_errors_are_the_honed_classes(tmp_path: Path) -> None:
    assert _core.ArtifactError is honed.ArtifactError
    assert _core.IncompatibleArtifactError is honed.IncompatibleArtifactError
    assert _core.UntrustedArtifactError is honed.UntrustedArtifactError
    bad = tmp_path / "bad.honed"
    bad.write_bytes(b"not a zip")
    with pytest.raises(honed.ArtifactError):
        _core.read_artifact(str(bad))


def test_python_errors_in_callbacks_pass_through() -> None:
    with pytest.raises(ZeroDivisionError):
        _core.interleaved([lambda: None, lambda: 1 / 0], _core.InjectedTimer([1.0]), 2, 2)


def test_core_is_not_public_but_importable() -> None:
    assert "_core" not in honed.__all__
    assert all(hasattr(honed, name) for name in honed.__all__)
    assert importlib.import_module("honed._core").__version__ == _core.__version__
