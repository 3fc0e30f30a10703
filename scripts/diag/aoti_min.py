"""Minimal AOTInductor compile/load repro, no honed import (device diagnosis)."""
import sys

import torch

dev = sys.argv[1]
path = sys.argv[2]
mode = sys.argv[3]


class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).relu()


m = M().to(dev).eval()
x = torch.randn(4, 8, device=dev)
if mode in ("compile", "both"):
    ep = torch.export.export(m, (x,))
    opts = {}
    for kv in sys.argv[4:]:
        k, v = kv.split("=", 1)
        opts[k] = v == "1" if v in ("0", "1") else v
    p = torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=opts)
    print("compiled", p, flush=True)
if mode in ("load", "both"):
    r = torch._inductor.aoti_load_package(path)
    print("loaded", flush=True)
    with torch.no_grad():
        print("maxdiff", (r(x) - m(x)).abs().max().item(), flush=True)
