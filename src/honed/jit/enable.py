"""src/honed/jit/enable.py: ``import honed.jit.enable`` turns JIT tuning on for the whole process."""

from __future__ import annotations

from honed.jit.patcher import enable

enable()

