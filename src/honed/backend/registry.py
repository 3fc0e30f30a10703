"""src/honed/backend/registry.py: backend names -> classes, loaded on first lookup; the defaults.

A dict from names to backend classes. Built-in backends are named here with the module that
defines them and imported the first time one is looked up, so ``import honed`` loads none of
them. Other packages add backends through the ``honed.backends`` entry-point group (loaded on
the first lookup of a name honed does not know, or when every backend is listed), and code can
call ``register_backend``. A name is taken once: a second backend of the same name is refused,
so a user's class named like a built-in never replaces it.

``availability(cls)`` is the one place a backend's ``available()`` is asked; whatever it
raises becomes an "unavailable: <error>" verdict there.

A plugin package declares its backends in its packaging metadata, e.g. in pyproject.toml::

    [project.entry-points."honed.backends"]
    MyBackend = "my_package.honed_backend:MyBackend"
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from honed.backend.base import Availability, Backend
from honed.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from honed.backend.base import GraphInfo

log = logging.getLogger("honed")

ENTRY_POINT_GROUP = "honed.backends"

# Built-in backend name -> the module that defines it (imported on first lookup).
_BUILTIN: dict[str, str] = {
    "TorchEagerBackend": "honed.backend.torch_eager",
    "TorchInductorBackend": "honed.backend.torch_inductor",
    "TorchInductorAotBackend": "honed.backend.torch_inductor_aot",
    "CudaGraphsBackend": "honed.backend.cuda_graphs",
    "ONNXRuntimeBackend": "honed.backend.onnxruntime",
    "TorchAOBackend": "honed.backend.torchao",
    "TensorRTBackend": "honed.backend.tensorrt",
    "TorchTensorRTJitBackend": "honed.backend.torch_tensorrt",
    "TorchTensorRTAotBackend": "honed.backend.torch_tensorrt",
}
_LOADED: dict[str, type[Backend]] = {}  # every name looked up or registered so far
_PLUGIN_ERRORS: dict[str, str] = {}  # entry-point name -> why it could not be loaded
_plugins_scanned = False

B = TypeVar("B", bound=type[Backend])


def register_backend(cls: B | None = None, *, name: str | None = None) -> Any:
    """Register a backend class under ``name`` (default: its class name); usable as a decorator.

    A name is taken once: registering a second backend under a taken name (a built-in's
    included) raises ConfigError.
    """

    def add(backend: B) -> B:
        _add(name or backend.__name__, backend, f"{backend.__module__}.{backend.__qualname__}")
        return backend

    return add(cls) if cls is not None else add


def _add(name: str, cls: Any, origin: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise ConfigError(
            f"backend {name!r} ({origin}) is {cls!r}, not a subclass of honed.backend.Backend"
        )
    taken = _LOADED.get(name)
    if taken is cls:
        return
    if taken is not None or name in _BUILTIN:
        holder = f"{taken.__module__}.{taken.__qualname__}" if taken else _BUILTIN[name]
        raise ConfigError(
            f"a backend named {name!r} is registered already (by {holder}); {origin} cannot "
            "take its name: register it under another one (register_backend(cls, name=...))"
        )
    _LOADED[name] = cls


def lookup_backend(name: str) -> type[Backend]:
    """The backend class registered as ``name``; built-ins and plugins load on first lookup."""
    found = find_backend(name)
    if found is None:
        raise ConfigError(f"no backend named {name!r}; known: {', '.join(list_backends())}")
    return found


def find_backend(name: str) -> type[Backend] | None:
    if name in _LOADED:
        return _LOADED[name]
    if name in _BUILTIN:
        cls: type[Backend] = getattr(importlib.import_module(_BUILTIN[name]), name)
        _LOADED[name] = cls
        return cls
    _scan_plugins()
    return _LOADED.get(name)


def _scan_plugins() -> None:
    """Register the ``honed.backends`` entry points, once per process."""
    global _plugins_scanned
    if _plugins_scanned:
        return
    _plugins_scanned = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            _add(ep.name, ep.load(), f"the {ENTRY_POINT_GROUP} entry point {ep.value}")
        except Exception as e:  # a broken plugin must not take honed down
            _PLUGIN_ERRORS[ep.name] = f"{type(e).__name__}: {e}"
            log.error("honed: backend plugin %r (%s) is not loaded: %s", ep.name, ep.value, e)


def registered_name(cls: type[Backend]) -> str | None:
    """The name ``cls`` is registered under, or None (without loading anything)."""
    for name, loaded in _LOADED.items():
        if loaded is cls:
            return name
    if _BUILTIN.get(cls.__name__) == cls.__module__:
        return cls.__name__
    return None


def list_backends() -> list[str]:
    """Every backend name: the built-ins, then registered ones and plugins."""
    _scan_plugins()
    return list(_BUILTIN) + sorted(n for n in _LOADED if n not in _BUILTIN)


def builtin_backends() -> list[type[Backend]]:
    """Every backend class honed ships, available here or not."""
    return [lookup_backend(name) for name in _BUILTIN]


# How deep this thread is in installed_only blocks (they may nest).
_NO_IMPORTS = threading.local()


@contextlib.contextmanager
def installed_only() -> Iterator[None]:
    """In this block, on this thread, a backend whose ``requires`` libraries are not imported yet
    is available when they are installed (found on the path, not imported); its ``available()``
    runs in the process that builds it.

    JIT lists its candidates in the program's process, beside the program's calls: importing
    onnxruntime, onnxscript or torchao there is hundreds of ms of imports and extension loading
    that hold the GIL. Its candidates are built in workers, which check fully: a library that
    fails to import fails that candidate there, and the tune goes on without it.
    """
    _NO_IMPORTS.depth = getattr(_NO_IMPORTS, "depth", 0) + 1
    try:
        yield
    finally:
        _NO_IMPORTS.depth -= 1


def imports_deferred() -> bool:
    """Whether this thread is in an ``installed_only`` block: a check that would import a large
    part of torch (TorchDynamo, for the backends that compile) leaves it to the worker."""
    return getattr(_NO_IMPORTS, "depth", 0) > 0


def availability(cls: type[Backend]) -> Availability:
    """``cls.available()``; an exception inside it is an unavailable verdict naming the error
    (reported as "unavailable: <error>"), never a crash."""
    if cls.requires and imports_deferred():
        missing = [
            name
            for name in cls.requires
            if name not in sys.modules and importlib.util.find_spec(name) is None
        ]
        if missing:
            return Availability(False, f"{', '.join(missing)} is not installed")
        if any(name not in sys.modules for name in cls.requires):
            return Availability(True)
    try:
        verdict = cls.available()
    except Exception as e:
        log.debug("honed: %s.available() raised", cls.__name__, exc_info=True)
        return Availability(
            False,
            f"{cls.__name__}.available() raised {type(e).__name__}: {e}",
            "report this as a bug in the backend",
        )
    if not isinstance(verdict, Availability):
        return Availability(
            False,
            f"{cls.__name__}.available() returned {verdict!r}, not an Availability",
            "report this as a bug in the backend",
        )
    return verdict


def available_backends() -> dict[str, Availability]:
    """Backend name -> availability (with the reason and fix when unavailable)."""
    out: dict[str, Availability] = {}
    for name in list_backends():
        try:
            out[name] = availability(lookup_backend(name))
        except Exception as e:  # a built-in module that fails to import
            out[name] = Availability(False, f"{name} cannot be imported: {type(e).__name__}: {e}")
    for name, error in _PLUGIN_ERRORS.items():
        out.setdefault(name, Availability(False, f"the plugin failed to load: {error}"))
    return out


def default_backends(device: torch.device, graph: GraphInfo | None = None) -> list[Backend]:
    """Every available backend with configs likely to win on ``device`` (eager is the baseline).

    ``graph`` (what the tuner knows of the graph) lets the list fit the module: image models
    (a 4-D tensor input) also get channels_last candidates. See ``_defaults.py``.
    """
    from honed.backend._defaults import default_candidates

    return [b for b in default_candidates(device, graph) if availability(type(b))]
