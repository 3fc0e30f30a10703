"""bench/profile/load_profile.py: where honed.load's time goes in a fresh interpreter: load ARTIFACT
(saved by bench/profile/make_cpp_artifact.py) under cProfile; print the wall time and the top
entries."""

import cProfile
import pstats
import sys
import time

started = time.perf_counter()
import torch  # noqa: E402
from torch import nn  # noqa: E402

import honed  # noqa: E402

print(f"import torch + honed: {time.perf_counter() - started:.2f} s", flush=True)
device = sys.argv[2] if len(sys.argv) > 2 else "cuda"
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval().to(device)
module = honed.Module(net, "tiny")
profile = cProfile.Profile()
started = time.perf_counter()
profile.runcall(honed.load, module, sys.argv[1], trust_native_code=True)
print(f"honed.load: {time.perf_counter() - started:.2f} s; tuned: {module.is_tuned}", flush=True)
pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
