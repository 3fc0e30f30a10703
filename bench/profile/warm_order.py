"""bench/profile/warm_order.py: does a JIT restart's variant run slower because it is installed
early in the program's life? (issue 23's 3 % bound; GPU.)

On the H100 a cold JIT run's installed variant (BERT-base b8, AOTInductor bf16 + CUDA graphs)
ran as fast as the AOT tune's, and a warm restart's, installed from the cache 2-3 s after the
program's first call, 5 % slower. This runs, in fresh processes on one cache: a cold run that
waits for its tune (HONED_JIT_WAIT=1), then warm restarts that install the cached variant
early (the default) or late (after ``--eager-calls`` eager calls, JIT paused meanwhile), in
turns, and prints each one's median call (CUDA-synchronised, the loop's last half) and a bf16
matmul's time in the same process (the GPU's clocks).

    python3 bench/profile/warm_order.py [--rounds 2] [--eager-calls 3000] [--out warm_order.json]

``--aot`` puts an AOT tune's run (``honed.tune`` with its defaults, then the same loop) in the
first round's late place, and prints the kernels whose GPU time per call (torch.profiler, 30
calls) differs most between it and the first warm restart.
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
from pathlib import Path

CHILD = textwrap.dedent(
    """
    import json, statistics, sys, time
    import torch
    from transformers import BertConfig, BertModel

    mode, eager_calls = sys.argv[1], int(sys.argv[2])
    late = mode == "late"
    seconds, out = float(sys.argv[3]), sys.argv[4]
    torch.manual_seed(0)
    model = BertModel(BertConfig()).eval().cuda()
    ids = torch.randint(0, 30522, (8, 128), generator=torch.Generator().manual_seed(1)).cuda()
    def call():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))
    if mode == "aot":  # the AOT way: honed.tune with its defaults, then the same loop
        import honed
        module = honed.Module(model, "bert")
        honed.tune(module, [dict(input_ids=ids, attention_mask=torch.ones_like(ids))])
        def call():
            module(input_ids=ids, attention_mask=torch.ones_like(ids))
    with torch.no_grad():
        if late:  # eager calls JIT does not see, as a program's life before the module's first call
            from honed.jit.patcher import paused
            with paused():
                for _ in range(eager_calls):
                    call()
                torch.cuda.synchronize()
        times, start = [], time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0 = time.perf_counter(); call(); torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        mm = []
        for _ in range(200):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record(); a @ a; e1.record(); torch.cuda.synchronize()
            mm.append(e0.elapsed_time(e1))
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(30):
            call()
        torch.cuda.synchronize()
    kernels = {}
    for e in prof.key_averages():
        us = getattr(e, "self_device_time_total", 0.0) or 0.0
        if us > 0:
            kernels[e.key[:100]] = round(us / 30, 2)
    import honed.jit
    roots = honed.jit.roots()
    json.dump({"median_ms": statistics.median(times[len(times) // 2:]), "calls": len(times),
               "mm_ms": statistics.median(mm), "tuned": [r.describe() for r in roots],
               "tunes": [r.line() for r in honed.jit.tunes()], "kernels": kernels},
              open(out, "w"))
    """
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--eager-calls", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--out", default="warm_order.json")
    parser.add_argument(
        "--aot", action="store_true", help="an AOT tune's run in the first round's late place"
    )
    args = parser.parse_args()
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="honed-warm-order-") as tmp:
        folder = Path(tmp)
        (folder / "child.py").write_text(CHILD)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HONED_")}
        env.update(
            HONED_JIT="1",
            HONED_JIT_TIME_BUDGET_S="150",
            HONED_CACHE_DIR=str(folder / "honed-cache"),
            TORCHINDUCTOR_CACHE_DIR=str(folder / "inductor"),
        )

        def run(tag: str, order: str, extra: dict[str, str], seconds: float) -> None:
            out = folder / f"{tag}.json"
            cmd = [sys.executable, str(folder / "child.py"), order, str(args.eager_calls),
                   str(seconds), str(out)]  # fmt: skip
            proc = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True)
            if proc.returncode != 0:
                results.append({"run": tag, "failed": proc.stderr[-1500:]})
            else:
                results.append({"run": tag, **json.loads(out.read_text())})
            print(json.dumps(results[-1])[:600], flush=True)

        run("cold-wait", "early", {"HONED_JIT_WAIT": "1"}, 5.0)
        for r in range(args.rounds):
            run(f"early-{r}", "early", {}, args.seconds)
            if args.aot and r == 0:
                aot = {"HONED_JIT": "0", "HONED_CACHE_DIR": str(folder / "aot-cache"),
                       "TORCHINDUCTOR_CACHE_DIR": str(folder / "aot-inductor")}  # fmt: skip
                run("aot", "aot", aot, args.seconds)
            else:
                run(f"late-{r}", "late", {}, args.seconds)
    early = [x["median_ms"] for x in results if x["run"].startswith("early") and "median_ms" in x]
    late = [x["median_ms"] for x in results if x["run"].startswith("late") and "median_ms" in x]
    if early and late:
        e, la = statistics.mean(early), statistics.mean(late)
        print(f"installed early: {e:.4f} ms; late: {la:.4f} ms; early / late {e / la:.4f}")
    aot_run = next((x for x in results if x["run"] == "aot" and "kernels" in x), None)
    warm_run = next((x for x in results if x["run"] == "early-0" and "kernels" in x), None)
    if aot_run and warm_run:  # the kernels whose time per call differs most
        print(f"aot {aot_run['median_ms']:.4f} ms, warm {warm_run['median_ms']:.4f} ms; "
              f"kernel time per call: aot {sum(aot_run['kernels'].values()):.1f} us, "
              f"warm {sum(warm_run['kernels'].values()):.1f} us")  # fmt: skip
        names = set(aot_run["kernels"]) | set(warm_run["kernels"])
        diffs = sorted(
            names,
            key=lambda n: -abs(warm_run["kernels"].get(n, 0) - aot_run["kernels"].get(n, 0)),
        )
        for n in diffs[:12]:
            a, w = aot_run["kernels"].get(n, 0.0), warm_run["kernels"].get(n, 0.0)
            print(f"  {w - a:+8.2f} us  aot {a:8.2f}  warm {w:8.2f}  {n}")
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
