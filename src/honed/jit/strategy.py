"""src/honed/jit/strategy.py: the candidates JIT tries when none are named."""

from __future__ import annotations

import torch

from honed.backend.base import Backend, GraphInfo
from honed.backend.cuda_graphs import CudaGraphsBackend
from honed.backend.registry import installed_only
from honed.backend.torch_inductor import TorchInductorBackend
from honed.tune_strategy import MaxThroughputStrategy


def captures_cuda_graphs(backend: Backend) -> bool:
    """Whether installing ``backend``'s variant captures CUDA graphs in this process: CUDA
    graphs over eager, and Inductor's modes with CUDA graphs (reduce-overhead, max-autotune)."""
    if isinstance(backend, CudaGraphsBackend):
        return True
    if isinstance(backend, TorchInductorBackend):
        return backend.config.mode in ("reduce-overhead", "max-autotune")
    return False


class JitDefaultStrategy(MaxThroughputStrategy):
    """honed's default candidates, less those whose install captures CUDA graphs.

    JIT installs a winner on its own thread while the program keeps running CUDA work on its
    thread: on the H100 the BERT script of issue 23 crashed with "operation not permitted when
    stream is capturing" while JIT installed a CUDA-graph variant, and Inductor's CUDA-graph
    trees recorded on JIT's thread failed on the program's. AOTInductor's CUDA graphs stay:
    honed captures them itself in thread-local mode. Naming the others in
    ``honed.jit.config.backends`` still tries them.
    """

    def backends(self, device: torch.device, graph: GraphInfo | None = None) -> list[Backend]:
        # listed in the program's process: what each candidate requires is imported by the
        # worker that builds it, not here (registry.installed_only)
        with installed_only():
            listed = super().backends(device, graph)
        return [b for b in listed if not captures_cuda_graphs(b)]
