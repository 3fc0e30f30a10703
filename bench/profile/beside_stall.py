"""bench/profile/beside_stall.py: what JIT's work in a program's process costs the program's calls.

The program is a loop of BERT eager calls on the main thread, each synchronized and timed (as in
bench/jit_bert.py); beside it a thread repeats one piece of the work a JIT tune does in the
program's process, for a few seconds, with honed's courtesy probe set as JIT sets it:

- ``hash-python``: the weights hashed tensor by tensor in Python (hashlib; a GPU tensor's bytes
  copied in pieces on a side stream through pinned memory), as the cache key was made before
  ``honed.pipeline.cache.Digest``;
- ``hash-engine``: ``model_fingerprint`` as it is (``_core.Sha256``, one call without the GIL);
- ``check``: ``compare`` of two eager outputs, on honed's own stream, as an install's check does;
- its parts: ``copy-pageable`` (the outputs copied to the host as ``.cpu()`` does, back to back),
  ``copy-pinned`` (into pinned memory on honed's stream, then waited for), ``figures``
  (``compare`` of outputs already on the host: the figures in the engine, ``_core.closeness``)
  and ``figures-torch`` (the same figures made with torch's CPU ops in float64, as before);
- a big buffer in the program's process, as reading a cached payload or receiving a package
  from a worker makes one: ``read-file`` (a 256 MiB file read whole, from the page cache, the
  GIL free while it is read), and ``read-file-heap`` (run last: the setting stays), the same
  with glibc told to serve large allocations from its heap and keep freed memory (``mallopt``:
  no mmap, no trimming), so no buffer is mapped, faulted in or unmapped again.

Printed per mode: how long one piece took, and the program's calls meanwhile (median, 99th
percentile, slowest, how many over twice the median of the loop alone).

    python bench/profile/beside_stall.py [--device cuda] [--modes hash-python hash-engine ...]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from honed.pipeline import cache, correctness, courtesy

_IN_CALL = [False]
MODES = (
    "hash-python",
    "hash-engine",
    "check",
    "copy-pageable",
    "copy-pinned",
    "figures",
    "figures-torch",
    "read-file",
    "read-file-heap",
)
_BIG = 256 << 20


def _model(device: str, small: bool) -> tuple[Any, dict[str, Any]]:
    from transformers import BertConfig, BertModel

    cfg = (
        BertConfig(
            hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256
        )
        if small
        else BertConfig()
    )
    model = BertModel(cfg).to(device).eval()
    ids = torch.randint(0, cfg.vocab_size, (8, 32 if small else 128), device=device)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _calls(
    model: Any,
    inputs: dict[str, Any],
    device: str,
    until: threading.Event,
    out: list[float],
    starts: list[float] | None = None,
    kernel: list[tuple[int, float]] | None = None,
) -> None:
    """The program: ``model`` called until ``until``, each call's ms in ``out`` (and its start,
    perf_counter seconds, in ``starts`` when given; shared with install_stall.py). ``kernel``:
    each call's voluntary context switches (waits: for the GIL, a lock, the GPU) and the
    thread's CPU ms."""
    with torch.no_grad():
        while not until.is_set():
            if kernel is not None:
                switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
                cpu = time.thread_time()
            start = time.perf_counter()
            _IN_CALL[0] = True
            if courtesy.TURN[0]:  # as JIT's patch: the call waits for a turn under way
                _IN_CALL[0] = False
                courtesy.call_starting()
                _IN_CALL[0] = True
            began = time.perf_counter()
            model(**inputs)
            _IN_CALL[0] = False
            courtesy.call_ended(time.perf_counter() - began)
            _sync(device)
            out.append((time.perf_counter() - start) * 1e3)
            if kernel is not None:
                kernel.append(
                    (
                        resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - switches,
                        (time.thread_time() - cpu) * 1e3,
                    )
                )
            if starts is not None:
                starts.append(start)


def _python_fingerprint(module: torch.nn.Module) -> str:
    """The weights hashed tensor by tensor in Python, each GPU tensor in 8 MiB pieces."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        courtesy.give_way()
        h.update(name.encode())
        h.update(f"{tuple(t.shape)}:{t.dtype}:".encode())
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
        if not raw.is_cuda:
            h.update(raw.numpy().data)
            continue
        side, staging = cache.prepare_copies(raw.device)
        side.wait_stream(torch.cuda.current_stream(raw.device))
        with torch.cuda.stream(side):
            for start in range(0, raw.numel(), 8 << 20):
                piece = raw[start : start + (8 << 20)]
                buf = staging[: piece.numel()]
                buf.copy_(piece, non_blocking=True)
                side.synchronize()
                h.update(buf.numpy().data)
    return h.hexdigest()


def _keep_freed_memory() -> None:
    """glibc: large allocations from the heap (no mmap), freed memory kept (no trimming)."""
    libc = ctypes.CDLL(None)
    m_trim_threshold, m_mmap_max = -1, -4
    assert libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1


def _big_job(mode: str) -> Callable[[], None]:
    if mode.endswith("-heap"):
        _keep_freed_memory()
    path = Path(tempfile.gettempdir()) / "honed-beside-stall.bin"
    if not path.exists() or path.stat().st_size != _BIG:
        path.write_bytes(os.urandom(_BIG))
    return lambda: path.read_bytes() and None


def _job(mode: str, model: Any, inputs: dict[str, Any], device: str) -> Callable[[], None]:
    if mode.startswith("read-file"):
        return _big_job(mode)
    if mode == "hash-python":
        return lambda: _python_fingerprint(model)
    if mode == "hash-engine":
        return lambda: cache.model_fingerprint(model)
    with torch.no_grad():
        ref, out = model(**inputs), model(**inputs)

    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    if mode == "copy-pageable":
        return lambda: [t.cpu() for t in leaves] and None
    if mode == "copy-pinned":

        def copy_pinned() -> None:
            with courtesy.own_stream(torch.device(device)):
                [t.to("cpu", non_blocking=True) for t in leaves]

        return copy_pinned
    if mode.startswith("figures"):
        ref_host, out_host = (
            [t.cpu() for t in torch.utils._pytree.tree_leaves(x) if isinstance(t, torch.Tensor)]
            for x in (ref, out)
        )
        if mode == "figures":
            return lambda: correctness.compare(ref_host, out_host) and None
        return lambda: (
            [_torch_figures(r, o) for r, o in zip(ref_host, out_host, strict=True)] and None
        )

    def check() -> None:
        with courtesy.own_stream(torch.device(device)):
            result = correctness.compare(ref, out)
        assert result.ok, result.reason

    return check


def _torch_figures(ref: torch.Tensor, out: torch.Tensor) -> tuple[float, float, float]:
    """The check's figures made with torch's CPU ops in float64 (before ``_core.closeness``)."""
    courtesy.give_way()
    r, o = ref.double(), out.double()
    finite = torch.isfinite(r) & torch.isfinite(o)
    bool((~torch.isfinite(o) & torch.isfinite(r)).any())
    r, o = r[finite], o[finite]
    diff = (o - r).abs()
    scale = float(r.abs().max())
    max_rel = float((diff / r.abs().clamp_min(max(scale * 1e-3, 1e-12))).max())
    bool((diff <= 1e-4 * max(1.0, scale) + 1e-3 * r.abs()).all())
    cosine = float((r * o).sum()) / (float(r.norm()) * float(o.norm()))
    return float(diff.max()), max_rel, cosine


def _summary(calls: list[float], alone_median: float) -> dict[str, Any]:
    ordered = sorted(calls)
    return {
        "calls": len(calls),
        "median_ms": round(statistics.median(calls), 3),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))], 3),
        "slowest_ms": round(ordered[-1], 3),
        "over_2x": sum(c > 2 * alone_median for c in calls),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="a small BERT (the CPU machine)")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    ap.add_argument("--seconds", type=float, default=4.0, help="per mode")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    model, inputs = _model(args.device, args.small)
    if args.device.startswith("cuda"):
        cache.prepare_copies(torch.device(args.device))
    calls: list[float] = []
    stop = threading.Event()
    program = threading.Thread(target=_calls, args=(model, inputs, args.device, stop, calls))
    program.start()
    time.sleep(2.0)  # warm-up
    mark = len(calls)
    time.sleep(args.seconds)
    alone = calls[mark:]
    alone_median = statistics.median(alone)
    result: dict[str, Any] = {"device": args.device, "alone": _summary(alone, alone_median)}
    print(f"alone: {json.dumps(result['alone'])}")
    courtesy.watch(lambda: _IN_CALL[0])
    try:
        for mode in args.modes:
            job = _job(mode, model, inputs, args.device)
            job()  # first run apart: lazy loading, first imports
            took: list[float] = []
            mark = len(calls)
            end = time.perf_counter() + args.seconds
            while time.perf_counter() < end:
                start = time.perf_counter()
                job()
                took.append((time.perf_counter() - start) * 1e3)
            during = calls[mark:]
            result[mode] = {
                "job_ms": round(statistics.median(took), 2),
                "jobs": len(took),
                **_summary(during, alone_median),
            }
            print(f"{mode}: {json.dumps(result[mode])}")
            time.sleep(0.5)
    finally:
        courtesy.watch(None)
        end_program(stop, program)
    write_json(result, args.json)


def end_program(stop: threading.Event, program: threading.Thread) -> None:
    """Stop the program's loop and wait for its last call (shared with worker_start.py)."""
    stop.set()
    program.join()


def write_json(result: dict[str, Any], path: str) -> None:
    """The profile's figures to ``path`` ("": nowhere)."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
