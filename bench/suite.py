"""bench/suite.py: the benchmark suite: honed against what a user would do instead, per row.

    python bench/suite.py [--rows bert:8 resnet50:64 | --models bert gpt2 --batches 1 8]
                          [--budget-s 480] [--parallel 1] [--honed-run PATH] [--out DIR|FILE]

Per row (model, batch), llama-bench style (the product of models and batches, or --rows in order):
  1. cold, each in a fresh process with empty honed, Inductor and Triton caches (bench/cold.py):
     the one-liner's compile + first call; honed's default tune + honed.save; the warm re-tune (a
     new process reusing the caches the tune left); with --honed-run, a target="cpp" tune + save
     and honed-run --check on the artifact;
  2. side by side, in this process, nothing else running: eager fp32, the one-liner, the expert
     hand (bf16 weights, channels_last for convnets, reduce-overhead), honed's selection
     (honed.load of the saved artifact) and every candidate honed tried and passed, rebuilt from
     its recipe; each checked against eager fp32 (max error, cosine) and measured round-robin
     (bench/timing.py). The one-liner and honed's candidates compile from the caches their cold
     processes left, so their kernels are the ones those processes chose.

--parallel N runs the one-liner's cold compiles of all rows up to N at once first (compiles are
CPU-bound; Inductor's kernel benchmarks take a lock, so no two processes time kernels at once);
their compile times then carry how many ran together. honed's tunes, the C++ run and every
latency in the table always run alone.

The JSON (schema honed-bench-suite/2, read by bench/report.py) is rewritten after every job and
row, so a run stopped by a time limit keeps what it finished; --budget-s gives each job what is
left and starts no row that cannot finish.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import gc
import json
import math
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import variants  # bench/variants.py (the script's folder is on sys.path)
from cold import JOBS, Job, compile_caches, earlier_record, merge_tree, run_jobs  # bench/cold.py
from models import SPECS, SUITE  # bench/models.py
from provenance import commit  # bench/provenance.py
from timing import round_robin  # bench/timing.py

from honed import _core
from honed.environment import fingerprint

SCHEMA = "honed-bench-suite/2"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
BATCHES = [1, 8, 64]
MIN_JOB_S = 20.0  # a cold job given less than this is not started
HONED_MARGIN_S = 30.0  # of a tune job's time, kept for starting the process and honed.save


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
    for lib in ("triton", "torchvision", "transformers", "timm"):
        env[lib] = _version(lib, "pytorch-triton") if lib == "triton" else _version(lib)
    env["driver"] = None
    env["float32_matmul_precision"] = torch.get_float32_matmul_precision()  # "highest": no TF32
    env["cpu_count"] = os.cpu_count()
    # A suite run beside others on a host of several GPUs gets its own GPU and its own cores
    # (scripts/gpu-rows.sh); the report says so next to the run.
    env["cpus_usable"] = len(os.sched_getaffinity(0))
    env["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    if device.type == "cuda":
        probe = _core.probe_gpus()
        env["driver"] = probe.driver_version or None
        env["driver_cuda"] = _core.cuda_version_string(probe.driver_cuda_version)
    return env


def precision(name: str) -> str:
    """fp32, bf16 or fp16, from a candidate's name (autocast defaults to bf16)."""
    for cast in ("bf16", "fp16"):  # precision= casts the weights: "(..., bf16 weights)"
        if f"{cast} weights" in name:
            return cast
    if "float16" in name and "bfloat16" not in name:
        return "fp16"
    return "bf16" if "autocast_enabled=True" in name or "bfloat16" in name else "fp32"


# -- the JSON of a run -------------------------------------------------------------------------
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
            "args": {k: v for k, v in vars(args).items() if k not in ("out", "work_dir")},
            "rows": [],
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


# -- the plan ----------------------------------------------------------------------------------
def plan(args: argparse.Namespace) -> list[tuple[str, int]]:
    """(model, batch) rows in the order they run: --rows as given, else models x batches."""
    if args.rows:
        return list(args.rows)
    return [(m, b) for m in args.models for b in args.batches]


def new_row(name: str, batch: int) -> dict[str, Any]:
    spec = SPECS[name]
    return {
        "model": name,
        "title": spec.title,
        "library": spec.library,
        "batch": batch,
        "status": "running",
        "reason": "",
        "cold": {},
        "variants": {},
        "candidates": [],
        "selection": {},
    }


class Budget:
    """The run's time budget (``seconds`` <= 0: none): what each job may still take."""

    def __init__(self, run: Run, seconds: float, reserve_s: float) -> None:
        self.run, self.seconds, self.reserve_s = run, seconds, reserve_s

    def left(self) -> float:
        return math.inf if self.seconds <= 0 else self.seconds - self.run.elapsed()

    def for_job(self, cap: float) -> float:
        """Seconds a cold job may take, keeping the side-by-side's reserve for its row."""
        return min(cap, self.left() - self.reserve_s)


# -- the cold jobs of one row ------------------------------------------------------------------
def row_work(args: argparse.Namespace, name: str, batch: int) -> Path:
    return Path(args.work_dir) / f"{name}-b{batch}"


def common_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--device", args.device, "--compile-backend", args.compile_backend]
    argv += ["--candidates", args.candidates]
    if args.isolation:
        argv += ["--isolation", args.isolation]
    return argv + (["--tiny"] if args.tiny else [])


def oneliner_job(args: argparse.Namespace, name: str, batch: int, timeout: float) -> Job:
    work = row_work(args, name, batch) / "oneliner"
    extra = ["--gpu-lock", str(Path(args.work_dir) / "gpu.lock")] if args.parallel > 1 else []
    return Job("oneliner", name, batch, work, extra, timeout)


def honed_budget(args: argparse.Namespace, row: dict[str, Any]) -> float | None:
    """time_budget_s for honed's tune: seconds, or a multiple of the row's one-liner compile."""
    spec = args.honed_time_budget
    if not spec:
        return None
    if spec.endswith("x"):
        one = row["cold"].get("oneliner", {})
        if one.get("status") != "ok":
            return None
        return float(spec[:-1]) * one["compile_first_call_s"]
    return float(spec)


def cold_jobs(args: argparse.Namespace, row: dict[str, Any], budget: Budget, run: Run) -> None:
    """The row's cold jobs, one after another, each alone; records land in row["cold"]."""
    name, batch = row["model"], row["batch"]
    work = row_work(args, name, batch)
    kinds = ["oneliner", "honed"] + (["retune"] if args.retune else [])
    kinds += ["cpp"] if args.honed_run else []
    for kind in kinds:
        if kind in row["cold"]:
            continue  # done in the parallel phase
        earlier = earlier_record(work / kind) if args.keep_work and kind not in args.redo else None
        if earlier is not None:
            row["cold"][kind] = earlier
            print(f"suite: {name} b{batch}: {kind}: reused from an earlier call", flush=True)
            continue
        timeout = budget.for_job(args.job_timeout_s)
        if timeout < MIN_JOB_S:
            row["cold"][kind] = {"job": kind, "status": "skipped", "reason": _budget_reason(budget)}
            continue
        if kind == "oneliner":
            job = oneliner_job(args, name, batch, timeout)
        elif kind == "retune":
            if row["cold"].get("honed", {}).get("status") != "ok":
                row["cold"][kind] = {"job": kind, "status": "skipped", "reason": "no cold tune"}
                continue
            job = Job("retune", name, batch, work / "retune", [], timeout, work / "honed")
        else:
            extra = []
            seconds = honed_budget(args, row) if kind == "honed" else None
            if seconds:
                extra += ["--time-budget-s", f"{min(seconds, timeout - HONED_MARGIN_S):.1f}"]
            if kind == "cpp":
                extra += ["--honed-run", str(Path(args.honed_run).resolve())]
            job = Job(kind, name, batch, work / kind, extra, timeout)
        print(f"suite: {name} b{batch}: {kind} (up to {timeout:.0f} s) ...", flush=True)
        (record,) = run_jobs([job], common_argv(args))
        row["cold"][kind] = record
        run.write()
        print(f"suite: {name} b{batch}: {kind}: {_cold_summary(record)}", flush=True)
        if kind == args.stop_after:
            return


def _cold_summary(record: dict[str, Any]) -> str:
    if record["status"] != "ok":
        return f"{record['status']}: {record.get('reason', '')}"
    seconds = record.get("compile_first_call_s") or record.get("tune_s")
    selected = (record.get("report") or {}).get("selected")
    return f"{seconds:.1f} s" + (f", selected {selected}" if selected else "")


def _budget_reason(budget: Budget) -> str:
    return f"time budget ({max(budget.left(), 0):.0f} s left of {budget.seconds:.0f} s)"


def warm_caches(args: argparse.Namespace, row: dict[str, Any]) -> Path:
    """One cache folder for the row's side-by-side: the one-liner's and honed's caches merged."""
    work = row_work(args, row["model"], row["batch"])
    warm = work / "warm"
    shutil.rmtree(warm, ignore_errors=True)  # an earlier call's (a row resumed with --keep-work)
    for kind in ("oneliner", "honed"):
        if row["cold"].get(kind, {}).get("status") == "ok":
            for sub in ("inductor", "triton"):
                merge_tree(work / kind / sub, warm / sub)
    return warm


# -- side by side ------------------------------------------------------------------------------
def side_by_side(
    args: argparse.Namespace, row: dict[str, Any], device: torch.device, budget: Budget
) -> None:
    """Build every variant of the row here, check it against eager, measure them round-robin."""
    spec = SPECS[row["model"]]
    model = spec.build(tiny=args.tiny).to(device)
    x = spec.inputs(row["batch"], device, tiny=args.tiny)
    row["params"] = sum(p.numel() for p in model.parameters())
    row["others_on_gpu"] = others_on_gpu(device)
    built: dict[str, variants.Built] = {}
    reference = _add(row["variants"], built, "eager", lambda: variants.eager(model, x), None)
    if reference is None:
        raise RuntimeError(row["variants"]["eager"]["reason"])
    cold = row["cold"]
    builders: dict[str, Callable[[], variants.Built]] = {
        "oneliner": lambda: variants.oneliner(model, x, args.compile_backend),
        "expert": lambda: variants.expert(model, x, spec.convnet, args.compile_backend),
        "honed": lambda: variants.honed_loaded(
            copy.deepcopy(model), row["model"], _artifact(cold), x
        ),
    }
    for name, build in builders.items():
        why = _not_buildable(name, cold)
        if why:
            row["variants"][name] = {"status": "not run", "reason": why}
            continue
        _add(row["variants"], built, name, build, reference)
    fns = {name: b.fn for name, b in built.items()}
    fns.update(_candidates(row, model, x, reference, budget, args.exhaustive))
    with torch.no_grad():  # inference, as every variant was built and checked
        results = round_robin(fns, device, row["batch"], args.rounds, args.block_ms)
    for name, figures in results.items():
        target = row["variants"].get(name) or _candidate(row, name)
        target.update(figures)
    row["selection"] = selection(row)


def others_on_gpu(device: torch.device) -> list[str]:
    """Other processes holding memory on the GPU while this row is measured (a cold job's
    orphaned worker would be one), as NVML lists them; [] when none or not a GPU."""
    if device.type != "cuda":
        return []
    try:
        listing = torch.cuda.list_gpu_processes(device)
    except Exception as e:  # NVML missing or failing must not stop the measurement
        return [f"unknown ({first_line(e)})"]
    if not listing.startswith("GPU:"):  # e.g. "pynvml module not found, ..."
        return [f"unknown ({listing.strip()})"]
    pids = [int(m) for m in re.findall(r"process\s+(\d+) uses", listing)]
    if os.getpid() in pids:
        return [f"process {p}" for p in pids if p != os.getpid()]
    if len(pids) > 1:  # another PID namespace: which one is this process cannot be told
        return [f"{len(pids)} processes hold GPU memory (NVML pids {pids})"]
    return []


def _artifact(cold: dict[str, Any]) -> Path:
    return Path(cold["honed"]["artifact"])


def _not_buildable(name: str, cold: dict[str, Any]) -> str:
    """Why a variant is not built here ("" when it is): its cold process did not finish."""
    job = {"oneliner": "oneliner", "honed": "honed"}.get(name)
    if job is None:
        return ""
    record = cold.get(job) or {"status": "not run", "reason": "not started"}
    if record["status"] != "ok":
        return f"cold {job}: {record['status']}: {record.get('reason', '')}"
    if job == "honed" and not record.get("artifact"):
        return "honed.save wrote no artifact"
    return ""


def _add(
    into: dict[str, Any],
    built: dict[str, variants.Built],
    name: str,
    build: Callable[[], variants.Built],
    reference: list[torch.Tensor] | None,
) -> list[torch.Tensor] | None:
    """Build one variant, check its outputs; on failure record the one-line reason. Returns
    the variant's outputs (the reference, for eager)."""
    try:
        b = build()
        outputs = variants.snapshot(b.fn)
    except Exception as e:  # a variant failing is a finding; the others still run
        into[name] = {"status": "failed", "reason": first_line(e)}
        return None
    record: dict[str, Any] = {"status": "ok", "build_s": b.build_s}
    if reference is not None:
        record.update(variants.compare(reference, outputs))
        if "error" in record:
            record.update(status="wrong", reason=record.pop("error"))
    into[name] = record
    built[name] = b
    return outputs


def _candidate(row: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c["check"] for c in row["candidates"] if c["name"] == name)


def _candidates(
    row: dict[str, Any],
    model: torch.nn.Module,
    x: torch.Tensor,
    reference: list[torch.Tensor],
    budget: Budget,
    exhaustive: bool = True,
) -> dict[str, Callable[[], Any]]:
    """Every candidate honed's cold tune tried, with its figures; those that passed rebuilt
    (only the selected one when not ``exhaustive``)."""
    report = (row["cold"].get("honed") or {}).get("report") or {}
    selected = report.get("selected")
    fns: dict[str, Callable[[], Any]] = {}
    entries = []
    for c in report.get("candidates", []):
        entry: dict[str, Any] = {
            "name": c["name"],
            "precision": precision(c["name"]),
            "honed": {k: v for k, v in c.items() if k not in ("name", "recipe")},
            "check": {},
        }
        row["candidates"].append(entry)
        entries.append((c, entry))
    # The selection first: without its figure the check has no gap to give, whatever the
    # budget leaves of the others.
    entries.sort(key=lambda pair: pair[0]["name"] != selected)
    for c, entry in entries:
        into: dict[str, Any] = {}
        built: dict[str, variants.Built] = {}
        if c.get("status") != "ok":
            into[c["name"]] = {"status": "not run", "reason": "did not pass honed's gate"}
        elif not exhaustive and c["name"] != selected:
            into[c["name"]] = {"status": "not run", "reason": "--no-exhaustive"}
        elif c.get("recipe") is None:
            into[c["name"]] = {"status": "not run", "reason": "no recipe for this name"}
        elif budget.left() < budget.reserve_s / 2 + float(c.get("build_s") or 0.0):
            into[c["name"]] = {"status": "not run", "reason": "time budget"}
        else:
            recipe = c["recipe"]
            # A copy each: a candidate that casts or re-lays out the module it is given must
            # not change eager's or another candidate's weights.
            build = lambda r=recipe: variants.candidate(r, copy.deepcopy(model), x)  # noqa: E731
            _add(into, built, c["name"], build, reference)
        entry["check"] = into[c["name"]]
        if c["name"] in built:
            fns[c["name"]] = built[c["name"]].fn
    return fns


def selection(row: dict[str, Any]) -> dict[str, Any]:
    """honed's selection against the best candidate re-measured here (throughput, host wall)."""
    measured = {
        c["name"]: c["check"]["throughput"]
        for c in row["candidates"]
        if c["check"].get("status") == "ok" and c["check"].get("throughput")
    }
    report = (row["cold"].get("honed") or {}).get("report") or {}
    selected = report.get("selected")
    # With no selection honed runs eager: the baseline candidate stands for it.
    runs = selected or next(
        (c["name"] for c in row["candidates"] if c["honed"].get("is_baseline")), None
    )
    out: dict[str, Any] = {"selected": selected, "checked": len(measured), "best": None}
    out["not_checked"] = [c["name"] for c in row["candidates"] if c["name"] not in measured]
    if measured:
        best = max(measured, key=lambda n: measured[n])
        out["best"] = best
        if runs in measured:
            out["gap_pct"] = (measured[best] / measured[runs] - 1.0) * 100.0
    return out


# -- the run -----------------------------------------------------------------------------------
def run_suite(args: argparse.Namespace) -> Path:
    device = torch.device(args.device)
    out = args.out if args.out is not None else RESULTS_DIR
    if args.out is None or out.is_dir():
        out = out / _default_name(args)
    run = Run(out, args, device)
    budget = Budget(run, args.budget_s, args.reserve_s)
    print(f"suite: writing {out}", flush=True)
    pairs = plan(args)
    with _stopped_by_signal(run), _work_dir(args):
        rows = [new_row(name, batch) for name, batch in pairs]
        run.data["rows"] = rows
        for row in rows:
            missing = SPECS[row["model"]].missing()
            if missing:
                row.update(status="skipped", reason=missing)
        run.write()
        if args.parallel > 1:
            parallel_oneliners(args, [r for r in rows if r["status"] == "running"], budget, run)
        for row in rows:
            if row["status"] == "running":
                one_row(args, row, device, budget, run)
        run.data["finished"] = True
        run.write()
    return out


def parallel_oneliners(
    args: argparse.Namespace, rows: list[dict[str, Any]], budget: Budget, run: Run
) -> None:
    timeout = budget.for_job(args.job_timeout_s)
    if timeout < MIN_JOB_S:
        return
    todo = []
    for row in rows:
        job = oneliner_job(args, row["model"], row["batch"], timeout)
        reuse = args.keep_work and "oneliner" not in args.redo
        earlier = earlier_record(job.work) if reuse else None
        if earlier is not None:
            row["cold"]["oneliner"] = earlier
        else:
            todo.append((row, job))
    print(f"suite: {len(todo)} one-liner compile(s), {args.parallel} at once ...", flush=True)
    records = run_jobs([job for _, job in todo], common_argv(args), args.parallel)
    for (row, _), record in zip(todo, records, strict=True):
        row["cold"]["oneliner"] = record
        print(f"suite: {row['model']} b{row['batch']}: oneliner: {_cold_summary(record)}")
    run.write()


def one_row(
    args: argparse.Namespace, row: dict[str, Any], device: torch.device, budget: Budget, run: Run
) -> None:
    name, batch = row["model"], row["batch"]
    if budget.left() < budget.reserve_s + MIN_JOB_S:
        row.update(status="skipped", reason=_budget_reason(budget))
        run.write()
        return
    started = time.perf_counter()
    cold_jobs(args, row, budget, run)
    if args.stop_after:
        row.update(status="partial", reason=f"--stop-after {args.stop_after}: cold jobs only")
        run.write()
        print(f"suite: {name} b{batch}: stopped after {args.stop_after}", flush=True)
        return
    warm = warm_caches(args, row)
    print(f"suite: {name} b{batch}: side by side ...", flush=True)
    try:
        with compile_caches(warm / "inductor", warm / "triton"), variants.dynamo_limits():
            side_by_side(args, row, device, budget)
        row["status"] = "ok"
    except Exception as e:  # one row failing must not lose the others
        row.update(status="failed", reason=first_line(e))
    finally:
        _release(device)
    row["row_wall_s"] = time.perf_counter() - started
    run.write()
    print(f"suite: {name} b{batch}: {summary(row)}", flush=True)
    if not args.keep_work:
        shutil.rmtree(row_work(args, name, batch), ignore_errors=True)


def summary(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('reason', '')}"
    v = row["variants"]
    parts = [
        f"{k} {v[k]['median_ms']:.3f} ms" if "median_ms" in v.get(k, {}) else f"{k} -"
        for k in ("eager", "oneliner", "expert", "honed")
    ]
    sel = row["selection"]
    gap = sel.get("gap_pct")
    parts.append(f"selection vs best {'-' if gap is None else f'{gap:+.1f}%'}")
    return ", ".join(parts) + f", row {row['row_wall_s']:.0f} s"


# -- helpers -----------------------------------------------------------------------------------
def _release(device: torch.device) -> None:
    """Drop compiled code and CUDA graphs between rows, so each row starts alike."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    line = f"{type(e).__name__}: {lines[0] if lines else ''}"
    return line if len(line) <= 300 else line[:297] + "..."


def _default_name(args: argparse.Namespace) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    # Letters, digits, "." and "-" only: the GPU machine returns no file with another character
    # in its name (a HONED_COMMIT of "abc+" lost a run's JSON).
    label = re.sub(r"[^A-Za-z0-9.-]", "-", commit())
    # Runs started together on one host (scripts/gpu-rows.sh) differ by their GPU, not the second.
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "") if getattr(args, "beside", 0) else ""
    where = "-gpu" + re.sub(r"[^A-Za-z0-9]", "-", gpu) if gpu else ""
    return f"suite-{args.device.split(':')[0]}-{stamp}-{label}{where}.json"


@contextlib.contextmanager
def _work_dir(args: argparse.Namespace) -> Iterator[None]:
    """The run's scratch folder (every job's caches and artifacts), removed at the end."""
    made = args.work_dir is None
    if made:
        args.work_dir = tempfile.mkdtemp(prefix="honed-bench-")
    # Absolute: the jobs' cache folders are passed on in the environment, and AOTInductor's
    # CUDA build did not compile with a relative TORCHINDUCTOR_CACHE_DIR.
    args.work_dir = os.path.abspath(args.work_dir)
    try:
        yield
    finally:
        if made and not args.keep_work:
            shutil.rmtree(args.work_dir, ignore_errors=True)


@contextlib.contextmanager
def _stopped_by_signal(run: Run) -> Iterator[None]:
    """SIGTERM (e.g. from `timeout`) stops the run like Ctrl-C; the JSON keeps every finished
    job and row and says the run was stopped."""

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


def _row_arg(text: str) -> tuple[str, int]:
    name, _, batch = text.partition(":")
    if name not in SPECS or not batch.isdigit():
        raise argparse.ArgumentTypeError(
            f"--rows takes MODEL:BATCH (e.g. bert:8) with MODEL one of {', '.join(SPECS)}"
        )
    return name, int(batch)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rows", nargs="+", type=_row_arg, default=None, help="MODEL:BATCH, in order")
    p.add_argument("--models", nargs="+", choices=list(SPECS), default=SUITE)
    p.add_argument("--batches", nargs="+", type=int, default=BATCHES)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--candidates",
        choices=["default", "light"],
        default="default",
        help="honed's default candidates, or a short list (no max-autotune, no AOT)",
    )
    p.add_argument(
        "--isolation",
        choices=["process", "none"],
        default=None,
        help="honed.tune's isolation (default: honed's own default)",
    )
    p.add_argument(
        "--honed-time-budget",
        default=None,
        help="time_budget_s for honed's tune where honed has it: seconds, or NUMx "
        "for NUM times the row's one-liner compile (e.g. 1.5x)",
    )
    p.add_argument("--honed-run", default=None, help="honed-run binary: adds the target=cpp job")
    p.add_argument("--retune", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument(
        "--exhaustive",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="rebuild and re-measure every candidate honed tried (else only its selection)",
    )
    p.add_argument("--parallel", type=int, default=1, help="one-liner compiles at once")
    p.add_argument(
        "--beside",
        type=int,
        default=0,
        help="how many other suite runs share this host at the same time, each on its own GPU "
        "and cores (scripts/gpu-rows.sh); recorded for the report",
    )
    p.add_argument("--budget-s", type=float, default=0.0, help="the run's wall budget; 0: none")
    p.add_argument(
        "--reserve-s",
        type=float,
        default=None,
        help="time kept for a row's side-by-side (default 120 on cuda, 60 on cpu)",
    )
    p.add_argument("--job-timeout-s", type=float, default=900.0, help="cap on one cold job")
    p.add_argument("--rounds", type=int, default=20, help="round-robin rounds")
    p.add_argument("--block-ms", type=float, default=25.0, help="time per variant per round")
    p.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the one-liner and expert (tests: eager)",
    )
    p.add_argument("--tiny", action="store_true", help="test-sized configs (CPU tests)")
    p.add_argument("--work-dir", default=None, help="scratch folder (default: a temporary one)")
    p.add_argument(
        "--keep-work",
        action="store_true",
        help="keep caches and artifacts in --work-dir; a later run with the same folder reuses "
        "every cold job that finished there (a row split over two device calls)",
    )
    p.add_argument("--redo", nargs="+", choices=JOBS, default=[], help="with --keep-work: rerun")
    p.add_argument(
        "--stop-after",
        choices=JOBS,
        default=None,
        help="with --keep-work: end each row after this cold job (a row split over device calls)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSON file, or a folder for it")
    args = p.parse_args(argv)
    if "honed" in args.redo and "retune" not in args.redo:
        args.redo.append("retune")  # the re-tune starts from the caches the tune leaves
    if args.reserve_s is None:
        args.reserve_s = 120.0 if args.device.startswith("cuda") else 60.0
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
