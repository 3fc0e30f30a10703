"""src/honed/cli/doctor.py: `honed doctor`: what this machine can run; for the rest, why and the fix

``diagnose(device)`` gathers, without ever raising for what it finds:
  - the GPUs and the driver, from the engine (libcuda and NVML loaded at run time, not torch):
    driver version and the highest CUDA version it supports;
  - torch's version, its CUDA build (torch.version.cuda), and whether it initializes CUDA, with
    the warning torch gives when it cannot ("The NVIDIA driver on your system is too old ...");
  - the engine's diagnosis of driver against torch build (``_core.diagnose_driver``);
  - optional packages: each import is tried in a subprocess (``_core.run_isolated``), so one that
    raises, crashes or hangs on import is a finding ("torchao 0.13.0 fails to import with torch
    2.6.0: AttributeError: ..."), never a crash of honed; versions come from package metadata;
  - every built-in backend's ``available()`` with its reason and fix.

``problems`` block what was asked for (the CPU path by default, or CUDA); ``warnings`` disable
something optional (a package that fails to import; CUDA when only the CPU was asked for).

JSON schema of ``honed doctor --json`` (``DoctorReport.to_dict()``), one object:
  ok                bool: ``device`` can run here (no problems)
  device            "cpu" | "cuda": what was asked for
  problems          [str]: each names what is wrong, then "Fix: " and what to do
  warnings          [str]: same form; they do not block ``device``
  honed, python, platform   str
  driver            {loaded: bool, error: str, version: str (e.g. "580.159.04", "" without
                    NVML), cuda_version: int (e.g. 12080; 0 without a driver), cuda: str ("12.8")}
  gpus              [{index: int, name: str, compute_capability: str ("9.0"),
                      total_memory_bytes: int}]
  torch             {version: str, cuda: str | null (the CUDA build; null for a CPU build),
                    cuda_available: bool, cuda_warning: str | null, device_count: int}
  driver_diagnosis  {ok: bool, message: str, fix: str}
  packages          [{name: str, installed: bool, version: str | null (from metadata),
                      imports: bool | null (null when not installed), error: str | null}]
  backends          [{name: str, available: bool, reason: str, fix: str}]
Exit status of ``honed doctor``: 0 when ``ok``, 1 otherwise.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import platform
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from honed import _core, config
from honed._version import __version__

# Optional packages: import name, distribution names (the first with metadata gives the
# version), and what honed uses it for.
OPTIONAL_PACKAGES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("triton", ("triton", "pytorch-triton"), "Inductor's GPU kernels"),
    ("torchao", ("torchao",), "TorchAO quantization"),
    ("onnx", ("onnx",), "ONNX export"),
    ("onnxruntime", ("onnxruntime", "onnxruntime-gpu"), "ONNX Runtime backend"),
    ("tensorrt", ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"), "TensorRT backend"),
    ("torch_tensorrt", ("torch-tensorrt", "torch_tensorrt"), "Torch-TensorRT backends"),
    ("safetensors", ("safetensors",), "artifact weights"),
    ("numpy", ("numpy",), "tensors in and out"),
)

_IMPORT_PROBE = "import importlib, sys; m = importlib.import_module(sys.argv[1]); " + (
    "print(getattr(m, '__version__', ''))"
)


@dataclasses.dataclass
class PackageStatus:
    name: str
    installed: bool
    version: str | None = None
    imports: bool | None = None
    error: str | None = None


@dataclasses.dataclass
class DoctorReport:
    """Everything ``honed doctor`` found; ``ok`` when ``device`` can run here."""

    device: str
    problems: list[str]
    warnings: list[str]
    driver: dict[str, Any]
    gpus: list[dict[str, Any]]
    torch: dict[str, Any]
    driver_diagnosis: dict[str, Any]
    packages: list[PackageStatus]
    backends: list[dict[str, Any]]
    honed: str = __version__
    python: str = dataclasses.field(default_factory=platform.python_version)
    platform: str = dataclasses.field(
        default_factory=lambda: f"{sys.platform}-{platform.machine()}"
    )

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the module docstring."""
        return {
            "ok": self.ok,
            "device": self.device,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "honed": self.honed,
            "python": self.python,
            "platform": self.platform,
            "driver": dict(self.driver),
            "gpus": [dict(g) for g in self.gpus],
            "torch": dict(self.torch),
            "driver_diagnosis": dict(self.driver_diagnosis),
            "packages": [dataclasses.asdict(p) for p in self.packages],
            "backends": [dict(b) for b in self.backends],
        }


def _torch_cuda() -> dict[str, Any]:
    """torch's CUDA build and whether it initializes CUDA, with the warning it gives if not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = bool(torch.cuda.is_available())
        count = torch.cuda.device_count() if available else 0
    texts = [" ".join(str(w.message).split()) for w in caught if "CUDA" in str(w.message)]
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_available": available,
        "cuda_warning": " ".join(texts) or None,
        "device_count": count,
    }


def _metadata_version(dists: tuple[str, ...]) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _probe_package(name: str, dists: tuple[str, ...]) -> tuple[PackageStatus, str]:
    """Tries ``import name`` in a subprocess: a failing, crashing or hanging import is a finding.

    Returns the status and, when the import failed, how ("fails to import", "crashes on import",
    "hangs on import"); the status's error holds the detail.
    """
    version = _metadata_version(dists)
    if importlib.util.find_spec(name) is None:
        return PackageStatus(name, installed=False, version=version), ""
    options = _core.IsolateOptions(
        [sys.executable, "-W", "ignore", "-c", _IMPORT_PROBE, name],
        timeout_s=config.doctor_import_timeout_s,
    )
    result = _core.run_isolated(options, check_signals=False)  # from a thread: no signals here
    if result.ok:
        return PackageStatus(name, True, version or result.stdout_tail.strip() or None, True), ""
    last = _last_line(result.stderr_tail)
    if result.start_error:
        how, error = "cannot be probed", f"could not start python: {result.start_error}"
    elif result.timed_out:
        how, error = "hangs on import", result.summary()
    elif result.signal:
        how, error = "crashes on import", f"{result.summary()} {last}".strip()
    else:
        how, error = "fails to import", last or result.summary()
    return PackageStatus(name, True, version, False, error), how


def _import_key(name: str, dists: tuple[str, ...]) -> str | None:
    """What decides whether ``import name`` works here: the package's version and files, torch,
    python and honed (None when the package is not installed)."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None
    origin = spec.origin or next(iter(spec.submodule_search_locations or []), "")
    try:
        stamp = os.stat(origin).st_mtime_ns if origin else 0
    except OSError:
        stamp = 0
    parts = [name, _metadata_version(dists), origin, stamp, torch.__version__, sys.executable]
    return hashlib.sha256(json.dumps([__version__, *parts]).encode()).hexdigest()[:24]


def _remembered() -> Path:
    return Path(config.cache_dir) / "doctor" / "imports-ok"


def _probe_packages(fresh: bool) -> list[tuple[PackageStatus, str]]:
    """Every optional package's import probe, in parallel subprocesses.

    An import that worked before with the same package files, torch and python is remembered
    (in the cache folder) and not probed again unless ``fresh``; a failure is never remembered.
    """
    keys = {name: _import_key(name, dists) for name, dists, _ in OPTIONAL_PACKAGES}
    known = _remembered()
    results: dict[str, tuple[PackageStatus, str]] = {}
    todo = []
    for name, dists, _ in OPTIONAL_PACKAGES:
        key = keys[name]
        if key is None:
            results[name] = (PackageStatus(name, False, _metadata_version(dists)), "")
        elif not fresh and (known / key).exists():
            results[name] = (PackageStatus(name, True, _metadata_version(dists), True), "")
        else:
            todo.append((name, dists))
    if todo:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(todo)) as pool:
            for (name, _dists), probed in zip(
                todo, pool.map(lambda nd: _probe_package(*nd), todo), strict=True
            ):
                results[name] = probed
                key = keys[name]
                if probed[0].imports and key is not None:
                    with contextlib.suppress(OSError):  # a read-only cache only costs time
                        known.mkdir(parents=True, exist_ok=True)
                        (known / key).write_text(f"{name} {probed[0].version or ''}\n")
    return [results[name] for name, _, _ in OPTIONAL_PACKAGES]


@contextlib.contextmanager
def quiet_imports() -> Iterator[None]:
    """Third-party warnings and log lines (raised while backends import their libraries to say
    whether they are available) are not the doctor's output."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _package_warning(p: PackageStatus, how: str, dist: str) -> str:
    label = f"{p.name} {p.version}" if p.version else p.name
    torch_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    return (
        f"{label} {how} with torch {torch.__version__}: {p.error}. "
        f"Fix: install the {dist} release made for torch {torch_minor} (the newest one may need "
        f"a newer torch), or pip uninstall {dist}; honed skips what needs it"
    )


def _backends(packages: list[PackageStatus]) -> list[dict[str, Any]]:
    """Each backend's availability. A backend whose library failed its import probe is not asked
    (its available() would import that library here, and a crash there would end the doctor)."""
    from honed.backend.registry import availability, builtin_backends

    broken = {p.name: p for p in packages if p.installed and p.imports is False}
    rows = []
    for cls in builtin_backends():
        bad = [broken[name] for name in getattr(cls, "requires", ()) if name in broken]
        if bad:
            rows.append(
                {
                    "name": cls.__name__,
                    "available": False,
                    "reason": "; ".join(
                        f"{p.name} {p.version or ''} does not import here: {p.error}" for p in bad
                    ),
                    "fix": "see the package warnings above",
                }
            )
            continue
        a = availability(cls)
        rows.append({"name": cls.__name__, "available": a.ok, "reason": a.reason, "fix": a.fix})
    return rows


def _cuda_problems(probe: Any, torch_info: dict[str, Any], diag: Any) -> list[str]:
    """Why CUDA cannot run here, one line per cause with its fix; [] when it can."""
    problems: list[str] = []
    cpu_build = torch_info["cuda"] is None
    if not probe.driver_loaded:
        problems.append(
            f"no NVIDIA driver: {probe.error}. Fix: install the NVIDIA driver, or use --device cpu"
        )
    elif not probe.gpus:
        problems.append(
            f"the NVIDIA driver sees no GPU ({probe.error or 'it reports 0 devices'}). "
            "Fix: check that nvidia-smi lists a GPU and that CUDA_VISIBLE_DEVICES names one"
        )
    said = f" (torch says: {torch_info['cuda_warning']})" if torch_info["cuda_warning"] else ""
    if not diag.ok and (cpu_build or probe.driver_loaded):
        problems.append(f"{diag.message}{said}. Fix: {diag.fix}")
    elif not cpu_build and probe.gpus and not torch_info["cuda_available"]:
        why = torch_info["cuda_warning"] or "torch.cuda.is_available() returned False"
        problems.append(
            f"torch {torch_info['version']} cannot initialize CUDA: {why}. "
            "Fix: check that nvidia-smi works and that CUDA_VISIBLE_DEVICES names a GPU"
        )
    return problems


def _cuda_state() -> tuple[Any, dict[str, Any], Any]:
    """The GPUs and driver the engine sees, torch's CUDA build, and the engine's verdict on the
    two together."""
    probe = _core.probe_gpus()
    torch_info = _torch_cuda()
    diag = _core.diagnose_driver(
        probe.driver_cuda_version, torch_info["version"], torch_info["cuda"] or ""
    )
    return probe, torch_info, diag


def cuda_problems() -> list[str]:
    """Why CUDA cannot run here, one line per cause with its fix ([] when it can): what
    ``diagnose("cuda")`` says of the driver and torch's build, without its probes of the
    optional packages and the backends (seconds of imports), for an error about the device."""
    return _cuda_problems(*_cuda_state())


def diagnose(device: str = "cpu", fresh: bool = False) -> DoctorReport:
    """What this machine can run; ``.ok`` when ``device`` ("cpu" or "cuda") can run here.

    ``fresh``: probe every optional package's import again (see ``_probe_packages``).
    """
    device = device.split(":")[0]
    if device not in ("cpu", "cuda"):
        raise ValueError(f"honed doctor checks device 'cpu' or 'cuda', not {device!r}")
    probe, torch_info, diag = _cuda_state()
    packages: list[PackageStatus] = []
    package_warnings: list[str] = []
    for (status, how), (_name, dists, _use) in zip(
        _probe_packages(fresh), OPTIONAL_PACKAGES, strict=True
    ):
        packages.append(status)
        if how:
            package_warnings.append(_package_warning(status, how, dists[0]))
    with quiet_imports():
        backends = _backends(packages)

    cuda_problems = _cuda_problems(probe, torch_info, diag)
    problems: list[str] = []
    warnings_: list[str] = []
    if device == "cuda":
        problems += cuda_problems
    elif probe.gpus:  # a GPU that cannot be used is worth saying even when the CPU was asked for
        warnings_ += cuda_problems
    eager = next((b for b in backends if b["name"] == "TorchEagerBackend"), None)
    if eager is not None and not eager["available"]:
        problems.append(f"the eager baseline cannot run: {eager['reason']}. Fix: {eager['fix']}")
    warnings_ += package_warnings

    return DoctorReport(
        device=device,
        problems=problems,
        warnings=warnings_,
        driver={
            "loaded": probe.driver_loaded,
            "error": probe.error,
            "version": probe.driver_version,
            "cuda_version": probe.driver_cuda_version,
            "cuda": _core.cuda_version_string(probe.driver_cuda_version),
        },
        gpus=[
            {
                "index": g.index,
                "name": g.name,
                "compute_capability": f"{g.cc_major}.{g.cc_minor}",
                "total_memory_bytes": g.total_memory_bytes,
            }
            for g in probe.gpus
        ],
        torch=torch_info,
        driver_diagnosis={"ok": diag.ok, "message": diag.message, "fix": diag.fix},
        packages=packages,
        backends=backends,
    )


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def render(report: DoctorReport) -> list[Any]:
    """The readable report: rich renderables, printed in order."""
    from rich.table import Table

    t, d = report.torch, report.driver
    machine = Table(title=f"honed doctor ({report.device})", show_header=False)
    machine.add_column(style="bold")
    machine.add_column()
    machine.add_row("honed", f"{report.honed} (python {report.python}, {report.platform})")
    machine.add_row(
        "torch",
        f"{t['version']}, " + (f"CUDA {t['cuda']} build" if t["cuda"] else "CPU-only build"),
    )
    if d["loaded"]:
        driver = f"{d['version'] or 'version unknown (no NVML)'}, supports CUDA {d['cuda'] or '?'}"
    else:
        driver = f"not loaded: {d['error']}"
    machine.add_row("NVIDIA driver", driver)
    if report.gpus:
        for g in report.gpus:
            machine.add_row(
                f"GPU {g['index']}",
                f"{g['name']}, compute capability {g['compute_capability']}, "
                f"{_gib(g['total_memory_bytes'])}",
            )
    elif d["loaded"]:
        machine.add_row("GPUs", f"none ({d['error'] or 'the driver reports 0 devices'})")
    cuda = "yes" if t["cuda_available"] else "no"
    if t["cuda_warning"]:
        cuda += f" ({t['cuda_warning']})"
    machine.add_row("torch initializes CUDA", cuda)
    diag = report.driver_diagnosis
    verdict = "ok" if diag["ok"] else "no"
    machine.add_row(
        "driver vs torch",
        f"{verdict}: {diag['message']}" + (f"; {diag['fix']}" if diag["fix"] else ""),
    )

    packages = Table(title="optional packages")
    for col in ("package", "version", "imports", "note"):
        packages.add_column(col)
    uses = {name: use for name, _dists, use in OPTIONAL_PACKAGES}
    for p in report.packages:
        if not p.installed:
            imports = "[dim]not installed[/dim]"
        else:
            imports = "[green]yes[/green]" if p.imports else "[red]no[/red]"
        note = p.error if p.error else uses[p.name]
        packages.add_row(p.name, p.version or "-", imports, note)

    backends = Table(title="backends")
    for col in ("backend", "available", "reason / fix"):
        backends.add_column(col)
    for b in report.backends:
        why = "; ".join(x for x in (b["reason"], b["fix"]) if x)
        backends.add_row(
            b["name"], "[green]yes[/green]" if b["available"] else "[red]no[/red]", why
        )

    lines: list[Any] = [machine, packages, backends]
    lines += [f"[red]problem:[/red] {p}" for p in report.problems]
    lines += [f"[yellow]warning:[/yellow] {w}" for w in report.warnings]
    if report.ok:
        lines.append(f"[green]ok[/green]: honed can run on {report.device} here")
    else:
        lines.append(
            f"[red]cannot run on {report.device}[/red]: {len(report.problems)} problem(s) above"
        )
    return lines


def run(device: str = "cpu", as_json: bool = False, fresh: bool = False) -> int:
    """`honed doctor`: print the report (or its JSON); 0 when ``device`` can run, else 1."""
    report = diagnose(device, fresh)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        from rich.console import Console

        console = Console()
        if not console.is_terminal:
            console = Console(width=160)  # a log or a pipe: do not wrap the tables
        for item in render(report):
            console.print(item)
    return 0 if report.ok else 1
