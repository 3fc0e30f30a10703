"""bench/gpu_neighbours.py: what another process's steps on the same GPU do to a program's calls.

Issue 23 wants no call of a program over 2x eager's median while JIT tunes beside it. The slow
calls left in ``bench/jit_bert.py``'s cold runs came as a worker took its first job (the graph-break
check, the first second of a build) and during a check: each a worker touching the GPU. This
bench times each such step alone: a loop of Hugging Face BERT-base calls (batch 8, sequence 128,
fp32, CUDA synchronised, as jit_bert.py's program) in this process, while a neighbour process
takes the steps one at a time, each after a quiet stretch, and says when each started and
ended (one monotonic clock for both). For each step: the slowest call overlapping it, over the
loop's median, beside the quiet stretches' slowest.

    python bench/gpu_neighbours.py --out neighbours.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

NEIGHBOUR = textwrap.dedent(
    r"""
    import pickle, sys, time
    def step(name, fn):
        t0 = time.monotonic(); fn(); t1 = time.monotonic()
        print(json.dumps([name, t0, t1]), flush=True)
    import json
    shared_path = sys.argv[1]
    state = {}
    def imp():
        import torch
        state["torch"] = torch
    def imp_inductor():
        import torch._inductor.compile_fx  # noqa
        import triton  # noqa
    def ctx():
        t = state["torch"]; t.cuda.init(); t.empty(1, device="cuda"); t.cuda.synchronize()
    def ipc():
        t = state["torch"]
        with open(shared_path, "rb") as f:
            shared = pickle.load(f)
        copies = {k: v.clone() for k, v in shared.items()}
        t.cuda.synchronize()
        state["weights"] = copies
        del shared
    def model():
        t = state["torch"]
        from transformers import BertConfig, BertModel
        m = BertModel(BertConfig()).eval()
        m.load_state_dict(state["weights"], strict=False)
        state["model"] = m.cuda()
        g = t.Generator().manual_seed(0)
        state["ids"] = t.randint(0, 30522, (8, 128), generator=g).cuda()
        t.cuda.synchronize()
    def forward():
        t = state["torch"]
        with t.no_grad():
            state["model"](input_ids=state["ids"])
        t.cuda.synchronize()
    def forward_bf16():
        t = state["torch"]
        with t.no_grad(), t.autocast("cuda", dtype=t.bfloat16):
            state["model"](input_ids=state["ids"])
        t.cuda.synchronize()
    def explain():
        t = state["torch"]
        import torch._dynamo
        with t.no_grad():
            torch._dynamo.explain(state["model"])(input_ids=state["ids"])
        t.cuda.synchronize()
    steps = {"import torch": imp, "import inductor and triton": imp_inductor,
             "create CUDA context": ctx, "open IPC handles and copy weights": ipc,
             "build its own model": model, "one fp32 forward": forward,
             "one bf16 autocast forward": forward_bf16, "dynamo explain": explain}
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        step(name, steps[name])
    """
)

PLAN = [
    "import torch",
    "import inductor and triton",
    "create CUDA context",
    "open IPC handles and copy weights",
    "build its own model",
    *["one fp32 forward"] * 5,
    *["one bf16 autocast forward"] * 5,
    "dynamo explain",
    *["one fp32 forward"] * 3,
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quiet-s", type=float, default=2.0, help="seconds between steps")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch
    from torch.multiprocessing.reductions import reduce_tensor
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).eval().cuda()
    ids = torch.randint(0, 30522, (8, 128), generator=torch.Generator().manual_seed(0)).cuda()
    calls: list[tuple[float, float]] = []  # (start, end) monotonic seconds
    with torch.no_grad():
        for _ in range(50):
            model(input_ids=ids)
        torch.cuda.synchronize()

    folder = Path(tempfile.mkdtemp(prefix="neighbours-"))
    shared = folder / "shared.pkl"

    class Shared:
        def __init__(self, t: torch.Tensor) -> None:
            self.t = t

        def __reduce__(self) -> Any:
            return reduce_tensor(self.t)

    with shared.open("wb") as f:
        pickle.dump({k: Shared(v) for k, v in model.state_dict().items()}, f)

    neighbour = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR, str(shared)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    steps: list[tuple[str, float, float]] = []
    quiet: list[tuple[float, float]] = []
    stop = threading.Event()

    def drive() -> None:
        assert neighbour.stdin is not None and neighbour.stdout is not None
        for name in PLAN:
            q0 = time.monotonic()
            time.sleep(args.quiet_s)
            quiet.append((q0 + 0.2, time.monotonic()))
            neighbour.stdin.write(name + "\n")
            neighbour.stdin.flush()
            got = json.loads(neighbour.stdout.readline())
            steps.append((got[0], got[1], got[2]))
        time.sleep(args.quiet_s)
        stop.set()

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    with torch.no_grad():
        while not stop.is_set():
            t0 = time.monotonic()
            model(input_ids=ids)
            torch.cuda.synchronize()
            calls.append((t0, time.monotonic()))
    neighbour.stdin.close()  # type: ignore[union-attr]
    neighbour.wait(30)

    median = statistics.median(e - s for s, e in calls) * 1e3

    def slowest(a: float, b: float) -> tuple[float, int]:
        over = [(e - s) * 1e3 for s, e in calls if e > a and s < b]
        return (max(over) if over else 0.0), len(over)

    rows = []
    for name, a, b in steps:
        ms, n = slowest(a, b + 0.002)
        rows.append(
            {
                "step": name,
                "seconds": round(b - a, 4),
                "calls": n,
                "slowest_ms": round(ms, 3),
                "over_median": round(ms / median, 2),
            }
        )
    quiet_slowest = max(slowest(a, b)[0] for a, b in quiet)
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "median_ms": round(median, 3),
        "calls": len(calls),
        "quiet_slowest_ms": round(quiet_slowest, 3),
        "quiet_over_median": round(quiet_slowest / median, 2),
        "steps": rows,
    }
    print(
        f"loop median {median:.3f} ms over {len(calls)} calls; quiet stretches' slowest "
        f"{quiet_slowest:.3f} ms ({quiet_slowest / median:.2f}x)"
    )
    for r in rows:
        print(
            f"  {r['step']:<36} {r['seconds']:>8.3f} s  {r['calls']:>4} calls  slowest "
            f"{r['slowest_ms']:>7.3f} ms ({r['over_median']:.2f}x)"
        )
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
