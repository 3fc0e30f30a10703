"""bench/profile/first_capture.py: where a first CUDA-graph capture of BERT spends its time.

JIT's first stand-in (CUDA graphs over eager under bf16 autocast) is captured in the program's
process seconds after its first call. In a cold run on the H200 host that capture took 0.83 s
from its warm-up's end to its end, and the program's ``torch.cuda.synchronize``, which waits
for a capture under way (``cuda_graphs.CAPTURING``), waited as long; the same capture in the
program's process 18 s into another run took 0.15 s. This profile captures the model
``--reps`` times in one fresh process, each on a new ``CudaGraphed`` (its own pool), timing the
steps: the warm-up calls, ``capture_begin``, the forward recorded, ``capture_end`` (the graph's
instantiation), with or without a program beside it (``--alone``): a thread calling BERT eager
in a loop, each call synchronized through honed's guard, as bench/jit_bert.py's program. Printed
per capture: each step's ms, and the program's slowest call overlapping the capture, and the
whole build.

``--prefill`` asks whether the first recorded forward waits on memory from the driver: each
capture's pool is then a ``torch.cuda.MemPool`` that one more warm-up call, on the capture's
stream, has allocated from (and freed back to), so the capture finds its blocks cached there.
``--trace`` records the first build, warm-up included, under torch's profiler (CPU ops of every
thread, the CUDA runtime's calls and the kernels) and keeps, for each of the program's calls over
2x its median, what ran during it: the longest events of each thread and the kernels' busy time
per stream, to tell a wait for the GIL, for a driver lock and for the GPU apart.
``--warm-elsewhere`` first runs, in a process of its own that ends before the program starts,
the attention the capture's path meets (bf16, BERT's mask): whether what the first capture's
warm-up waits for is this process's (cuDNN's runtime-compiled plans, loaded here) or the
machine's (libraries read from disk, caches a process before filled).
``--give-way`` captures as JIT does with ``HONED_JIT_CAPTURE_GIVES_WAY=1``: JIT's patch of
``Module.__call__`` in place and the recorded forward giving way to the program's calls.
``--sample-ms`` samples the building thread's Python stack that often through the first build,
from a thread of its own, and keeps for each of the program's calls over 2x the stacks seen during
it and the sampler's longest gap there: a gap far past the period is a stretch in which no other
thread got the GIL, and the stack sampled at its end is what held it.
``--turns`` builds as JIT does by default (``HONED_JIT_TAKES_TURNS``): JIT's patch of
``Module.__call__`` in place, the warm-up's and the recording's module calls in turns with the
program's calls (``courtesy.taking_turns``), each of the program's calls waiting for a turn
under way; without it the build takes no turns (as before that setting).
``--first-build`` builds the first capture as JIT's early stand-in does (``courtesy.first_build``:
its warm-up ends with a call on the capture's path beside the program too).
``--reserve-mib`` asks whether the calls held up while the warm-up's first bf16 linears run wait
for the driver's memory: a block that large is allocated and freed on the capture's stream first,
so the caching allocator cuts the warm-up's allocations from it. Run with
``CUDA_MODULE_LOADING=EAGER`` in the environment, every kernel's module is loaded when the
process's CUDA context starts (the JSON says which).
``--warm-first`` asks what is left once the capture's path has run on the capturing thread
before the program's first call (as a first call that waited for it would): one bf16 forward
with ``is_current_stream_capturing`` answering yes on this thread, before the program starts.
cuDNN's attention plans are cached per thread in torch, and CUDA's loaded kernels per process.
``--pieces`` captures one graph per encoder layer instead of one for the whole forward (the
embeddings, the mask and the pooler between them stay eager): a program's synchronize then waits
for one layer's recording at most. Each layer is built on the arguments it got in one eager
forward; the row sums the pieces' steps and gives the slowest piece's recording.
``--pre-capture`` asks whether the first capture's extra time is the process's, once, or each
model's: a small BERT (2 layers, hidden 128) is captured first, timed alike. ``--profile``
records the first capture under torch's profiler (CPU) and keeps the slowest single ops of its
recorded forward, to name where the time goes.

    python bench/profile/first_capture.py [--reps 3] [--alone] [--prefill] [--pre-capture]
        [--profile] [--sdpa cudnn|efficient|math] [--give-way] [--turns] [--trace]
        [--warm-elsewhere] [--first-build] [--warm-first] [--pieces] [--sample-ms MS]
        [--switch-us US] [--reserve-mib MIB] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import statistics
import threading
import time
from contextlib import nullcontext
from typing import Any

import beside_stall  # the program's loop (this folder: run as a script)
import torch

from honed.backend import cuda_graphs
from honed.backend.base import GraphInfo, Sample, known_outputs
from honed.pipeline import courtesy

_SPANS: list[tuple[str, float, float]] = []


def _timed(owner: Any, name: str, label: str) -> None:
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            with torch.profiler.record_function(label):
                return real(*args, **kwargs)
        finally:
            _SPANS.append((label, start, time.perf_counter()))

    setattr(owner, name, wrapper)


_POOLS: list[Any] = []  # --prefill: each capture's MemPool, the latest last


def _mem_pool_handle() -> Any:
    """Stands in for torch.cuda.graph_pool_handle (--prefill): a new MemPool's id."""
    pool = torch.cuda.MemPool()
    _POOLS.append(pool)
    return pool.id


def _prefilled(real: Any) -> Any:
    """CudaGraphed._warm_up, then one more call on the capture's stream allocating from the
    capture's MemPool (--prefill)."""

    def warm_up(self: Any, args: Any, kwargs: Any, *rest: Any) -> Any:
        dtypes = real(self, args, kwargs, *rest)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.no_grad(), torch.cuda.stream(stream), torch.cuda.use_mem_pool(_POOLS[-1]):
            self._run(*args, **kwargs)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return dtypes

    return warm_up


def _reserving(real: Any, mib: int) -> Any:
    """CudaGraphed._warm_up, after one block of ``mib`` MiB allocated on the capture's stream and
    freed again (--reserve-mib): the caching allocator keeps it for that stream, so the warm-up's
    allocations (bf16 copies of the weights, activations) are cut from it instead of each asking
    the driver (cudaMalloc) beside the program's launches."""

    def warm_up(self: Any, args: Any, kwargs: Any, *rest: Any) -> Any:
        if mib and not getattr(self, "_reserved", False):
            block = torch.cuda.caching_allocator_alloc(mib << 20, self.device, self._stream)
            torch.cuda.caching_allocator_delete(block)
            self._reserved = True
        return real(self, args, kwargs, *rest)

    return warm_up


def _replay_ms(fn: Any, inputs: dict[str, Any], calls: int = 100) -> float:
    """The captured function's mean call, timed alone (with --alone only)."""
    with torch.no_grad():
        for _ in range(10):
            fn(**inputs)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(**inputs)
        torch.cuda.synchronize()
    return round((time.perf_counter() - start) / calls * 1e3, 4)


def _steps(
    start: float,
    end: float,
    starts: list[float] | None,
    took_ms: list[float],
    median: float | None = None,
) -> dict[str, Any]:
    """One build's steps (ms) from _SPANS, and the program's calls overlapping its captures.
    A build of several captures (--pieces) sums each step over them, and gives their count and
    the slowest piece's recorded forward."""
    warm = [(s, e) for label, s, e in _SPANS if label == "warm-up"]
    begins = [(s, e) for label, s, e in _SPANS if label == "capture_begin"]
    ends = [(s, e) for label, s, e in _SPANS if label == "capture_end"]
    captures = list(zip(begins, ends, strict=True))
    recorded = [ended[0] - begin[1] for begin, ended in captures]
    row: dict[str, Any] = {
        "build_ms": round((end - start) * 1e3, 1),
        "warm_up_ms": round(sum(e - s for s, e in warm) * 1e3, 1),
        "capture_begin_ms": round(sum(e - s for s, e in begins) * 1e3, 2),
        "forward_recorded_ms": round(sum(recorded) * 1e3, 1),
        "capture_end_ms": round(sum(e - s for s, e in ends) * 1e3, 1),
    }
    if len(captures) > 1:
        row["pieces"] = len(captures)
        row["slowest_piece_recorded_ms"] = round(max(recorded) * 1e3, 2)
    if starts is not None:
        hit = [
            ms
            for s, ms in zip(starts, took_ms, strict=False)
            if any(s < ended[1] and s + ms / 1e3 > begin[0] for begin, ended in captures)
        ]
        row["program_calls_in_capture"] = len(hit)
        row["program_slowest_in_capture_ms"] = round(max(hit), 2) if hit else None
        # the whole build: the warm-up calls (the one on the capture's path too) and the capture
        built = [
            ms for s, ms in zip(starts, took_ms, strict=False) if s < end and s + ms / 1e3 > start
        ]
        row["program_calls_in_build"] = len(built)
        row["program_slowest_in_build_ms"] = round(max(built), 2) if built else None
        if median is not None:
            row["program_over_2x_in_build"] = sorted(
                (round(ms, 2) for ms in built if ms > 2 * median), reverse=True
            )
    return row


def _layer_calls(model: Any, inputs: dict[str, Any]) -> list[tuple[Any, Sample, Any]]:
    """Each encoder layer of a BERT with the call it got in one eager forward and what it
    returned (--pieces): each piece is built on its own call, eager's output known."""
    seen: list[list[Any]] = []

    def before(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        seen.append([layer, Sample(tuple(args), dict(kwargs)), None])

    def after(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        seen[-1][2] = out

    layers = list(model.encoder.layer)
    handles = [layer.register_forward_pre_hook(before, with_kwargs=True) for layer in layers]
    handles += [layer.register_forward_hook(after, with_kwargs=True) for layer in layers]
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return [(layer, sample, out) for layer, sample, out in seen]


def _build_pieces(
    backend: Any, calls: list[tuple[Any, Sample, Any]], device: torch.device
) -> list[Any]:
    """One CUDA graph per layer, each built on its call (--pieces)."""
    built = []
    for layer, sample, out in calls:
        with known_outputs([sample], [out]):
            built.append(backend.build_graph(layer, [sample], GraphInfo(device=device)))
    return built


def _with_pieces(model: Any, calls: list[tuple[Any, Sample, Any]], built: list[Any]) -> Any:
    """The model called with each layer answered by its graph, the rest eager under bf16
    autocast, as the stand-in's pieces would run (--pieces with --alone: the replay's time)."""

    layers = [layer for layer, _, _ in calls]

    def run(**inputs: Any) -> Any:
        for layer, graphed in zip(layers, built, strict=True):
            layer.forward = graphed
        try:
            with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
                return model(**inputs)
        finally:
            for layer in layers:
                del layer.forward

    return run


def _warm_first(model: Any, inputs: dict[str, Any]) -> float:
    """The capture's path run once on this thread before the program starts (--warm-first):
    one forward under bf16 autocast, on a stream of its own, with ``is_current_stream_capturing``
    answering yes here; its seconds."""
    stream = torch.cuda.Stream()
    start = time.perf_counter()
    stream.wait_stream(torch.cuda.current_stream())
    with (
        torch.no_grad(),
        torch.cuda.stream(stream),
        torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False),
        cuda_graphs._as_if_capturing(),
    ):
        model(**inputs)
    torch.cuda.synchronize()
    return time.perf_counter() - start


_PROFILED: list[Any] = []  # --profile: the profiler to start at the next capture_begin


def _recorded_forward_profiled() -> Any:
    """A profiler (CPU) that the next capture starts after capture_begin, stops before
    capture_end: the recorded forward alone."""
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    )
    _PROFILED[:] = [profiler]
    return profiler


def _profiling(owner: Any, name: str, start: bool) -> None:
    real = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _PROFILED and not start:
            _PROFILED[0].stop()
        out = real(*args, **kwargs)
        if _PROFILED and start:
            _PROFILED[0].start()
        return out

    setattr(owner, name, wrapper)


def _slowest(profiler: Any, count: int = 15) -> list[dict[str, Any]]:
    """The profiled build's single ops with the most self CPU time, slowest first."""
    events = sorted(profiler.events(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {
            "op": e.name,
            "self_cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
            "cpu_ms": round(e.cpu_time_total / 1e3, 2),
            "shapes": str(e.input_shapes)[:120],
        }
        for e in events[:count]
    ]


def _program_marked() -> None:
    """The program's calls and synchronizes as named spans in a profiler's trace (--trace)."""
    real_calls, real_sync = beside_stall._calls, beside_stall._sync

    class Marked:
        def __init__(self, model: Any) -> None:
            self.model = model

        def __call__(self, **kwargs: Any) -> Any:
            with torch.profiler.record_function("program call"):
                return self.model(**kwargs)

    def sync(device: str) -> None:
        with torch.profiler.record_function("program sync"):
            real_sync(device)

    def calls(model: Any, *args: Any, **kwargs: Any) -> None:
        real_calls(Marked(model), *args, **kwargs)

    beside_stall._sync = sync
    beside_stall._calls = calls


class _Sampler:
    """The Python stack of one thread every ``period_s``, from a thread of its own (--sample-ms)."""

    def __init__(self, thread_id: int, period_s: float) -> None:
        self.samples: list[tuple[float, tuple[str, ...]]] = []
        self._id, self._period = thread_id, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import sys
        import traceback

        while not self._stop.wait(self._period):
            frame = sys._current_frames().get(self._id)
            stack = traceback.extract_stack(frame)[-8:] if frame is not None else []
            names = tuple(f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})" for f in stack)
            self.samples.append((time.perf_counter(), names[::-1]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def during(self, start: float, end: float, top: int = 4) -> dict[str, Any]:
        """The samples between ``start`` and ``end``: the longest gap between two (ms) with the
        stack that ended it, and the stacks seen most often."""
        inside = [(t, s) for t, s in self.samples if start <= t <= end]
        before = [(t, s) for t, s in self.samples if t < start][-1:]
        gap, gap_stack = 0.0, ()
        for (t0, _), (t1, stack) in itertools.pairwise(before + inside):
            if t1 - t0 > gap:
                gap, gap_stack = t1 - t0, stack
        seen = collections.Counter(stack[:4] for _, stack in inside)
        return {
            "samples": len(inside),
            "longest_gap_ms": round(gap * 1e3, 2),
            "stack_after_gap": list(gap_stack),
            "most_seen": [[n, list(s)] for s, n in seen.most_common(top)],
        }


_ELSEWHERE = """
import torch
import torch.nn.functional as F
q, k, v = (torch.randn(8, 12, 128, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
mask = torch.zeros(8, 1, 128, 128, device="cuda", dtype=torch.bfloat16)
F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
torch.cuda.synchronize()
"""


def _warm_elsewhere() -> float:
    """BERT's masked bf16 attention in a process of its own (--warm-elsewhere); its seconds."""
    import subprocess
    import sys

    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", _ELSEWHERE], check=True)
    return time.perf_counter() - start


def _all_threads() -> Any:
    """The profiler's setting for every thread's CPU ops (the program's too), where torch has it."""
    from torch._C._profiler import _ExperimentalConfig

    try:
        return _ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=True)
    except TypeError:
        print("this torch's profiler records the main thread's CPU ops only", flush=True)
        return _ExperimentalConfig(enable_cuda_sync_events=True)


def _slow_calls_traced(path: str, median_ms: float, top: int = 10) -> list[dict[str, Any]]:
    """From a chrome trace of one build: each program call (its span and its synchronize's) over
    2x ``median_ms``, with the longest events of each thread and the kernels' busy ms per stream
    overlapping it."""
    with open(path) as f:
        events = [
            e
            for e in json.load(f)["traceEvents"]
            if e.get("ph") == "X" and "dur" in e and e.get("cat") != "Trace"
        ]
    named = {"program call": [], "program sync": []}
    for e in events:
        if e["name"] in named and e.get("cat") == "user_annotation":  # not its GPU-side copy
            named[e["name"]].append(e)
    calls = sorted(named["program call"], key=lambda e: e["ts"])
    syncs = sorted(named["program sync"], key=lambda e: e["ts"])
    out: list[dict[str, Any]] = []
    for call in calls:
        start = call["ts"]
        sync = next((s for s in syncs if s["ts"] >= start + call["dur"]), None)
        end = sync["ts"] + sync["dur"] if sync else start + call["dur"]
        if (end - start) / 1e3 <= 2 * median_ms:
            continue
        during = [e for e in events if e["ts"] < end and e["ts"] + e["dur"] > start]
        kernels: dict[str, float] = {}
        threads: dict[str, list[tuple[float, str]]] = {}
        for e in during:
            overlap = (min(end, e["ts"] + e["dur"]) - max(start, e["ts"])) / 1e3
            if e.get("cat") == "kernel":
                stream = str(e.get("args", {}).get("stream", e.get("tid")))
                kernels[stream] = kernels.get(stream, 0.0) + overlap
            elif e["dur"] >= 500:
                key = f"{e.get('cat', '?')}/{e.get('tid')}"
                threads.setdefault(key, []).append((e["dur"] / 1e3, e["name"][:60]))
        out.append(
            {
                "call_ms": round(call["dur"] / 1e3, 2),
                "sync_ms": round(sync["dur"] / 1e3, 2) if sync else None,
                "kernel_ms_by_stream": {k: round(v, 2) for k, v in kernels.items()},
                "longest_by_thread": {
                    k: [(round(ms, 2), name) for ms, name in sorted(v, reverse=True)[:top]]
                    for k, v in threads.items()
                },
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--alone", action="store_true", help="no program beside the captures")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between captures")
    parser.add_argument(
        "--prefill", action="store_true", help="captures into a MemPool a warm-up call filled"
    )
    parser.add_argument("--pre-capture", action="store_true", help="a small BERT captured first")
    parser.add_argument("--profile", action="store_true", help="torch's profiler on the first")
    parser.add_argument(
        "--sdpa",
        choices=("cudnn", "efficient", "math"),
        default=None,
        help="the only SDPA backend enabled, for the whole run (the program's calls too)",
    )
    parser.add_argument(
        "--give-way",
        action="store_true",
        help="the capture gives way at module calls (HONED_JIT_CAPTURE_GIVES_WAY), JIT's patch on",
    )
    parser.add_argument(
        "--turns",
        action="store_true",
        help="the build takes turns with the program's calls (HONED_JIT_TAKES_TURNS), JIT's "
        "patch on",
    )
    parser.add_argument(
        "--trace", action="store_true", help="the first build under torch's profiler, every thread"
    )
    parser.add_argument(
        "--warm-elsewhere",
        action="store_true",
        help="the capture's attention first run in a process of its own",
    )
    parser.add_argument(
        "--first-build",
        action="store_true",
        help="the first capture built as JIT's early stand-in builds (courtesy.first_build: its "
        "warm-up ends with a call on the capture's path beside the program too)",
    )
    parser.add_argument(
        "--warm-first",
        action="store_true",
        help="the capture's path run once on this thread (bf16, masked) before the program starts",
    )
    parser.add_argument(
        "--pieces",
        action="store_true",
        help="one graph per encoder layer, the rest eager, instead of one for the whole forward",
    )
    parser.add_argument(
        "--sample-ms",
        type=float,
        default=0.0,
        help="sample the building thread's Python stack this often through the first build",
    )
    parser.add_argument(
        "--switch-us",
        type=float,
        default=0.0,
        help="Python's switch interval through the run (JIT's jobs use 50 µs; Python's is 5000)",
    )
    parser.add_argument(
        "--reserve-mib",
        type=int,
        default=0,
        help="a block this large allocated and freed on the capture's stream before its warm-up",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.switch_us:
        import sys

        sys.setswitchinterval(args.switch_us / 1e6)
    if args.trace:
        _program_marked()
    if args.warm_elsewhere:
        print(f"attention warmed in another process in {_warm_elsewhere():.2f}s", flush=True)

    if args.sdpa:
        from torch.nn.attention import SDPBackend, _sdpa_kernel

        named = {"cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
        _sdpa_kernel([getattr(SDPBackend, named[args.sdpa])])
    model, inputs = beside_stall._model("cuda", small=False)
    with torch.no_grad():
        ref = model(**inputs)
    torch.cuda.synchronize()
    if args.prefill:
        torch.cuda.graph_pool_handle = _mem_pool_handle  # CudaGraphed takes its pool from it
        cuda_graphs.CudaGraphed._warm_up = _prefilled(cuda_graphs.CudaGraphed._warm_up)
    if args.reserve_mib:
        cuda_graphs.CudaGraphed._warm_up = _reserving(
            cuda_graphs.CudaGraphed._warm_up, args.reserve_mib
        )
    _timed(cuda_graphs.CudaGraphed, "_warm_up", "warm-up")
    _profiling(torch.cuda.CUDAGraph, "capture_begin", start=True)
    _profiling(torch.cuda.CUDAGraph, "capture_end", start=False)
    _timed(torch.cuda.CUDAGraph, "capture_begin", "capture_begin")
    _timed(torch.cuda.CUDAGraph, "capture_end", "capture_end")

    warmed_first_s = _warm_first(model, inputs) if args.warm_first else None
    if warmed_first_s is not None:
        print(f"the capture's path run first on this thread in {warmed_first_s:.3f}s", flush=True)
    calls = _layer_calls(model, inputs) if args.pieces else []

    took_ms: list[float] = []
    starts: list[float] = []
    stop = threading.Event()
    program = None
    median = None
    cuda_graphs.guard_synchronize(True)  # as JIT sets it beside a program
    from honed import config as honed_config
    from honed.jit import patcher

    honed_config.jit_takes_turns = args.turns
    if args.give_way or args.turns:  # JIT's patch of Module.__call__, this thread as JIT's own
        patcher.install()
        patcher.STATE.bypass = 1
        honed_config.jit_capture_gives_way = args.give_way
    if not args.alone:
        program = threading.Thread(
            target=beside_stall._calls, args=(model, inputs, "cuda", stop, took_ms, starts)
        )
        program.start()
        time.sleep(3.0)
        median = statistics.median(took_ms[len(took_ms) // 3 :])
        courtesy.watch(lambda: beside_stall._IN_CALL[0])
        print(f"program alone: {len(took_ms)} calls, median {median:.3f} ms", flush=True)
    backend = cuda_graphs.CudaGraphsBackend(
        cuda_graphs.CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
    )
    sample = Sample((), dict(inputs))
    rows: list[dict[str, Any]] = []
    slowest_ops: list[dict[str, Any]] = []
    traced: list[dict[str, Any]] = []
    sampled: list[dict[str, Any]] = []
    try:
        if args.pre_capture:
            small, small_inputs = beside_stall._model("cuda", small=True)
            _SPANS.clear()
            start = time.perf_counter()
            with courtesy.own_stream("cuda"):
                backend.build_graph(
                    small, [Sample((), dict(small_inputs))], GraphInfo(device=torch.device("cuda"))
                )
            rows.append(
                {
                    "rep": "small",
                    **_steps(start, time.perf_counter(), starts if program else None, took_ms),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
            time.sleep(args.gap)
        for rep in range(args.reps):
            _SPANS.clear()
            profiler = _recorded_forward_profiled() if args.profile and rep == 0 else None
            tracer = None
            if args.trace and rep == 0:
                tracer = torch.profiler.profile(
                    activities=[
                        torch.profiler.ProfilerActivity.CPU,
                        torch.profiler.ProfilerActivity.CUDA,
                    ],
                    experimental_config=_all_threads(),
                )
                tracer.start()
            sampler = None
            if args.sample_ms and rep == 0:
                sampler = _Sampler(threading.get_ident(), args.sample_ms / 1e3)
            start = time.perf_counter()
            first = courtesy.first_build() if args.first_build and rep == 0 else nullcontext()
            with courtesy.own_stream("cuda"), first:
                if args.pieces:
                    built = _build_pieces(backend, calls, torch.device("cuda"))
                    fn = _with_pieces(model, calls, built)
                    del built  # fn holds the graphs: `del fn` below frees them
                else:
                    with known_outputs([sample], [ref]):
                        fn = backend.build_graph(
                            model, [sample], GraphInfo(device=torch.device("cuda"))
                        )
            end = time.perf_counter()
            if sampler is not None:
                time.sleep(0.1)  # the program's call held up by the build has returned
                sampler.stop()
                sampled = [
                    {
                        "at_ms": round((s - start) * 1e3, 1),
                        "ms": ms,
                        **sampler.during(s, s + ms / 1e3),
                    }
                    for s, ms in zip(starts, took_ms, strict=False)
                    if median is not None and ms > 2 * median and s < end and s + ms / 1e3 > start
                ]
            if tracer is not None:
                time.sleep(0.1)  # the program's call held up by the build has returned
                tracer.stop()
                tracer.export_chrome_trace("/tmp/first-capture-trace.json")
                if median is not None:
                    traced = _slow_calls_traced("/tmp/first-capture-trace.json", median)
            if profiler is not None:
                _PROFILED.clear()
                slowest_ops = _slowest(profiler)
            if program is not None:
                time.sleep(0.1)  # the program's call held up by the capture has returned
            row = {"rep": rep, **_steps(start, end, starts if program else None, took_ms, median)}
            if program is None:
                row["replay_ms"] = _replay_ms(fn, inputs)
            rows.append(row)
            print(json.dumps(row), flush=True)
            del fn
            time.sleep(args.gap)
    finally:
        stop.set()
        if program is not None:
            program.join()
        if args.give_way or args.turns:
            patcher.uninstall()
        courtesy.watch(None)
        cuda_graphs.guard_synchronize(False)
    result = {
        "device": torch.cuda.get_device_name(),
        "alone": args.alone,
        "prefill": args.prefill,
        "pre_capture": args.pre_capture,
        "sdpa": args.sdpa,
        "first_build": args.first_build,
        "switch_us": args.switch_us or None,
        "reserve_mib": args.reserve_mib or None,
        "module_loading": os.environ.get("CUDA_MODULE_LOADING", "LAZY (torch's default)"),
        "give_way": args.give_way,
        "turns": args.turns,
        "warm_elsewhere": args.warm_elsewhere,
        "warm_first_s": round(warmed_first_s, 3) if warmed_first_s is not None else None,
        "pieces": len(calls) if args.pieces else None,
        "rows": rows,
    }
    if slowest_ops:
        result["first_capture_slowest_ops"] = slowest_ops
    if traced:
        result["traced_slow_calls"] = traced
    if sampled:
        result["sampled_slow_calls"] = sampled
    if median is not None:
        result["program_median_ms"] = round(median, 3)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
