"""tests/test_core_stub.py: the committed type stub of honed._core is what the bindings generate
(`make stub` regenerates it; `make lint` runs the same check as `make stub-check`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import honed

STUB = Path(honed.__file__).parent / "_core.pyi"


def test_committed_stub_matches_the_bindings(tmp_path: Path) -> None:
    fresh = tmp_path / "_core.pyi"
    subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "honed._core", "-o", str(fresh)],
        check=True,
        timeout=120,
    )
    assert fresh.read_text() == STUB.read_text(), "src/honed/_core.pyi is stale: run make stub"


def test_stub_names_the_honed_errors() -> None:
    text = STUB.read_text()
    assert "from honed.errors import" in text and "class GraphProfile" in text
