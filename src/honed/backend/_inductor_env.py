"""src/honed/backend/_inductor_env.py: what Inductor needs: TorchDynamo support, a C++ compiler.

Shared by the backends that compile with Inductor (torch.compile, AOTInductor, TorchAO).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import sys
from typing import Any

from honed.backend.base import Availability


def inductor_available() -> Availability:
    """torch.compile works with this Python and torch build.

    Asking imports TorchDynamo, and with it sympy, torch.fx, torch.distributed and torch.onnx:
    seconds of imports holding the GIL. Where imports are deferred (JIT listing its candidates
    in the program's process, beside its calls) and nothing has imported it yet, the worker
    that builds the candidate asks instead; a torch.compile that cannot work fails it there."""
    if left_to_the_worker("torch._dynamo"):
        return Availability(True)
    try:
        from torch._dynamo.eval_frame import is_dynamo_supported
    except Exception as e:  # an import failure is a reason, not a crash
        return Availability(False, f"torch._dynamo cannot be imported: {e}", "reinstall torch")
    try:
        supported = bool(is_dynamo_supported())
    except Exception as e:
        return Availability(
            False, f"torch.compile is not supported here: {e}", "use a supported Python/torch"
        )
    if not supported:
        return Availability(
            False, "torch.compile does not support this Python/torch", "use a supported Python"
        )
    return Availability(True)


def inductor_cache_dir() -> str:
    """Inductor's cache folder as Inductor finds it (made if missing, and set in
    TORCHINDUCTOR_CACHE_DIR for this process's children), without importing Inductor where
    nothing has: its package imports TorchDynamo, seconds of imports holding the GIL beside a
    JIT program's calls. Inductor keeps this function in a file of its own that needs no torch
    import but one; that file is loaded by itself."""
    if "torch._inductor" not in sys.modules:
        light = _cache_dir_utils()
        if light is not None:
            return str(light.cache_dir())
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()


@functools.cache
def _cache_dir_utils() -> Any:
    """torch/_inductor/runtime/cache_dir_utils.py loaded on its own, or None where it is not."""
    try:
        package = importlib.util.find_spec("torch._inductor")  # found, not imported
        folders = list(package.submodule_search_locations or []) if package else []
        path = os.path.join(folders[0], "runtime", "cache_dir_utils.py") if folders else ""
        spec = importlib.util.spec_from_file_location("_honed_inductor_cache_dir", path)
        if not (path and os.path.isfile(path) and spec is not None and spec.loader is not None):
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:  # any other layout: Inductor's own import path
        return None
    return module if callable(getattr(module, "cache_dir", None)) else None


def left_to_the_worker(module: str) -> bool:
    """Whether an availability check that needs ``module`` leaves it to the worker that builds
    the candidate: imports are deferred on this thread (``registry.installed_only``) and nothing
    has imported ``module`` yet."""
    from honed.backend.registry import imports_deferred

    return imports_deferred() and module not in sys.modules


def cpu_compiler() -> str | None:
    """The C++ compiler Inductor's CPU code would use: $CXX, else the first one on PATH."""
    for cxx in (os.environ.get("CXX", ""), "g++", "c++", "clang++"):
        if cxx and shutil.which(cxx):
            return cxx
    return None


def cpu_available() -> Availability:
    """Inductor's CPU kernels are C++: a compiler must be on PATH."""
    if cpu_compiler() is None:
        return Availability(
            False,
            "Inductor generates C++ for CPU and no C++ compiler was found",
            "install one (apt-get install g++) or set CXX",
        )
    return Availability(True)
