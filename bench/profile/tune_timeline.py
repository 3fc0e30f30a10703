"""bench/profile/tune_timeline.py: where the time of a default tune goes: tunes one model of the
suite (bench/models.py; default the MLP) with honed's default candidates and prints, per
candidate, when it started and finished and its phases (from honed's progress tracker), then
the report.

    python bench/profile/tune_timeline.py [--model vit_b_16] [--batch 1] [--device cuda]

Run it in a fresh process with empty caches (HONED_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR) to see a cold tune as a new user meets it."""

import argparse
import sys
import time
from pathlib import Path

import torch

import honed
from honed.pipeline import isolation, pool, progress, tuner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import SPECS  # bench/models.py

START = time.perf_counter()


def stamp(what: str) -> None:
    print(f"{time.perf_counter() - START:8.2f} s  {what}", flush=True)


def traced(name: str, original):  # type: ignore[no-untyped-def]
    def wrapper(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        stamp(f"{name} {' '.join(str(a) for a in args)}")
        return original(self, *args, **kwargs)

    return wrapper


def around(owner: object, name: str, label: str) -> None:
    """Stamp when ``owner.name`` is entered and when it returns."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        stamp(f"{label} ...")
        try:
            return original(*args, **kwargs)
        finally:
            stamp(f"{label} done")

    setattr(owner, name, wrapper)


for method in ("candidate", "phase", "finished"):
    setattr(progress.Tracker, method, traced(method, getattr(progress.Tracker, method)))
# The steps before the first build: the worker pool's start, and what travels to the workers.
around(isolation.GraphJobs, "__init__", "the graph's job context (module, samples, outputs)")
around(pool.WorkerPool, "__init__", "worker pool created")
around(pool._Slot, "_wait_ready", "a worker's start (importing torch)")
around(tuner, "_record", "recording the samples")
around(tuner.machine, "start_of_tune", "the machine check (load, GPU)")

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mlp", choices=list(SPECS))
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--budget", type=float, default=None, help="time_budget_s of the tune")
args = parser.parse_args()
device = torch.device(args.device)
spec = SPECS[args.model]
model = spec.build().to(device)
wrapped = honed.Module(model, args.model)
stamp("tune starts")
report = honed.tune(
    wrapped,
    [spec.inputs(args.batch, device)],
    device=str(device),
    time_budget_s=args.budget,
)
stamp(f"tune done ({report.wall_s:.1f} s)")
print(report.render(width=200))
