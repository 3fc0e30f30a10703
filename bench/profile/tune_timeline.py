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
from honed.backend.registry import lookup_backend
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


def _slot_noted(original):  # type: ignore[no-untyped-def]
    def run(self, job):  # type: ignore[no-untyped-def]
        result = original(self, job)
        stamp(f"{job.kind} {job.label} ran on worker slot {self.index}")
        return result

    return run


pool._Slot._run = _slot_noted(pool._Slot._run)

parser = argparse.ArgumentParser()
parser.add_argument("--model", default="mlp", choices=list(SPECS))
parser.add_argument("--batch", type=int, default=1)
parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
parser.add_argument("--budget", type=float, default=None, help="time_budget_s of the tune")
parser.add_argument(
    "--backends",
    default="",
    help="comma-separated registered backend names to tune with instead of honed's defaults",
)
parser.add_argument(
    "--any-worker",
    action="store_true",
    help="the finalists' re-measure to whichever worker is idle first, not the one that built most"
    " of them (for a side-by-side comparison)",
)
args = parser.parse_args()
if args.any_worker:
    isolation._loads_best_on = lambda outcomes: -1
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
    strategy=honed.MaxThroughputStrategy(
        [lookup_backend(name)() for name in args.backends.split(",")]
    )
    if args.backends
    else None,
)
stamp(f"tune done ({report.wall_s:.1f} s)")
print(report.render(width=200))
