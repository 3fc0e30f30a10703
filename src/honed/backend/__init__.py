"""src/honed/backend: one file per backend and a small registry (see registry.py).

Nothing heavy is imported here: a backend's module is imported the first time one of its names
is used (``honed.backend.TorchInductorBackend``), and a backend imports its library inside
``build``/``available``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    backend_from_recipe,
)
from honed.backend.registry import (
    availability,
    available_backends,
    builtin_backends,
    default_backends,
    list_backends,
    lookup_backend,
    register_backend,
)

if TYPE_CHECKING:
    from honed.backend.cuda_graphs import CudaGraphsBackend, CudaGraphsBackendConfig
    from honed.backend.onnxruntime import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
    from honed.backend.tensorrt import TensorRTBackend, TensorRTBackendConfig
    from honed.backend.torch_eager import TorchEagerBackend, TorchEagerBackendConfig
    from honed.backend.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig
    from honed.backend.torch_inductor_aot import (
        TorchInductorAotBackend,
        TorchInductorAotBackendConfig,
    )
    from honed.backend.torch_tensorrt import (
        TorchTensorRTAotBackend,
        TorchTensorRTAotBackendConfig,
        TorchTensorRTJitBackend,
        TorchTensorRTJitBackendConfig,
    )
    from honed.backend.torchao import TorchAOBackend, TorchAOBackendConfig

# Public name -> the module that defines it, imported on first use.
_LAZY = {
    "CudaGraphsBackend": "cuda_graphs",
    "CudaGraphsBackendConfig": "cuda_graphs",
    "ONNXRuntimeBackend": "onnxruntime",
    "ONNXRuntimeBackendConfig": "onnxruntime",
    "TensorRTBackend": "tensorrt",
    "TensorRTBackendConfig": "tensorrt",
    "TorchAOBackend": "torchao",
    "TorchAOBackendConfig": "torchao",
    "TorchEagerBackend": "torch_eager",
    "TorchEagerBackendConfig": "torch_eager",
    "TorchInductorAotBackend": "torch_inductor_aot",
    "TorchInductorAotBackendConfig": "torch_inductor_aot",
    "TorchInductorBackend": "torch_inductor",
    "TorchInductorBackendConfig": "torch_inductor",
    "TorchTensorRTAotBackend": "torch_tensorrt",
    "TorchTensorRTAotBackendConfig": "torch_tensorrt",
    "TorchTensorRTJitBackend": "torch_tensorrt",
    "TorchTensorRTJitBackendConfig": "torch_tensorrt",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'honed.backend' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"honed.backend.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Availability",
    "Backend",
    "BackendConfig",
    "CudaGraphsBackend",
    "CudaGraphsBackendConfig",
    "GraphInfo",
    "ONNXRuntimeBackend",
    "ONNXRuntimeBackendConfig",
    "Sample",
    "TensorRTBackend",
    "TensorRTBackendConfig",
    "TorchAOBackend",
    "TorchAOBackendConfig",
    "TorchEagerBackend",
    "TorchEagerBackendConfig",
    "TorchInductorAotBackend",
    "TorchInductorAotBackendConfig",
    "TorchInductorBackend",
    "TorchInductorBackendConfig",
    "TorchTensorRTAotBackend",
    "TorchTensorRTAotBackendConfig",
    "TorchTensorRTJitBackend",
    "TorchTensorRTJitBackendConfig",
    "availability",
    "available_backends",
    "backend_from_recipe",
    "builtin_backends",
    "default_backends",
    "list_backends",
    "lookup_backend",
    "register_backend",
]
