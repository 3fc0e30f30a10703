"""tests/test_end_to_end.py: every CPU backend: tune, check, save, load in a new process, serve.

The model has a dynamic batch axis (recorded at 2, 4 and 8): a batch inside the profile that was
never recorded (5) takes the tuned path; one outside it (32) runs eager with a warning; both
match eager.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
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

from conftest import TinyMLP, batches

CASES: dict[str, Backend] = {
    "eager": TorchEagerBackend(),
    "eager-bf16": TorchEagerBackend(
        TorchEagerBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
    ),
    "inductor": TorchInductorBackend(),
    "aot-inductor": TorchInductorAotBackend(),
}

LOADER = """
import sys, torch
sys.path.insert(0, {tests!r})
import honed
from conftest import TinyMLP
model = honed.Module(TinyMLP().eval(), "tiny")
honed.load(model, {artifact!r})
assert model.is_tuned, "no variant was installed"
x = torch.load({inputs!r})
torch.save([model(t) for t in x], {outputs!r})
print("BACKEND", type(model.variants[0].backend).__name__)
"""


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
    honed.save(model, artifact)
    torch.save([inside, outside], tmp_path / "x.pt")
    script = textwrap.dedent(LOADER).format(
        tests=str(Path(__file__).parent),
        artifact=str(artifact),
        inputs=str(tmp_path / "x.pt"),
        outputs=str(tmp_path / "y.pt"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"BACKEND {type(backend).__name__}" in proc.stdout
    got_inside, got_outside = torch.load(tmp_path / "y.pt")
    torch.testing.assert_close(got_inside, model(inside))
    torch.testing.assert_close(got_outside, model.module(outside))
