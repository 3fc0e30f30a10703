"""bench/provenance.py: the commit a benchmark ran from, for the JSON of every bench script."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def commit() -> str:
    """HONED_COMMIT when set (the device's copy of the tree has no .git of its own), else git."""
    named = os.environ.get("HONED_COMMIT")
    if named:
        return named
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out or "unknown"
