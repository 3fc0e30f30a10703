"""src/honed/backend/_aoti_env.py: AOTInductor and this machine's toolchain.

What building and loading AOTInductor packages needs beyond torch's own calls: link options
that keep a private C++ runtime out of the generated wrapper, torch's CPU vector-ISA check
remembered across processes, a loader without torch's device-information check, and a load
probe in a child process whose success is remembered on disk. Used by TorchInductorAotBackend;
the probe's child imports ``load_runner`` from here.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from honed.errors import TuneError

PACKAGE_NAME = "model.pt2"


# -- link options ----------------------------------------------------------------------------------
_LIBSTDCXX = ":libstdc++.so.6"


def link_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The user's Inductor options plus an explicit dynamic libstdc++ for the generated wrapper.

    Some toolchains link the wrapper.so against the static libstdc++.a, so it carries a private
    copy of the C++ runtime next to the process's shared one; the two disagree about locale
    facets and loading a CUDA package segfaults in std::regex. Naming ``libstdc++.so.6`` as a
    library resolves every C++ runtime symbol from the shared library before the linker's
    implicit ``-lstdc++`` is reached. Only done where the compiler can find that file.
    """
    merged = dict(options or {})
    if sys.platform.startswith("linux") and shared_libstdcxx_found():
        libs = list(merged.get("aot_inductor.custom_op_libs") or [])
        if _LIBSTDCXX not in libs:
            libs.append(_LIBSTDCXX)
        merged["aot_inductor.custom_op_libs"] = libs
    return merged


@functools.cache
def shared_libstdcxx_found() -> bool:
    """Whether the C++ compiler Inductor uses resolves libstdc++.so.6 (it is GCC's runtime)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        done = subprocess.run(
            [get_cpp_compiler(), "-print-file-name=libstdc++.so.6"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except Exception:
        return False
    found = done.stdout.strip()
    # An unknown file is echoed back as its bare name; a found one comes back as a path.
    return done.returncode == 0 and os.path.isabs(found) and os.path.exists(found)


# -- verdicts remembered on disk -------------------------------------------------------------------
def verdict_file(name: str, *key: Any) -> Path | None:
    """Where a remembered success lives in the cache folder (None with the cache off), keyed by
    ``key`` and everything that decides how packages are built and loaded here."""
    from honed import __version__, config

    if not config.cache_enabled:
        return None
    parts = [__version__, torch.__version__, sys.executable, os.environ.get("CXX", ""), *key]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]
    return Path(config.cache_dir) / "aoti-probe" / f"{name}-{digest}.ok"


def remember(verdict: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # a read-only cache only costs time
        verdict.parent.mkdir(parents=True, exist_ok=True)
        verdict.write_text(text + "\n")


# -- torch's CPU vector-ISA check, side by side and remembered -----------------------------------
# Before its first compile in a process, torch builds a test program per CPU vector ISA (AVX2,
# AVX-512, ...) the CPU's flags name and imports each in a child interpreter, one after another,
# and every worker process pays that again. honed runs torch's own checks side by side instead
# (threads waiting on the children), which torch then finds answered. Once every flagged ISA has
# passed (same torch, interpreter, compiler and CPU flags), later processes tell torch so
# (``cpp.vec_isa_ok``) and skip the test builds. A failed ISA is never remembered, so torch keeps
# checking on such machines, and a user's own ``cpp.vec_isa_ok`` (TORCHINDUCTOR_VEC_ISA_OK)
# always wins.
def _flagged() -> list[Any] | None:
    """torch's ISA objects that this CPU's flags name, or None off x86 Linux."""
    import platform

    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return None
    try:
        from torch._inductor import cpu_vec_isa

        flags = cpu_vec_isa.x86_isa_checker()
        return [
            isa
            for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())
        ]
    except Exception:  # another torch layout: no shortcut
        return None


def flagged_vec_isas() -> list[str] | None:
    """The vector ISAs torch would test here (those the CPU's flags name), or None off x86."""
    isas = _flagged()
    return None if isas is None else [str(isa) for isa in isas]


def check_vec_isas_side_by_side() -> list[str] | None:
    """Run torch's check of each flagged ISA at once, in threads; the names that passed, or None
    where torch's layout differs (torch then checks one by one, as it would anyway)."""
    from concurrent.futures import ThreadPoolExecutor

    isas = _flagged()
    if not isas:
        return None
    try:
        with ThreadPoolExecutor(max_workers=len(isas), thread_name_prefix="honed-isa") as pool:
            passed = list(pool.map(bool, isas))  # VecISA.__bool__: torch's cached check
    except Exception:
        return None
    return [str(isa) for isa, ok in zip(isas, passed, strict=True) if ok]


@contextlib.contextmanager
def vec_isa_known() -> Iterator[None]:
    """Compile with torch's ISA check skipped when an earlier process saw every ISA pass, else
    with it done side by side first."""
    from torch._inductor import config as inductor_config

    flagged = flagged_vec_isas()
    if not flagged or inductor_config.cpp.vec_isa_ok is not None:
        yield
        return
    verdict = verdict_file("vec-isa", flagged)  # None with the cache off: checked each time
    if verdict is None or not verdict.exists():
        passed = check_vec_isas_side_by_side()
        if passed is None or passed != flagged:
            yield  # torch decides, as it always does
            return
        if verdict is not None:
            remember(verdict, f"vector ISAs that build here: {' '.join(passed)}")
    with inductor_config.patch({"cpp.vec_isa_ok": True}):
        yield


CACHE_DIR_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def absolute_cache_dirs() -> None:
    """Inductor's and Triton's cache folders made absolute in the environment, as newer torch
    does itself: AOTInductor's CUDA build (torch 2.11) compiles and links in folders of its own,
    where a relative path names another place, and fails."""
    for name in CACHE_DIR_VARIABLES:
        value = os.environ.get(name)
        if value and not os.path.isabs(value):
            os.environ[name] = os.path.abspath(value)


# -- the precompiled header ---------------------------------------------------------------------
# AOTInductor first precompiles the header its wrapper includes, under torch's temporary
# folder. On the CPU machine making it cost about 6 s and saved about 1.6 s per compile that
# found it made. A tune's worker has a temporary folder of its own, removed with it, and usually
# compiles one package; so CPU packages are built without it, unless this process has compiled
# one already (a program or test that compiles many) or a header made earlier is there to use.
_COMPILES = 0


def compiled_here() -> None:
    global _COMPILES
    _COMPILES += 1


def precompiled_header_pays() -> bool:
    if _COMPILES > 0:
        return True
    try:
        from torch._inductor import codecache

        folder = Path(codecache._HEADER_DIR)
    except (ImportError, AttributeError, TypeError):
        return False
    return folder.is_dir() and any(folder.glob("*.gch"))


# -- loading ---------------------------------------------------------------------------------------
def load_package(
    package: bytes, device_type: str, single_threaded: bool = False, direct: bool = True
) -> Any:
    """Load a .pt2 from bytes; the loader extracts what it needs, so the file can go after.
    ``single_threaded``: see load_runner; ``direct=False``: torch's loader whatever is asked."""
    with tempfile.TemporaryDirectory(prefix="honed-aot-") as tmp:
        path = Path(tmp) / PACKAGE_NAME
        path.write_bytes(package)
        probe_loading(path, device_type)
        runner = load_runner(str(path), device_type, single_threaded, direct)
        if IN_WORKER:
            _loaded_here(device_type)
        return runner


def load_runner(
    path: str, device_type: str, single_threaded: bool = False, direct: bool = True
) -> Any:
    """AOTInductor's package loader, without torch's device-information check.

    ``torch._inductor.aoti_load_package`` first compares the package's metadata with this
    machine's only to log a warning, and finding this CPU's vector ISA compiles and loads test
    programs in child processes, which dominates loading. honed checks the environment itself
    (the artifact's fingerprint) and loads with libtorch's loader directly, as the C++ runtime
    does; torch's function is the fallback where that loader's Python binding differs. First
    choice, where the package allows it: the library's C interface without the GIL
    (_aoti_direct), so a program's other threads run while a package loads and runs.

    ``single_threaded``: one runner that records no CUDA event per call. The pooled runner does,
    and an event recorded while a CUDA graph captures the call can no longer be queried, which
    fails the next plain call; a package called through CUDA graphs is loaded this way.
    """
    from honed.backend import _aoti_direct

    unlocked = _aoti_direct.open_package(path, device_type, single_threaded) if direct else None
    if unlocked is not None:
        return unlocked  # without importing Inductor (and TorchDynamo with it): seconds of GIL
    import torch._inductor

    try:
        # torch re-exports it here without listing it in __all__ (its defining module moves)
        from torch._inductor.package import AOTICompiledModel  # type: ignore[attr-defined]

        index = torch.cuda.current_device() if device_type == "cuda" else -1
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", single_threaded, 1, index)
    except (ImportError, AttributeError, TypeError):
        if single_threaded:
            return torch._inductor.aoti_load_package(path, run_single_threaded=True)
        return torch._inductor.aoti_load_package(path)
    return AOTICompiledModel(loader)


# -- the load probe ------------------------------------------------------------------------------
# AOTInductor's package loader can kill the whole process with a segfault (a wrapper linked
# against a private C++ runtime does). Such a crash must stay out of the user's process, so the
# first package of each device type is loaded in a child process first; a crash there becomes
# an error here. Results are kept per process (device type -> "" (loads) or the failure), and a
# success also on disk (see verdict_file), so later processes skip the child: it costs a fresh
# interpreter importing torch. A failure is never kept on disk: a repaired environment is
# probed again.
PROBE_CODE = (
    "import sys; from honed.backend._aoti_env import load_runner; "
    "load_runner(sys.argv[1], sys.argv[2])"
)
PROBED: dict[str, str] = {}
# A tune's worker process is itself the child such a crash stays in (the pool fails only that
# job), so it loads without a probe and, once a load returns, records the verdict that spares
# later processes the probe: the caller installing the winner among them.
IN_WORKER = False


def probe_loading(path: Path, device_type: str) -> None:
    if device_type not in PROBED:  # once per process and device type
        PROBED[device_type] = "" if IN_WORKER else _probe(path, device_type)
    check_probe(device_type)


def _loaded_here(device_type: str) -> None:
    verdict = verdict_file(device_type)
    if verdict is not None and not verdict.exists():
        remember(verdict, f"loads: torch {torch.__version__}, {sys.executable} (a tune's worker)")


def _probe(path: Path, device_type: str) -> str:
    """ "" when packages of ``device_type`` load here (known from disk, or a child loads this
    one), else how the child failed."""
    verdict = verdict_file(device_type)
    if verdict is not None and verdict.exists():
        return ""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE_CODE, str(path), device_type],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "timed out after 600 s"
    rc = done.returncode
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if rc < 0:
        return f"crashed with signal {-rc}"
    if rc > 0:
        return f"failed (exit code {rc}: {last})"
    if verdict is not None:
        remember(verdict, f"loads: torch {torch.__version__}, {sys.executable}")
    return ""


def check_probe(device_type: str) -> None:
    """Raise when a probe found that packages of this device type cannot be loaded here."""
    failure = PROBED.get(device_type)
    if failure:
        raise TuneError(
            f"loading an AOTInductor {device_type} package {failure} in a probe process, so "
            f"it is not loaded here: this torch build ({torch.__version__}) cannot run "
            "AOTInductor packages on this machine; use another backend, or another torch build"
        )
