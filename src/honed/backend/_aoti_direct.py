"""src/honed/backend/_aoti_direct.py: AOTInductor packages loaded and run without the GIL.

torch's package loader (``torch._C._aoti.AOTIModelPackageLoader``) holds the GIL while it opens
the package's library, takes the constants and runs each call, the first of which loads every
kernel. A program that keeps calling its model while JIT mode installs a winner beside it stops
for all of that. ``DirectLoader`` does the same work through the library's C interface
(``honed._core.AotiContainer``), which releases the GIL around each step, and answers what honed
asks of torch's loader (``boxed_run``, ``get_call_spec``, ``load_constants``,
``get_constant_fqns``), so ``AotCompiled`` and the constants code take either.

A JIT process loads its packages this way (CPU and CUDA ones: AUTO_DEVICE_TYPES), from
``beside_a_program`` at JIT's start on (its tunes run on threads of their own, beside the
program's); elsewhere torch's loader stays, whose calls cost a little less host time (no handle
conversion, no GIL hand-over). ``unlocked_loads`` asks for it on one thread;
``HONED_AOTI_LOADER=direct`` or ``=torch`` (``honed.config.aoti_loader``) decides for every
load instead.

It takes a package only where nothing else of torch's loader is needed: one model library, no
extern-kernel description (ops outside AOTInductor's C shim run through torch's proxy executor,
which only torch's loader makes), and torch's helpers that turn tensors into handles and back.
``open_package`` answers None otherwise, and the caller uses torch's loader.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import tempfile
import threading
import zipfile
from collections.abc import Iterator
from typing import Any

import torch

from honed.pipeline.courtesy import beside_program, give_way

log = logging.getLogger("honed")

# Beside a program, a package takes its constants this many at a time, with a wait for the end of
# the program's call between handfuls: it copies each one with a call into the CUDA runtime, and
# a model's constants handed over in one go all fell within one of the program's calls, whose
# thread then waited many times over (bench/profile/install_stall.py's voluntary switches).
HANDOVER_CHUNK = 16
# honed's AOTInductor packages hold one model, under this folder of the archive.
_MODEL_DIR = "data/aotinductor/model/"
_THIS_THREAD = threading.local()
_PROCESS = {"beside_a_program": False}
# How this process's package loads went: "direct", or why torch's loader took one.
LOADS: collections.Counter[str] = collections.Counter()


@contextlib.contextmanager
def unlocked_loads() -> Iterator[None]:
    """Packages this thread loads meanwhile are loaded and run without the GIL (where they can
    be): work done beside a program whose own calls must not wait."""
    depth = getattr(_THIS_THREAD, "depth", 0)
    _THIS_THREAD.depth = depth + 1
    try:
        yield
    finally:
        _THIS_THREAD.depth = depth


def beside_a_program(on: bool) -> None:
    """Every package this process loads from now on, on any thread, without the GIL (where it
    can be): a process whose program keeps calling while honed works beside it (JIT mode)."""
    _PROCESS["beside_a_program"] = on


# Device types whose packages JIT loads directly unasked (both ran on their devices: the CPU
# tests and runs, the H100's tests and BERT loop under JIT). Anything else: torch's loader unless
# HONED_AOTI_LOADER=direct (honed.config.aoti_loader) asks.
AUTO_DEVICE_TYPES = ("cpu", "cuda")


def wanted(device_type: str = "cpu") -> bool:
    from honed import config

    if config.aoti_loader != "auto":  # HONED_AOTI_LOADER
        return config.aoti_loader == "direct"
    if device_type not in AUTO_DEVICE_TYPES:
        return False
    return _PROCESS["beside_a_program"] or getattr(_THIS_THREAD, "depth", 0) > 0


def _handles() -> Any:
    aoti = getattr(torch._C, "_aoti", None)
    needed = ("unsafe_alloc_void_ptrs_from_tensors", "alloc_tensors_by_stealing_from_void_ptrs")
    return aoti if aoti is not None and all(hasattr(aoti, n) for n in needed) else None


class DirectLoader:
    """One AOTInductor model container, called through its C interface without the GIL."""

    def __init__(self, container: Any, folder: tempfile.TemporaryDirectory[str], device: str):
        self._container = container
        # Kernel binaries load lazily, at a kernel's first launch: the files stay while we do.
        self._folder = folder
        self._cuda = device.startswith("cuda")
        self._aoti = _handles()
        self.single_threaded = False
        names = container.constants()
        self._fqn_to_name = {fqn: name for name, fqn in names}

    def get_call_spec(self) -> list[str]:
        return list(self._container.call_spec())

    def get_constant_fqns(self) -> list[str]:
        return list(self._fqn_to_name)

    def load_constants(
        self,
        constants: dict[str, torch.Tensor],
        use_inactive: bool = False,
        check_full_update: bool = True,
        user_managed: bool = False,
    ) -> None:
        """As torch's loader does with these arguments: constants by FQN, copied in."""
        if use_inactive or user_managed:
            raise NotImplementedError("DirectLoader copies constants into the active buffer only")
        unknown = [fqn for fqn in constants if fqn not in self._fqn_to_name]
        if unknown:
            raise RuntimeError(
                f"the AOTInductor package has no constant {unknown[0]!r}; it was compiled from "
                "another module"
            )
        fqns = list(constants)
        if self._cuda:
            # The tensors' pending work (their copy onto the device) comes before the
            # container's copy, whichever stream that uses.
            torch.cuda.current_stream().synchronize()
        size = len(fqns)
        # In handfuls only where every constant comes (the package's own check of a full
        # update sees one handful at a time; with all there it could not fail).
        if beside_program() and not set(self._fqn_to_name) - set(fqns):
            size = HANDOVER_CHUNK
        for first in range(0, len(fqns), size):
            give_way()
            part = fqns[first : first + size]
            handles = self._aoti.unsafe_alloc_void_ptrs_from_tensors([constants[f] for f in part])
            try:
                pairs = [(self._fqn_to_name[f], h) for f, h in zip(part, handles, strict=True)]
                self._container.update_constants(pairs, check_full_update and size == len(fqns))
            finally:
                # The container borrowed the handles; they are ours to free.
                self._aoti.alloc_tensors_by_stealing_from_void_ptrs(handles)

    def boxed_run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        handles = self._aoti.unsafe_alloc_void_ptrs_from_tensors(inputs)
        inputs.clear()  # as torch's boxed_run: the call owns its inputs now
        stream = torch.cuda.current_stream().cuda_stream if self._cuda else 0
        # While a CUDA graph captures the call, the GIL stays held (as torch's loader holds it):
        # another thread's device-wide synchronize (a program's torch.cuda.synchronize) during a
        # capture invalidates it, and both fail.
        capturing = self._cuda and torch.cuda.is_current_stream_capturing()
        outs = self._container.run(handles, stream, self.single_threaded, capturing)
        result: list[torch.Tensor] = self._aoti.alloc_tensors_by_stealing_from_void_ptrs(outs)
        return result

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self.boxed_run(list(inputs))


class DirectRunner:
    """What honed holds of a loaded package (torch's AOTICompiledModel has the same ``loader``)."""

    def __init__(self, loader: DirectLoader) -> None:
        from torch.utils._pytree import treespec_loads

        self.loader = loader
        self._out_spec = treespec_loads(loader.get_call_spec()[1])  # parsed once, not per call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils._pytree import tree_unflatten

        if kwargs:
            raise TypeError("a package loaded by honed takes its flat tensors, no keywords")
        return tree_unflatten(self.loader.boxed_run(list(args)), self._out_spec)


def open_package(
    path: str, device_type: str, single_threaded: bool, pairs: bool = True
) -> DirectRunner | None:
    """The package at ``path`` through its C interface, or None where torch's loader is needed
    (see the module's docstring, and a library this loader cannot open: the reason is counted in
    ``LOADS`` and logged). ``pairs``: hand constants over through the C-ABI pairs where the
    library has them (False: the C++ map older libraries take; for tests)."""
    if not wanted(device_type):
        return None
    if _handles() is None:
        LOADS["torch: torch._C._aoti lacks the tensor handle helpers"] += 1
        return None
    from honed._core import AotiContainer

    # Beside a JIT program, the archive's listing and each file's copy are Python holding the
    # GIL (a CUDA package holds a kernel binary per kernel): between the program's calls.
    give_way()
    with zipfile.ZipFile(path) as archive:
        # The model folder's files by their path inside it (kernel binaries may sit deeper).
        members = {rel: m for m in archive.infolist() if (rel := _in_model_dir(m.filename))}
        top = [rel for rel in members if "/" not in rel]
        libraries = [n for n in top if n.endswith(".so")]
        extern = [n for n in top if n.endswith(".json") and not n.endswith("_metadata.json")]
        if len(libraries) != 1 or extern:
            why = "extern kernels (a proxy executor)" if extern else f"{len(libraries)} libraries"
            LOADS[f"torch: {why}"] += 1
            return None
        folder = tempfile.TemporaryDirectory(prefix="honed-aoti-")
        for rel, member in members.items():
            if rel.endswith((".cpp", ".h")):
                continue  # sources: nothing loads them
            give_way()
            target = os.path.join(folder.name, *rel.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with archive.open(member) as src, open(target, "wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
    if device_type == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"
    else:
        device = device_type
    library = os.path.join(folder.name, libraries[0])
    try:
        container = AotiContainer.open(
            library,
            device,
            folder.name if device_type == "cuda" else "",
            bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)),
            pairs,
        )
    except RuntimeError as e:
        # Never a candidate lost to this loader: torch's takes the package instead.
        first = (str(e).splitlines() or [type(e).__name__])[0]
        log.info("honed: torch's AOTInductor loader takes %s: %s", path, first)
        LOADS[f"torch: {first}"] += 1
        folder.cleanup()
        return None
    loader = DirectLoader(container, folder, device)
    loader.single_threaded = single_threaded
    LOADS["direct"] += 1
    return DirectRunner(loader)


def _in_model_dir(name: str) -> str:
    """A file's path inside the archive's model folder ("<archive>/data/aotinductor/model/"),
    "" for anything else."""
    head, sep, rest = name.partition(_MODEL_DIR)
    if not sep or head.count("/") > 1 or not rest or rest.endswith("/"):
        return ""
    parts = rest.split("/")
    return rest if all(p not in ("", ".", "..") for p in parts) else ""
