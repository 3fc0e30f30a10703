"""bench/cpp_vs_python.py: one artifact, two front ends: honed-run (C++) against honed.load.

For each model, tunes it with AOTInductor (``target="cpp"``), saves it, then measures the same
artifact at each batch size through
  * C++: ``honed-run ARTIFACT --batch B --json`` (libhoned_runtime; the engine's protocol), and
  * Python: a fresh interpreter that times ``honed.load`` and measures the loaded honed.Module
    with the engine's protocol (CUDA events on the current stream on a GPU),
and prints load time and latency side by side. Each (model, batch) is measured --repeats times,
the two front ends taking turns to go first (a GPU warming up or a noisy neighbour then hits both
alike); the table shows the median over the repeats. Every record carries the commit, GPU, driver
and library versions; raw records go to --json.

    python bench/cpp_vs_python.py --honed-run build/cpp/cpp/runtime/honed-run \
        [--device cuda] [--models mlp convnet] [--batches 1 8] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from provenance import commit  # bench/provenance.py
from torch import nn

import honed

HERE = Path(__file__).resolve().parent


def build_model(name: str) -> tuple[nn.Module, list[int]]:
    """A model built in code and the shape of one sample without its batch axis."""
    torch.manual_seed(0)
    if name == "mlp":
        layers: list[nn.Module] = []
        for _ in range(4):
            layers += [nn.Linear(512, 512), nn.GELU()]
        return nn.Sequential(*layers, nn.Linear(512, 10)).eval(), [512]
    if name == "convnet":
        net = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
            nn.Flatten(), nn.Linear(128, 10),
        )  # fmt: skip
        return net.eval(), [3, 64, 64]
    raise SystemExit(f"unknown model {name!r}; choose mlp or convnet")


def tune_and_save(name: str, device: str, batches: list[int], path: Path) -> None:
    model, shape = build_model(name)
    module = honed.Module(model.to(device), name)
    sizes = sorted({1, *batches, max(batches) * 2})
    data = [torch.randn(b, *shape, device=device) for b in sizes]
    honed.tune(
        module,
        data,
        backends=[honed.backend.TorchInductorAotBackend()],
        target="cpp",
        device=device,
        isolation="none",
    )
    honed.save(module, path)


# Runs in a fresh interpreter, so the load is timed as a deployment would see it.
_PYTHON_SIDE = r"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
import honed
from honed import _core
from honed.candidate import make_timer
from cpp_vs_python import build_model
name, path, device, batch = sys.argv[2], sys.argv[3], torch.device(sys.argv[4]), int(sys.argv[5])
model, shape = build_model(name)
module = honed.Module(model.to(device), name)
start = time.perf_counter()
honed.load(module, path, trust_native_code=True)  # the artifact this script just built
load_s = time.perf_counter() - start
x = torch.randn(batch, *shape, device=device)
cfg = _core.MeasureConfig()
cfg.batch_size = batch
with torch.no_grad():
    module(x)
    m = _core.measure(lambda: module(x), make_timer(device), cfg)
s = m.stats
print(json.dumps({"load_s": load_s, "median_ms": s.median_ms, "p99_ms": s.p99_ms, "cv": s.cv,
                  "throughput": m.throughput, "stable": m.stable, "tuned": module.is_tuned}))
"""


def python_side(name: str, path: Path, device: str, batch: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _PYTHON_SIDE, str(HERE), name, str(path), device, str(batch)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"python side failed for {name} batch {batch}:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def cpp_side(honed_run: Path, path: Path, device: str, batch: int, out: Path) -> dict[str, Any]:
    done = subprocess.run(
        [str(honed_run), str(path), "--device", device, "--batch", str(batch), "--check",
         "--trust-native-code", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"honed-run failed for {path} batch {batch}:\n{done.stdout}{done.stderr}")
    r = json.loads(out.read_text())
    lat = r["latency"]
    return {
        "load_s": r["load_s"],
        "median_ms": lat["median_ms"],
        "p99_ms": lat["p99_ms"],
        "cv": lat["cv"],
        "throughput": r["throughput"],
        "stable": r["stable"],
        "check_ok": r["check"]["ok"],
    }


def environment(device: str) -> dict[str, Any]:
    env: dict[str, Any] = {
        "commit": commit(),
        "honed": honed.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": device,
    }
    if device.startswith("cuda"):
        probe = honed._core.probe_gpus()
        env["gpu"] = torch.cuda.get_device_name()
        env["driver"] = probe.driver_version
    return env


def table(records: list[dict[str, Any]]) -> str:
    """One row per (model, batch): medians over its repeats, and the range of the latency ratio."""
    lines = [
        "| model | batch | runs | C++ load s | Python load s | C++ median ms | Python median ms "
        "| C++ p99 ms | Python p99 ms | Python / C++ median (range) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        rows.setdefault((r["model"], r["batch"]), []).append(r)
    for (model, batch), runs in rows.items():

        def mid(side: str, field: str, runs: list[dict[str, Any]] = runs) -> float:
            return statistics.median(r[side][field] for r in runs)

        ratios = [r["python"]["median_ms"] / r["cpp"]["median_ms"] for r in runs]
        lines.append(
            f"| {model} | {batch} | {len(runs)} | {mid('cpp', 'load_s'):.3f} "
            f"| {mid('python', 'load_s'):.3f} | {mid('cpp', 'median_ms'):.4f} "
            f"| {mid('python', 'median_ms'):.4f} | {mid('cpp', 'p99_ms'):.4f} "
            f"| {mid('python', 'p99_ms'):.4f} | {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--honed-run", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=["mlp", "convnet"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per row")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    env = environment(args.device)
    records = []
    with tempfile.TemporaryDirectory(prefix="honed-cpp-vs-py-") as tmp:
        for name in args.models:
            path = Path(tmp) / f"{name}.honed"
            started = time.perf_counter()
            tune_and_save(name, args.device, args.batches, path)
            print(f"{name}: tuned and saved in {time.perf_counter() - started:.0f} s", flush=True)
            for batch in args.batches:
                for repeat in range(args.repeats):
                    sides = {}
                    for side in ("cpp", "python") if repeat % 2 == 0 else ("python", "cpp"):
                        sides[side] = (
                            cpp_side(args.honed_run, path, args.device, batch, Path(tmp) / "r.json")
                            if side == "cpp"
                            else python_side(name, path, args.device, batch)
                        )
                    first = next(iter(sides))
                    records.append(
                        {**env, "model": name, "batch": batch, "repeat": repeat, "first": first}
                        | sides
                    )
                    run = f"{name} batch {batch} run {repeat + 1}/{args.repeats}"
                    print(f"{run}: C++ {sides['cpp']}\n  Python {sides['python']}", flush=True)
                if args.json:  # after every record: a run stopped by a time limit keeps them
                    args.json.write_text(json.dumps(records, indent=2))
    print(f"\n{env}\n")
    print(table(records))
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))


if __name__ == "__main__":
    main()
