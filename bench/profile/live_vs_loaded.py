"""bench/profile/live_vs_loaded.py: is a tuned variant as fast loaded from its artifact as it was
right after the tune, in one process?

A warm JIT restart (the winner installed from its stored payload) ran BERT-base's steady calls
slower than the cold run that built it, and slower than the AOT tune's process, with the same
selection (bench/results/jit). This tunes BERT-base (b8, s128) with one candidate, AOTInductor
with bf16 weights and CUDA graphs, saves it, loads it into a copy of the model, and calls the two
in turns (blocks of 25 calls, 40 rounds): the wall time of a call with its sync, the time to
return (launch), the GPU time between two events. Then a program's loop (call, then sync) in
this process, in fresh processes that load the artifact (``--fresh``: each one's steps, the
loaded variant's loop or the plain model's), and here again, by 5 s windows with a pure-Python
call's time, the GPU's SM clock and the CPU the loop ran on: is the speed the variant's, the
process's or the host's?

    python bench/profile/live_vs_loaded.py --loop-seconds 15 --fresh loop,loop \
        --fresh eager,loop --out bench/results/profile/live-vs-loaded-<tag>.json
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import honed
from honed.backend.torch_inductor_aot import TorchInductorAotBackend, TorchInductorAotBackendConfig


def turns(ways: dict[str, Callable[[], Any]], rounds: int = 40, block: int = 26) -> dict[str, Any]:
    """Each way called in blocks, in turns: medians of wall (with sync), launch and GPU time."""
    taken: dict[str, tuple[list[float], list[float], list[float]]] = {n: ([], [], []) for n in ways}
    with torch.no_grad():
        for _ in range(rounds):
            for name, way in ways.items():
                for k in range(block):
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    e0.record()
                    way()
                    tl = time.perf_counter()
                    e1.record()
                    torch.cuda.synchronize()
                    t1 = time.perf_counter()
                    if k:  # a block's first call pays for the switch
                        taken[name][0].append((t1 - t0) * 1e3)
                        taken[name][1].append((tl - t0) * 1e3)
                        taken[name][2].append(e0.elapsed_time(e1))
    return {
        n: {
            "wall_ms": round(statistics.median(a), 4),
            "launch_ms": round(statistics.median(b), 4),
            "gpu_ms": round(statistics.median(c), 4),
        }
        for n, (a, b, c) in taken.items()
    }


def _cpu() -> int:
    """The CPU this thread runs on now."""
    return int(ctypes.CDLL(None).sched_getcpu())


def _python_ns() -> float:
    """A pure-Python call's time now (ns): the host CPU's own speed, whatever the GPU does."""

    def nothing(a: int) -> int:
        return a

    t0 = time.perf_counter()
    for _ in range(20_000):
        nothing(1)
    return (time.perf_counter() - t0) / 20_000 * 1e9


def _sm_clock() -> int | None:
    """The GPU's SM clock now (MHz), through NVML where torch finds it."""
    try:
        return int(torch.cuda.clock_rate())
    except Exception:
        return None


def loop(call: Callable[[], Any], seconds: float) -> dict[str, Any]:
    """A program's loop: call, then torch.cuda.synchronize(); per 5 s window the medians of the
    wall time and the launch, a pure-Python call's ns, the SM clocks seen and the CPUs run on."""
    calls: list[tuple[float, float, float]] = []
    probes: list[tuple[float, float, int | None, int]] = []
    with torch.no_grad():
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            call()
            tl = time.perf_counter()
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            calls.append((t0 - start, (t1 - t0) * 1e3, (tl - t0) * 1e3))
            if len(calls) % 2000 == 0:  # the host's and the GPU's state now and then
                probes.append((t1 - start, _python_ns(), _sm_clock(), _cpu()))
    windows = []
    for w in range(0, int(seconds), 5):
        inside = [c for c in calls[10:] if w <= c[0] < w + 5]
        if inside:
            wall = statistics.median(c[1] for c in inside)
            launch = statistics.median(c[2] for c in inside)
            seen = [p for p in probes if w <= p[0] < w + 5]
            windows.append(
                [
                    w,
                    round(wall, 4),
                    round(launch, 4),
                    round(statistics.median(p[1] for p in seen), 1) if seen else None,
                    [p[2] for p in seen],
                    sorted({p[3] for p in seen}),
                ]
            )
    return {
        "calls": len(calls),
        "median_ms": round(statistics.median(c[1] for c in calls[10:]), 4),
        "windows": windows,
    }


def bert() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval().cuda()
    ids = torch.randint(0, 30522, (8, 128), device="cuda")
    return model, dict(input_ids=ids, attention_mask=torch.ones_like(ids))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--loop-seconds", type=float, default=30.0)
    parser.add_argument("--load", help="(the fresh process) load this artifact and loop")
    parser.add_argument(
        "--plan",
        default="loop",
        help="(the fresh process) its steps, comma-separated: loop (the loaded variant), eager "
        "(the plain model), each --loop-seconds long",
    )
    parser.add_argument(
        "--fresh",
        action="append",
        default=[],
        help="a fresh process's --plan (repeatable; default: one that loops)",
    )
    args = parser.parse_args()
    model, kw = bert()
    if args.load:
        steps: list[Any] = []
        fresh = honed.Module(copy.deepcopy(model), "bert")
        honed.load(fresh, args.load, trust_native_code=True)
        for step in args.plan.split(","):
            target = fresh if step == "loop" else model
            steps.append([step, loop(lambda m=target: m(**kw), args.loop_seconds)])
        print(json.dumps(steps))
        return
    original = copy.deepcopy(model)
    live = honed.Module(model, "bert")
    backend = TorchInductorAotBackend(
        TorchInductorAotBackendConfig(precision="bf16", cuda_graphs=True)
    )
    t0 = time.perf_counter()
    report = honed.tune(live, [kw], backends=[backend])
    result: dict[str, Any] = {
        "tune_s": round(time.perf_counter() - t0, 1),
        "selected": report.selected(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
    }
    print(f"tuned in {result['tune_s']} s: {result['selected']}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="live-vs-loaded-")
    path = Path(tmp) / "bert.honed"
    honed.save(live, path)
    loaded = honed.Module(copy.deepcopy(original), "bert")
    honed.load(loaded, path, trust_native_code=True)
    again = honed.Module(copy.deepcopy(original), "bert")
    honed.load(again, path, trust_native_code=True)
    with torch.no_grad():
        want = original(**kw).last_hidden_state.float()
        for name, m in (("live", live), ("loaded", loaded), ("loaded again", again)):
            got = m(**kw).last_hidden_state.float()
            err = (got - want).abs().max().item()
            print(f"{name}: max abs difference to eager {err:.4f}", flush=True)
    ways = {
        "live": lambda: live(**kw),
        "loaded": lambda: loaded(**kw),
        "loaded again": lambda: again(**kw),
    }
    result["modules"] = turns(ways)
    for n, r in result["modules"].items():
        print(f"module {n}: {r}", flush=True)
    # The same variant in the loop a program runs (call, then sync), here where it was tuned and
    # in a fresh process that loads it from the artifact: a process's own speed, window by window.
    result["loop_here"] = loop(lambda: live(**kw), args.loop_seconds)
    print(f"loop in the tuning process: {result['loop_here']}", flush=True)
    result["fresh"] = []
    for plan in args.fresh or ["loop"]:
        argv = [sys.executable, __file__, "--load", str(path), "--plan", plan]
        argv += ["--loop-seconds", f"{args.loop_seconds}"]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        result["fresh"].append(json.loads(out.splitlines()[-1]))
        print(f"a fresh process, {plan}: {result['fresh'][-1]}", flush=True)
        Path(args.out).write_text(json.dumps(result, indent=2))  # kept if a later step is cut
    result["loop_here_again"] = loop(lambda: live(**kw), args.loop_seconds)
    print(f"loop in the tuning process again: {result['loop_here_again']}", flush=True)
    shutil.rmtree(tmp)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
