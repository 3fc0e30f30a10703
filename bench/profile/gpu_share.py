"""bench/profile/gpu_share.py: which kinds of GPU work in another process slow the program's calls.

A JIT tune's workers are other processes on the program's GPU, which time-slices between
processes and gives the program no priority. Here the program is a loop of BERT-base eager
calls (batch 8, seq 128, fp32), each synchronized and timed (host launch time and total); beside
it a side process runs steps one after another, each the kind of work a worker does: start
(import torch and transformers), its CUDA context, the program's module pickled for workers as
JIT does (``dumps``: in the program's process, on a thread that gives way to its calls, three
times), that module received as a JIT worker receives it (``ipc``: the weights' IPC handles
opened and copied into the worker's memory; ``release``: the handles let go), a bf16 copy of
it (``cast``), fresh device memory mapped and given back (``alloc``), copy weights in, single
forwards with gaps, forwards back to back, Inductor's kernel benchmarker, the graph-break check
(torch._dynamo.explain), an AOTInductor compile with Inductor's defaults and one with pointwise
autotuning off. Printed per step: the program's calls meanwhile (count, median, slowest, how
many over 2x the median of the loop alone, and the slowest call's launch time: a long launch is
the host, a short one the GPU).

    python bench/profile/gpu_share.py [--seconds-alone 5] [--steps start,forward,...] [--out F]
                                      [--side-env NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
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

from honed.pipeline import courtesy  # JIT's probe, set around "dumps"

STEPS = (
    "start",
    "context",
    "dumps",
    "ipc",
    "release",
    "cast",
    "alloc",
    "weights",
    "forward_gaps",
    "forward_loop",
    "benchmarker",
    "explain",
    "aoti_default",
    "aoti_no_pointwise_autotune",
)

# The side process: one step per line on stdin, answers "step start end" on stdout.
_SIDE = r"""
import json, os, sys, time
T = time.monotonic
def say(step, start, **extra):
    print(json.dumps({"step": step, "start": start, "end": T(), **extra}), flush=True)
start = T()
import torch
from transformers import BertConfig, BertModel
cpu = BertModel(BertConfig()).eval()
say("start", start)
model = received = None
for line in sys.stdin:
    step = line.strip()
    start = T()
    if step == "context":  # this process's CUDA context
        torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
        ids = torch.randint(0, 30000, (8, 128), device="cuda")
        kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    elif step.startswith("ipc "):  # the program's module, as a JIT worker receives it
        import pickle
        from honed.pipeline import sharing
        with open(step[4:], "rb") as f:
            received = pickle.loads(f.read())  # sharing.loads, but the handles kept till "release"
        torch.cuda.synchronize()
    elif step == "release":  # the handles let go, as sharing.loads ends
        sharing._COPIES.clear()
        torch.cuda.synchronize()
    elif step == "cast":  # a bf16 copy of the received weights, as a bf16 candidate's build
        bf16 = {k: v.to(torch.bfloat16) for k, v in received.state_dict().items()}
        torch.cuda.synchronize()
    elif step == "alloc":  # fresh device memory, mapped and given back five times
        for _ in range(5):
            x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda"); x.fill_(1)
            torch.cuda.synchronize(); del x; torch.cuda.empty_cache(); time.sleep(0.2)
    elif step == "weights":
        model = cpu.cuda(); torch.cuda.synchronize()
    elif step == "forward_gaps":
        with torch.no_grad():
            for _ in range(20):
                model(**kw); torch.cuda.synchronize(); time.sleep(0.2)
    elif step == "forward_loop":
        with torch.no_grad():
            while T() - start < 3:
                model(**kw)
            torch.cuda.synchronize()
    elif step == "benchmarker":
        from torch._inductor.runtime.benchmarking import benchmarker
        a = torch.randn(4096, 4096, device="cuda")
        for _ in range(10):
            benchmarker.benchmark_gpu(lambda: a @ a); time.sleep(0.2)
    elif step == "explain":
        import torch._dynamo
        with torch.no_grad():
            torch._dynamo.explain(model)(**kw)
        torch._dynamo.reset()
    elif step.startswith("aoti"):
        import torch._inductor.config as ic
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = sys.argv[1] + "/" + step
        options = {"triton.autotune_pointwise": False} if "no_pointwise" in step else {}
        with torch.no_grad():
            ep = torch.export.export(model, (), kw)
            marks = [("exported", T())]
            path = torch._inductor.aoti_compile_and_package(
                ep, package_path=sys.argv[1] + f"/{step}.pt2", inductor_configs=options)
        marks.append(("compiled", T()))
        say(step, start, marks=marks)
        continue
    say(step, start)
"""


_IN_CALL = [False]
_MODEL: list[Any] = []  # the program's model, for the "dumps" step


def _program(until: threading.Event, calls: list[tuple[float, float, float]]) -> None:
    import torch
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).cuda().eval()
    _MODEL.append(model)
    ids = torch.randint(0, 30000, (8, 128), device="cuda")
    kw = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        for _ in range(20):
            model(**kw)
        torch.cuda.synchronize()
        while not until.is_set():
            start = time.monotonic()
            _IN_CALL[0] = True
            model(**kw)
            _IN_CALL[0] = False
            courtesy.call_ended()
            launched = time.monotonic()
            torch.cuda.synchronize()
            calls.append((start, launched - start, time.monotonic() - start))


def _dumps(blob: Path) -> dict[str, Any]:
    """The program's module pickled for a worker three times on a thread of this process (the
    graph-break check's worker and a tune's two), the last kept in ``blob`` for "ipc" (the
    other two are never loaded: torch keeps their shares counted until this process ends)."""
    from honed.pipeline import sharing

    out: dict[str, Any] = {}

    def work() -> None:
        out["start"] = time.monotonic()
        for _ in range(3):
            frames, _count = sharing.dumps(_MODEL[0])
        blob.write_bytes(bytes(frames[0]))
        out["end"] = time.monotonic()

    courtesy.watch(lambda: _IN_CALL[0])  # it gives way to the calls, as JIT's threads do
    try:
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        courtesy.watch(None)
    return {"step": "dumps", **out}


def _summary(calls: list[tuple[float, float, float]], base: float) -> dict[str, Any]:
    if not calls:
        return {"calls": 0}
    total = [c[2] for c in calls]
    slowest = max(calls, key=lambda c: c[2])
    return {
        "calls": len(calls),
        "median_ms": round(statistics.median(total) * 1e3, 3),
        "slowest_ms": round(slowest[2] * 1e3, 3),
        "slowest_launch_ms": round(slowest[1] * 1e3, 3),
        "over_2x": sum(t > 2 * base for t in total),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds-alone", type=float, default=5.0)
    p.add_argument("--steps", default=",".join(STEPS))
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--side-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a variable for the side process only (e.g. PYTORCH_CUDA_ALLOC_CONF=...)",
    )
    args = p.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    calls: list[tuple[float, float, float]] = []
    until = threading.Event()
    program = threading.Thread(target=_program, args=(until, calls), daemon=True)
    program.start()
    while len(calls) < 50:
        time.sleep(0.1)
    time.sleep(args.seconds_alone)
    alone = list(calls)
    base = statistics.median(c[2] for c in alone)
    results = {"alone": _summary(alone, base), "side_env": args.side_env, "steps": []}
    print(f"alone: {results['alone']}", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        side = subprocess.Popen(
            [sys.executable, "-c", _SIDE, scratch],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                **dict(v.split("=", 1) for v in args.side_env),
            },
        )
        assert side.stdin is not None and side.stdout is not None

        def read() -> dict[str, Any]:
            line = side.stdout.readline()
            if not line:
                raise SystemExit(f"the side process ended (exit {side.wait()})")
            return json.loads(line)

        answers = [read()]  # "start" is its first step, unasked
        blob = Path(scratch) / "module.pickle"
        for step in steps[1:] if steps[:1] == ["start"] else steps:
            if step == "dumps":  # in this process, beside its calls, as JIT pickles per worker
                answers.append(_dumps(blob))
            else:
                side.stdin.write((f"ipc {blob}" if step == "ipc" else step) + "\n")
                side.stdin.flush()
                answers.append(read())
                answers[-1]["step"] = step
            time.sleep(1.0)  # a gap between steps, so each step's calls are its own
        side.stdin.close()
        side.wait()
    until.set()
    program.join()
    for a in answers:
        during = [c for c in calls if a["start"] <= c[0] <= a["end"]]
        row = {"step": a["step"], "seconds": round(a["end"] - a["start"], 2)}
        row.update(_summary(during, base))
        if "marks" in a:
            row["marks_s"] = {name: round(t - a["start"], 2) for name, t in a["marks"]}
        results["steps"].append(row)
        print(row, flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
