"""bench/profile/aot_phases.py: where one AOTInductor build's time goes, phase by phase, for a
model of the suite (bench/models.py): torch.export, Inductor's lowering and code generation,
the time spent waiting for Triton/C++ kernel compiles, each C++ compile of the wrapper, and the
load. The phases are timed by wrapping torch's functions; only AotCodeCompiler.compile (the C++
side of the build) runs under cProfile, which would slow the Python-heavy lowering.

    TORCHINDUCTOR_COMPILE_THREADS=N python bench/profile/aot_phases.py --model vit_b_16 \
        [--batch 1] [--precision bf16] [--channels-last]

Run it in a fresh process with empty TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR for a cold
build."""

import argparse
import collections
import cProfile
import functools
import pstats
import sys
import time
from pathlib import Path

import torch

import honed

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import SPECS  # bench/models.py

START = time.perf_counter()
spent: dict[str, float] = collections.defaultdict(float)
counts: dict[str, int] = collections.Counter()
profiles: list[tuple[str, pstats.Stats]] = []


def timed(owner: object, name: str, label: str, profile: bool = False) -> None:
    original = getattr(owner, name, None)
    if original is None:
        print(f"(no {label} to time in this torch)")
        return

    @functools.wraps(original)
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        profiler = cProfile.Profile() if profile else None
        try:
            if profiler is None:
                return original(*args, **kwargs)
            return profiler.runcall(original, *args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - start
            counts[label] += 1
            if profiler is not None:
                profiles.append((label, pstats.Stats(profiler)))

    setattr(owner, name, wrapper)


parser = argparse.ArgumentParser()
parser.add_argument("--model", default="vit_b_16", choices=list(SPECS))
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--precision", default="bf16")
parser.add_argument("--channels-last", action="store_true")
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
args = parser.parse_args()

from torch._inductor import async_compile, codecache, cpp_builder  # noqa: E402

timed(torch.export, "export", "torch.export.export")
timed(torch._inductor, "aoti_compile_and_package", "aoti_compile_and_package (all of it)")
timed(codecache.AotCodeCompiler, "compile", "AotCodeCompiler.compile (wrapper C++, link)", True)
timed(async_compile.AsyncCompile, "wait", "AsyncCompile.wait (kernel compiles outstanding)")
timed(cpp_builder.CppBuilder, "build", "CppBuilder.build (each C++ compile or link)")
timed(torch._inductor, "aoti_load_package", "aoti_load_package")

device = torch.device(args.device)
spec = SPECS[args.model]
model = spec.build().to(device)
config = honed.backend.TorchInductorAotBackendConfig(
    precision=args.precision,
    memory_format="channels_last" if args.channels_last else None,
    cuda_graphs=device.type == "cuda",
)
threads = torch._inductor.config.compile_threads
print(f"compile threads {threads}, model {args.model} b{args.batch}, {config}")
with honed.config.patch(cache_enabled=False, isolation="none"):
    report = honed.tune(
        honed.Module(model, args.model),
        [spec.inputs(args.batch, device)],
        strategy=honed.OneBackendStrategy(honed.backend.TorchInductorAotBackend(config)),
        device=str(device),
    )
total = time.perf_counter() - START
for c in report.graphs[0].candidates:
    print(f"  {c.name}: {c.status} build {c.build_s or 0:.1f} s {c.reason[:200]}")
print(f"total {total:.1f} s (compile threads {threads})")
for label, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
    print(f"  {seconds:7.1f} s  {counts[label]:4d}x  {label}")
from torch._dynamo.utils import compile_times  # noqa: E402

print("Inductor's own phase times:")
print(compile_times(repr="str"))
for label, stats in profiles:
    print(f"-- inside {label}, by cumulative time:")
    stats.sort_stats("cumulative").print_stats(30)
