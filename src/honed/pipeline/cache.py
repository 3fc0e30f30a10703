"""src/honed/pipeline/cache.py: the persistent tuning cache.

A second tune of the same model (weights and forward code), inputs, environment and candidate
reuses each candidate's earlier outcome (status, check, measured samples) instead of building
and measuring again; only the winner is built in the process (a payload backend's stored files
are loaded as they are). One JSON record per (model, graph, candidate) under
``<cache_dir>/tune/v1/``, written atomically.

It lives in Python rather than the engine: only the tuner reads it; the C++ runtime never does.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import linecache
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from honed import _core, trust
from honed._version import __version__
from honed.errors import HonedError
from honed.pipeline.courtesy import give_way
from honed.pipeline.figures import reusable

log = logging.getLogger("honed")

VERSION = "v1"


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


# GPU bytes reach the hash through a pinned staging buffer of this many bytes (two halves: one
# is hashed while the next pieces are copied into the other).
_STAGING_BYTES = 16 << 20
_COPIERS: dict[torch.device, tuple[Any, torch.Tensor]] = {}
_COPY_LOCK = threading.Lock()  # one staging buffer per device: one hashing at a time
_MAKE_LOCK = threading.Lock()  # making them never waits for a hashing under way


def prepare_copies(device: torch.device) -> tuple[Any, torch.Tensor]:
    """The side stream and pinned staging buffer that hash ``device``'s tensors, made once.

    Making them holds the GIL (torch's stream pool, the pinned allocation), so a JIT program
    makes them in its first call (honed.jit.patcher), not beside a later one."""
    device = torch.device(device)
    if device.index is None:
        device = torch.device(device.type, torch.cuda.current_device())
    made = _COPIERS.get(device)
    if made is None:
        with _MAKE_LOCK:
            made = _COPIERS.get(device)
            if made is None:
                stream = torch.cuda.Stream(device)
                staging = torch.empty(_STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
                made = _COPIERS[device] = (stream, staging)
    return made


class Digest:
    """SHA-256 of bytes and tensors' contents, the tensors' bytes hashed in the engine
    (``_core.Sha256``) with the GIL released, ``_GROUP_BYTES`` per call.

    In a JIT program this runs on JIT's thread beside the program's calls. Hashing tensor by
    tensor in Python took the GIL back a dozen times per tensor (torch calls each give it up),
    and each time the program's next op waited for it; a GPU tensor's bytes are copied on a
    stream of honed's own (a copy on the program's stream would queue its kernels behind it),
    through pinned memory, while the program's kernels run. The digest of a GPU tensor equals
    that of the same tensor on the CPU.
    """

    def __init__(self) -> None:
        self._hash = _core.Sha256()
        self._parts: list[Any] = []
        self._tensors: list[torch.Tensor] = []  # alive until their bytes are hashed
        self._device: torch.device | None = None

    def update(self, data: bytes) -> None:
        self._parts.append(data)

    def tensor(self, t: torch.Tensor) -> None:
        """Shape, dtype and every byte of ``t``."""
        self._parts.append(f"{tuple(t.shape)}:{t.dtype}:".encode())
        if not t.numel():
            return
        if t.device.type not in ("cpu", "cuda"):
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.device != self._device:
            self._flush()
            self._device = t.device
        self._tensors.append(t)
        self._parts.append((t.data_ptr(), t.nbytes, t.is_cuda))

    def hexdigest(self) -> str:
        self._flush()
        return self._hash.hexdigest()

    def _flush(self) -> None:
        parts, device = self._parts, self._device
        if not parts:
            return
        on_gpu = device is not None and device.type == "cuda"
        if device is not None and on_gpu:
            side, staging = prepare_copies(device)
            side.wait_stream(torch.cuda.current_stream(device))  # the bytes as the caller left them
        for group in _groups(parts, _GROUP_BYTES):
            if not on_gpu:
                self._hash.update(group)
            else:
                with _COPY_LOCK, torch.cuda.device(device):
                    self._hash.update(group, side.cuda_stream, staging.data_ptr(), staging.nbytes)
            give_way()
        # update() returns once every copy is done: the tensors (and temporaries made here) may go
        self._parts, self._tensors = [], []


# The bytes hashed per engine call: between calls, a thread beside a JIT program gives way
# while the program is inside a call. Unpaced, the copies and the hashing of BERT-base's
# weights back to back held the program's calls up to 2.5 times their length on the H100,
# where hashing paced tensor by tensor did not (bench/profile/beside_stall.py).
_GROUP_BYTES = _STAGING_BYTES // 2


def _groups(parts: list[Any], limit: int) -> Iterator[list[Any]]:
    """``parts`` in runs of at most ``limit`` memory bytes each, a region split where needed."""
    group: list[Any] = []
    size = 0
    for part in parts:
        if isinstance(part, bytes):
            group.append(part)
            continue
        address, length, device = part
        while length:
            if size == limit:
                yield group
                group, size = [], 0
            take = min(length, limit - size)
            group.append((address, take, device))
            address, length, size = address + take, length - take, size + take
    if group:
        yield group


# Sources read so far (a function's by its code object, a class's by the class): the cache key
# of every tune reads them.
_SOURCES: dict[Any, str] = {}


def source_text(obj: Any) -> str:
    """The source of a class or function, or "" where there is none (built-in, REPL, C).

    A function's is the lines its code spans (decorators to its last statement), read without
    tokenizing: ``inspect.getsource`` tokenizes the block to find its end, which in a JIT
    program holds the GIL beside the program's calls (160 ms for BERT's modules on the H100).
    A class's is the whole file that defines it: finding the class in it takes a parse of the
    file, one C call holding the GIL beside a JIT program's call (docs/jit.md); the file holds
    the class, so a change to the class still shows.
    """
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    key = code if code is not None else obj
    try:
        return _SOURCES[key]
    except (KeyError, TypeError):
        pass
    text = _code_lines(code) if code is not None else _file_text(obj)
    with contextlib.suppress(TypeError):
        _SOURCES[key] = text
    return text


def _code_lines(code: Any) -> str:
    linecache.checkcache(code.co_filename)  # a file edited since it was last read, as inspect does
    lines = linecache.getlines(code.co_filename)
    if not lines:
        return ""
    last, todo = code.co_firstlineno, [code]
    while todo:  # the function's own lines and those of what it defines (nested functions)
        c = todo.pop()
        last = max([last, *(line for _, _, line in c.co_lines() if line is not None)])
        todo.extend(k for k in c.co_consts if hasattr(k, "co_lines"))
    return "".join(lines[code.co_firstlineno - 1 : last])


def _file_text(obj: Any) -> str:
    try:
        path = inspect.getsourcefile(obj)  # the module's file, found without reading it
    except (OSError, TypeError):
        return ""
    if not path:
        return ""
    linecache.checkcache(path)
    return "".join(linecache.getlines(path))


def model_fingerprint(module: torch.nn.Module) -> str:
    """SHA-256 of the module's class, forward source, and every parameter and buffer."""
    h = Digest()
    cls = type(module)
    h.update(f"{cls.__module__}.{cls.__qualname__}".encode())
    for sub in module.modules():
        give_way()
        h.update(source_text(type(sub).forward).encode())
    for name, t in module.state_dict().items():
        give_way()  # a few hundred tensors' details in Python, beside a program's call
        h.update(name.encode())
        h.tensor(t)
    return h.hexdigest()


def inputs_fingerprint(samples: list[Any], values: bool = True) -> str:
    """SHA-256 of the recorded samples (structure, shapes, dtypes and values).

    values: False leaves the tensors' values out (their strides and devices go in instead): a
    JIT program's calls differ from run to run, and the outcomes cached for a tune of the same
    shapes still decide, each install being checked against eager on the samples of the day.
    """
    h = Digest()
    for sample in samples:
        leaves, spec = torch.utils._pytree.tree_flatten((sample.args, sample.kwargs))
        h.update(str(spec).encode())
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor):
                h.update(repr(leaf).encode())
            elif values:
                h.tensor(leaf)
            else:
                h.update(
                    f"{tuple(leaf.shape)}:{leaf.stride()}:{leaf.dtype}:{leaf.device.type}".encode()
                )
    return h.hexdigest()


class TuneCache:
    """Candidate outcomes on disk, keyed by everything that could change them."""

    def __init__(self, root: Path) -> None:
        self.dir = Path(root) / "tune" / VERSION
        # Cached payloads are loaded as code: the folders must be this user's alone (as ssh
        # requires of ~/.ssh); otherwise the cache is off for this tune.
        self.refused = next(
            filter(
                None, (trust.folder_problem(p) for p in (Path(root), self.dir.parent, self.dir))
            ),
            "",
        )
        if self.refused:
            log.warning("honed: the tuning cache is off: %s", self.refused)
        # (key, record, files) of the last get whose payload verified, for files()
        self._verified: tuple[str, dict[str, Any], dict[str, bytes] | None] | None = None

    @staticmethod
    def key(**parts: Any) -> str:
        return hashlib.sha256(_canonical({"honed": __version__, **parts}).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.json"

    def get(
        self, key: str, unstable_too: bool = False, payload: bool = True
    ) -> dict[str, Any] | None:
        """The record stored under ``key``; one whose measurement was unstable only with
        ``unstable_too`` (a JIT restart replays the decision made on it rather than measuring
        beside the program again). Its payload files are read and verified first, unless
        ``payload`` is False (the record is only rewritten, nothing of it loaded); verified,
        they are kept for the ``files`` call that follows (hashed once, not twice)."""
        self._verified = None
        if self.refused:
            return None
        path = self._path(key)
        try:
            record: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            log.warning("honed: ignoring unreadable cache entry %s (%s)", path, e)
            return None
        if payload and isinstance(record, dict) and record.get("files"):
            files = self._read_files(key, record)
            problem = trust.payload_problem(key, record, files)
            if problem:
                log.warning("honed: ignoring cache entry %s: %s; evaluating again", path, problem)
                return None
            self._verified = (key, record, files)
        if unstable_too:
            return record
        return record if reusable(record) else None  # an unstable measurement is no decision

    def put(self, key: str, record: dict[str, Any], files: dict[str, bytes] | None = None) -> None:
        """Store ``record`` (and payload ``files`` beside it) atomically; failures only warn."""
        if self.refused:
            return
        path = self._path(key)
        try:
            trust.mkdir_private(path.parent)
            if files:
                record = dict(record, files=sorted(files), **trust.sign_payload(key, files))
                for name, data in files.items():
                    self._write(self.payload_dir(key) / name, data)
            self._write(path, _canonical(record).encode())
        except (OSError, HonedError) as e:
            log.warning("honed: could not write the tuning cache at %s (%s)", self.dir, e)

    def payload_dir(self, key: str) -> Path:
        return self.dir / key[:2] / f"{key}.files"

    def files(self, key: str, record: dict[str, Any]) -> dict[str, bytes] | None:
        """The payload files of ``record`` under ``key``, verified; None where they do not."""
        verified, self._verified = self._verified, None
        if not record.get("files"):
            return None
        if verified is not None and verified[0] == key and verified[1] is record:
            return verified[2]
        files = self._read_files(key, record)
        return files if not trust.payload_problem(key, record, files) else None

    def _read_files(self, key: str, record: dict[str, Any]) -> dict[str, bytes] | None:
        try:
            return {n: (self.payload_dir(key) / n).read_bytes() for n in record.get("files", [])}
        except OSError:
            return None

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        trust.mkdir_private(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def clear(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def unwritable(folder: Path) -> str:
    """Why files cannot be created in ``folder`` or, while it is missing, in the nearest folder
    above it that exists; "" when they can. Nothing is left behind (no folder is created)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return ""


def open_for_tune(root: Path, enabled: bool) -> tuple[TuneCache | None, Path]:
    """The tune's cache (None when off) and the folder for its build logs (buildlog.py).

    A cache folder that cannot be written turns the cache off and sends the build logs to a
    temporary folder, with one warning: the tune goes on.
    """
    from honed import config
    from honed.pipeline import buildlog

    cache_why = unwritable(root) if enabled else ""
    cache = TuneCache(root) if enabled and not cache_why else None  # it checks its owner too
    run_dir = buildlog.new_run_dir()
    logs_why = unwritable(run_dir.parent)
    if not cache_why and not logs_why:
        return cache, run_dir
    if logs_why:
        run_dir = Path(tempfile.mkdtemp(prefix="honed-logs-"))
    what = []
    if cache_why:
        what.append(f"the tuning cache is off for this tune ({root}: {cache_why})")
    if logs_why:
        what.append(f"build logs go to {run_dir} ({Path(config.cache_dir)}: {logs_why})")
    log.warning(
        "honed: the cache folder cannot be written, so %s; make it writable or set "
        "HONED_CACHE_DIR to a writable folder.",
        " and ".join(what),
    )
    return cache, run_dir
