"""bench/profile/autotune_cost.py: what Inductor's pointwise autotuning costs an AOTInductor build,
and what it buys (GPU).

JIT builds its AOTInductor candidates beside the program's calls; Inductor's autotuning runs
kernel benchmarks on the program's GPU while it compiles. This builds BERT-base (batch 8, seq 128)
as JIT's pick is built (AOTInductor, bf16 weights, CUDA graphs), once per setting, each in a
fresh process on empty Inductor and honed caches, and times each build; then one process loads
every artifact and times them in turns (blocks of calls, CUDA-synchronised), so the speed ratio
is side by side.

    python3 bench/profile/autotune_cost.py [--rounds 30] [--out autotune_cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

SETTINGS = {
    "defaults": {},
    "no pointwise autotune": {"triton.autotune_pointwise": False},
}

MODEL = textwrap.dedent(
    """
    import torch
    from transformers import BertConfig, BertModel
    torch.manual_seed(0)
    model = BertModel(BertConfig()).cuda().eval()
    ids = torch.randint(0, 30000, (8, 128), device="cuda")
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    """
)

BUILD = MODEL + textwrap.dedent(
    """
    import json, sys, time
    import honed
    from honed.backend.torch_inductor_aot import (
        TorchInductorAotBackend, TorchInductorAotBackendConfig)
    from honed.tune_strategy import OneBackendStrategy
    options, path = json.loads(sys.argv[1]), sys.argv[2]
    config = TorchInductorAotBackendConfig(
        precision="bf16", cuda_graphs=True, options=options or None)
    module = honed.Module(model, "bert", strategy=OneBackendStrategy(
        TorchInductorAotBackend(config)))
    started = time.perf_counter()
    report = honed.tune(module, [inputs])
    took = time.perf_counter() - started
    honed.save(module, path)
    rows = [c for g in report.graphs for c in g.candidates]
    print(json.dumps({"tune_s": took, "selected": report.selected(),
                      "build_s": {c.name: c.build_s for c in rows}}))
    """
)

TIME = MODEL + textwrap.dedent(
    """
    import json, statistics, sys, time
    import honed
    paths, rounds = json.loads(sys.argv[1]), int(sys.argv[2])
    tuned = {}
    for name, path in paths.items():
        tuned[name] = honed.Module(model, "bert")
        honed.load(tuned[name], path, trust_native_code=True)
    blocks = {name: [] for name in tuned}
    with torch.no_grad():
        for _ in range(rounds):
            for name, m in tuned.items():
                m(**inputs); torch.cuda.synchronize()  # the block's first call: the switch
                t0 = time.perf_counter()
                for _ in range(50):
                    m(**inputs)
                torch.cuda.synchronize()
                blocks[name].append((time.perf_counter() - t0) / 50 * 1e3)
    print(json.dumps({n: statistics.median(b) for n, b in blocks.items()}))
    """
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    results: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="honed-autotune-") as tmp:
        paths = {}
        for name, options in SETTINGS.items():
            work = Path(tmp) / name.replace(" ", "-")
            work.mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith("HONED_")}
            env.update(
                TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"),
                HONED_CACHE_DIR=str(work / "honed"),
                TMPDIR=str(work),
            )
            paths[name] = str(work / "bert.honed")
            proc = subprocess.run(
                [sys.executable, "-c", BUILD, json.dumps(options), paths[name]],
                env=env,
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                sys.exit(f"{name}: the build failed:\n{proc.stderr[-3000:]}")
            results[name] = {"options": options, **json.loads(proc.stdout.splitlines()[-1])}
            print(name, results[name], flush=True)
        proc = subprocess.run(
            [sys.executable, "-c", TIME, json.dumps(paths), str(args.rounds)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            sys.exit(f"timing failed:\n{proc.stderr[-3000:]}")
        medians = json.loads(proc.stdout.splitlines()[-1])
    first = next(iter(medians))
    for name, ms in medians.items():
        results[name]["median_ms"] = round(ms, 4)
        results[name]["vs_defaults"] = round(ms / medians[first], 4)
        print(f"{name}: {ms:.4f} ms a call ({ms / medians[first]:.3f}x {first})", flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
