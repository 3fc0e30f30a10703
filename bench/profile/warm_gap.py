"""bench/profile/warm_gap.py: why a JIT warm restart's variant runs slower than the same variant
installed by an AOT tune (issue 23's 3 % bound; GPU).

On the H100 BERT-base b8's AOTInductor (bf16 weights, CUDA graphs) variant took ~0.93 ms a call
when a warm JIT restart installed it from the cache, ~0.885 ms when a cold JIT tune or honed.tune
installed it. This runs the same variant installed in different ways, each in a fresh process,
and prints per scenario: the median GPU time of a call (CUDA events, blocks of calls), a bf16
matmul's time (the GPU's clocks: what the process cannot change), and the GPU time per call of
the largest kernels (torch.profiler), so the scenarios can be compared kernel by kernel.

    python3 bench/profile/warm_gap.py [--out warm_gap.json]

Scenarios (an artifact saved once by an AOT tune of that one candidate):
  tuned        the tune's own installed module (in the tuning process);
  load-first   honed.load in a fresh process before any eager call;
  eager-first  2,000 eager calls, then honed.load;
  on-thread    honed.load and its first calls on a second thread while the main thread runs
               eager calls (what a JIT restart does), measured on the main thread afterwards;
  jit-wait     HONED_JIT=1, HONED_JIT_WAIT=1, JIT's default candidates (the program waits for
               the tune), then the loop; jit-warm: the same program again on that cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import json, os, statistics, sys, threading, time
    from pathlib import Path
    import torch
    from transformers import BertConfig, BertModel

    scenario, artifact, out = sys.argv[1], sys.argv[2], sys.argv[3]
    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval().cuda()
    ids = torch.randint(0, 30522, (8, 128), generator=torch.Generator().manual_seed(1)).cuda()
    def inputs():
        return dict(input_ids=ids, attention_mask=torch.ones_like(ids))

    def gpu_ms(call, calls=1500, block=50):
        got = []
        with torch.no_grad():
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            for b in range(calls // block):
                pairs = []
                for _ in range(block):
                    e0 = torch.cuda.Event(enable_timing=True)
                    e1 = torch.cuda.Event(enable_timing=True)
                    e0.record(); call(); e1.record()
                    pairs.append((e0, e1))
                torch.cuda.synchronize()
                got += [a.elapsed_time(b) for a, b in pairs[1:]]
        return statistics.median(got)

    def mm_ms():
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        return gpu_ms(lambda: a @ a, calls=300)

    def kernels(call, calls=30):
        from torch.profiler import ProfilerActivity, profile
        with torch.no_grad():
            call(); torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
        table = {}
        for e in prof.key_averages():
            us = getattr(e, "self_device_time_total", None)
            if us is None:
                us = getattr(e, "self_cuda_time_total", 0.0)
            if us:
                table[e.key[:90]] = round(us / calls, 2)
        return dict(sorted(table.items(), key=lambda kv: -kv[1])[:25])

    result = {"scenario": scenario}
    if scenario == "tuned":
        import honed
        from honed.backend import TorchInductorAotBackend, TorchInductorAotBackendConfig
        module = honed.Module(model, "bert")
        backend = TorchInductorAotBackend(
            TorchInductorAotBackendConfig(precision="bf16", cuda_graphs=True))
        t0 = time.perf_counter()
        report = honed.tune(module, [inputs()], backends=[backend])
        result["tune_s"] = time.perf_counter() - t0
        result["selected"] = report.selected()
        honed.save(module, artifact)
        call = lambda: module(**inputs())
    elif scenario.startswith("jit"):
        call = lambda: model(**inputs())
        with torch.no_grad():
            call()  # JIT-wait: the tune runs here
        import honed.jit
        roots = honed.jit.roots()
        result["jit_state"] = [r.describe() for r in roots]
    else:
        import honed
        module = honed.Module(model, "bert")
        if scenario == "eager-first":
            with torch.no_grad():
                for _ in range(2000):
                    model(**inputs())
            torch.cuda.synchronize()
        if scenario == "on-thread":
            done = threading.Event()
            def load():
                honed.load(module, artifact, trust_native_code=True)
                with torch.no_grad():
                    module(**inputs())
                done.set()
            threading.Thread(target=load).start()
            with torch.no_grad():
                while not done.is_set():
                    model(**inputs())
            torch.cuda.synchronize()
        else:
            honed.load(module, artifact, trust_native_code=True)
        result["tuned"] = module.is_tuned
        call = lambda: module(**inputs())
    result["mm_ms"] = mm_ms()
    result["gpu_ms"] = gpu_ms(call)
    result["mm_ms_after"] = mm_ms()
    result["kernels"] = kernels(call)
    Path(out).write_text(json.dumps(result))
    """
)


def run(scenario: str, folder: Path, env: dict[str, str]) -> dict:
    out = folder / f"{scenario}.json"
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(folder / "child.py"), scenario, str(folder / "bert.honed"), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    if proc.returncode != 0:
        return {"scenario": scenario, "failed": proc.stderr[-2000:]}
    data = json.loads(out.read_text())
    data["wall_s"] = round(time.perf_counter() - started, 1)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="warm_gap.json")
    parser.add_argument("--no-jit", action="store_true", help="leave out jit-wait and jit-warm")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="honed-warm-gap-") as tmp:
        folder = Path(tmp)
        (folder / "child.py").write_text(CHILD)
        base = {k: v for k, v in os.environ.items() if not k.startswith("HONED_")}
        base.update(
            TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"),
            HONED_CACHE_DIR=str(folder / "honed-cache"),
        )
        scenarios = ["tuned", "load-first", "eager-first", "on-thread"]
        for scenario in scenarios:
            results.append(run(scenario, folder, base))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "kernels"}), flush=True)
        if not args.no_jit:
            jit = dict(
                base,
                HONED_JIT="1",
                HONED_JIT_TIME_BUDGET_S="150",
                HONED_CACHE_DIR=str(folder / "jit-cache"),
                TORCHINDUCTOR_CACHE_DIR=str(folder / "jit-inductor"),
            )
            results.append(run("jit-wait", folder, dict(jit, HONED_JIT_WAIT="1")))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "kernels"}), flush=True)
            results.append(run("jit-warm", folder, jit))
            print(json.dumps({k: v for k, v in results[-1].items() if k != "kernels"}), flush=True)
    reference = next((r for r in results if r.get("scenario") == "tuned" and "gpu_ms" in r), None)
    for r in results:
        if reference is None or "gpu_ms" not in r:
            continue
        # Each process's call time over the tuned one's, and the same corrected for the clocks.
        r["vs_tuned"] = round(r["gpu_ms"] / reference["gpu_ms"], 4)
        clock = statistics.mean([r["mm_ms"], r["mm_ms_after"]]) / statistics.mean(
            [reference["mm_ms"], reference["mm_ms_after"]]
        )
        r["vs_tuned_clock_corrected"] = round(r["vs_tuned"] / clock, 4)
        print(
            f"{r['scenario']:12s} gpu {r['gpu_ms']:.4f} ms  vs tuned {r['vs_tuned']:.4f}  "
            f"clock-corrected {r['vs_tuned_clock_corrected']:.4f}  mm {r['mm_ms']:.3f}"
        )
        if r is not reference:  # the kernels whose time differs most from the tuned module's
            diffs = []
            for name, us in r["kernels"].items():
                ref = reference["kernels"].get(name)
                if ref:
                    diffs.append((us - ref, name, ref, us))
            for d, name, ref, us in sorted(diffs, key=lambda x: -abs(x[0]))[:6]:
                print(f"    {d:+8.2f} us  {ref:8.2f} -> {us:8.2f}  {name}")
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
