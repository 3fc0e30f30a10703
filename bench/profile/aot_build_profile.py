"""bench/profile/aot_build_profile.py: where an AOTInductor build's time goes: tunes the bench MLP
at batch 1 with TorchInductorAotBackend alone, in this process (no worker, no tuning cache),
under cProfile, and prints the slowest calls by cumulative time. Run it in fresh processes, with
and without TORCHINDUCTOR_VEC_ISA_OK=1, to see what torch's CPU vector-ISA probe costs. With
"cache", honed's cache stays on (its load-probe and vector-ISA verdicts apply) and the weights
are new each run, so the tuning cache still misses and the package is built.

    python bench/profile/aot_build_profile.py [cuda|cpu] [cache]"""

import cProfile
import pstats
import sys
import time

import torch
from torch import nn

import honed

device = sys.argv[1] if len(sys.argv) > 1 else "cuda"
use_cache = sys.argv[2:] == ["cache"]
torch.manual_seed(time.time_ns() if use_cache else 0)
layers: list[nn.Module] = []
for _ in range(4):
    layers += [nn.Linear(512, 512), nn.GELU()]
model = nn.Sequential(*layers, nn.Linear(512, 10)).eval().to(device)
wrapped = honed.Module(model, "mlp")
backend = honed.backend.TorchInductorAotBackend()
profile = cProfile.Profile()
start = time.perf_counter()
with honed.config.patch(cache_enabled=use_cache, isolation="none"):
    profile.enable()
    report = honed.tune(
        wrapped,
        [torch.randn(1, 512, device=device)],
        strategy=honed.OneBackendStrategy(backend),
        device=device,
    )
    profile.disable()
print(f"tune {time.perf_counter() - start:.1f} s")
for c in report.graphs[0].candidates:
    print(f"  {c.name}: {c.status} build {c.build_s or 0:.1f} s")
stats = pstats.Stats(profile)
stats.sort_stats("cumulative").print_stats(r"(inductor|honed|subprocess|export)", 40)
