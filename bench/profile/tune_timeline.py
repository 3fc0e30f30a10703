"""bench/profile/tune_timeline.py: where the time of a default tune goes: tunes an MLP (4 x
Linear(512, 512) + GELU) at batch 1 with honed's default candidates and prints, per candidate,
when it started and finished and its phases (from honed's progress tracker), then the report.

    python bench/profile/tune_timeline.py [cuda|cpu]

Run it twice in fresh processes to compare empty and warm compile caches (honed's tuning cache
is off both times, so every candidate is built and measured)."""

import sys
import time

import torch
from torch import nn

import honed
from honed.pipeline import progress

START = time.perf_counter()


def stamp(what: str) -> None:
    print(f"{time.perf_counter() - START:8.2f} s  {what}", flush=True)


def traced(name: str, original):  # type: ignore[no-untyped-def]
    def wrapper(self, *args):  # type: ignore[no-untyped-def]
        stamp(f"{name} {' '.join(str(a) for a in args)}")
        return original(self, *args)

    return wrapper


for method in ("candidate", "phase", "finished"):
    setattr(progress.Tracker, method, traced(method, getattr(progress.Tracker, method)))

device = sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
layers: list[nn.Module] = []
for _ in range(4):
    layers += [nn.Linear(512, 512), nn.GELU()]
model = nn.Sequential(*layers, nn.Linear(512, 10)).eval().to(device)
wrapped = honed.Module(model, "mlp")
stamp("tune starts")
with honed.config.patch(cache_enabled=False):
    report = honed.tune(wrapped, [torch.randn(1, 512, device=device)], device=device)
stamp(f"tune done ({report.wall_s:.1f} s)")
print(report.render(width=200))
