"""src/honed/backend/registry.py: the built-in backends and the default candidate list."""

from __future__ import annotations

import torch

from honed.backend.base import Availability, Backend
from honed.backend.cuda_graphs import CudaGraphsBackend, CudaGraphsBackendConfig
from honed.backend.onnxruntime import ONNXRuntimeBackend
from honed.backend.tensorrt import TensorRTBackend
from honed.backend.torch_eager import TorchEagerBackend
from honed.backend.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig
from honed.backend.torch_inductor_aot import TorchInductorAotBackend
from honed.backend.torch_tensorrt import TorchTensorRTAotBackend, TorchTensorRTJitBackend
from honed.backend.torchao import TorchAOBackend


def builtin_backends() -> list[type[Backend]]:
    """Every backend class honed ships, available here or not."""
    return [
        TorchEagerBackend,
        TorchInductorBackend,
        TorchInductorAotBackend,
        CudaGraphsBackend,
        ONNXRuntimeBackend,
        TorchAOBackend,
        TensorRTBackend,
        TorchTensorRTJitBackend,
        TorchTensorRTAotBackend,
    ]


def available_backends() -> dict[str, Availability]:
    """Backend name -> availability (with the reason and fix when unavailable)."""
    return {cls.__name__: cls.available() for cls in builtin_backends()}


def default_backends(device: torch.device) -> list[Backend]:
    """Every available backend with sensible configs for ``device`` (eager is the baseline).

    CPU: Inductor (dynamic as the profile needs, and specialized per shape), AOTInductor and
    ONNX Runtime (CPU provider).
    CUDA: Inductor's modes (default, max-autotune without CUDA graphs, reduce-overhead), the
    same with bf16 autocast where it passes the correctness gate, CUDA graphs over eager (fp32
    and bf16), and AOTInductor.
    """
    inductor = TorchInductorBackendConfig
    candidates: list[Backend]
    if device.type == "cuda":
        bf16 = torch.bfloat16
        candidates = [
            TorchInductorBackend(inductor()),
            TorchInductorBackend(inductor(mode="max-autotune-no-cudagraphs")),
            TorchInductorBackend(inductor(mode="reduce-overhead")),
            TorchInductorBackend(
                inductor(
                    mode="max-autotune-no-cudagraphs", autocast_enabled=True, autocast_dtype=bf16
                )
            ),
            TorchInductorBackend(
                inductor(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=bf16)
            ),
            CudaGraphsBackend(),
            CudaGraphsBackend(CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=bf16)),
            TorchInductorAotBackend(),
        ]
    else:
        candidates = [
            TorchInductorBackend(inductor()),
            TorchInductorBackend(inductor(dynamic=False)),
            TorchInductorAotBackend(),
            ONNXRuntimeBackend(),
        ]
    return [b for b in candidates if type(b).available()]
