"""AOTInductor through honed on CUDA: show whether the wrapper links the shared libstdc++
(device check of _link_options), then load (probe in a child first) and compare with eager."""
import io
import subprocess
import tempfile
import time
import zipfile

import torch
from torch import nn

import honed.backend.torch_inductor_aot as aot
from honed.backend import GraphInfo, Sample

t0 = time.perf_counter()
original_load = aot._load


def load(package: bytes, device_type: str):
    print(f"compiled in {time.perf_counter() - t0:.0f} s", flush=True)
    with tempfile.TemporaryDirectory() as d, zipfile.ZipFile(io.BytesIO(package)) as z:
        z.extractall(d)
        for name in z.namelist():
            if name.endswith(".so"):
                out = subprocess.run(["readelf", "-d", f"{d}/{name}"], capture_output=True, text=True)
                needed = [ln.split("[")[1].rstrip("]") for ln in out.stdout.splitlines() if "NEEDED" in ln]
                print("NEEDED", name.rsplit("/", 1)[-1][:12], needed, flush=True)
    return original_load(package, device_type)


aot._load = load
dev = torch.device("cuda")
m = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).to(dev).eval()
x = torch.randn(4, 256, device=dev)
g = GraphInfo(dev, False, ((4, 256),), ((4, 256),), ((4, 256),))
fn = aot.TorchInductorAotBackend().build_graph(m, [Sample((x,), {})], g)
with torch.no_grad():
    print("AOTI cuda max diff vs eager:", (fn(x) - m(x)).abs().max().item(), flush=True)
print(f"done in {time.perf_counter() - t0:.0f} s", flush=True)
