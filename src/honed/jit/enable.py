"""src/honed/jit/enable.py: ``import honed.jit.enable`` turns JIT tuning on, process-wide."""

from __future__ import annotations

from honed.jit.patcher import enable

enable()
