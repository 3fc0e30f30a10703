"""src/_honed_jit_hook.py: HONED_JIT=1 start-up hook: enable JIT tuning once torch is imported.

``honed_jit.pth`` imports this module only when HONED_JIT is set, and ``install()`` does not
import honed or torch: it puts a finder on ``sys.meta_path`` that waits for ``import torch`` and,
once torch has finished importing, enables JIT tuning. Every Python process inherits HONED_JIT=1
from the shell, including the short helper processes torch itself spawns (Inductor probes the
CPU's vector ISA in ten ``python -c`` children that deliberately never import torch): those must
not pay for importing honed and torch, which an eager import here made cost ~2 s each.

A top-level module installed beside the .pth; it imports only ``sys`` (importlib.abc and typing
would add ~25 ms to every Python start with HONED_JIT=1: bench/jit_restart.py measures it).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any


def _enable() -> None:
    try:
        import honed.jit

        honed.jit._autoload()
    except Exception as e:  # a broken honed must not break the user's ``import torch``
        print(f"honed: HONED_JIT=1 but JIT tuning could not start: {e!r}", file=sys.stderr)


class _AfterTorchImport:
    """Finds ``torch`` through the other finders and runs ``_enable`` after it has executed."""

    def find_spec(
        self, name: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != "torch":
            return None
        uninstall()
        for finder in sys.meta_path:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                break
        else:
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _enable()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _AfterTorchImport()


def install() -> None:
    """Enable JIT now if torch is already imported, else as soon as it is."""
    if "torch" in sys.modules:
        _enable()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
