"""src/honed/backend/_defaults.py: the default candidates, per device and kind of model.

CPU: Inductor (dynamic as the profile needs, and specialized per shape), AOTInductor and ONNX
Runtime (CPU provider); the Inductor variants run only when AOTInductor does not pass
(honed.pipeline.planning, "AOTInductor covers Inductor on CPU").

CUDA: Inductor's default mode and reduce-overhead, reduce-overhead under bf16 autocast and with
the weights in bf16, CUDA graphs over eager (fp32 and bf16 autocast), and AOTInductor in fp32 and
with bf16 weights, both replayed from CUDA graphs (the candidates a ``target="cpp"`` tune keeps;
the C++ runtime replays them from CUDA graphs too). Image models (a 4-D tensor input) also get
reduce-overhead and AOTInductor with bf16 weights in channels_last, the layout convolution
kernels prefer.

Left out: Inductor's max-autotune without CUDA graphs, fp32 and under bf16 autocast. In every
H100 row of the suite that measured them it was 1.3x to 4.6x slower than the selection, and its
builds were the longest of the tune (80 s to 340 s); docs/tuning.md lists the figures. Named in
a strategy, it is still tried.

Every reduced-precision candidate passes the correctness gate or is rejected; the lead's runs
of bench/suite.py decide which stay (bench/RESULTS.md).
"""

from __future__ import annotations

import torch

from honed.backend._precision import has_image_input
from honed.backend.base import Backend, GraphInfo


def default_candidates(device: torch.device, graph: GraphInfo | None) -> list[Backend]:
    """The default candidates for ``device``, available here or not."""
    from honed.backend.cuda_graphs import CudaGraphsBackend, CudaGraphsBackendConfig
    from honed.backend.onnxruntime import ONNXRuntimeBackend
    from honed.backend.torch_inductor import TorchInductorBackend
    from honed.backend.torch_inductor import TorchInductorBackendConfig as Inductor
    from honed.backend.torch_inductor_aot import TorchInductorAotBackend
    from honed.backend.torch_inductor_aot import TorchInductorAotBackendConfig as Aot

    if device.type != "cuda":
        return [
            TorchInductorBackend(Inductor()),
            TorchInductorBackend(Inductor(dynamic=False)),
            TorchInductorAotBackend(),
            ONNXRuntimeBackend(),
        ]
    bf16 = torch.bfloat16
    candidates: list[Backend] = [
        TorchInductorBackend(Inductor()),
        TorchInductorBackend(Inductor(mode="reduce-overhead")),
        TorchInductorBackend(
            Inductor(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=bf16)
        ),
        TorchInductorBackend(Inductor(mode="reduce-overhead", precision="bf16")),
        CudaGraphsBackend(),
        CudaGraphsBackend(CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=bf16)),
        TorchInductorAotBackend(Aot(cuda_graphs=True)),
        TorchInductorAotBackend(Aot(precision="bf16", cuda_graphs=True)),
    ]
    if graph is not None and has_image_input(graph.min_shapes):
        candidates += [
            TorchInductorBackend(
                Inductor(mode="reduce-overhead", precision="bf16", memory_format="channels_last")
            ),
            TorchInductorAotBackend(
                Aot(precision="bf16", memory_format="channels_last", cuda_graphs=True)
            ),
        ]
    return candidates
