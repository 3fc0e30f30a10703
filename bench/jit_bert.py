"""bench/jit_bert.py: issue 23's scenario: a plain BERT loop under HONED_JIT=1, cold then warm.

A plain script that never imports honed builds Hugging Face ``BertModel(BertConfig())`` with
random weights (no download), and calls it on batch 8, sequence 128, at least ``--calls`` times
and for at least ``--seconds`` seconds, timing every call (CUDA synchronised). It runs in fresh
processes: without honed (the eager reference), then with HONED_JIT=1 on empty honed and
Inductor caches (cold: JIT tunes beside the loop), then again on those caches (warm: the cached
winner is installed from its payload; ``--warm-seed N``: on other input ids of the same
shapes, as a restarted program's data would be), then tuned the AOT way (below). Printed and
written to ``--out`` (JSON):

- eager: the median call (after the first), and its own calls over 2x that median (with
  ``--eager-seconds`` as long as ``--cold-seconds``: what the machine alone does in the time
  the cold run is judged on);
- each JIT run: the first call, the slowest call after the first (and its ratio to eager's
  median), the steady-state median (the last quarter of the calls), the seconds from the first
  call until calls run at tuned speed (the first call from which a run of 5 calls has a median
  within 10 % of the steady state), and JIT's tune records from its history; its calls over 2x
  eager's median by the tune's phase last entered and by what held each up (it returned in
  time and then waited, on CUDA for the GPU; or returned late with its thread on the CPU all
  along, or off it);
- a fourth run (``--no-aot`` leaves it out) tunes the model the AOT way first (``honed.tune``
  with its defaults, its own empty caches) and then runs the same loop, and a second warm JIT
  run follows it: each warm run's steady median over the AOT run's, with the 99 % bootstrap
  interval of the ratio (issue 23: within 3 %); the two ratios bracket the machine's drift
  between runs, which no interval of one run shows; ``--pairs N`` adds N more (AOT, warm)
  processes in turns (the AOT ones replay their tune from its cache) and judges the ratio
  across processes, one steady median each; and in one process: the AOT run saves its
  selection (``honed.save``), and the warm run after it loads it (``honed.load``) after its
  loop and calls it in turns with JIT's own route, blocks of 25 calls each, 40 times: warm JIT
  over AOT with no drift between processes in it (``jit_over_aot_in_process``);
- a run of what a user types instead of honed (``--no-one-liner`` leaves it out), between the
  warm runs: ``torch.compile(model, mode="max-autotune")`` under bf16 autocast, on an empty
  Inductor cache; its cold compile (its first call) and each JIT run's steady speed over its
  steady speed, with the 99 % interval (the goal: at least 1.25x).

    python bench/jit_bert.py --out jit.json                 # GPU: base config
    python bench/jit_bert.py --small --out jit.json         # CPU: a small config

JIT's default candidates unless ``--backends`` names some. Each run has its own, empty,
temporary folder (Inductor keeps precompiled headers there whatever its cache folder).

``--small`` uses a 2-layer, 128-wide BERT with sequence 32; without transformers installed it
falls back to a torch TransformerEncoder of the same size (said so in the JSON).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from cpu_pairs import cpu_list  # bench/cpu_pairs.py, beside this file

# --marks: each named function (module:Qualified.name, where its callers look it up) wrapped to
# report each call's span and thread; shared by the program and the workers' sitecustomize.
MARKING = textwrap.dedent(
    """
    import functools, importlib, threading

    def marked(item, fn, note):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            began = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                note(item, threading.current_thread().name, began, time.perf_counter())
        return wrapper

    def mark_all(spec, note):
        for item in spec.split(","):
            where, _, qualname = item.partition(":")
            owner = importlib.import_module(where)
            *path, attr = qualname.split(".")
            for part in path:
                owner = getattr(owner, part)
            setattr(owner, attr, marked(qualname, getattr(owner, attr), note))
    """
)

# The program under test: honed appears nowhere in it.
PROGRAM = textwrap.dedent(
    """
    import ctypes, json, os, resource, sys, time
    import torch
    __MARKING__
    small, device, calls, seconds, out, mode = (
        sys.argv[1] == "1", sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5],
        sys.argv[6])
    torch.manual_seed(0)
    batch, seq = 8, (32 if small else 128)
    try:
        from transformers import BertConfig, BertModel
        cfg = (BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=256) if small else BertConfig())
        model, name = BertModel(cfg), f"BertModel({'small' if small else 'base'})"
        vocab = cfg.vocab_size
        def inputs(ids):
            return dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    except ImportError:
        if not small:
            raise
        layer = torch.nn.TransformerEncoderLayer(128, 2, 256, batch_first=True)
        enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        emb = torch.nn.Embedding(1000, 128)
        model, name, vocab = torch.nn.Sequential(emb, enc), "TransformerEncoder stand-in", 1000
        def inputs(ids):
            return dict(input=ids)
    model = model.eval().to(device)
    if device.startswith("cuda") and os.environ.get("JIT_BERT_BLOCKING_SYNC") == "1":
        # the context waits for the GPU asleep: a call's thread CPU time is then only what ran
        # on the CPU (BERT's mask check waits for the GPU inside each call, spinning by default)
        torch.cuda.synchronize()
        assert ctypes.CDLL("libcuda.so.1").cuCtxSetFlags(4) == 0  # CU_CTX_SCHED_BLOCKING_SYNC
    marks = []
    if os.environ.get("JIT_BERT_MARKS"):
        # named functions of honed's, each call's span and thread, so a slow call can be put
        # beside what honed's threads were doing in this process (a diagnostic)
        mark_all(os.environ["JIT_BERT_MARKS"], lambda *span: marks.append(span))
    g = torch.Generator().manual_seed(int(os.environ.get("JIT_BERT_IDS_SEED", "1")))
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    tuned = {}
    if mode == "tune":  # the AOT way, for comparison: honed.tune first, then the same loop
        import copy, honed, threading
        busy = sys.argv[9] == "1"
        if busy:  # the tune beside a second copy's eager calls, as JIT's tune runs beside them
            done = threading.Event()
            other = copy.deepcopy(model)
            def keep_busy():
                with torch.no_grad():
                    while not done.is_set():
                        other(**inputs(ids)); sync()
            beside = threading.Thread(target=keep_busy, daemon=True)
            beside.start()
        model = honed.Module(model, "bert")
        t0 = time.perf_counter()
        report = honed.tune(model, [inputs(ids)])
        tuned = {"tune_s": time.perf_counter() - t0, "selected": report.selected(),
                 "tuned_beside_calls": busy}
        if busy:
            done.set(); beside.join(); del other
        if sys.argv[11]:  # the selection, for a warm JIT run to call beside its own
            honed.save(model, sys.argv[11])
    if mode == "oneliner":  # what a user types instead: max-autotune under bf16 autocast
        compiled = torch.compile(model, mode=sys.argv[10])
        def model(**kw):
            # autocast entered per call, as a user's loop does: its cache of bf16 weights ends
            # with each call (a cache outliving the call breaks max-autotune's CUDA graphs)
            with torch.autocast(device.split(":")[0], dtype=torch.bfloat16):
                return compiled(**kw)
        t0 = time.perf_counter()
        with torch.no_grad():
            model(**inputs(ids)); sync()
        tuned = {"compile_s": time.perf_counter() - t0, "compile_mode": sys.argv[10]}
    times = []
    watch_ms = float(sys.argv[7])
    if watch_ms > 0:
        # A thread polling every watch_ms / 2 writes every other thread's stack once a call runs
        # past watch_ms. It needs the GIL for that, so it gets it when the holder lets go: a
        # thread inside one long C call shows as the Python line that made it.
        import threading, traceback
        dumps = open(out + ".stacks", "w")
        now = {"call": None}
        def where(frame, depth):  # innermost first
            return " < ".join(
                f"{f.name} ({f.filename.rsplit('/', 1)[-1]}:{f.lineno})"
                for f in traceback.extract_stack(frame)[-depth:][::-1])
        def watch():
            seen = None
            me, main = threading.get_ident(), threading.main_thread().ident
            while True:
                time.sleep(watch_ms / 2e3)
                call = now["call"]
                late = call is not None and time.perf_counter() - call[1] >= watch_ms / 1e3
                if not late or call[0] == seen:
                    continue
                seen = call[0]
                for ident, frame in sys._current_frames().items():
                    if ident == main:
                        # the program's own thread, as soon as it lets the GIL go: the Python
                        # line of the C call that held it up, or where it waits
                        dumps.write(f"@@ {call[0]} program: {where(frame, 10)}\\n")
                    elif ident != me:
                        # an import's module names (innermost first): which one compiles or runs
                        names, f = [], frame
                        while f is not None:
                            if f.f_code.co_name == "_find_and_load":
                                names.append(str(f.f_locals.get("name")))
                            f = f.f_back
                        dumps.write(f"@@ {call[0]} thread {ident}: {where(frame, 6)}"
                            + (f" < importing {' < '.join(names)}" if names else "") + "\\n")
                dumps.flush()
        threading.Thread(target=watch, daemon=True).start()
        def arm():
            now["call"] = (len(times), time.perf_counter())
        def disarm(i, t, ms):
            now["call"] = None
            if ms >= watch_ms:
                dumps.write(f"@@ {i} took {ms:.3f} ms at {t:.3f} s\\n")
    else:
        arm = lambda: None
        disarm = lambda i, t, ms: None
    # Python's collector stops the whole process, eager's calls too: each collection's span
    # (from the loop's start) and generation, so a slow call can be told apart from one honed
    # made slow.
    import gc
    collections, gc_started = [], [0.0]
    def on_gc(phase, info):
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            collections.append((gc_started[0] - start, time.perf_counter() - start,
                                info["generation"]))
    gc.callbacks.append(on_gc)
    # Per call, where its thread ran and what the kernel did to it: the CPU it returned on, and
    # the thread's minor page faults and involuntary and voluntary context switches during it.
    getcpu = ctypes.CDLL(None).sched_getcpu

    def kernel_counts():
        r = resource.getrusage(resource.RUSAGE_THREAD)
        return r.ru_minflt, r.ru_nivcsw, r.ru_nvcsw

    # After each call, a fixed piece of pure Python timed on the thread's own CPU clock: whether
    # its CPU ran slow just then (its clock, or caches and memory shared with busy cores), apart
    # from waits for the GIL or the GPU, which that clock does not count.
    def pause(a):
        return a

    def python_ns():
        c = time.thread_time_ns()
        for _ in range(200):
            pause(1)
        return (time.thread_time_ns() - c) / 200

    # And on a GPU, one tiny kernel's round trip (launch, run, synchronize) just after each call:
    # a GPU shared with another process's context (time-sliced) holds it for a slice, where a
    # CPU that ran slow barely moves it.
    if device.startswith("cuda"):
        probe_t = torch.zeros(1, device=device)

        def gpu_us():
            t = time.perf_counter()
            probe_t.add_(1)
            torch.cuda.synchronize()
            return (time.perf_counter() - t) * 1e6
    else:
        gpu_us = None

    if "honed" in sys.modules:  # JIT's: the CPUs its workers may use, and the physical cores
        # before the first call: while JIT works it keeps this thread off its workers' CPUs,
        # and these read the calling thread's CPUs
        try:
            import honed
            from honed.pipeline.isolation import physical_cores, worker_cpus
            # as JIT's tunes see it (JIT's flags hold only while it starts a pool)
            spare = honed.config.jit_spare_cores if torch.device(device).type == "cuda" else 0
            with honed.config.patch(worker_spare_cores=spare):
                tuned["worker_cpus"] = worker_cpus()
            tuned["cores"] = list(physical_cores().values())
        except Exception as e:
            tuned["worker_cpus_error"] = repr(e)
    with torch.no_grad():
        start = time.perf_counter()
        tuned["loop_started_unix"] = time.time()  # the host's samples (parent) line up with it
        tuned["loop_started_perf"] = start  # and the workers' marks (one monotonic clock)
        while len(times) < calls or time.perf_counter() - start < seconds:
            arm()
            k0 = kernel_counts()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            model(**inputs(ids))
            tl = time.perf_counter()
            cl = time.thread_time()
            sync()
            t1 = time.perf_counter()
            k1 = kernel_counts()
            disarm(len(times), t0 - start, (t1 - t0) * 1e3)
            # start, call, until it returned (before the sync), this thread's CPU time till then;
            # the CPU it ended on; its minor faults, involuntary and voluntary switches; the
            # pure-Python probe's ns per call just after it; on a GPU, the round trip's µs
            times.append((t0 - start, (t1 - t0) * 1e3, (tl - t0) * 1e3, (cl - c0) * 1e3,
                          getcpu(), *(b - a for a, b in zip(k0, k1)), python_ns(),
                          *((gpu_us(),) if gpu_us else ())))
    gc.callbacks.remove(on_gc)
    tuned["collections"] = collections
    tuned["marks"] = [[m[0], m[1], round(m[2] - start, 4), round(m[3] - start, 4)] for m in marks]
    if watch_ms > 0:
        dumps.flush()  # the last calls' lines, before the program's end
    routes = {}
    ways = {}
    if sys.argv[8] == "1":  # the JIT's tuned module called through JIT, and directly, in turns
        if mode == "tune":
            ways = {"honed.Module": lambda: model(**inputs(ids))}
        else:
            import honed.jit
            jit_tuned = honed.jit.roots()[0].tuned if honed.jit.roots() else None
            ways = {"jit": lambda: model(**inputs(ids))}
            if jit_tuned is not None:
                ways["honed.Module"] = lambda: jit_tuned(**inputs(ids))
    if mode != "tune" and sys.argv[11]:
        # The AOT tune's selection, loaded from its artifact, called in turns with JIT's route
        # in this process: the same GPU, clocks and memory for both (issue 23's 3 %).
        import contextlib, copy, honed, honed.jit
        from honed.jit.patcher import STATE as jit_state
        @contextlib.contextmanager
        def unseen():  # JIT neither discovers nor tunes the copy (its own route does the same)
            jit_state.bypass += 1
            try:
                yield
            finally:
                jit_state.bypass -= 1
        with unseen():
            aot_model = honed.Module(copy.deepcopy(model), "bert")
            honed.load(aot_model, sys.argv[11], trust_native_code=True)
        def call_aot():
            with unseen():
                aot_model(**inputs(ids))
        ways.setdefault("jit", lambda: model(**inputs(ids)))
        ways["aot"] = call_aot
    if ways:
        gpu = device.startswith("cuda")
        taken = {name: ([], [], []) for name in ways}
        with torch.no_grad():
            for _ in range(40):
                for name, way in ways.items():
                    for k in range(26):
                        if gpu:
                            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                                enable_timing=True)
                            e0.record()
                        t0 = time.perf_counter(); way(); tl = time.perf_counter()
                        if gpu:
                            e1.record()
                        sync()
                        t1 = time.perf_counter()
                        if k:  # a block's first call pays for the switch
                            taken[name][0].append((t1 - t0) * 1e3)
                            taken[name][1].append((tl - t0) * 1e3)
                            taken[name][2].append(e0.elapsed_time(e1) if gpu else 0.0)
        import statistics
        routes = {name: {"median_ms": statistics.median(a), "launch_ms": statistics.median(b),
                         "gpu_ms": statistics.median(c), "calls_ms": a}
                  for name, (a, b, c) in taken.items()}
    tuned["routes"] = routes
    def omp_threads_here():
        if "honed" not in sys.modules:
            return None
        from honed.pipeline.openmp import runtime
        omp = runtime()
        return omp.omp_get_max_threads() if omp is not None else None
    # What in this process could make every call slower: its threads, hooks and settings, and
    # the time of a pure-Python call (the same in every run unless something hooks the frames).
    import gc, threading
    def nothing(a, b=1):
        return a
    t0 = time.perf_counter()
    for _ in range(200_000):
        nothing(1)
    eval_frame = None
    try:
        from torch._C._dynamo import eval_frame as ef
        previous = ef.set_eval_frame(None)
        ef.set_eval_frame(previous)
        eval_frame = repr(previous)
    except Exception as e:
        eval_frame = f"unknown: {e}"
    tuned["process"] = {
        "python_call_ns": (time.perf_counter() - t0) / 200_000 * 1e9,
        "threads": sorted(t.name for t in threading.enumerate()),
        "trace": repr(sys.gettrace()), "profile": repr(sys.getprofile()),
        "switch_interval_s": sys.getswitchinterval(),
        "gc": [gc.isenabled(), gc.get_freeze_count(), list(gc.get_threshold())],
        "torch_threads": torch.get_num_threads(),
        "eval_frame": eval_frame,
        "grad": torch.is_grad_enabled(),
        "modules": len(sys.modules),
        "module_call": repr(torch.nn.Module.__call__),
        "aoti_loads": dict(getattr(sys.modules.get("honed.backend._aoti_direct"), "LOADS", {})),
        # this thread's OpenMP team size (JIT takes one while it works: honed.jit.cores)
        "omp_threads_here": omp_threads_here(),
    }
    progress = sys.modules.get("honed.pipeline.progress")
    # when each candidate entered each phase, in the loop's seconds
    tuned["phases"] = [
        [round(e.at - start, 3), e.candidate, e.phase] for e in getattr(progress, "RECENT", [])
    ]
    jit = sys.modules.get("honed.jit")  # under HONED_JIT: each candidate's outcome and why
    tuned["candidates"] = [
        [c.name, c.status, c.reason]
        for r in (jit.roots() if jit else []) if r.report is not None
        for g in r.report.graphs for c in g.candidates
    ]
    # each JIT tune's state as the loop ended ("running": it had not ended by then)
    tuned["tune_status"] = [r.status for r in jit.tunes()] if jit else []
    # how often the program's calls stopped JIT's workers (honed.jit.pacing)
    pacer = getattr(sys.modules.get("honed.jit.pacing"), "_PACER", [None])[0]
    tuned["pacing"] = None if pacer is None else {
        "ratio": pacer.ratio, "pauses": pacer.pauses, "paused_s": round(pacer.paused_s, 3),
        "backoffs": pacer.backoffs, "slowest_beside_workers": round(pacer.slowest, 3),
    }
    json.dump({"model": name, "batch": batch, "seq": seq, "calls": times, **tuned}, open(out, "w"))
    """
).replace("__MARKING__\n", MARKING)


# What --marks default times: JIT's work in the program's process, by step.
DEFAULT_MARKS = ",".join(
    (
        "honed.pipeline.graph_tuner:GraphTuner._install",
        "honed.pipeline.graph_tuner:install_outcome",
        "honed.pipeline.graph_tuner:check",
        "honed.backend.cuda_graphs:CudaGraphed._warm_up",
        "honed.backend.cuda_graphs:CudaGraphed._capture",
        "honed.backend._aoti_direct:open_package",
        "honed.backend._aoti_direct:DirectLoader.load_constants",
        "honed.pipeline.pool:_Slot._start",
        "honed.pipeline.pool:_Slot._wait_ready",
        "honed.pipeline.sharing:dumps",
        "honed.jit.tuner:_check",
        "honed.jit.tuner:_tune",
        "honed.jit.tuner:_install",
        "honed.jit.tuner:_cached_pass",
        "honed.jit.tuner:_new_tuner",
        "honed.pipeline.tuner:_record",
        "honed.pipeline.tuner:open_for_tune",
        "honed.pipeline.machine:start_of_tune",
        "honed.pipeline.guidance:at_tune_start",
        "honed.pipeline.graph_tuner:GraphTuner._profile",
        "honed.pipeline.graph_tuner:GraphTuner._cache_key_parts",
        "honed.pipeline.graph_tuner:plan",
        "honed.pipeline.isolation:GraphJobs.__init__",
        "honed.pipeline.sharing:Shared.blob",
    )
)


# What --marks default times in JIT's worker processes (each name where its callers look it up).
DEFAULT_WORKER_MARKS = ",".join(
    (
        "honed.pipeline.sharing:loads",
        "honed.pipeline.graph_breaks:explain_job",
        "honed.pipeline.courtesy:wait_mid_call",
        "honed.pipeline.shipping:evaluate_for_caller",
        "honed.pipeline.candidate:_check",
        "honed.backend.torch_inductor_aot:TorchInductorAotBackend.build_graph",
        "honed.backend.torch_inductor_aot:converted",
        "honed.backend.torch_inductor_aot:export_program",
        "honed.backend.torch_inductor_aot:_compile",
        "honed.backend._aoti_env:load_package",
        "honed.backend._aoti_constants:give",
        "honed.backend.torch_inductor_aot:AotCompiled.capture",
        "honed.backend.cuda_graphs:CudaGraphed._warm_up",
        "honed.backend.cuda_graphs:CudaGraphed._capture",
        # the compiles' kernel benchmarks (GPU time beside the program's calls)
        "torch._inductor.runtime.benchmarking:InductorBenchmarker.benchmark_gpu",
    )
)

# A worker's marks: sitecustomize, found first on the workers' PYTHONPATH, wraps the named
# functions in each JIT worker process (python -m honed.pipeline._worker) only; each call's span
# goes to a file per process, which the benchmark reads after the run. It shadows any other
# sitecustomize for the JIT runs' processes (a diagnostic run only).
WORKER_SITE = textwrap.dedent(
    """
    import os, sys, time
    __MARKING__
    def _mark_worker():
        spec = os.environ.get("JIT_BERT_WORKER_MARKS")
        folder = os.environ.get("JIT_BERT_MARKS_DIR")
        if not spec or not folder or sys.orig_argv[1:3] != ["-m", "honed.pipeline._worker"]:
            return
        path = os.path.join(folder, f"{os.getpid()}.txt")

        def note(item, thread, began, ended):
            with open(path, "a") as f:
                f.write(f"{item}\\t{thread}\\t{began}\\t{ended}\\n")

        mark_all(spec, note)

    _mark_worker()
    """
).replace("__MARKING__\n", MARKING)


def worker_marks(folder: Path, loop_started: float | None) -> list[list[Any]]:
    """The workers' marks in ``folder``, as the program's: [name, "worker PID THREAD", start s,
    end s] in the loop's seconds."""
    if loop_started is None or not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.txt")):
        for line in path.read_text().splitlines():
            name, thread, began, ended = line.split("\t")
            out.append(
                [
                    name,
                    f"worker {path.stem} {thread}",
                    round(float(began) - loop_started, 4),
                    round(float(ended) - loop_started, 4),
                ]
            )
    return out


def run_program(
    args: argparse.Namespace,
    workdir: Path,
    tag: str,
    env: dict[str, str],
    seconds: float,
    mode: str = "plain",
    compile_mode: str = "max-autotune",
    may_fail: bool = False,
    artifact: str = "",
    cpus: str = "",
) -> dict[str, Any]:
    """One run of the program in a fresh process; its JSON with the wall time, its slow calls'
    stacks and its stderr. A run that fails ends the benchmark, unless ``may_fail``: then
    ``{"failed": the error's last line}``. ``artifact``: a tune run saves its selection there;
    a JIT run loads it and calls it in turns with its own route after its loop. ``cpus``
    (``0-7,12``): the process runs on those CPUs only."""
    out = workdir / f"{tag}.json"
    script = workdir / "plain_bert.py"
    script.write_text(PROGRAM)
    cmd = [
        sys.executable,
        str(script),
        "1" if args.small else "0",
        args.device,
        str(args.calls),
        str(seconds),
        str(out),
        mode,
        str(args.watch_ms or 0),
        "1" if args.routes and tag not in ("eager", "cold", "oneliner") else "0",
        "1" if args.aot_busy else "0",
        compile_mode,
        artifact,
    ]
    marks_dir = Path(env["JIT_BERT_MARKS_DIR"]) if env.get("JIT_BERT_MARKS_DIR") else None
    if marks_dir is not None:  # this run's workers' marks only
        shutil.rmtree(marks_dir, ignore_errors=True)
        marks_dir.mkdir(parents=True)
    started = time.perf_counter()
    launched = time.time()  # the program's start, to its first call (loop_started_unix)
    host = HostSampler()
    try:
        pinned = cpu_list(cpus)
        proc = subprocess.run(
            cmd,
            env=env,
            capture_output=True,
            text=True,
            timeout=args.timeout,
            preexec_fn=(lambda: os.sched_setaffinity(0, pinned)) if pinned else None,
        )
    finally:
        host.stop()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        # The whole stderr beside the JSON: JIT's report at exit follows the program's traceback.
        log = Path(args.out).with_suffix(f".{tag}.stderr.txt")
        log.write_text(proc.stderr)
        errors = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "Traceback" in ln]
        if may_fail:
            reason = errors[-1] if errors else f"exit status {proc.returncode}"
            return {"failed": reason, "failed_after_s": round(wall, 1)}
        sys.exit(
            f"{tag} run failed ({proc.returncode}), stderr in {log}:\n"
            + "\n".join(errors[-20:])
            + f"\n...\n{proc.stderr[-1500:]}"
        )
    data = json.loads(out.read_text())
    data["wall_s"] = wall
    if data.get("loop_started_unix"):
        data["start_s"] = data["loop_started_unix"] - launched
    data["host"] = host.since(data.get("loop_started_unix"))
    if marks_dir is not None:
        data["marks"] = data.get("marks", []) + worker_marks(
            marks_dir, data.get("loop_started_perf")
        )
    stacks = out.with_name(out.name + ".stacks")
    if stacks.exists():
        data["slow_calls"] = slow_call_stacks(stacks.read_text())
    data["stderr"] = proc.stderr
    return data


class HostSampler:
    """The whole machine's CPU time, from /proc/stat, every ``PERIOD_S`` while a run goes on:
    the share of its CPUs busy and the share stolen (a virtual machine's CPUs given to other
    guests by the hypervisor; a thread's CPU time then includes time it did not run). A call
    slow "on the program's CPU" while much was stolen was slowed by the host, not by honed."""

    PERIOD_S = 0.1

    def __init__(self) -> None:
        import threading

        self.samples: list[tuple[float, list[int]]] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            try:
                with open("/proc/stat") as f:
                    fields = [int(x) for x in f.readline().split()[1:]]
            except (OSError, ValueError):
                return
            self.samples.append((time.time(), fields))
            self._done.wait(self.PERIOD_S)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def since(self, t0: float | None) -> list[list[float]]:
        """[start s (from ``t0``), end s, busy share, stolen share] per period."""
        import itertools

        rows = []
        base = t0 if t0 is not None else (self.samples[0][0] if self.samples else 0.0)
        for (a, fa), (b, fb) in itertools.pairwise(self.samples):
            d = [y - x for x, y in zip(fa, fb, strict=True)]
            total = sum(d[:8]) or 1  # user nice system idle iowait irq softirq steal
            idle = d[3] + d[4]
            steal = d[7] if len(d) > 7 else 0
            rows.append(
                [
                    round(a - base, 3),
                    round(b - base, 3),
                    round(1 - idle / total, 3),
                    round(steal / total, 4),
                ]
            )
        return rows


def _host_at(host: list[list[float]], t: float) -> list[float] | None:
    """[busy share, stolen share] of the host's period around ``t`` (s), None without one."""
    for a, b, busy, steal in host:
        if a <= t < b:
            return [busy, steal]
    return None


def slow_call_stacks(text: str) -> list[dict[str, Any]]:
    """What JIT's threads were doing while a call ran past ``--watch-ms``: the program's
    watchdog lines ``@@ I thread T: frames`` (``others``), ``@@ I program: frames`` (the
    program's own thread, ``program``) and ``@@ I took MS ms at T s``, for the slowest calls
    (innermost frame first)."""
    calls: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("@@ "):
            continue
        head, _, rest = line[3:].partition(" ")
        call = calls.setdefault(int(head), {"call": int(head), "others": []})
        if rest.startswith("took "):
            words = rest.split()  # took MS ms at T s
            call["ms"], call["at_s"] = float(words[1]), float(words[4])
        elif rest.startswith("program: "):
            call["program"] = rest.partition(": ")[2].split(" < ")
        else:
            call["others"].append(rest.partition(": ")[2].split(" < "))
    timed = [c for c in calls.values() if "ms" in c]
    return sorted(timed, key=lambda c: -c["ms"])[:25]


def steady_calls(data: dict[str, Any]) -> list[float]:
    """The last quarter of a run's calls (at least 5), in ms: its steady state."""
    ms = [c[1] for c in data["calls"]]
    return ms[-max(5, len(ms) // 4) :]


def ratio_ci99(a: list[float], b: list[float]) -> tuple[float, list[float]]:
    """median(a) / median(b) and its 99 % bootstrap interval, rounded for the JSON."""
    from honed import _core

    ci = _core.compare(a, b, confidence=0.99)
    return round(ci.ratio, 4), [round(ci.lo, 4), round(ci.hi, 4)]


def against_aot(warms: list[dict[str, Any]], aot: dict[str, Any]) -> dict[str, Any]:
    """Each warm JIT run's steady median over the AOT-tuned run's, with the 99 % bootstrap
    interval of that ratio (issue 23's goal: JIT's steady speed within 3 % of the AOT tune's).

    The runs are separate processes one after the other, so a drift of the machine between
    them is in the ratio and not in its interval: one warm run goes before the AOT run and one
    after, and where their ratios disagree beyond their intervals, the drift is that large."""
    figures = [ratio_ci99(steady_calls(warm), steady_calls(aot)) for warm in warms]
    return {
        "jit_over_aot": [r for r, _ in figures],  # the warm run before the AOT run, then after
        "ci99": [ci for _, ci in figures],
        "aot_selected": aot.get("selected"),
        "aot_tune_s": round(aot.get("tune_s", 0.0), 1),
        "aot_tuned_beside_calls": aot.get("tuned_beside_calls", False),
    }


def between_processes(warms: list[dict[str, Any]], aots: list[dict[str, Any]]) -> dict[str, Any]:
    """Warm JIT over AOT judged across processes: each run's steady median is one figure, and
    the 99 % bootstrap interval of the ratio of their medians resamples processes, so the
    machine's difference between processes (which no run's own interval shows) is in it."""
    warm_ms = [round(statistics.median(steady_calls(w)), 4) for w in warms]
    aot_ms = [round(statistics.median(steady_calls(a)), 4) for a in aots]
    ratio, ci = ratio_ci99(warm_ms, aot_ms)
    return {
        "ratio": ratio,
        "ci99": ci,
        "warm_ms": warm_ms,
        "aot_ms": aot_ms,
    }


def against_one_liner(
    runs: dict[str, dict[str, Any] | None], one_liner: dict[str, Any]
) -> dict[str, Any]:
    """Each JIT run's steady speed over the one-liner's (its steady median over the run's),
    with the 99 % bootstrap interval: the brief's "at least 1.25x faster than the one-liner"."""
    done = {tag: run for tag, run in runs.items() if run is not None}
    figures = [ratio_ci99(steady_calls(one_liner), steady_calls(run)) for run in done.values()]
    return {
        "runs": list(done),
        "speedup": [r for r, _ in figures],
        "ci99": [ci for _, ci in figures],
    }


# What the eager run reports of its own slow calls: what JIT's runs are held against.
_OWN_SLOW_CALLS = (
    "slowest_after_first_ms",
    "start_s",
    "over_2x",
    "over_2x_in_gc",
    "slowest_outside_gc_ms",
    "host_busy_median",
    "host_stolen_max",
    "python_ns_median",
    "gpu_us_median",
)


def _in_gc(call: list[float], collections: list[list[float]]) -> float:
    """The ms of ``call`` (start s, ms, ...) that Python's collector spent collecting."""
    t0, t1 = call[0], call[0] + call[1] / 1e3
    return sum(max(0.0, min(t1, b) - max(t0, a)) for a, b, _ in collections) * 1e3


def _gc_made_slow(call: list[float], collections: list[list[float]], eager_ms: float) -> bool:
    """Whether the collector took most of the time ``call`` ran over eager's median."""
    return _in_gc(call, collections) >= 0.5 * (call[1] - eager_ms)


# What held a slow call up, from its own figures: it returned within the bound and then waited
# (on CUDA: for the GPU, in the sync); it returned late with its thread on the CPU all along (a
# slow launch: the CPU's speed, a lock it spun on); or it returned late with its thread off the
# CPU (the GIL, a core taken, a page fault's wait).
_CAUSES = ("returned in time, then waited", "slow on the program's CPU", "off the CPU")


def _by_cause(slow: list[list[float]], eager_ms: float) -> dict[str, int]:
    counts = dict.fromkeys(_CAUSES, 0)
    for call in slow:
        if len(call) < 4:  # a run from before the host and CPU times were kept
            continue
        returned, cpu = call[2], call[3]
        if returned <= 2 * eager_ms:
            counts[_CAUSES[0]] += 1
        elif cpu >= 0.8 * returned:
            counts[_CAUSES[1]] += 1
        else:
            counts[_CAUSES[2]] += 1
    return counts


_PINNED_KEYS = (
    "calls",
    "steady_median_ms",
    "steady_launch_ms",
    "seconds_to_tuned_speed",
    "slowest_after_first_ms",
    "python_ns_median",
    "gpu_us_median",
    "timeline",
)


def ab_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A warm A/B run's figures: its calls over 2x eager and where they fell, and its speed."""
    keys = ("over_2x", "over_2x_calls", "over_2x_by_phase", "over_2x_by_cause", "phases")
    return {k: summary[k] for k in (*_PINNED_KEYS, *keys) if k in summary}


def pinned_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """A pinned warm run's figures: its speed, and where its calls ran (the timeline)."""
    return {k: summary[k] for k in _PINNED_KEYS if k in summary}


# A tune's record where a variant answered the calls from some call on (a stand-in, or a
# candidate promoted): "... ran meanwhile: eager until call K, then X" (", meanwhile" after X in
# records written before session 34).
_ANSWERED_FROM = re.compile(r" until call (\d+), then (.+?)(?:, meanwhile)?$")


def stand_in(
    calls: list[list[float]],
    tunes: list[str],
    phases: list[list[Any]],
    eager_ms: float | None,
) -> dict[str, Any] | None:
    """The calls a variant answered while the tune went on (its record's "until call K, then
    X"): from the call after K until the tune's final turns began (its "finalists" phase) or
    the loop ended, with their median, slowest and count over 2x eager's median; None where no
    variant answered meanwhile."""
    found = next((m for line in tunes if (m := _ANSWERED_FROM.search(line))), None)
    if found is None:
        return None
    first = int(found.group(1))
    until = min((p[0] for p in phases if p[1] == "finalists"), default=float("inf"))
    answered = [c for c in calls[first:] if c[0] < until]
    if not answered:
        return None
    ms = [c[1] for c in answered]
    out: dict[str, Any] = {
        "label": found.group(2),
        "from_call": first,
        "from_s": round(answered[0][0], 3),
        "until_s": round(answered[-1][0], 3),
        "calls": len(ms),
        "median_ms": round(statistics.median(ms), 4),
        "slowest_ms": round(max(ms), 3),
    }
    if eager_ms:
        out["over_2x"] = sum(m > 2 * eager_ms for m in ms)
    return out


def summarize(data: dict[str, Any], eager_ms: float | None) -> dict[str, Any]:
    calls = data["calls"]
    ms = [c[1] for c in calls]
    steady = statistics.median(steady_calls(data))
    tuned_at = next(
        (
            calls[i][0]
            for i in range(len(ms) - 4)
            if statistics.median(ms[i : i + 5]) <= 1.1 * steady
        ),
        None,
    )
    statuses = data.get("tune_status") or []
    if statuses and not {"installed", "eager"} & set(statuses):
        # No tune ended within the loop: its last quarter is eager's, and where the calls first
        # reach that speed says nothing about the tune.
        tuned_at = None
    slowest = max(ms[1:]) if len(ms) > 1 else ms[0]
    out: dict[str, Any] = {
        "calls": len(ms),
        "loop_s": round(calls[-1][0] + ms[-1] / 1e3, 3),
        "wall_s": round(data["wall_s"], 3),
        "first_call_ms": round(ms[0], 3),
        # from the program's launch to its first call: its imports, the model's build and load
        "start_s": round(data["start_s"], 3) if "start_s" in data else None,
        "median_ms": round(statistics.median(ms[1:] or ms), 4),
        "slowest_after_first_ms": round(slowest, 3),
        "steady_median_ms": round(steady, 4),
        "seconds_to_tuned_speed": None if tuned_at is None else round(tuned_at, 3),
    }
    if statuses:
        out["tune_status"] = statuses
    if data.get("pacing"):
        out["pacing"] = data["pacing"]
    launches = [c[2] for c in calls[-len(steady_calls(data)) :] if len(c) > 2]
    if launches:  # the steady calls' host time until the call returned, before the sync
        out["steady_launch_ms"] = round(statistics.median(launches), 4)
    routes = data.get("routes") or {}
    if routes:
        out["routes"] = {
            way: {k: v for k, v in fig.items() if k != "calls_ms"} for way, fig in routes.items()
        }
    if "jit" in routes and "aot" in routes:
        # blocks of calls through each, in turns, in one process: no drift between processes
        ratio, ci = ratio_ci99(routes["jit"]["calls_ms"], routes["aot"]["calls_ms"])
        out["jit_over_aot_in_process"] = {"ratio": ratio, "ci99": ci}
    if data.get("process"):
        out["process"] = data["process"]
    collections = data.get("collections", [])
    if eager_ms:
        slow = [c for c in calls[1:] if c[1] > 2 * eager_ms]
        in_gc = [c for c in slow if _gc_made_slow(c, collections, eager_ms)]
        out["over_2x"], out["over_2x_in_gc"] = len(slow), len(in_gc)
        # Each such call (the first 400): index, start s, ms, ms until it returned (before the
        # sync), its thread's CPU ms; where kept, the CPU it ended on, its thread's minor page
        # faults, involuntary and voluntary context switches, and the ns of a pure-Python call
        # just after it (its CPU's speed then: python_ns_median is the run's usual). A call that
        # returned late ran slow on the host (the GIL, a core, its CPU's speed); one that
        # returned on time waited for the GPU.
        probes = [c[8] for c in calls[1:] if len(c) > 8]
        if probes:
            out["python_ns_median"] = round(statistics.median(probes), 2)
        # and on a GPU the µs of a tiny kernel's round trip just after it (gpu_us_median the
        # run's usual): a GPU time-sliced with another process holds it up
        trips = [c[9] for c in calls[1:] if len(c) > 9]
        if trips:
            out["gpu_us_median"] = round(statistics.median(trips), 2)
        out["over_2x_calls"] = [
            [i, *(round(x, 3) for x in c)] for i, c in enumerate(calls) if i and c[1] > 2 * eager_ms
        ][:400]
        out["over_2x_by_cause"] = _by_cause(slow, eager_ms)
        for key in ("worker_cpus", "cores"):  # over_2x_calls' fifth field is a CPU of these
            if data.get(key) is not None:
                out[key] = data[key]
        host = data.get("host") or []
        marks = data.get("marks") or []
        if marks:  # which of honed's marked functions ran during each call over 2x
            out["over_2x_marks"] = {
                str(i): sorted({m[0] for m in marks if m[2] < c[0] + c[1] / 1e3 and m[3] > c[0]})
                for i, c in enumerate(calls)
                if i and c[1] > 2 * eager_ms
            }
            out["marks"] = marks[:2000]
        if host:
            # the whole loop's host figures, and at each call over 2x: [index, busy, stolen]
            inside = [h for h in host if 0 <= h[0] <= out["loop_s"]]
            if inside:
                out["host_busy_median"] = statistics.median(h[2] for h in inside)
                out["host_stolen_max"] = max(h[3] for h in inside)
            out["over_2x_host"] = [
                [i, *(_host_at(host, c[0]) or [None, None])]
                for i, c in enumerate(calls)
                if i and c[1] > 2 * eager_ms
            ][:400]
        outside = [c[1] for c in calls[1:] if not _gc_made_slow(c, collections, eager_ms)]
        out["slowest_outside_gc_ms"] = round(max(outside), 3) if outside else None
        out["collections"] = {  # generation: [how many, longest ms]
            str(g): [
                sum(1 for *_, k in collections if k == g),
                round(max([(b - a) * 1e3 for a, b, k in collections if k == g] or [0.0]), 3),
            ]
            for g in (0, 1, 2)
        }
    if data.get("phases") and eager_ms:
        out["phases"] = data["phases"]
        # Calls after the first over 2x eager's median, by the phase last entered before each
        # (which candidate was building, checking, measuring or installing meanwhile).
        by_phase: dict[str, int] = {}
        events = sorted(data["phases"])
        for call in calls[1:]:
            t, m = call[0], call[1]
            if m <= 2 * eager_ms:
                continue
            before = [e for e in events if e[0] <= t]
            key = (
                "garbage collection"
                if _gc_made_slow(call, collections, eager_ms)
                else f"{before[-1][1]}: {before[-1][2]}"
                if before
                else "before the tune"
            )
            by_phase[key] = by_phase.get(key, 0) + 1
        out["over_2x_by_phase"] = dict(sorted(by_phase.items(), key=lambda kv: -kv[1]))
    # Per 5 s of the loop: its start, the median and the slowest call, and the median call's
    # time until it returned and its thread's CPU time till then (a launch that waited, for
    # the GIL or a core, took more time than CPU; one that ran slower took more CPU); where
    # JIT's workers run on CPUs of their own, the share of the window's calls that ended on one
    # of those.
    windows: dict[int, list[list[float]]] = {}
    for c in calls:
        windows.setdefault(int(c[0] // 5), []).append(c)
    placed = set(data.get("worker_cpus") or ())
    out["timeline"] = [
        [5 * w, round(statistics.median(c[1] for c in v), 3), round(max(c[1] for c in v), 3)]
        + [round(statistics.median(c[k] for c in v), 3) for k in (2, 3) if len(v[0]) > k]
        + ([round(sum(c[4] in placed for c in v) / len(v), 3)] if placed and len(v[0]) > 4 else [])
        for w, v in sorted(windows.items())
    ]
    if eager_ms:
        out["slowest_vs_eager_median"] = round(slowest / eager_ms, 3)
        out["steady_speedup_vs_eager"] = round(eager_ms / steady, 3)
    lines = data["stderr"].splitlines()
    out["tunes"] = [  # finished ("Tuned ..."), cancelled or failed ("Tuning ... cancelled")
        s.strip() for s in lines if s.strip().startswith(("Tuned ", "Tuning ")) and "beside" in s
    ]
    out["hierarchy"] = [s for s in lines if "├─" in s][:3]
    # what became of the workers started as JIT turned on (honed.jit.early), from the report
    out["early_workers"] = list(
        dict.fromkeys(
            s.strip()
            for s in lines
            if "JIT turn" in s or "workers start when needed" in s
            if not s.startswith("honed.jit: ")  # the log's copy of a report line
        )
    )
    out["candidates"] = data.get("candidates", [])
    answered = stand_in(calls, out["tunes"], data.get("phases") or [], eager_ms)
    if answered is not None:
        out["stand_in"] = answered
    out["stderr_tail"] = lines[-40:]  # what JIT said, for a run whose tune shows nothing
    if "slow_calls" in data:
        out["slow_calls"] = data["slow_calls"]
    return out


def print_probes(tag: str, r: dict[str, Any]) -> None:
    """A run's host time per call, its --routes figures and its process probe, a line each."""
    if "steady_launch_ms" in r:
        launch = r["steady_launch_ms"]
        print(f"  {tag}steady calls returned after {launch:.3f} ms (before the sync)")
    for way, fig in r.get("routes", {}).items():
        print(
            f"  {tag}through {way}: {fig['median_ms']:.4f} ms a call ({fig['launch_ms']:.4f} "
            f"host, {fig['gpu_ms']:.4f} gpu)"
        )
    if "process" in r:
        print(f"  {tag}process: {json.dumps(r['process'])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where the JSON goes")
    parser.add_argument("--small", action="store_true", help="a small config, for the CPU")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--calls", type=int, default=160, help="calls per run, at least")
    parser.add_argument("--seconds", type=float, default=None, help="warm and eager loop length")
    parser.add_argument(
        "--cold-seconds", type=float, default=None, help="cold loop length (covers the tune)"
    )
    parser.add_argument(
        "--eager-seconds",
        type=float,
        default=None,
        help="eager loop length (default: --seconds); as long as --cold-seconds, its calls "
        "over 2x are what the machine alone does in the time the cold run is judged on",
    )
    parser.add_argument("--budget", type=float, default=None, help="HONED_JIT_TIME_BUDGET_S")
    parser.add_argument("--backends", default=None, help="HONED_JIT_BACKENDS (class names)")
    parser.add_argument("--timeout", type=float, default=560.0, help="per run, seconds")
    parser.add_argument(
        "--loader",
        choices=["auto", "direct", "torch"],
        default=None,
        help="HONED_AOTI_LOADER for the JIT runs (AOTInductor packages through honed's loader "
        "or torch's; default: honed.config's)",
    )
    parser.add_argument(
        "--jit-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a honed or Inductor setting for the JIT runs (repeatable; the environment's HONED_ "
        "variables are not passed on), e.g. HONED_JIT_SHARE_CORES=0 or "
        "TORCHINDUCTOR_COMPILE_THREADS=1",
    )
    parser.add_argument(
        "--cold-wait",
        action="store_true",
        help="the cold run waits for JIT's tune (HONED_JIT_WAIT=1): its variants are built and "
        "measured beside an idle program, then the warm runs use them (is a variant built beside "
        "the program's calls slower?)",
    )
    parser.add_argument(
        "--aot-busy",
        action="store_true",
        help="the AOT run's honed.tune runs beside a second copy's eager calls in a thread, as "
        "JIT's tune runs beside the program's (is a variant built beside a busy GPU slower?)",
    )
    parser.add_argument(
        "--routes",
        action="store_true",
        help="after each warm run's loop, time the JIT's tuned module called through JIT and "
        "directly (its honed.Module), in turns, in that process",
    )
    parser.add_argument(
        "--watch-ms",
        type=float,
        default=0.0,
        help="note what every other thread is doing when a call runs past this many ms "
        "(the JSON's slow_calls)",
    )
    parser.add_argument(
        "--no-one-liner",
        dest="one_liner",
        action="store_false",
        help="leave out the run of what a user types instead of honed: torch.compile(model, "
        'mode="max-autotune") under bf16 autocast, on an empty Inductor cache',
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=0,
        help="after the AOT run and the warm run after it, this many more (AOT, warm JIT) "
        "processes in turns; warm JIT over AOT is then also judged across processes",
    )
    parser.add_argument(
        "--blocking-sync",
        action="store_true",
        help="every run's CUDA context waits for the GPU asleep instead of spinning, so that a "
        "call's thread CPU time counts no wait for the GPU (a diagnostic: it changes the program)",
    )
    parser.add_argument(
        "--marks",
        default="",
        help="honed functions to time in the JIT runs, module:Qualified.name, comma-separated "
        "('default' among them: a set of JIT's steps, the workers' too): the JSON lists their "
        "spans and which ran during each call over 2x",
    )
    parser.add_argument(
        "--warm-seed",
        type=int,
        default=1,
        help="the seed of the warm run's input ids (the other runs': 1): another value gives "
        "it other data of the same shapes, as a restarted program's calls would carry",
    )
    parser.add_argument(
        "--warm-cpus",
        action="append",
        default=[],
        metavar="CPUS",
        help="after the warm run, one more warm run on these CPUs only (0-7,12; repeatable, "
        "in turns): does where the program's thread runs move the tuned speed?",
    )
    parser.add_argument(
        "--warm-ab",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="with --warm-pairs: a setting of the B runs (repeatable; as --jit-env)",
    )
    parser.add_argument(
        "--warm-pairs",
        type=int,
        default=0,
        help="after the warm run, this many more pairs of warm runs, one as the others (A) and "
        "one with --warm-ab's settings (B), in turns: does a setting change what a warm "
        "restart's install costs the program's calls?",
    )
    parser.add_argument(
        "--no-aot",
        dest="aot",
        action="store_false",
        help="leave out the fourth run: honed.tune with its defaults, then the same loop",
    )
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device.startswith("cuda")
    seconds = args.seconds if args.seconds is not None else (15.0 if gpu else 20.0)
    cold_s = args.cold_seconds if args.cold_seconds is not None else (300.0 if gpu else 240.0)
    budget = args.budget if args.budget is not None else (240.0 if gpu else 180.0)
    backends = args.backends or ""
    with tempfile.TemporaryDirectory(prefix="honed-jit-bert-") as tmp:
        workdir = Path(tmp)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("HONED_", "_HONED_"))}
        if args.blocking_sync:
            base["JIT_BERT_BLOCKING_SYNC"] = "1"
        named = [m for m in (args.marks or "").split(",") if m]
        with_defaults = "default" in named  # the defaults, and the workers' steps too
        marks = ",".join(DEFAULT_MARKS if m == "default" else m for m in named)
        base["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "inductor")
        (workdir / "tmp").mkdir()
        base["TMPDIR"] = str(workdir / "tmp")  # Inductor's precompiled headers: cold too
        jit_env = dict(
            base,
            HONED_JIT="1",
            HONED_JIT_REPORT="1",
            HONED_CACHE_DIR=str(workdir / "honed-cache"),
            HONED_JIT_TIME_BUDGET_S=str(budget),
        )
        if backends:
            jit_env["HONED_JIT_BACKENDS"] = backends
        if args.loader:  # the environment's HONED_ variables are left out above: only this one
            jit_env["HONED_AOTI_LOADER"] = args.loader

        def settings(given: list[str], option: str) -> dict[str, str]:
            out: dict[str, str] = {}
            for setting in given:
                name, sep, value = setting.partition("=")
                if not sep or not name.startswith(("HONED_", "TORCHINDUCTOR_")):
                    parser.error(
                        f"{option} {setting!r}: expected HONED_NAME=VALUE or "
                        "TORCHINDUCTOR_NAME=VALUE"
                    )
                out[name] = value
            return out

        jit_env.update(settings(args.jit_env, "--jit-env"))
        b_settings = settings(args.warm_ab, "--warm-ab")
        if args.warm_pairs and not b_settings:
            parser.error("--warm-pairs needs the B runs' settings: --warm-ab NAME=VALUE")
        eager_s = args.eager_seconds if args.eager_seconds is not None else seconds
        eager = run_program(args, workdir, "eager", base, eager_s)
        eager_ms = statistics.median([c[1] for c in eager["calls"][1:]])
        if marks:
            jit_env["JIT_BERT_MARKS"] = marks
        if with_defaults:
            site = workdir / "worker-site"
            site.mkdir()
            (site / "sitecustomize.py").write_text(WORKER_SITE)
            jit_env["PYTHONPATH"] = os.pathsep.join(
                [str(site)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
            )
            jit_env["JIT_BERT_WORKER_MARKS"] = DEFAULT_WORKER_MARKS
            jit_env["JIT_BERT_MARKS_DIR"] = str(workdir / "worker-marks")
        cold_env = dict(jit_env, HONED_JIT_WAIT="1") if args.cold_wait else jit_env
        cold = run_program(args, workdir, "cold", cold_env, cold_s)
        warm_env = dict(jit_env, JIT_BERT_IDS_SEED=str(args.warm_seed))
        warm = run_program(args, workdir, "warm", warm_env, seconds)
        pinned = [
            (spec, run_program(args, workdir, f"warm-cpus-{i}", warm_env, seconds, cpus=spec))
            for i, spec in enumerate(args.warm_cpus)
        ]
        warm_ab: list[tuple[Any, Any]] = []
        for i in range(args.warm_pairs):
            warm_ab.append(
                (
                    run_program(args, workdir, f"warm-a-{i}", warm_env, seconds),
                    run_program(
                        args, workdir, f"warm-b-{i}", dict(warm_env, **b_settings), seconds
                    ),
                )
            )
        one_liner = aot = warm_after = None
        pairs: list[Any] = []

        def assemble(complete: bool) -> dict[str, Any]:
            """The figures of the runs made so far (a run killed later keeps these)."""
            result: dict[str, Any] = {
                "scenario": f"{eager['model']}, batch {eager['batch']}, seq {eager['seq']}, "
                f"{args.device}, HONED_JIT=1",
                "device": args.device,
                "budget_s": budget,
                "backends": backends or "default",
                "cold_waited": bool(args.cold_wait),
                "aoti_loader": args.loader or "default",
                "jit_env": args.jit_env,
                "blocking_sync": bool(args.blocking_sync),
                "warm_ids_seed": args.warm_seed,
                "eager": {
                    "median_ms": round(eager_ms, 4),
                    "calls": len(eager["calls"]),
                    "loop_s": round(eager_s, 1),
                    # a fresh process's first calls run slower without honed too (lazy kernel loads)
                    "first_calls_ms": [round(c[1], 2) for c in eager["calls"][:12]],
                    **{k: v for k, v in summarize(eager, eager_ms).items() if k in _OWN_SLOW_CALLS},
                    "process": eager.get("process"),
                },
                "cold": summarize(cold, eager_ms),
                "warm": summarize(warm, eager_ms),
            }
            if pinned:
                result["warm_pinned"] = [
                    {"cpus": spec, **pinned_summary(summarize(run, eager_ms))}
                    for spec, run in pinned
                ]
            if warm_ab:
                result["warm_ab"] = {
                    "b_settings": args.warm_ab,
                    **{
                        side: [ab_summary(summarize(pair[k], eager_ms)) for pair in warm_ab]
                        for k, side in enumerate(("a", "b"))
                    },
                }
            if aot is not None:
                result["aot"] = summarize(aot, eager_ms)
                result["warm_after"] = summarize(warm_after, eager_ms)
                result["warm_vs_aot"] = against_aot([warm, warm_after], aot)
                if pairs:
                    aots = [aot] + [a for a, _ in pairs]
                    warms = [warm, warm_after] + [w for _, w in pairs]
                    result["warm_vs_aot_processes"] = between_processes(warms, aots)
            if one_liner is not None and "failed" in one_liner:
                result["one_liner"] = {k: v for k, v in one_liner.items() if "failed" in k}
            elif one_liner is not None:
                result["one_liner"] = summarize(one_liner, eager_ms)
                result["one_liner"]["compile_s"] = round(one_liner["compile_s"], 1)
                result["one_liner"]["compile_mode"] = one_liner["compile_mode"]
                if "max_autotune_failed" in one_liner:
                    result["one_liner"]["max_autotune_failed"] = one_liner["max_autotune_failed"]
                runs = {"warm": warm, "warm_after": warm_after, "cold": cold}
                result["vs_one_liner"] = against_one_liner(runs, one_liner)
            result["complete"] = complete
            return result

        def save(complete: bool) -> dict[str, Any]:
            result = assemble(complete)
            Path(args.out).write_text(json.dumps(result, indent=2))
            return result

        save(False)
        if args.one_liner:  # between the warm runs, as the AOT run: drift shows in both ratios
            one_env = dict(base, TORCHINDUCTOR_CACHE_DIR=str(workdir / "oneliner-inductor"))
            one_liner = run_program(
                args, workdir, "oneliner", one_env, seconds, "oneliner", may_fail=True
            )
            if "failed" in one_liner:
                # what a user does next: the same without CUDA graphs, on a cold cache again
                failed = f"{one_liner['failed']} (after {one_liner['failed_after_s']} s)"
                one_env["TORCHINDUCTOR_CACHE_DIR"] = str(workdir / "oneliner-inductor-2")
                one_liner = run_program(
                    args,
                    workdir,
                    "oneliner",
                    one_env,
                    seconds,
                    "oneliner",
                    "max-autotune-no-cudagraphs",
                    may_fail=True,
                )
                one_liner["max_autotune_failed"] = failed
        save(False)
        if args.aot:  # a cache of its own: its selection must not come from JIT's figures
            aot_env = dict(
                base,
                TORCHINDUCTOR_CACHE_DIR=str(workdir / "aot-inductor"),
                HONED_CACHE_DIR=str(workdir / "aot-honed-cache"),
            )
            artifact = str(workdir / "aot.honed")
            aot = run_program(
                args, workdir, "aot", aot_env, seconds, mode="tune", artifact=artifact
            )
            warm_after = run_program(
                args, workdir, "warm-after", jit_env, seconds, artifact=artifact
            )
            save(False)
            # more processes in turns; the AOT ones replay their tune from its cache
            for i in range(args.pairs):
                pairs.append(
                    (
                        run_program(args, workdir, f"aot-{i}", aot_env, seconds, mode="tune"),
                        run_program(args, workdir, f"warm-{i}", jit_env, seconds),
                    )
                )
        result = save(True)
    print(f"{result['scenario']}: eager median {eager_ms:.3f} ms")
    first = ", ".join(f"{m:.1f}" for m in result["eager"]["first_calls_ms"])
    print(f"  eager first calls (ms): {first}")
    e = result["eager"]
    print(
        f"  eager alone: started in {e.get('start_s') or float('nan'):.2f}s; slowest after "
        f"the first {e['slowest_after_first_ms']:.2f} ms, "
        f"{e['over_2x']} call(s) over 2x its median ({e['over_2x_in_gc']} in Python's garbage "
        f"collection); slowest outside it {e['slowest_outside_gc_ms']} ms"
        + (
            f"; the host {e['host_busy_median']:.0%} busy, at most {e['host_stolen_max']:.1%} "
            "stolen"
            if "host_busy_median" in e
            else ""
        )
    )
    for tag in ("cold", "warm"):
        r = result[tag]
        print(
            f"{tag}: started in {r.get('start_s') or float('nan'):.2f}s; "
            f"{r['calls']} calls in {r['loop_s']:.1f}s; first {r['first_call_ms']:.1f} ms, "
            f"slowest after the first {r['slowest_after_first_ms']:.2f} ms "
            f"({r['slowest_vs_eager_median']:.2f}x eager), steady median "
            f"{r['steady_median_ms']:.3f} ms ({r['steady_speedup_vs_eager']:.2f}x), "
            + (
                f"tuned speed after {r['seconds_to_tuned_speed']} s"
                if r["seconds_to_tuned_speed"] is not None
                else "no tune ended within the loop"
                if r.get("tune_status")
                else "tuned speed not reached"
            )
            + f"; slowest outside garbage collection {r['slowest_outside_gc_ms']} ms"
        )
        for line in r["tunes"] + r.get("early_workers", []):
            print(f"  {line}")
        if r.get("stand_in"):
            a = r["stand_in"]
            print(
                f"  {a['label']} answered {a['calls']} call(s) meanwhile, {a['from_s']:.1f}-"
                f"{a['until_s']:.1f} s: median {a['median_ms']:.3f} ms, slowest "
                f"{a['slowest_ms']:.2f} ms"
                + (f", {a['over_2x']} over 2x eager" if "over_2x" in a else "")
            )
        if r.get("pacing"):
            p = r["pacing"]
            print(
                f"  pacing (HONED_JIT_PACE={p['ratio']:g}): the workers stopped {p['pauses']} "
                f"time(s), {p['paused_s']:.1f} s in all, {p['backoffs']} back-off(s); the "
                f"slowest call beside running workers {p['slowest_beside_workers']:.2f}x its pace"
            )
        print_probes("", r)
        if r.get("over_2x_by_phase"):
            over = sum(r["over_2x_by_phase"].values())
            print(
                f"  {over} call(s) after the first over 2x eager, by the phase last entered: "
                + "; ".join(f"{k} {v}" for k, v in list(r["over_2x_by_phase"].items())[:8])
            )
        if r.get("over_2x"):
            print(
                "  by what held them up: "
                + "; ".join(f"{k} {v}" for k, v in r["over_2x_by_cause"].items())
            )
            after = [c[9] for c in r.get("over_2x_calls", []) if len(c) > 9]
            if after and "python_ns_median" in r:
                print(
                    f"  a pure-Python call just after them: median {statistics.median(after):.0f}"
                    f" ns (slowest {max(after):.0f}), against {r['python_ns_median']:.0f} ns "
                    "over the run"
                )
            trips = [c[10] for c in r.get("over_2x_calls", []) if len(c) > 10]
            if trips and "gpu_us_median" in r:
                print(
                    f"  a GPU round trip just after them: median {statistics.median(trips):.0f} µs"
                    f" (slowest {max(trips):.0f}), against {r['gpu_us_median']:.0f} µs over the run"
                )
        if "host_busy_median" in r:
            stolen = [h[2] for h in r.get("over_2x_host", []) if h[2] is not None]
            print(
                f"  the host: median {r['host_busy_median']:.0%} of its CPUs busy, at most "
                f"{r['host_stolen_max']:.1%} stolen in a {HostSampler.PERIOD_S:g} s period"
                + (f"; at the calls over 2x at most {max(stolen):.1%} stolen" if stolen else "")
            )
        for c in r.get("slow_calls", [])[:8]:
            doing = (
                " | ".join(
                    " < ".join(fs[:2] + [f for f in fs[2:] if f.startswith("importing")])
                    for fs in c["others"]
                    if fs and not fs[0].startswith(("wait (threading", "_converse (pool"))
                )
                or "-"
            )
            print(f"  slow call {c['call']} at {c['at_s']:.1f} s, {c['ms']:.1f} ms: {doing}")
            if c.get("program"):
                print(f"    the program's thread: {' < '.join(c['program'][:4])}")
    for w in result.get("warm_pinned", []):
        share = [row[5] for row in w.get("timeline", []) if len(row) > 5]
        print(
            f"warm on CPUs {w['cpus']}: steady median {w['steady_median_ms']:.3f} ms, launch "
            f"{w.get('steady_launch_ms')} ms, tuned speed after {w['seconds_to_tuned_speed']} s; "
            f"share of calls on the workers' CPUs per window {share}"
        )
    ab = result.get("warm_ab")
    if ab:
        print(f"warm pairs, A as the warm run, B with {' '.join(ab['b_settings'])}:")
        for side in ("a", "b"):
            runs = ab[side]
            print(
                f"  {side.upper()}: calls over 2x {[r['over_2x'] for r in runs]} (sum "
                f"{sum(r['over_2x'] for r in runs)}), slowest "
                f"{[r['slowest_after_first_ms'] for r in runs]} ms, tuned speed after "
                f"{[r['seconds_to_tuned_speed'] for r in runs]} s, steady "
                f"{[r['steady_median_ms'] for r in runs]} ms"
            )
    if aot is not None:
        v = result["warm_vs_aot"]
        ratios = ", ".join(
            f"{r:.3f} (99% CI {lo:.3f}-{hi:.3f})"
            for r, (lo, hi) in zip(v["jit_over_aot"], v["ci99"], strict=True)
        )
        print(
            f"aot: honed.tune then the same loop: selected {v['aot_selected']} in "
            f"{v['aot_tune_s']} s, steady median {result['aot']['steady_median_ms']:.3f} ms; "
            f"a warm JIT run again after it: steady median "
            f"{result['warm_after']['steady_median_ms']:.3f} ms; warm JIT / AOT, before and "
            f"after: {ratios}"
        )
        for tag in ("aot", "warm_after"):
            print_probes(f"{tag}: ", result[tag])
        side = result["warm_after"].get("jit_over_aot_in_process")
        if side:
            lo, hi = side["ci99"]
            print(
                f"  warm JIT / AOT's selection in one process, called in turns: "
                f"{side['ratio']:.4f} (99% CI {lo:.4f}-{hi:.4f})"
            )
        print(f"  eager process: {json.dumps(result['eager'].get('process'))}")
    if "warm_vs_aot_processes" in result:
        v = result["warm_vs_aot_processes"]
        print(
            f"warm JIT / AOT over processes ({len(v['warm_ms'])} warm, {len(v['aot_ms'])} AOT, "
            f"in turns): {v['ratio']:.4f} (99% CI {v['ci99'][0]:.4f}-{v['ci99'][1]:.4f}); "
            f"steady medians warm {v['warm_ms']}, AOT {v['aot_ms']}"
        )
    o = result.get("one_liner", {})
    for key in ("max_autotune_failed", "failed"):
        if key in o:
            print(f"one-liner ({key.replace('_', ' ')}): {o[key]}")
    if "vs_one_liner" in result:
        v = result["vs_one_liner"]
        speedups = ", ".join(
            f"{tag} {r:.3f} (99% CI {lo:.3f}-{hi:.3f})"
            for tag, r, (lo, hi) in zip(v["runs"], v["speedup"], v["ci99"], strict=True)
        )
        print(
            f'one-liner: torch.compile(mode="{o["compile_mode"]}") under bf16 autocast: '
            f"compiled in {o['compile_s']} s (cold), steady median {o['steady_median_ms']:.3f} ms "
            f"({o['steady_speedup_vs_eager']:.2f}x eager); JIT's steady speed over it: {speedups}"
        )
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
