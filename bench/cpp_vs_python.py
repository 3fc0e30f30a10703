"""bench/cpp_vs_python.py: one artifact, two front ends: honed-run (C++) against honed.load.

Measures a target="cpp" artifact at each batch size through
  * C++: ``honed-run ARTIFACT --batch B --json`` (libhoned_runtime, CUDA graphs on by default;
    on CUDA also with ``--no-cuda-graphs``), with where its load time went, and
  * Python: a fresh interpreter that times ``honed.load`` of the same artifact and measures the
    loaded honed.Module with the engine's protocol (CUDA events on the current stream on a GPU),
  * optionally the best Python selection (``--python-artifact``, an artifact of a target="python"
    tune of the same model; or ``--python-best``, which tunes the Python-only candidates that won
    the suite's GPU rows), loaded and measured the same way; the best Python figure is the faster
    of that and the C++ artifact loaded in Python: issue 22's "C++ within 5 % of the best Python
    candidate" is the C++ / Python column,
and reports the artifact's size against its stored weights. Each (model, batch) is measured
--repeats times, the sides taking turns to go first (a GPU warming up or a noisy neighbour then
hits all alike); the table shows medians over the repeats. Every record carries the commit, GPU,
driver and library versions; raw records go to --json.

Without --artifact it tunes each of --models itself (target="cpp": honed's default candidates for
the C++ runtime, every AOTInductor precision and layout; --time-budget caps it) at the --batches
given (one batch: static shapes, as the suite's rows) and saves it;
--models takes the built-in "mlp" and "convnet" or the suite's models (bench/models.py: "bert",
"resnet50", ...). With --artifact it measures that file, built from --models' one model:

    python bench/cpp_vs_python.py --honed-run build/cpp/cpp/runtime/honed-run \
        [--device cuda] [--models mlp convnet] [--batches 1 8] [--repeats 3] [--json FILE]
    python bench/cpp_vs_python.py --honed-run ... --models bert --batches 8 \
        --artifact bert-cpp.honed [--python-artifact bert-python.honed]
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
import zipfile
from pathlib import Path
from typing import Any

import torch
from provenance import commit  # bench/provenance.py
from torch import nn

import honed

HERE = Path(__file__).resolve().parent
LOCAL = ("mlp", "convnet")  # built here; any other name comes from bench/models.py


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


def model_and_input(name: str, batch: int, device: str) -> tuple[nn.Module, torch.Tensor]:
    """The model (seeded weights, eval) on `device` and one batch of its inputs."""
    if name in LOCAL:
        model, shape = build_model(name)
        g = torch.Generator().manual_seed(batch)
        return model.to(device), torch.randn(batch, *shape, generator=g).to(device)
    from models import SPECS  # bench/models.py

    if name not in SPECS:
        raise SystemExit(f"unknown model {name!r}; choose one of {[*LOCAL, *SPECS]}")
    spec = SPECS[name]
    if spec.missing():
        raise SystemExit(spec.missing())
    return spec.build().to(device), spec.inputs(batch, torch.device(device))


def tune_and_save(
    name: str,
    device: str,
    batches: list[int],
    path: Path,
    target: str = "cpp",
    backends: list[Any] | None = None,
    time_budget_s: float | None = None,
) -> dict[str, Any]:
    """Tune ``name`` at ``batches`` (one batch: static shapes, as the suite's rows) and save it.

    target="cpp" with ``backends`` None: honed's default candidates for the C++ runtime (every
    AOTInductor precision and layout); target="python": ``backends``, or the defaults. Returns
    what the report says of the tune (selected, seconds, each candidate's status)."""
    model, _ = model_and_input(name, 1, device)
    module = honed.Module(model, name)
    data = [model_and_input(name, b, device)[1] for b in batches]
    started = time.perf_counter()
    report = honed.tune(
        module, data, backends=backends, target=target, device=device,
        time_budget_s=time_budget_s,
    )  # fmt: skip
    tune_s = time.perf_counter() - started
    honed.save(module, path)
    return {
        "target": target,
        "tune_s": tune_s,
        "selected": report.selected(),
        "report": str(report).splitlines()[-40:],
    }


def python_best_backends(name: str) -> list[Any]:
    """The Python-only candidates that won the suite's GPU rows (bench/RESULTS.md): Inductor's
    reduce-overhead with bf16 weights, and for image models the same in channels_last. The
    AOTInductor candidates are the C++ artifact's own, measured through honed.load too."""
    from models import SPECS  # bench/models.py

    from honed.backend import TorchInductorBackend
    from honed.backend.torch_inductor import TorchInductorBackendConfig as Inductor

    found = [TorchInductorBackend(Inductor(mode="reduce-overhead", precision="bf16"))]
    if name in SPECS and SPECS[name].kind == "image":
        found.append(
            TorchInductorBackend(
                Inductor(mode="reduce-overhead", precision="bf16", memory_format="channels_last")
            )
        )
    return found


def sizes(path: Path) -> dict[str, int]:
    """The artifact's bytes, its modules' stored weights and its compiled packages."""
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        entry = {i.filename: i.file_size for i in z.infolist()}
    weights = sum(entry.get(m.get("weights") or "", 0) for m in manifest["modules"])
    payload = [
        (file, entry.get(name, 0))
        for m in manifest["modules"]
        for g in m["graphs"]
        for file, name in (g.get("payload") or {}).items()
    ]
    # Issue 22's goal: the artifact within 1.05x of the weights plus the compiled code (the .pt2).
    code = sum(size for file, size in payload if file.endswith(".pt2"))
    # The stored check sample (inputs and eager's outputs, for honed-run --check): at batch 64 of
    # 224x224 images it is the largest entry after the weights.
    samples = sum(
        entry.get(name, 0)
        for m in manifest["modules"]
        for g in m["graphs"]
        for name in (g.get("samples"), g.get("outputs"))
        if name
    )
    return {"artifact_bytes": path.stat().st_size, "weights_bytes": weights,
            "payload_bytes": sum(size for _, size in payload), "code_bytes": code,
            "samples_bytes": samples}  # fmt: skip


# Runs in a fresh interpreter, so the load is timed as a deployment would see it.
_PYTHON_SIDE = r"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
import honed
from honed import _core
from honed.pipeline.candidate import make_timer
from cpp_vs_python import model_and_input
name, path, device, batch = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
model, x = model_and_input(name, batch, device)
module = honed.Module(model, name)
start = time.perf_counter()
honed.load(module, path, trust_native_code=True)  # an artifact the caller names
load_s = time.perf_counter() - start
cfg = _core.MeasureConfig()
cfg.batch_size = batch
with torch.no_grad():
    module(x)
    m = _core.measure(lambda: module(x), make_timer(torch.device(device)), cfg)
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
        raise SystemExit(f"python side failed for {path} batch {batch}:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def cpp_side(
    honed_run: Path, path: Path, device: str, batch: int, out: Path, graphs: bool = True
) -> dict[str, Any]:
    argv = [str(honed_run), str(path), "--device", device, "--batch", str(batch), "--check",
            "--trust-native-code", "--json", str(out)]  # fmt: skip
    if not graphs:
        argv.append("--no-cuda-graphs")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"honed-run failed for {path} batch {batch}:\n{done.stdout}{done.stderr}")
    r = json.loads(out.read_text())
    lat = r["latency"]
    return {
        "load_s": r["load_s"],
        "load_phases": {p["phase"]: p["seconds"] for p in r.get("load_phases", [])},
        "cuda_graphs": r.get("cuda_graphs", ""),
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
    """One row per (model, batch): medians over its repeats."""
    lines = [
        "| model | batch | runs | C++ load s | Python load s | C++ median ms | C++ no graphs ms "
        "| Python median ms | best Python ms | C++ / Python (best if given) | C++ samples/s "
        "| artifact MB | weights MB | code MB | artifact / weights | artifact / (weights + code) |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in records:
        rows.setdefault((r["model"], r["batch"]), []).append(r)
    for (model, batch), runs in rows.items():

        def mid(side: str, field: str, runs: list[dict[str, Any]] = runs) -> float | None:
            values = [r[side][field] for r in runs if side in r]
            return statistics.median(values) if values else None

        def cell(v: float | None, digits: int) -> str:
            return "—" if v is None else f"{v:.{digits}f}"

        pythons = [m for m in (mid("python_best", "median_ms"), mid("python", "median_ms")) if m]
        best = min(pythons) if pythons else None
        cpp = mid("cpp", "median_ms")
        size = runs[0]["sizes"]
        mb = 1e6
        weights = size["weights_bytes"]
        ratio = size["artifact_bytes"] / weights if weights else None
        code = size.get("code_bytes", 0)
        with_code = size["artifact_bytes"] / (weights + code) if weights + code else None
        lines.append(
            f"| {model} | {batch} | {len(runs)} | {cell(mid('cpp', 'load_s'), 3)} "
            f"| {cell(mid('python', 'load_s'), 3)} | {cell(cpp, 4)} "
            f"| {cell(mid('cpp_plain', 'median_ms'), 4)} | {cell(mid('python', 'median_ms'), 4)} "
            f"| {cell(mid('python_best', 'median_ms'), 4)} "
            f"| {cell(cpp / best if cpp and best else None, 3)} "
            f"| {cell(mid('cpp', 'throughput'), 1)} | {size['artifact_bytes'] / mb:.1f} "
            f"| {weights / mb:.1f} | {code / mb:.1f} | {cell(ratio, 3)} | {cell(with_code, 3)} |"
        )
    return "\n".join(lines)


def phases_table(records: list[dict[str, Any]]) -> str:
    """Where honed-run's load time went: the median of each phase over every C++ run."""
    by_phase: dict[str, list[float]] = {}
    for r in records:
        for phase, seconds in r["cpp"].get("load_phases", {}).items():
            by_phase.setdefault(phase, []).append(seconds)
    lines = ["| honed-run load phase | median s |", "|---|--:|"]
    lines += [f"| {p} | {statistics.median(v):.3f} |" for p, v in by_phase.items()]
    return "\n".join(lines)


def measure(args: argparse.Namespace, name: str, path: Path, tmp: Path, env: dict[str, Any],
            records: list[dict[str, Any]]) -> None:  # fmt: skip
    """Every batch size of one artifact, --repeats times, the sides taking turns to go first."""
    sides_of = ["cpp", "python"]
    if args.device.startswith("cuda"):
        sides_of.append("cpp_plain")
    if args.python_artifact:
        sides_of.append("python_best")
    size = sizes(path)
    for batch in args.batches:
        for repeat in range(args.repeats):
            order = sides_of[repeat % len(sides_of) :] + sides_of[: repeat % len(sides_of)]
            sides: dict[str, Any] = {}
            for side in order:
                if side.startswith("cpp"):
                    sides[side] = cpp_side(args.honed_run, path, args.device, batch,
                                           tmp / "r.json", graphs=side == "cpp")  # fmt: skip
                else:
                    which = path if side == "python" else args.python_artifact
                    sides[side] = python_side(name, which, args.device, batch)
            record = {**env, "model": name, "batch": batch, "repeat": repeat, "first": order[0]}
            records.append(record | {"sizes": size} | sides)
            print(f"{name} batch {batch} run {repeat + 1}/{args.repeats}:", flush=True)
            for side, r in sides.items():
                print(f"  {side}: {r}", flush=True)
            if args.json:  # after every record: a run stopped by a time limit keeps them
                args.json.write_text(json.dumps(records, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--honed-run", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", default=["mlp", "convnet"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side per row")
    parser.add_argument("--artifact", type=Path, help="measure this target='cpp' artifact")
    parser.add_argument("--python-artifact", type=Path, help="the best Python selection's artifact")
    parser.add_argument(
        "--python-best",
        action="store_true",
        help="also tune the Python-only winners of the suite (reduce-overhead, bf16 weights) and "
        "measure them as the best Python side",
    )
    parser.add_argument(
        "--time-budget", type=float, default=None, help="the target='cpp' tune's time_budget_s"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if (args.artifact or args.python_artifact or args.python_best) and len(args.models) != 1:
        parser.error("--artifact/--python-artifact measure one model: give --models NAME")
    for given in (args.artifact, args.python_artifact):
        if given is not None and not given.is_file():
            parser.error(f"{given} does not exist")
    env = environment(args.device)
    records: list[dict[str, Any]] = []
    tunes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="honed-cpp-vs-py-") as tmp:
        for name in args.models:
            path = args.artifact or Path(tmp) / f"{name}.honed"
            if args.artifact is None:
                tuned = tune_and_save(
                    name, args.device, args.batches, path, time_budget_s=args.time_budget
                )
                tunes.append({"model": name, **tuned})
                print(f"{name}: target=cpp tuned and saved in {tuned['tune_s']:.0f} s", flush=True)
                print("\n".join(tuned["report"]), flush=True)
            if args.python_best and args.python_artifact is None:
                args.python_artifact = Path(tmp) / f"{name}-python.honed"
                tuned = tune_and_save(
                    name, args.device, args.batches, args.python_artifact, target="python",
                    backends=python_best_backends(name),
                )  # fmt: skip
                tunes.append({"model": name, **tuned})
                print(f"{name}: Python best tuned and saved in {tuned['tune_s']:.0f} s", flush=True)
            measure(args, name, path, Path(tmp), env, records)
            if args.python_best:
                args.python_artifact = None
    print(f"\n{env}\n")
    print(table(records))
    print()
    print(phases_table(records))
    if args.json:
        args.json.write_text(json.dumps(records, indent=2))
        if tunes:
            args.json.with_suffix(".tunes.json").write_text(json.dumps(tunes, indent=2))


if __name__ == "__main__":
    main()
