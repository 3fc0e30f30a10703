"""tests/test_end_to_end.py: every CPU backend: tune, check, save, load in a new process, serve.

The model has a dynamic batch axis (recorded at 2, 4 and 8): a batch inside the profile that was
never recorded (5) takes the tuned path; one outside it (32) runs eager with a warning; both
match eager.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import honed
from honed.backend import (
    Backend,
    TorchEagerBackend,
    TorchEagerBackendConfig,
    TorchInductorAotBackend,
    TorchInductorBackend,
)

from conftest import TinyMLP, batches, load_in_new_process

pytestmark = pytest.mark.integration  # real compiles, then a new process loads the artifact

CASES: dict[str, Backend] = {
    "eager": TorchEagerBackend(),
    "eager-bf16": TorchEagerBackend(
        TorchEagerBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
    ),
    "inductor": TorchInductorBackend(),
    "aot-inductor": TorchInductorAotBackend(),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tune_save_load_in_a_new_process_and_serve(
    case: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = CASES[case]
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny", strategy=honed.OneBackendStrategy(backend))
    report = honed.tune(model, batches(2, 4, 8))
    assert report.selected() == [backend.name], report.render()
    reduced = case.endswith("bf16")
    tol = {"atol": 3e-2, "rtol": 3e-2} if reduced else {}

    inside, outside = batches(5, seed=1)[0], batches(32, seed=2)[0]
    torch.testing.assert_close(model(inside), model.module(inside), **tol)
    with caplog.at_level(logging.WARNING, logger="honed"):
        torch.testing.assert_close(model(outside), model.module(outside))
    assert "outside its tuned profile" in caplog.text

    artifact = tmp_path / f"{case}.honed"
    honed.trust.keygen()  # signed and trusted: native payloads (AOTInductor) load (docs/trust.md)
    honed.save(model, artifact)
    loaded = load_in_new_process(artifact, [inside, outside], tmp_path)
    assert loaded.backend_class == type(backend).__name__
    got_inside, got_outside = loaded.outputs
    torch.testing.assert_close(got_inside, model(inside))
    torch.testing.assert_close(got_outside, model.module(outside))
