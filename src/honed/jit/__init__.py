"""src/honed/jit/__init__.py: JIT mode: discover modules as they run and tune them, top down.

import honed.jit.enable            # or HONED_JIT=1, or @honed.jit.patch_for_jit_tuning
honed.jit.config.min_samples = 2   # settings (defaults from the HONED_JIT_* variables)
honed.jit.print_hierarchy()        # what was found and what became of it
honed.jit.history()                # the steps taken, with timings
honed.jit.tunes()                  # each tune: tried, won, on which evidence, how long, meanwhile
honed.jit.wait()                   # block until the tuning beside the program is done

Checks and tunes run beside the program (background.py): calls never wait for them, unless
``honed.jit.config.wait`` (HONED_JIT_WAIT=1) asks for it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from honed import config as _flags
from honed.jit import early
from honed.jit.background import TuneRecord, wait
from honed.jit.background import records as tunes
from honed.jit.config import JitConfig, config
from honed.jit.hierarchy import Node, State, render
from honed.jit.history import history
from honed.jit.patcher import STATE, opt_in, paused, reset, roots
from honed.jit.patcher import disable as disable_jit_tuning
from honed.jit.patcher import enable as enable_jit_tuning

F = TypeVar("F", bound=Callable[..., Any])


def patch_for_jit_tuning(func: F) -> F:
    """Enable JIT tuning while ``func`` runs, and for the models it returns from then on.

    As in the seed, the decorated function may only build the model: the modules it returns
    (or holds in what it returns) are tuned when they are called later, while the rest of the
    program stays untouched.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        was_enabled = STATE.enabled
        enable_jit_tuning()
        try:
            result = func(*args, **kwargs)
        finally:
            if not was_enabled:
                opted = list(STATE.opted_in)
                disable_jit_tuning()
                for module in opted:
                    opt_in(module)
        if not was_enabled:
            opt_in(result)
        return result

    return cast(F, wrapper)


def hierarchy() -> str:
    """The discovered modules as the seed's tree printout."""
    return render(roots())


def print_hierarchy() -> None:
    """Print the tree of discovered modules with their states, backends and call counts."""
    print(hierarchy())


def states() -> dict[str, str]:
    """A flat view for scripts and tests: 'Name@level#n' -> state name, in discovery order."""
    out: dict[str, str] = {}

    def visit(node: Node, path: str) -> None:
        out[path] = node.state.name
        for i, child in enumerate(node.children):
            visit(child, f"{path}/{child.name}#{i}")

    for i, root in enumerate(roots()):
        visit(root, f"{root.name}#{i}")
    return out


def _autoload() -> None:
    """What the HONED_JIT=1 start-up hook calls: enable JIT when honed.config.jit says so, and
    start its workers while the program starts (honed.jit.early)."""
    if _flags.jit:
        enable_jit_tuning()
        early.start()


__all__ = [
    "JitConfig",
    "Node",
    "State",
    "TuneRecord",
    "config",
    "disable_jit_tuning",
    "enable_jit_tuning",
    "hierarchy",
    "history",
    "patch_for_jit_tuning",
    "paused",
    "print_hierarchy",
    "reset",
    "roots",
    "states",
    "tunes",
    "wait",
]
