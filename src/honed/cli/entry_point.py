"""src/honed/cli/entry_point.py: entry points: ``pkg.module:function`` or ``file.py:function``.

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
        return _import_file(Path(target))
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and target.split(".")[0] == e.name.split(".")[0]:
            raise EntryPointError(
                f"cannot import module {target} ({e}); give {FORMS}, with the module on PYTHONPATH"
            ) from e
        raise _import_failed(target, e) from e
    except Exception as e:
        raise _import_failed(target, e) from e


def _import_file(path: Path) -> ModuleType:
    """Import ``path`` as ``python path`` runs it: its folder first on sys.path, so the modules
    beside it import (and worker processes, which get this sys.path, find them too)."""
    if not path.is_file():
        raise EntryPointError(f"entry point file {path} does not exist")
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise EntryPointError(f"cannot load {path} as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(path.stem, module)  # so classes defined there pickle by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        if sys.modules.get(path.stem) is module:
            del sys.modules[path.stem]
        raise _import_failed(str(path), e) from e
    return module


def _import_failed(target: str, error: BaseException) -> EntryPointError:
    """One line for an entry point whose import raised (a syntax error, a missing package...)."""
    if isinstance(error, SyntaxError):
        where = f"{error.filename or target}, line {error.lineno}"
        return EntryPointError(
            f"{target} has a syntax error ({where}: {error.msg}); fix it and run again"
        )
    return EntryPointError(
        f"importing {target} raised {_one_line(error)}{_where(error)}; fix it, or run with "
        "--traceback for the full stack"
    )


def _one_line(error: BaseException) -> str:
    first = (str(error).strip().splitlines() or [""])[0]
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _where(error: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost frame outside honed (the user's code), if any."""
    tb = error.__traceback__
    where = ""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if (
            "importlib" not in filename
            and f"{Path('honed') / 'cli' / 'entry_point.py'}" not in filename
        ):
            where = f" at {filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


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
    try:
        result = fn()
    except Exception as e:
        raise EntryPointError(
            f"{entry} raised {_one_line(e)}{_where(e)}; fix it, or run with --traceback for the "
            "full stack"
        ) from e
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
