"""The suite's independent-check order with variants: which one makes CUDA-graph replay crash."""
import os
import subprocess
import sys

VARIANTS = {
    "A-suite": ("ro32 ro16 cg32 cg16", 1),
    "B-no-ro16": ("ro32 cg32 cg16", 1),
    "C-no-cg16": ("ro32 ro16 cg32", 1),
    "D-cg-first": ("cg32 cg16 ro32 ro16", 1),
    "E-ro-warmed": ("ro32 ro16 cg32 cg16", 5),
    "F-one-ro-one-cg": ("ro32 cg32", 1),
}
if len(sys.argv) == 1:
    for name in VARIANTS:
        env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
        done = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True,
                              text=True, timeout=120)
        out = [ln for ln in (done.stdout + done.stderr).strip().splitlines() if "Error" in ln or ln.startswith("ok") or "FAIL" in ln]
        print(f"=== {name}: rc={done.returncode} :: " + " | ".join(out[-3:])[:500], flush=True)
    sys.exit(0)

import torch

sys.path.insert(0, "bench")
from models import SPECS
from honed.backend import GraphInfo, Sample
from honed.backend.cuda_graphs import CudaGraphsBackend, CudaGraphsBackendConfig
from honed.backend.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig

order, warm = VARIANTS[sys.argv[1]]
dev = torch.device("cuda")
spec = SPECS["mlp"]
model = spec.build(tiny=False).to(dev).eval()
x = spec.inputs(1, dev)
bf16 = torch.bfloat16
make = {
    "ro32": lambda: TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead")),
    "ro16": lambda: TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=bf16)),
    "cg32": lambda: CudaGraphsBackend(),
    "cg16": lambda: CudaGraphsBackend(CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=bf16)),
}
fns = {}
with torch.no_grad():
    ref = model(x)
    for name in order.split():
        fn = make[name]().build_graph(model, [Sample((x,), {})], GraphInfo(device=dev))
        for _ in range(warm if name.startswith("ro") else 1):
            fn(x)
        torch.cuda.synchronize()
        fns[name] = fn
    for r in range(3):
        for name, fn in fns.items():
            try:
                y = fn(x)
                torch.cuda.synchronize()
            except Exception as e:
                print(f"FAIL round {r} {name}: {type(e).__name__}: {str(e).splitlines()[0]}")
                sys.exit(3)
print("ok", {n: float((f(x).float() - ref).abs().max()) for n, f in fns.items()})
