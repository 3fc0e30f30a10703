"""bench/profile/compile_beside.py: what an AOTInductor compile in another process does to a
program's calls, and which part of it.

The program is a loop of BERT-base b8 eager calls on the main thread (each synchronized and
timed, as in bench/jit_bert.py), with two probes after each call: a fixed piece of pure Python on
the thread's CPU clock (the CPU's speed then) and, on a GPU, one tiny kernel's round trip (the
GPU shared with another context). Beside it, one side process placed as a JIT worker is (JIT's
niceness, the CPUs ``isolation.worker_cpus`` leaves it, Inductor's compile threads as a pool of
two gets them) compiles the same model with AOTInductor, cold (a cache folder of its own), and
marks its steps: Inductor's wait for its kernel compiles, the autotune block (each GPU kernel
run once on random inputs, those with several configs benchmarked), the benchmarks, the C++
builds. Variants, one side process each:

- ``gpu``: the bf16 model on the GPU, as JIT's AOTInductor candidate with bf16 weights builds;
- ``gpu-threads1``: the same with one Inductor compile thread (fewer busy CPUs);
- ``cpu``: the fp32 model compiled for the CPU: the host's share of a compile (processes, files,
  the C++ compiler) with no GPU context at all;
- ``gpu-two``: two side processes at once, the bf16 and the fp32 model, as JIT's two AOTInductor
  candidates build side by side.

Printed per variant: the calls while the side process ran (median, calls over twice the loop
alone's median, the slowest), each call over 2x with its thread's CPU time, its probes and the
side's steps it overlapped, and how many calls fell in each step. A sampler process reads each
CPU's busy share from /proc/stat every 50 ms, and each call keeps the CPU it ended on: per CPU
the program ran on, the other CPU whose being busy went with the most calls over 2x (a hidden
hyperthread sibling shows as one partner that slows it whenever busy).

    python bench/profile/compile_beside.py [--variants gpu cpu ...] [--seconds 150] [--json FILE]
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from beside_stall import _model  # the program's model, shared with that profile

from honed import config
from honed.pipeline import isolation

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jit_bert import MARKING  # bench/jit_bert.py's wrapper of marked functions

# The side process: argv = device, dtype, cache folder. Each marked step's span goes to stdout
# as one JSON line (perf_counter and monotonic: CLOCK_MONOTONIC, one clock for every process of
# the machine).
_SIDE = r"""
import json, sys, time
import torch
from transformers import BertConfig, BertModel
__MARKING__
device, dtype = sys.argv[1], getattr(torch, sys.argv[2])

def note(item, thread, began, ended):
    print(json.dumps([item.rsplit(".", 1)[-1], began, ended]), flush=True)

began = time.monotonic()
import torch._inductor
for item in (
    "torch._inductor.async_compile:AsyncCompile.wait",
    "torch._inductor.codegen.wrapper:PythonWrapperCodegen.generate_and_run_autotune_block",
    "torch._inductor.runtime.benchmarking:InductorBenchmarker.benchmark_gpu",
    "torch._inductor.cpp_builder:CppBuilder.build",
    "torch.export:export",
):
    try:
        mark_all(item, note)
    except Exception as e:
        print(json.dumps(["unmarked " + item, repr(e)]), flush=True)
model = BertModel(BertConfig()).to(device=device, dtype=dtype).eval()
ids = torch.randint(0, 30522, (8, 128), device=device)
kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
print(json.dumps(["start", began, time.monotonic()]), flush=True)
with torch.no_grad():
    exported = torch.export.export(model, (), kwargs)
    t = time.monotonic()
    torch._inductor.aoti_compile_and_package(
        exported, package_path=sys.argv[3] + "/model.pt2",
        inductor_configs={"aot_inductor.package_constants_in_so": False},
    )
    print(json.dumps(["aoti_compile_and_package", t, time.monotonic()]), flush=True)
""".replace("__MARKING__\n", MARKING)

# variant: the side processes, each (device, dtype, Inductor compile threads or None)
# Each CPU's busy share (0-1) over the last period, one JSON line per period: [monotonic, [...]].
_SAMPLER = r"""
import json, time
def read():
    with open("/proc/stat") as f:
        rows = [l.split() for l in f if l.startswith("cpu") and l[3] != " "]
    return [(sum(map(int, r[1:9])), int(r[4]) + int(r[5])) for r in rows]
before = read()
while True:
    time.sleep(0.05)
    now = read()
    busy = [round(1 - (i1 - i0) / max(1, t1 - t0), 2) for (t0, i0), (t1, i1) in zip(before, now)]
    print(json.dumps([time.monotonic(), busy]), flush=True)
    before = now
"""

VARIANTS: dict[str, list[tuple[str, str, int | None]]] = {
    "gpu": [("cuda", "bfloat16", None)],
    "gpu-threads1": [("cuda", "bfloat16", 1)],
    "cpu": [("cpu", "float32", None)],
    "gpu-two": [("cuda", "bfloat16", None), ("cuda", "float32", None)],
}


def _probes(device: str) -> tuple[Any, Any]:
    def pause(a: int) -> int:
        return a

    def python_ns() -> float:
        c = time.thread_time_ns()
        for _ in range(200):
            pause(1)
        return (time.thread_time_ns() - c) / 200

    if not device.startswith("cuda"):
        return python_ns, lambda: 0.0
    one = torch.zeros(1, device=device)

    def gpu_us() -> float:
        t = time.perf_counter()
        one.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e6

    return python_ns, gpu_us


def _loop(model: Any, inputs: dict[str, Any], device: str, until: Any) -> list[list[float]]:
    """Calls until ``until()``: [start (monotonic s), wall ms, thread CPU ms, python ns, gpu µs,
    the CPU it ended on]."""
    python_ns, gpu_us = _probes(device)
    getcpu = ctypes.CDLL(None).sched_getcpu
    calls = []
    with torch.no_grad():
        while not until():
            start, cpu = time.monotonic(), time.thread_time()
            model(**inputs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            wall = (time.monotonic() - start) * 1e3
            thread_ms = (time.thread_time() - cpu) * 1e3
            calls.append([start, wall, thread_ms, python_ns(), gpu_us(), getcpu()])
    return calls


def _side(
    side: tuple[str, str, int | None], folder: str, marks: list[list[Any]]
) -> subprocess.Popen[str]:
    device, dtype, threads = side
    os.makedirs(folder)
    cpus = isolation.worker_cpus()
    env = dict(os.environ)
    env.update(isolation.worker_env(2, len(cpus) if cpus else None))
    env["TORCHINDUCTOR_CACHE_DIR"] = folder  # cold: a folder of its own
    if threads:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(threads)
    nice = config.jit_worker_nice

    def place() -> None:
        os.nice(nice)
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(
        [sys.executable, "-c", _SIDE, device, dtype, folder],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=place,
    )
    _collect(proc, marks)
    return proc


def _collect(proc: subprocess.Popen[str], into: list[list[Any]]) -> None:
    """Each JSON line ``proc`` writes, appended to ``into`` by a thread as it comes."""

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(json.loads(line))

    threading.Thread(target=read, daemon=True).start()


def _sampler() -> tuple[subprocess.Popen[str], list[list[Any]]]:
    samples: list[list[Any]] = []
    proc = subprocess.Popen([sys.executable, "-c", _SAMPLER], stdout=subprocess.PIPE, text=True)
    _collect(proc, samples)
    return proc, samples


def _partners(
    calls: list[list[float]], samples: list[list[Any]], alone_ms: float
) -> dict[str, Any]:
    """Per CPU the program's calls ended on: for each other CPU, calls over 2x when it was busy
    (over half the period of the sample that covers the call's end) and when it was not; the
    partner is the CPU with the largest difference of those rates."""
    if not samples:
        return {}
    times = [x[0] for x in samples]
    table: dict[int, dict[int, list[int]]] = {}  # cpu: other: [busy calls, busy slow, idle, slow]
    for c in calls:
        at = bisect.bisect_left(times, c[0] + c[1] / 1e3)
        if at >= len(samples):
            continue
        busy, slow, mine = samples[at][1], c[1] > 2 * alone_ms, int(c[5])
        rows = table.setdefault(mine, {})
        for other, share in enumerate(busy):
            if other == mine:
                continue
            row = rows.setdefault(other, [0, 0, 0, 0])
            k = 0 if share > 0.5 else 2
            row[k] += 1
            row[k + 1] += slow
    out: dict[str, Any] = {}
    for mine, rows in sorted(table.items()):
        n = sum(rows[next(iter(rows))][::2]) if rows else 0

        def rate(r: list[int]) -> float:
            return (r[1] / r[0] if r[0] else 0.0) - (r[3] / r[2] if r[2] else 0.0)

        ranked = sorted(rows.items(), key=lambda kv: -rate(kv[1]))
        out[str(mine)] = {
            "calls": n,
            "slow": sum(rows[next(iter(rows))][1::2]) if rows else 0,
            "partners": [[o, *r] for o, r in ranked[:3]],  # other, busy calls, slow, idle, slow
        }
    return out


def _report(
    calls: list[list[float]], marks: list[list[Any]], alone_ms: float, origin: float
) -> dict[str, Any]:
    spans = [m for m in marks if len(m) == 3 and isinstance(m[1], float)]
    walls = [c[1] for c in calls]
    slow = [c for c in calls if c[1] > 2 * alone_ms]

    def during(c: list[float]) -> list[str]:
        end = c[0] + c[1] / 1e3
        return sorted({m[0] for m in spans if m[1] < end and m[2] > c[0]})

    by_step: dict[str, list[int]] = {}  # step: [calls, calls over 2x]
    for c in calls:
        for step in during(c) or ["(none marked)"]:
            counts = by_step.setdefault(step, [0, 0])
            counts[0] += 1
            counts[1] += c[1] > 2 * alone_ms
    return {
        "calls": len(calls),
        "median_ms": round(statistics.median(walls), 3) if walls else None,
        "over_2x": len(slow),
        "slowest_ms": round(max(walls), 3) if walls else None,
        "python_ns_median": round(statistics.median(c[3] for c in calls), 1) if calls else None,
        "gpu_us_median": round(statistics.median(c[4] for c in calls), 1) if calls else None,
        "slow_calls": [
            [round(c[0] - origin, 3), *(round(x, 3) for x in c[1:]), during(c)] for c in slow
        ][:200],
        "by_step": by_step,
        "steps": [[m[0], round(m[1] - origin, 3), round(m[2] - origin, 3)] for m in spans][:400],
        "said": [m for m in marks if m not in spans][:20],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help="repeatable"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--alone-seconds", type=float, default=10.0)
    parser.add_argument("--seconds", type=float, default=150.0, help="the longest a side runs")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    config_patch = config.patch(worker_spare_cores=config.jit_spare_cores)
    config_patch.__enter__()  # the CPUs JIT's workers get
    model, inputs = _model(args.device, small=False)
    warm = time.monotonic()
    _loop(model, inputs, args.device, lambda: time.monotonic() - warm > 2.0)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device != "cpu" else "cpu"
    }
    out["worker_cpus"] = isolation.worker_cpus()
    origin = time.monotonic()
    alone = _loop(
        model, inputs, args.device, lambda: time.monotonic() - origin > args.alone_seconds
    )
    alone_ms = statistics.median(c[1] for c in alone)
    out["alone"] = _report(alone, [], alone_ms, origin)
    print(f"alone: {alone_ms:.3f} ms median, {out['alone']['over_2x']} over 2x", flush=True)
    for variant in args.variants:
        with tempfile.TemporaryDirectory(prefix="compile-beside-") as folder:
            marks: list[list[Any]] = []
            procs = [
                _side(side, os.path.join(folder, str(i)), marks)
                for i, side in enumerate(VARIANTS[variant])
            ]
            origin = time.monotonic()

            def done(ps: list[Any] = procs, t: float = origin) -> bool:
                return all(p.poll() is not None for p in ps) or time.monotonic() - t > args.seconds

            sampler, samples = _sampler()
            calls = _loop(model, inputs, args.device, done)
            sampler.kill()
            sampler.wait()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            time.sleep(0.2)  # the readers' last lines
            r = _report(calls, marks, alone_ms, origin)
            r["exit"] = [p.returncode for p in procs]
            r["seconds"] = round(time.monotonic() - origin, 1)
            r["partners"] = _partners(calls, samples, alone_ms)
            out[variant if variant not in out else f"{variant}-{len(out)}"] = r
        print(
            f"{variant}: {r['seconds']} s (exit {r['exit']}), {r['calls']} calls, median "
            f"{r['median_ms']} ms, {r['over_2x']} over 2x (slowest {r['slowest_ms']} ms); "
            f"probes {r['python_ns_median']} ns, {r['gpu_us_median']} µs",
            flush=True,
        )
        for step, (n, over) in sorted(r["by_step"].items(), key=lambda kv: -kv[1][1]):
            print(f"  {step}: {n} calls, {over} over 2x", flush=True)
        for c in r["slow_calls"][:25]:
            print(f"  slow {c}", flush=True)
        for mine, p in r["partners"].items():
            print(
                f"  on CPU {mine}: {p['calls']} calls, {p['slow']} over 2x; partners (CPU, "
                f"calls with it busy, over 2x, idle, over 2x): {p['partners']}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
