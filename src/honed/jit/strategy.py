"""src/honed/jit/strategy.py: the candidates JIT tries when none are named."""

from __future__ import annotations

import torch

from honed.backend.base import Backend, GraphInfo
from honed.backend.registry import installed_only
from honed.backend.torch_inductor import TorchInductorBackend
from honed.tune_strategy import MaxThroughputStrategy


def records_graph_trees(backend: Backend) -> bool:
    """Whether ``backend``'s variant records Inductor's CUDA-graph trees (reduce-overhead,
    max-autotune, or ``triton.cudagraphs`` asked for), which honed does not capture itself."""
    return isinstance(backend, TorchInductorBackend) and backend.uses_cudagraphs


class JitDefaultStrategy(MaxThroughputStrategy):
    """honed's default candidates, less Inductor's modes that record CUDA-graph trees.

    JIT installs a winner on its own thread while the program keeps running CUDA work on its
    thread. Inductor's CUDA-graph trees recorded on JIT's thread failed on the program's, so
    reduce-overhead and max-autotune are left out (named in ``honed.jit.config.backends`` they
    are still tried). honed's own captures stay, AOTInductor's CUDA graphs and CUDA graphs over
    eager: they are made in thread-local mode, and the program's ``torch.cuda.synchronize``
    waits for them (honed.backend.cuda_graphs.guard_synchronize), where the program's device-wide
    synchronize during a capture once failed both. CUDA graphs over eager compile nothing: they
    answer the program's calls while the packages build (honed.jit.config.stand_in).

    Listed likeliest winner first (``Backend.expected_gain``), which the tune's plan keeps among
    candidates of one build cost: the program runs at a variant's speed only once it is built,
    and the first free worker builds the first listed.
    """

    def backends(self, device: torch.device, graph: GraphInfo | None = None) -> list[Backend]:
        # listed in the program's process: what each candidate requires is imported by the
        # worker that builds it, not here (registry.installed_only)
        with installed_only():
            listed = super().backends(device, graph)
        kept = [b for b in listed if not records_graph_trees(b)]
        return sorted(kept, key=lambda b: -b.expected_gain)  # stable: honed's order among equals
