"""bench/profile/make_cpp_artifact.py: tune the tests' tiny MLP with AOTInductor for the C++
runtime on DEVICE and save it to PATH; also write the graph's .pt2 next to it (PATH.pt2), which
bench/profile/run_overhead.cpp loads with libtorch's loader alone, and, the package holding code
only, the constants that loader must be given (PATH.pt2.constants: torch.save of {FQN: tensor},
read with torch::pickle_load)."""

import sys
import zipfile

import torch
from torch import nn

import honed
from honed.backend import _aoti_constants

path, device = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval().to(device)
module = honed.Module(net, "tiny")
data = [torch.randn(b, 16, device=device) for b in (1, 4, 8)]
with honed.config.patch(cache_enabled=False, isolation="none"):
    honed.tune(
        module,
        data,
        backends=[honed.backend.TorchInductorAotBackend()],
        target="cpp",
        device=device,
    )
honed.save(module, path)
with zipfile.ZipFile(path) as z:
    pt2 = [n for n in z.namelist() if n.endswith("model.pt2")]
    print("entries:", z.namelist())
    open(path + ".pt2", "wb").write(z.read(pt2[0]))
    folder = pt2[0].removesuffix("model.pt2")
    files = {n.removeprefix(folder): z.read(n) for n in z.namelist() if n.startswith(folder)}
constants = _aoti_constants.tensors(files, net, torch.device("cpu"))
if constants is not None:
    torch.save(constants, path + ".pt2.constants")
print("saved", path)
