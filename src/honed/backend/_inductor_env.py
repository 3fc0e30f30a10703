"""src/honed/backend/_inductor_env.py: what Inductor needs: TorchDynamo support, a C++ compiler.

Shared by the backends that compile with Inductor (torch.compile, AOTInductor, TorchAO).
"""

from __future__ import annotations

import os
import shutil

from honed.backend.base import Availability


def inductor_available() -> Availability:
    """torch.compile works with this Python and torch build."""
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
