"""bench/cold.py: the suite's cold measurements, each in a fresh process with empty caches.

    python bench/cold.py JOB --model M --batch B --out RESULT.json [--device cuda] [--tiny] ...

Jobs (what a user on a fresh machine would wait for):
    oneliner  torch.compile(model, mode="max-autotune") + its first call under bf16 autocast
    honed     honed.tune(honed.Module(model), [x]) with honed's defaults, then honed.save
    retune    the same tune again in a new process, with the honed and Inductor caches the honed
              job left (the warm re-tune)
    cpp       honed.tune(..., target="cpp"), honed.save, then honed-run --check on the artifact

The parent (bench/suite.py) gives each job its own cache folders through the environment
(TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, HONED_CACHE_DIR) and runs it with ``spawn`` below:
in its own process group, under a timeout, killed with its compile workers when it runs over.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOBS = ("oneliner", "honed", "retune", "cpp")
RESULT_PREFIX = "COLD-RESULT "


# == the child =================================================================================
def _model_and_input(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from models import SPECS

    spec = SPECS[args.model]
    device = torch.device(args.device)
    return spec.build(tiny=args.tiny).to(device), spec.inputs(args.batch, device, tiny=args.tiny)


def serialize_gpu_benchmarks(lock_path: str) -> bool:
    """Make Inductor's kernel benchmarks (max-autotune, Triton autotuning) take an inter-process
    lock, so one-liner compiles running side by side never time kernels at the same moment.

    Returns False when this torch has no such hook (the caller then runs the job alone).
    """
    try:
        from torch._inductor.runtime import benchmarking
    except ImportError:
        return False
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o600)
    depth = threading.local()

    def locked(method: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any, **kw: Any) -> Any:
            outer = getattr(depth, "n", 0) == 0
            if outer:
                fcntl.flock(fd, fcntl.LOCK_EX)
            depth.n = getattr(depth, "n", 0) + 1
            try:
                return method(*a, **kw)
            finally:
                depth.n -= 1
                if outer:
                    fcntl.flock(fd, fcntl.LOCK_UN)

        return run

    patched = False
    for cls in vars(benchmarking).values():
        if not isinstance(cls, type) or not issubclass(cls, benchmarking.Benchmarker):
            continue
        for attr in ("benchmark_gpu", "benchmark_gpu_with_cuda_graph"):
            if attr in vars(cls):
                setattr(cls, attr, locked(vars(cls)[attr]))
                patched = True
    return patched


def tune_options(args: argparse.Namespace, device: Any) -> tuple[dict[str, Any], list[str]]:
    """honed.tune keyword arguments for this job, and the optional ones this honed lacks."""
    import honed

    accepted = inspect.signature(honed.tune).parameters
    options: dict[str, Any] = {"device": device}
    if args.honed_cache:
        options["cache_dir"] = args.honed_cache
    if args.isolation:
        options["isolation"] = args.isolation
    if args.candidates == "light":
        options["backends"] = light_backends(device)
    lacking = []
    if args.time_budget_s:
        if "time_budget_s" in accepted:
            options["time_budget_s"] = args.time_budget_s
        else:
            lacking.append("time_budget_s")
    return options, lacking


def light_backends(device: Any) -> list[Any]:
    """A short candidate list for quick runs and CPU tests: no max-autotune, no AOTInductor."""
    import torch

    from honed.backend import (
        CudaGraphsBackend,
        CudaGraphsBackendConfig,
        TorchEagerBackend,
        TorchEagerBackendConfig,
        TorchInductorBackend,
        TorchInductorBackendConfig,
    )

    bf16 = torch.bfloat16
    if device.type != "cuda":
        return [TorchEagerBackend(TorchEagerBackendConfig(autocast_enabled=True))]
    inductor = TorchInductorBackendConfig
    return [
        TorchInductorBackend(inductor(mode="reduce-overhead")),
        TorchInductorBackend(
            inductor(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=bf16)
        ),
        CudaGraphsBackend(),
        CudaGraphsBackend(CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=bf16)),
    ]


def recipes(options: dict[str, Any], device: Any, x: Any) -> dict[str, dict[str, Any]]:
    """Each candidate's recipe by name, so the parent can rebuild every candidate honed tried.

    The default list depends on the graph (a 4-D input adds channels_last candidates), so it is
    asked for with the input's shape, as the tuner asks for it.
    """
    from honed.backend import GraphInfo, TorchEagerBackend, default_backends

    leaves = list(x.values()) if isinstance(x, dict) else x if isinstance(x, list | tuple) else [x]
    tensors = [t for t in leaves if hasattr(t, "shape")]
    shapes = tuple(tuple(t.shape) for t in tensors)
    graph = GraphInfo(device, min_shapes=shapes, opt_shapes=shapes, max_shapes=shapes)
    defaults = default_backends(device, graph)
    backends = [TorchEagerBackend(), *(options.get("backends") or defaults)]
    return {b.name: b.recipe() for b in backends}


def report_record(report: Any, known: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The tune report's one graph as JSON: every field honed reports (newer fields included),
    less build logs; each candidate with its recipe where known."""
    graph = dataclasses.asdict(report.graphs[0])
    for c in graph["candidates"]:
        c.pop("build_log", None)
        samples = c.pop("samples_ms", None) or []
        c["samples"] = len(samples)
        c["recipe"] = known.get(c["name"])
    graph["wall_s"] = report.wall_s
    graph["target"] = getattr(report, "target", "python")
    return graph


def job_oneliner(args: argparse.Namespace) -> dict[str, Any]:
    from variants import oneliner

    model, x = _model_and_input(args)
    locked = serialize_gpu_benchmarks(args.gpu_lock) if args.gpu_lock else False
    built = oneliner(model, x, args.compile_backend)
    return {"compile_first_call_s": built.build_s, "gpu_benchmarks_locked": locked}


def job_honed(args: argparse.Namespace, target: str = "python") -> dict[str, Any]:
    import torch

    import honed

    model, x = _model_and_input(args)
    device = torch.device(args.device)
    options, lacking = tune_options(args, device)
    if target != "python":
        options["target"] = target
    module = honed.Module(model, args.model)
    started = time.perf_counter()
    report = honed.tune(module, [x], **options)
    tune_s = time.perf_counter() - started
    out: dict[str, Any] = {"tune_s": tune_s, "api_lacks": lacking}
    out["time_budget_s"] = options.get("time_budget_s")
    out["report"] = report_record(report, recipes(options, device, x))
    if args.artifact:
        started = time.perf_counter()
        honed.save(module, args.artifact)
        out["save_s"] = time.perf_counter() - started
        out["artifact"] = args.artifact
        out["artifact_bytes"] = Path(args.artifact).stat().st_size
    return out


def job_cpp(args: argparse.Namespace) -> dict[str, Any]:
    out = job_honed(args, target="cpp")
    if not args.honed_run:
        return out
    with tempfile.TemporaryDirectory(prefix="honed-bench-cpp-") as tmp:
        result = Path(tmp) / "honed-run.json"
        argv = [args.honed_run, args.artifact, "--device", args.device, "--batch", str(args.batch)]
        argv += ["--check", "--json", str(result)]
        help_text = subprocess.run([args.honed_run, "--help"], capture_output=True, text=True)
        if "--trust-native-code" in help_text.stdout:
            argv.append("--trust-native-code")  # the suite signed nothing; it made this file
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-2:])
            out["honed_run_error"] = f"honed-run exit {done.returncode}: {tail}"
        else:
            out["honed_run"] = json.loads(result.read_text())
    return out


def child_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("job", choices=JOBS)
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--artifact", default=None)
    p.add_argument("--candidates", choices=["default", "light"], default="default")
    p.add_argument("--isolation", choices=["process", "none"], default=None)
    p.add_argument("--time-budget-s", type=float, default=None)
    p.add_argument("--compile-backend", default="inductor")
    p.add_argument("--gpu-lock", default=None)
    p.add_argument("--honed-run", default=None)
    p.add_argument("--honed-cache", default=None, help="honed.tune's cache_dir")
    args = p.parse_args(argv)
    sys.path.insert(0, str(HERE))
    body = {"oneliner": job_oneliner, "honed": job_honed, "retune": job_honed, "cpp": job_cpp}
    result = body[args.job](args)
    args.out.write_text(json.dumps(result, default=str))
    print(RESULT_PREFIX + str(args.out), flush=True)
    return 0


# == the parent ================================================================================
@dataclasses.dataclass
class Job:
    """One cold job of one row, with the cache folders it starts from."""

    kind: str
    model: str
    batch: int
    work: Path  # this job's folder: inductor/, triton/, honed/ (caches), result.json
    argv: list[str]  # extra child arguments
    timeout_s: float
    caches_from: Path | None = None  # start from a copy of another job's caches (warm re-tune)

    @property
    def artifact(self) -> Path:
        return self.work / "model.honed"


def child_env(job: Job) -> dict[str, str]:
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(job.work / "inductor")
    env["TRITON_CACHE_DIR"] = str(job.work / "triton")
    env["HONED_CACHE_DIR"] = str(job.work / "honed")  # honed's other on-disk state starts empty
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")]))
    return env


def start(job: Job, common: list[str]) -> subprocess.Popen[str]:
    """Start ``job`` in its own process group (its compile workers die with it), from empty
    folders (or a copy of ``caches_from``): what an earlier, unfinished try left is removed."""
    shutil.rmtree(job.work, ignore_errors=True)
    if job.caches_from is not None:
        for sub in ("inductor", "triton", "honed"):  # honed's own cache may be updated in place
            merge_tree(job.caches_from / sub, job.work / sub, link=sub != "honed")
    job.work.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(HERE / "cold.py"), job.kind, "--model", job.model]
    argv += ["--batch", str(job.batch), "--out", str(job.work / "result.json"), *common, *job.argv]
    argv += ["--honed-cache", str(job.work / "honed")]
    if job.kind in ("honed", "cpp"):
        argv += ["--artifact", str(job.artifact)]
    with (job.work / "log.txt").open("w") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            argv,
            env=child_env(job),
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )


def finish(job: Job, proc: subprocess.Popen[str], wall_s: float, timed_out: bool) -> dict[str, Any]:
    """The job's record: its result, or why there is none (timeout, exit code and last lines)."""
    record: dict[str, Any] = {"job": job.kind, "wall_s": round(wall_s, 3)}
    if timed_out:
        record.update(status="timeout", timeout_s=job.timeout_s)
        record["reason"] = f"did not finish in {job.timeout_s:.0f} s (stopped)"
        return record
    result = job.work / "result.json"
    if proc.returncode == 0 and result.exists():
        record.update(status="ok", **json.loads(result.read_text()))
        return record
    lines = [ln for ln in _log_tail(job).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    record.update(
        status="failed", reason=f"exit {proc.returncode}: {(errors or lines or [''])[-1]}"
    )
    return record


def _log_tail(job: Job) -> str:
    with contextlib.suppress(OSError):
        with (job.work / "log.txt").open() as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8000))
            return f.read()
    return ""


def kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill the child we started and its workers (its own process group), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_jobs(jobs: list[Job], common: list[str], parallel: int = 1) -> list[dict[str, Any]]:
    """Run ``jobs`` (at most ``parallel`` at once), each record saying how many ran beside it at
    most (``concurrent``: 1 = it ran alone). Records come back in the order of ``jobs``."""
    records: list[dict[str, Any] | None] = [None] * len(jobs)
    running: dict[int, tuple[subprocess.Popen[str], float, int]] = {}
    waiting = list(range(len(jobs)))
    try:
        while waiting or running:
            while waiting and len(running) < max(1, parallel):
                i = waiting.pop(0)
                running[i] = (start(jobs[i], common), time.perf_counter(), 1)
            busy = len(running)
            for i, (proc, began, most) in list(running.items()):
                most = max(most, busy)
                running[i] = (proc, began, most)
                elapsed = time.perf_counter() - began
                over = elapsed > jobs[i].timeout_s
                if proc.poll() is None and not over:
                    continue
                if over and proc.poll() is None:
                    kill_group(proc)
                del running[i]
                record = finish(jobs[i], proc, elapsed, timed_out=over and proc.returncode != 0)
                record["concurrent"] = most
                records[i] = record
                # A later call with the same --work-dir reuses it; a timeout too: run again, a
                # compile would start from the caches the stopped one left, no longer cold.
                if record["status"] in ("ok", "timeout"):
                    (jobs[i].work / "record.json").write_text(json.dumps(record, default=str))
            if running:
                time.sleep(0.2)  # polling children's exit; no result depends on this interval
    finally:
        for proc, _, _ in running.values():
            kill_group(proc)
    return [r for r in records if r is not None]


def earlier_record(folder: Path) -> dict[str, Any] | None:
    """The record of the job whose folder this is, from an earlier call that finished it."""
    path = folder / "record.json"
    if not path.exists():
        return None
    record = dict(json.loads(path.read_text()))
    record["reused"] = True
    return record


def merge_tree(src: Path, dst: Path, link: bool = True) -> None:
    """Add ``src``'s files to ``dst``: hard links where the file system allows (compile caches
    write new files, never into old ones), else, or with ``link=False``, copies."""
    if not src.is_dir():
        return

    def linked(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, dirs_exist_ok=True, copy_function=linked if link else shutil.copy2)


@contextlib.contextmanager
def compile_caches(inductor: Path, triton: Path) -> Iterator[None]:
    """Point this process's Inductor and Triton caches at the given folders for a while."""
    names = {"TORCHINDUCTOR_CACHE_DIR": inductor, "TRITON_CACHE_DIR": triton}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: str(v) for k, v in names.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


if __name__ == "__main__":
    sys.exit(child_main())
