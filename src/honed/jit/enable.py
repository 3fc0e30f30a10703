"""src/honed/jit/enable.py: ``import honed.jit.enable`` turns JIT tuning on, process-wide, and
starts its workers while the program starts (honed.jit.early)."""

from __future__ import annotations

from honed.jit import early
from honed.jit.patcher import enable

enable()
early.start()
