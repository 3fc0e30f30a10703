"""src/honed/jit/disable.py: ``import honed.jit.disable`` turns JIT tuning off again."""

from __future__ import annotations

from honed.jit.patcher import disable

disable()
