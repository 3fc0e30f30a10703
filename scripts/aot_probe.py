"""scripts/aot_probe.py: compile and load a tiny AOTInductor package, printing each step.

A diagnostic for machines where loading a package crashes (seen with torch 2.11.0+cu130 on the
GPU machine): run it under a debugger to see where, e.g.
    cuda-gdb -batch -ex run -ex bt --args python3 scripts/aot_probe.py [cpu|cuda]
"""

from __future__ import annotations

import faulthandler
import sys
import tempfile

import torch

faulthandler.enable()
device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
model = torch.nn.Linear(4, 4).to(device).eval()
x = torch.randn(2, 4, device=device)
print("torch", torch.__version__, "device", device, flush=True)
exported = torch.export.export(model, (x,))
print("exported", flush=True)
with tempfile.TemporaryDirectory() as tmp:
    path = torch._inductor.aoti_compile_and_package(exported, package_path=f"{tmp}/m.pt2")
    print("compiled", path, flush=True)
    runner = torch._inductor.aoti_load_package(path)
    print("loaded", flush=True)
    print("max error", float((runner(x) - model(x)).abs().max()), flush=True)
