"""bench/profile/module_loading.py: what CUDA_MODULE_LOADING=EAGER costs a process at its start.

CUDA loads each kernel's module at its first launch by default (lazy loading); a first build of a
new path in a program's process (JIT's in-process capture) then loads modules beside the
program's calls, and a module load holds up the program's kernel launches. EAGER loads every
module when the process creates its CUDA context instead. This times, in a fresh process per
setting, the context's creation (the first tensor on the GPU), the GPU memory the process holds
then, and BERT-base's first and median eager calls (batch 8, seq 128).

    python bench/profile/module_loading.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = """
import json, statistics, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
t2 = time.perf_counter()
free, total = torch.cuda.mem_get_info()
held_mib = (total - free) / 2**20
from transformers import BertConfig, BertModel
model = BertModel(BertConfig()).cuda().eval()
ids = torch.randint(0, 30000, (8, 128), device="cuda")
mask = torch.ones(8, 128, dtype=torch.long, device="cuda")
times = []
with torch.no_grad():
    for _ in range(50):
        s = time.perf_counter()
        model(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - s) * 1e3)
print(json.dumps({
    "import_torch_s": round(t1 - t0, 3),
    "context_s": round(t2 - t1, 3),
    "gpu_held_at_start_mib": round(held_mib),
    "bert_first_call_ms": round(times[0], 1),
    "bert_median_ms": round(statistics.median(times[10:]), 3),
    "gpu_held_after_mib": round((total - torch.cuda.mem_get_info()[0]) / 2**20),
}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = {}
    for setting in ("LAZY", "EAGER"):
        env = dict(os.environ, CUDA_MODULE_LOADING=setting)
        out = subprocess.run(
            [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=True
        )
        rows[setting] = json.loads(out.stdout.strip().splitlines()[-1])
        print(setting, json.dumps(rows[setting]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
