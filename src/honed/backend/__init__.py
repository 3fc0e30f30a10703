"""src/honed/backend: one file per backend and a small registry of the built-in ones.

Nothing heavy is imported here: a backend imports its library inside ``build``/``available``.
"""

from __future__ import annotations

from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    backend_from_recipe,
)
from honed.backend.cuda_graphs import CudaGraphsBackend, CudaGraphsBackendConfig
from honed.backend.onnxruntime import ONNXRuntimeBackend, ONNXRuntimeBackendConfig
from honed.backend.registry import available_backends, builtin_backends, default_backends
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
    "available_backends",
    "backend_from_recipe",
    "builtin_backends",
    "default_backends",
]
