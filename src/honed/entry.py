"""src/honed/entry.py: command-line entry points: ``pkg.module:function`` or ``file.py:function``.

The function takes no arguments and returns ``(model, dataset)`` or ``(model, dataset, kwargs)``
where kwargs are extra keyword arguments for ``honed.tune`` (e.g. ``batch_sizes``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from honed.errors import EntryPointError

FORMS = "pkg.module:function or path/to/file.py:function"


@dataclasses.dataclass
class Entry:
    """What an entry point returned."""

    name: str  # the function's name: the default module and artifact name
    model: Any
    dataset: Any
    tune_kwargs: dict[str, Any]


def _import(target: str) -> ModuleType:
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = Path(target)
        if not path.is_file():
            raise EntryPointError(f"entry point file {target} does not exist")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise EntryPointError(f"cannot load {target} as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)  # so classes defined there pickle by name
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        raise EntryPointError(
            f"cannot import module {target} ({e}); give {FORMS}, with the module on PYTHONPATH"
        ) from e


def find(entry: str) -> Callable[..., Any]:
    """The function an entry point names."""
    target, sep, func = entry.rpartition(":")
    if not sep or not target or not func:
        raise EntryPointError(f"entry point {entry!r} must look like {FORMS}")
    module = _import(target)
    fn = getattr(module, func, None)
    if fn is None:
        raise EntryPointError(f"module {target} has no function {func}")
    if not callable(fn):
        raise EntryPointError(f"{target}:{func} is a {type(fn).__name__}, not a function")
    return cast(Callable[..., Any], fn)


def load(entry: str) -> Entry:
    """Call the entry point and check that it returned (model, dataset[, tune kwargs])."""
    fn = find(entry)
    func = entry.rpartition(":")[2]
    try:
        inspect.signature(fn).bind()
    except TypeError as e:
        raise EntryPointError(f"{func} must be callable with no arguments ({e})") from e
    except ValueError:
        pass  # no signature to read (a builtin): just call it
    result = fn()
    usage = f"{func} must return (model, dataset) or (model, dataset, kwargs_for_tune)"
    if not isinstance(result, tuple | list) or len(result) not in (2, 3):
        raise EntryPointError(f"{usage}, got {_describe(result)}")
    model, dataset = result[0], result[1]
    kwargs = result[2] if len(result) == 3 else {}
    if not callable(model):
        raise EntryPointError(f"{usage}; its model is a {type(model).__name__}, not callable")
    if not isinstance(kwargs, dict):
        raise EntryPointError(f"{usage}; its kwargs_for_tune is a {type(kwargs).__name__}")
    return Entry(func, model, dataset, dict(kwargs))


def _describe(value: Any) -> str:
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"
