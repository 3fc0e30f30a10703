"""bench/suite.py: the GPU benchmark suite: every model x batch, honed's tune against eager fp32.

    python bench/suite.py [--full] [--models mlp bert ...] [--batches 1 8 64] [--device cuda]
                          [--candidates light|default] [--max-autotune none|first|all]
                          [--budget-s 400] [--out bench/results/FILE.json]

Per model and batch (llama-bench style: lists of models and batches, the product is run):
  1. honed.tune with eager fp32 as the baseline: every candidate it tried with its figures
     (median, p99, throughput, build time, max error, status, latency samples) and its selection;
     tuning wall time;
  2. an independent check outside honed's selection: every candidate that passed is rebuilt here
     and re-measured round-robin, each call timed alone with CUDA events (host clock on CPU),
     rotating the order each round; the best median and how far honed's selection is from it;
  3. optionally the time of torch.compile(mode="max-autotune") alone (compile + first call), in a
     fresh process with a cold compile cache and a timeout.
Plus the per-call overhead of honed.Module (bench/overhead.py) and, with --knee, the throughput
knee of eager found by the engine's batch sweep (added as one more batch).

The JSON (schema below, see bench/report.py) is rewritten atomically after every row, so a run
stopped by a time limit keeps what it finished; --budget-s stops starting rows that would not fit.
Light mode (default): MLP, BERT, ResNet-50 at batches 1 and 64, candidates Inductor
reduce-overhead and CUDA graphs (fp32 and bf16 autocast), in-process candidates (no workers),
at most 6 measurement windows. --full: all five models, batches 1 8 64 + knee, honed's default
candidates (max-autotune variants, AOTInductor), worker processes, the full protocol.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from models import SPECS  # bench/models.py (the script's folder is on sys.path)
from provenance import commit  # bench/provenance.py

import honed
from honed import _core
from honed.backend import (
    Backend,
    CudaGraphsBackend,
    CudaGraphsBackendConfig,
    TorchInductorBackend,
    TorchInductorBackendConfig,
)
from honed.backend.base import GraphInfo, Sample
from honed.backend.registry import default_backends
from honed.environment import fingerprint
from honed.tuning import _dynamo_limits

SCHEMA = "honed-bench-suite/1"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
LIGHT_MODELS = ["mlp", "bert", "resnet50"]
LIGHT_BATCHES = [1, 64]
FULL_BATCHES = [1, 8, 64]
KEPT_SAMPLES = 300  # latency samples kept per candidate for the distribution plots
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


# -- environment -------------------------------------------------------------------------------
def _version(*dists: str) -> str | None:
    from importlib import metadata

    for dist in dists:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(dist)
    return None


def environment(device: torch.device) -> dict[str, Any]:
    env = fingerprint(device)
    env["commit"] = commit()
    env["triton"] = _version("triton", "pytorch-triton")
    env["driver"] = None
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()  # "highest": no TF32
    env["cudnn_allow_tf32"] = torch.backends.cudnn.allow_tf32  # convolutions in eager fp32
    if device.type == "cuda":
        probe = _core.probe_gpus()
        env["driver"] = probe.driver_version or None
        env["driver_cuda"] = _core.cuda_version_string(probe.driver_cuda_version)
    return env


# -- candidates --------------------------------------------------------------------------------
def light_candidates(device: torch.device) -> list[Backend]:
    """Inductor reduce-overhead and CUDA graphs, fp32 and bf16 autocast (no max-autotune)."""
    if device.type != "cuda":
        return [TorchInductorBackend()]
    bf16 = torch.bfloat16
    inductor = TorchInductorBackendConfig
    return [
        TorchInductorBackend(inductor(mode="reduce-overhead")),
        TorchInductorBackend(
            inductor(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=bf16)
        ),
        CudaGraphsBackend(),
        CudaGraphsBackend(CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=bf16)),
    ]


def candidates(kind: str, device: torch.device) -> list[Backend]:
    return light_candidates(device) if kind == "light" else default_backends(device)


def precision(name: str) -> str:
    """fp32, bf16 or fp16, from a candidate's name (autocast defaults to bf16)."""
    if "float16" in name and "bfloat16" not in name:
        return "fp16"
    return "bf16" if "autocast_enabled=True" in name or "bfloat16" in name else "fp32"


# -- the independent check ---------------------------------------------------------------------
def _timer(device: torch.device) -> Callable[[Callable[[], Any]], tuple[float, float]]:
    """(device ms, host wall ms) of one call, waited for: CUDA events around it and the host
    clock around the whole (record, call, record, synchronize); on a CPU both are the host clock.

    One call at a time (as a batch-1 request is served) measures the latency honed ranks by;
    back-to-back calls would hide a backend's host overhead behind the previous call's kernels.
    """
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

        def cuda_call(fn: Callable[[], Any]) -> tuple[float, float]:
            began = time.perf_counter()
            start.record()
            fn()
            end.record()
            end.synchronize()
            wall = (time.perf_counter() - began) * 1e3
            return float(start.elapsed_time(end)), wall

        return cuda_call

    def host_call(fn: Callable[[], Any]) -> tuple[float, float]:
        started = time.perf_counter()
        fn()
        ms = (time.perf_counter() - started) * 1e3
        return ms, ms

    return host_call


def round_robin(
    fns: dict[str, Callable[[], Any]],
    device: torch.device,
    batch: int,
    rounds: int,
    block_ms: float,
) -> dict[str, dict[str, Any]]:
    """Each fn measured in blocks of single timed calls, A B C / B C A / ... so drift hits all
    alike.

    Warm-up follows the protocol (>= warmup_calls and >= warmup_ms per fn); each block aims at
    ``block_ms``; every call is one sample. Throughput is the engine's definition: samples over
    the host wall time of the calls (what MaxThroughputStrategy ranks by).
    """
    timed = _timer(device)
    per_call: dict[str, float] = {}
    for name, fn in fns.items():
        warm: list[float] = []
        started = time.perf_counter()
        while (
            len(warm) < honed.config.warmup_calls
            or (time.perf_counter() - started) * 1e3 < honed.config.warmup_ms
        ):
            warm.append(timed(fn)[1])
        per_call[name] = sorted(warm)[len(warm) // 2]
    k = {name: max(1, min(500, math.ceil(block_ms / max(t, 1e-3)))) for name, t in per_call.items()}
    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    walls: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for _ in range(k[name]):
                ms, wall = timed(fns[name])
                samples[name].append(ms)
                walls[name].append(wall)
    out = {}
    for name in names:
        stats = _core.stats(samples[name])
        wall_stats = _core.stats(walls[name])
        total_s = sum(walls[name]) / 1e3
        out[name] = {
            "median_ms": stats.median_ms,
            "p99_ms": stats.p99_ms,
            "mean_ms": stats.mean_ms,
            "cv": stats.cv,
            "wall_median_ms": wall_stats.median_ms,
            "throughput": batch * len(walls[name]) / total_s if total_s > 0 else None,
            "calls_per_block": k[name],
            "samples_ms": samples[name],
        }
    return out


def independent_check(
    model: torch.nn.Module,
    x: torch.Tensor,
    rows: list[dict[str, Any]],
    backends: dict[str, Backend],
    device: torch.device,
    batch: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Rebuild every candidate that passed honed's gate and re-measure them all round-robin."""
    fns: dict[str, Callable[[], Any]] = {}
    failures: dict[str, str] = {}
    graph = GraphInfo(device=device)
    with torch.no_grad(), _dynamo_limits():
        for row in rows:
            if row["status"] != "ok" or row["median_ms"] is None:
                continue
            name = row["name"]
            if row["is_baseline"]:
                fns[name] = _bound(model, x)
                continue
            try:
                fn = backends[name].build_graph(model, [Sample((x,), {})], graph)
                fn(x)
                _sync(device)
                fns[name] = _bound(fn, x)
            except Exception as e:  # a rebuild failure is recorded, the others still run
                failures[name] = f"{type(e).__name__}: {_first_line(e)}"
        results = round_robin(fns, device, batch, args.indep_rounds, args.indep_block_ms)
    fns.clear()
    # Ranked by what honed's strategy (the default, MaxThroughputStrategy) maximises: throughput
    # over host wall time. The gap: how much longer the selection takes per call than the best.
    best = max(results, key=lambda n: results[n]["throughput"] or 0.0) if results else None
    baseline = next((r["name"] for r in rows if r["is_baseline"]), None)
    selected = next((r["name"] for r in rows if r["selected"]), baseline)  # none: eager runs
    gap = None
    if best is not None and selected in results and results[selected]["throughput"]:
        gap = (results[best]["throughput"] / results[selected]["throughput"] - 1.0) * 100.0
    for r in results.values():
        r["samples_ms"] = _kept(r["samples_ms"])
    return {
        "method": f"{'CUDA events and host clock' if device.type == 'cuda' else 'host clock'} "
        f"around each call, round-robin, {args.indep_rounds} rounds of ~{args.indep_block_ms:g} ms "
        "blocks, order rotated; best = highest throughput (host wall time)",
        "results": results,
        "failures": failures,
        "best": best,
        "selected": selected,
        "selection_gap_pct": gap,
        "eager": baseline if baseline in results else None,
    }


def _bound(fn: Callable[..., Any], x: torch.Tensor) -> Callable[[], Any]:
    return lambda: fn(x)


# -- one row -----------------------------------------------------------------------------------
def candidate_record(c: Any) -> dict[str, Any]:
    samples = list(c.samples_ms or [])
    record = {
        "name": c.name,
        "backend": c.backend,
        "precision": precision(c.name),
        "status": c.status,
        "reason": c.reason,
        "is_baseline": c.is_baseline,
        "selected": c.selected,
        "build_s": c.build_s,
        "median_ms": c.median_ms,
        "p99_ms": c.p99_ms,
        "throughput": c.throughput,
        "cv": c.cv,
        "stable": c.stable,
        "speedup": c.speedup,
        "max_abs_error": c.max_abs_error,
        "max_rel_error": c.max_rel_error,
        "cosine": c.cosine,
        "percentiles_ms": _percentiles(samples),
        "samples_ms": _kept(samples),
    }
    return record


def run_row(
    spec_name: str, batch: int, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """Tune one model at one batch size, then check honed's choice independently."""
    spec = SPECS[spec_name]
    model = spec.build(tiny=args.tiny).to(device)
    x = spec.inputs(model, batch, device)
    backends = {b.name: b for b in candidates(args.candidates, device)}
    wrapped = honed.Module(model, f"{spec_name}-b{batch}")
    started = time.perf_counter()
    with honed.config.patch(cache_enabled=False, **args.measure):
        report = honed.tune(
            wrapped,
            [x],
            backends=list(backends.values()),
            device=device,
            isolation=args.isolation,
        )
    tune_wall = time.perf_counter() - started
    graph = report.graphs[0]
    rows = [candidate_record(c) for c in graph.candidates]
    del wrapped, report
    _release(device)
    check = independent_check(model, x, rows, backends, device, batch, args)
    return {
        "model": spec_name,
        "title": spec.title,
        "batch": batch,
        "params": sum(p.numel() for p in model.parameters()),
        "status": "ok",
        "tune_wall_s": tune_wall,
        "selected": graph.selected,
        "decision": graph.decision,
        "candidates": rows,
        "independent": check,
    }


# -- max-autotune alone, in a fresh process ----------------------------------------------------
CHILD = """
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from models import SPECS
spec, batch, device = SPECS[sys.argv[2]], int(sys.argv[3]), torch.device(sys.argv[4])
model = spec.build(tiny=sys.argv[5] == "1").to(device)
x = spec.inputs(model, batch, device)
started = time.perf_counter()
compiled = torch.compile(model, mode="max-autotune")
with torch.no_grad():
    compiled(x)
if device.type == "cuda":
    torch.cuda.synchronize()
print("RESULT " + json.dumps({"compile_first_call_s": time.perf_counter() - started}))
"""


def max_autotune_time(
    spec_name: str, batch: int, device: torch.device, tiny: bool, timeout_s: float
) -> dict[str, Any]:
    """torch.compile(mode="max-autotune") + first call, cold caches, in its own process group."""
    record: dict[str, Any] = {"model": spec_name, "batch": batch, "timeout_s": timeout_s}
    with tempfile.TemporaryDirectory(prefix="honed-bench-mat-") as tmp:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor")
        env["TRITON_CACHE_DIR"] = f"{tmp}/triton"
        argv = [sys.executable, "-c", CHILD, str(Path(__file__).resolve().parent), spec_name]
        argv += [str(batch), str(device), "1" if tiny else "0"]
        started = time.perf_counter()
        proc = subprocess.Popen(
            argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            record.update(status="timeout", wall_s=time.perf_counter() - started)
            return record
        finally:  # also when the suite itself is stopped (Ctrl-C, SIGTERM)
            if proc.poll() is None:
                _kill_group(proc)
    record["wall_s"] = time.perf_counter() - started
    line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode == 0 and line is not None:
        record.update(status="ok", **json.loads(line.removeprefix("RESULT ")))
    else:
        tail = [ln for ln in out.strip().splitlines() if ln.strip()][-3:]
        record.update(status="failed", reason=f"exit {proc.returncode}: {' | '.join(tail)}")
    return record


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the child we started and its compile workers (its own process group), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


# -- the batch knee (the engine's sweep rule over eager throughput) ----------------------------
def knee(spec_name: str, device: torch.device, tiny: bool, max_batch: int) -> dict[str, Any]:
    spec = SPECS[spec_name]
    model = spec.build(tiny=tiny).to(device)
    cfg = _core.MeasureConfig(warmup_ms=20.0, window_ms=20.0, max_windows=5)
    timer = _core.HostTimer((lambda: torch.cuda.synchronize()) if device.type == "cuda" else None)
    points: list[list[float]] = []

    def throughput_at(batch: int) -> float | None:
        try:
            x = spec.inputs(model, batch, device)
            cfg.batch_size = batch
            with torch.no_grad():
                m = _core.measure(lambda: model(x), timer, cfg)
        except torch.cuda.OutOfMemoryError:
            _release(device)
            return None
        points.append([batch, float(m.throughput)])
        return float(m.throughput)

    result = _core.batch_sweep(throughput_at, start=1, max_batch=max_batch)
    _release(device)
    return {"knee": int(result.knee), "stop_reason": result.stop_reason, "points": points}


# -- the run -----------------------------------------------------------------------------------
class Run:
    """The JSON of one suite run, rewritten atomically whenever something is added."""

    def __init__(self, path: Path, args: argparse.Namespace, device: torch.device) -> None:
        self.path = path
        self.started = time.perf_counter()
        self.data: dict[str, Any] = {
            "schema": SCHEMA,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "finished": False,
            "elapsed_s": 0.0,
            "env": environment(device),
            "args": {k: v for k, v in vars(args).items() if not isinstance(v, Path)},
            "overhead": None,
            "knees": {},
            "rows": [],
            "max_autotune": [],
        }
        self.write()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def write(self) -> None:
        self.data["elapsed_s"] = round(self.elapsed(), 2)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_jsonable))
        os.replace(tmp, self.path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def plan(args: argparse.Namespace, run: Run, device: torch.device) -> list[tuple[str, int]]:
    """(model, batch) pairs in order, model-major; with --knee each model's knee is added."""
    pairs = []
    for name in args.models:
        batches = list(args.batches)
        if args.knee:
            try:
                found = knee(name, device, args.tiny, args.knee_max)
            except Exception as e:
                found = {"error": f"{type(e).__name__}: {_first_line(e)}"}
            run.data["knees"][name] = found
            run.write()
            if "knee" in found and found["knee"] not in batches:
                batches.append(found["knee"])
        pairs += [(name, b) for b in sorted(batches)]
    return pairs


def fits(run: Run, durations: dict[str, list[float]], model: str, budget: float) -> str:
    """'' when the next row of ``model`` fits the budget, else why not."""
    if budget <= 0:
        return ""
    left = budget - run.elapsed()
    same = durations.get(model)
    every = [d for ds in durations.values() for d in ds]
    need = same[-1] if same else (sum(every) / len(every) if every else 0.0)
    if left <= 0 or need > left:
        return f"skipped: time budget (needs ~{need:.0f} s, {max(left, 0):.0f} s left)"
    return ""


def run_suite(args: argparse.Namespace) -> Path:
    device = torch.device(args.device)
    out = args.out if args.out is not None else RESULTS_DIR
    if args.out is None or out.is_dir():
        out = out / _default_name(args)
    run = Run(out, args, device)
    print(f"suite: writing {out}", flush=True)
    with _stopped_by_signal(run), _compile_caches(args.keep_caches):
        if "overhead" in args.phases and args.overhead_calls > 0:
            run.data["overhead"] = _overhead(device, args.overhead_calls)
            run.write()
        durations: dict[str, list[float]] = {}
        pairs = plan(args, run, device)
        for i, (name, batch) in enumerate(pairs):
            if "tune" in args.phases:
                _one_row(run, durations, name, batch, args, device)
            last_of_model = i + 1 == len(pairs) or pairs[i + 1][0] != name
            if "max_autotune" in args.phases and args.max_autotune != "none":
                if args.max_autotune == "all":
                    _one_max_autotune(run, name, batch, args, device)
                elif last_of_model:  # "first": after the model's rows, at its first batch
                    first = next(b for n, b in pairs if n == name)
                    _one_max_autotune(run, name, first, args, device)
        run.data["finished"] = True
        run.write()
    return out


def _one_row(
    run: Run,
    durations: dict[str, list[float]],
    name: str,
    batch: int,
    args: argparse.Namespace,
    device: torch.device,
) -> None:
    skip = fits(run, durations, name, args.budget_s)
    if skip:
        print(f"suite: {name} batch {batch}: {skip}", flush=True)
        run.data["rows"].append(_stub(name, batch, "skipped", skip))
        run.write()
        return
    print(f"suite: {name} batch {batch} ...", flush=True)
    started = time.perf_counter()
    try:
        row = run_row(name, batch, args, device)
    except Exception as e:  # one row failing must not lose the others
        row = _stub(name, batch, "failed", f"{type(e).__name__}: {_first_line(e)}")
    _release(device)
    row["row_wall_s"] = time.perf_counter() - started
    durations.setdefault(name, []).append(row["row_wall_s"])
    run.data["rows"].append(row)
    run.write()
    print(f"suite: {name} batch {batch}: {_summary(row)}", flush=True)


def _stub(name: str, batch: int, status: str, reason: str) -> dict[str, Any]:
    return {"model": name, "batch": batch, "status": status, "reason": reason}


def _one_max_autotune(
    run: Run, name: str, batch: int, args: argparse.Namespace, device: torch.device
) -> None:
    left = args.budget_s - run.elapsed() if args.budget_s > 0 else args.max_autotune_timeout
    timeout = min(args.max_autotune_timeout, left)
    if timeout < 20:
        record = {"model": name, "batch": batch, "status": "skipped"}
        record["reason"] = f"time budget ({max(left, 0):.0f} s left)"
    else:
        print(f"suite: max-autotune {name} batch {batch} (timeout {timeout:.0f} s) ...", flush=True)
        record = max_autotune_time(name, batch, device, args.tiny, timeout)
    run.data["max_autotune"].append(record)
    run.write()
    print(f"suite: max-autotune {name} batch {batch}: {record['status']}", flush=True)


def _overhead(device: torch.device, calls: int) -> dict[str, Any]:
    from overhead import _Eager, measure  # bench/overhead.py

    out: dict[str, Any] = {"device": str(device), "calls": calls}
    variants: list[tuple[str, Backend]] = [
        ("eager variant", _Eager()),
        ("inductor variant", TorchInductorBackend()),
    ]
    for label, backend in variants:
        try:  # in-process: the installed variant is called here either way; no worker start-up
            with honed.config.patch(isolation="none"):
                out[label] = measure(backend, device, calls)
        except Exception as e:
            out[label] = {"error": f"{type(e).__name__}: {_first_line(e)}"}
    return out


def _summary(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason', '')}"
    check = row["independent"]
    gap = check["selection_gap_pct"]
    gap_text = "-" if gap is None else f"{gap:+.1f}%"
    return (
        f"tune {row['tune_wall_s']:.0f} s, selected {row['selected']}, independent best "
        f"{check['best']} (selection {gap_text}), row {row['row_wall_s']:.0f} s"
    )


# -- helpers -----------------------------------------------------------------------------------
def _percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)
    n = len(ordered)
    return {f"p{p}": ordered[min(n - 1, round(p / 100 * (n - 1)))] for p in PERCENTILES}


def _kept(samples: list[float], cap: int = KEPT_SAMPLES) -> list[float]:
    stride = -(-len(samples) // cap)
    return [round(s, 6) for s in (samples[::stride] if stride > 1 else samples)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _release(device: torch.device) -> None:
    """Drop compiled code and CUDA graphs between rows, so each row starts alike."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= 300 else line[:297] + "..."


def _default_name(args: argparse.Namespace) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    mode = "full" if args.full else "light"
    return f"suite-{mode}-{args.device.split(':')[0]}-{stamp}-{commit()}.json"


@contextlib.contextmanager
def _stopped_by_signal(run: Run) -> Iterator[None]:
    """SIGTERM (e.g. from `timeout`) stops the run like Ctrl-C (honed then leaves no worker
    behind); the JSON keeps every finished row and says the run was stopped."""

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    saved = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt as e:
        run.data["stopped"] = str(e) or "interrupted"
        run.write()
        print(f"suite: stopped ({run.data['stopped']}); finished rows are in {run.path}")
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, saved)


@contextlib.contextmanager
def _compile_caches(keep: bool) -> Iterator[None]:
    """A fresh Inductor/Triton cache for this run, so tuning times are cold-start times."""
    if keep:
        yield
        return
    tmp = tempfile.mkdtemp(prefix="honed-bench-inductor-")
    saved = {k: os.environ.get(k) for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{tmp}/inductor"
    os.environ["TRITON_CACHE_DIR"] = f"{tmp}/triton"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--full", action="store_true", help="every model, batch, candidate; no budget")
    p.add_argument("--models", nargs="+", choices=list(SPECS), default=None)
    p.add_argument("--batches", nargs="+", type=int, default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--candidates", choices=["light", "default"], default=None)
    p.add_argument("--isolation", choices=["none", "process"], default=None)
    p.add_argument("--max-autotune", choices=["none", "first", "all"], default="first")
    p.add_argument("--max-autotune-timeout", type=float, default=None)
    p.add_argument("--knee", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--knee-max", type=int, default=256)
    p.add_argument("--budget-s", type=float, default=None, help="soft limit; 0: none")
    p.add_argument("--phases", nargs="+", default=["overhead", "tune", "max_autotune"])
    p.add_argument("--overhead-calls", type=int, default=None)
    p.add_argument("--indep-rounds", type=int, default=None)
    p.add_argument("--indep-block-ms", type=float, default=25.0)
    p.add_argument("--tiny", action="store_true", help="test-sized models (CPU tests)")
    p.add_argument("--keep-caches", action="store_true", help="use the usual compile caches")
    p.add_argument("--out", type=Path, default=None, help="JSON file, or a folder for it")
    args = p.parse_args(argv)
    full, cuda = args.full, args.device.startswith("cuda")
    defaults = {
        "models": list(SPECS) if full else LIGHT_MODELS,
        "batches": FULL_BATCHES if full else LIGHT_BATCHES,
        "candidates": "default" if full else "light",
        "isolation": "process" if full else "none",
        "max_autotune_timeout": 600.0 if full else 60.0,
        "knee": full,
        "budget_s": 0.0 if full else 400.0,
        "overhead_calls": (100_000 if full else 20_000) if cuda else 0,
        "indep_rounds": 40 if full else 20,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.mode = "full" if full else "light"
    # Light mode stops after 6 windows (the protocol's limit is 10); warm-up and window lengths
    # stay the protocol's (>= 200 ms / 10 calls, >= 100 ms / 10 calls).
    args.measure = {} if full else {"max_windows": min(6, honed.config.max_windows)}
    return args


def main(argv: list[str] | None = None) -> int:
    """0 when every row that ran finished; 1 when a row failed (its reason is in the JSON)."""
    args = parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"suite: --device {args.device} but torch cannot use CUDA here (torch "
            f"{torch.__version__}); run `honed doctor --device cuda` for why, or pass --device cpu",
            file=sys.stderr,
        )
        return 2
    out = run_suite(args)
    failed = [r for r in json.loads(out.read_text())["rows"] if r["status"] == "failed"]
    print(f"suite: done, {out}" + (f" ({len(failed)} row(s) failed)" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
