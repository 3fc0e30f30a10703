"""src/honed/jit/history.py: the steps JIT tuning took, as readable strings with timings."""

from __future__ import annotations

import logging

log = logging.getLogger("honed.jit")

_STEPS: list[str] = []


def add(step: str, level: int = logging.INFO) -> None:
    """Append one step to the history and log it."""
    _STEPS.append(step)
    log.log(level, "honed.jit: %s", step)


def history() -> list[str]:
    """Every step JIT tuning took in this process, oldest first."""
    return list(_STEPS)


def clear() -> None:
    _STEPS.clear()


__all__ = ["add", "clear", "history"]
