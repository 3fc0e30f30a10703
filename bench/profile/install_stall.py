"""bench/profile/install_stall.py: which step of a JIT install holds the program's calls up.

A JIT tune installs each finalist in the program's process, beside its calls: the AOTInductor
package opened (its library loaded, its container made), the constants laid out and handed over,
its first run (each kernel loaded at its first launch), the CUDA-graph capture (warm-up runs,
capture, instantiation) and the check against eager. This profile builds the BERT-base packages
JIT builds (fp32 and bf16 weights, CUDA graphs) in a child process, then, in a process whose main
thread calls BERT eager in a loop (each call synchronized and timed, as bench/jit_bert.py's
program; honed's courtesy probe set as JIT sets it), installs each package step by step on
another thread, ``--gap`` seconds apart, ``--reps`` times (the first install in the process
first). Python's switch interval is JIT's jobs' (``--switch-us``), the install works
``courtesy.SLICE_S`` at a time between its waits for a call's end (``--slice-ms``), and hands the
package its constants a handful at a time (``--handover``), and starts each spaced run as one of
the program's calls ends (``--between-calls``); given several values, each
repetition tries each. Printed per step and setting: how long it took, and the
program's calls that overlapped it: how many, how many over twice the median of the loop alone,
their time beyond that median, their voluntary context switches (the program's thread waiting:
for the GIL, a lock of the driver's, the GPU) and the slowest.

    python bench/profile/install_stall.py [--reps 3] [--gap 0.4] [--json out.json]
    python bench/profile/install_stall.py --switch-us 50 5000 --slice-ms 2 0.5 --reps 4
    python bench/profile/install_stall.py --precisions bf16 --between-calls 1 0 --reps 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import pickle
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import beside_stall  # the program's loop (this folder: run as a script)
import torch

from honed.backend import _aoti_direct
from honed.jit import background
from honed.pipeline import correctness, courtesy

PRECISIONS = ("fp32", "bf16")


def _model(device: str) -> tuple[Any, dict[str, Any]]:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig()
    model = BertModel(cfg).eval().to(device)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (8, 128), generator=g).to(device)
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _backend(precision: str) -> Any:
    from honed.backend.torch_inductor_aot import (
        TorchInductorAotBackend,
        TorchInductorAotBackendConfig,
    )

    return TorchInductorAotBackend(
        TorchInductorAotBackendConfig(precision=precision, cuda_graphs=True)
    )


def _build(precision: str, path: str) -> None:
    """In a child process: the package JIT builds, its payload pickled to ``path``."""
    from honed.backend.base import Sample

    model, inputs = _model("cuda")
    backend = _backend(precision)
    fn = backend.build(model, [Sample((), inputs)])
    Path(path).write_bytes(pickle.dumps(backend.export_payload(fn)))


def _install(
    files: dict[str, bytes],
    precision: str,
    model: Any,
    inputs: dict[str, Any],
    ref: Any,
    gap: float,
    spans: list[Any],
    rep: int,
    label: str,
) -> None:
    """One install, step by step, each step's span noted; ``gap`` s between steps."""
    from honed.backend import _aoti_constants, _aoti_env
    from honed.backend._calling import Calling
    from honed.backend.torch_inductor_aot import PAYLOAD_CALLING, PAYLOAD_PACKAGE, AotCompiled

    device = torch.device("cuda", torch.cuda.current_device())
    state: dict[str, Any] = {}

    def step(name: str, work: Any) -> None:
        time.sleep(gap)
        start = time.perf_counter()
        with torch.no_grad(), courtesy.own_stream(device):
            work()
        spans.append((label, f"{precision} {name}", rep, start, time.perf_counter()))

    def open_() -> None:
        state["runner"] = _aoti_env.load_package(files[PAYLOAD_PACKAGE], "cuda", True)

    def constants() -> None:
        state["constants"] = _aoti_constants.tensors(files, model, device)

    def give() -> None:
        _aoti_constants.give(state["runner"].loader, state["constants"])
        calling = Calling.from_json(files[PAYLOAD_CALLING].decode(), None)
        kept = {n: files[n] for n in _aoti_constants.FILES if n in files}
        state["fn"] = AotCompiled(
            state["runner"], files[PAYLOAD_PACKAGE], calling, True, kept, device
        )
        state["flat"] = state["fn"].flatten((), inputs)

    # The runs are spaced as JIT's install spaces them (courtesy.spaced_run: its first run and
    # its check's; a capture spaces its warm-up and recording itself).
    def plain_run() -> None:
        with courtesy.spaced_run(device):
            state["fn"]._plain_run(list(state["flat"]))

    def capture() -> None:
        with courtesy.spaced_run(device):
            state["out"] = state["fn"](**inputs)

    def replay() -> None:
        with courtesy.spaced_run(device):
            state["fn"](**inputs)

    def check() -> None:
        with courtesy.spaced_run(device):
            out = state["fn"](**inputs)
        result = correctness.compare(ref, out, precision != "fp32")
        assert result.ok, result.reason

    step("open", open_)
    step("constants", constants)
    step("give", give)
    step("first run", plain_run)
    step("second run", plain_run)
    step("capture", capture)
    step("replay", replay)
    step("check", check)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--gap", type=float, default=0.4, help="seconds between steps")
    ap.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="a folder for the built packages, reused if there")
    ap.add_argument(
        "--loader",
        choices=("direct", "torch"),
        default="direct",
        help="honed's GIL-free loader, as JIT loads packages (default), or torch's",
    )
    settings: list[tuple[str, type, float, str]] = [
        (
            "--switch-us",
            float,
            background.SWITCH_INTERVAL_S * 1e6,
            "Python's switch interval during the installs, µs (default: as JIT's jobs run)",
        ),
        (
            "--slice-ms",
            float,
            courtesy.SLICE_S * 1e3,
            "how long the install works between its waits for a call's end (courtesy.SLICE_S), ms",
        ),
        (
            "--handover",
            int,
            _aoti_direct.HANDOVER_CHUNK,
            "constants handed to the package at a time (_aoti_direct.HANDOVER_CHUNK; 0: all "
            "at once)",
        ),
        (
            "--between-calls",
            int,
            1,
            "1: each spaced run starts as one of the program's calls ends, as JIT's install "
            "does (courtesy.wait_for_call_end); 0: whenever its gap has passed",
        ),
    ]
    for flag, kind, default, what in settings:
        ap.add_argument(
            flag,
            type=kind,
            nargs="+",
            default=[kind(default)],
            help=f"{what}; several: each repetition tries each",
        )
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="honed-install-stall-"))
    folder.mkdir(parents=True, exist_ok=True)
    payloads = {}
    spawn = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    builders = {}
    for p in args.precisions:
        if (folder / f"{p}.pkl").exists():
            continue  # built by an earlier run into --keep
        builders[p] = spawn.Process(target=_build, args=(p, str(folder / f"{p}.pkl")))
        builders[p].start()
    for p, child in builders.items():
        child.join()
        assert child.exitcode == 0, f"building the {p} package failed"
    for p in args.precisions:
        payloads[p] = pickle.loads((folder / f"{p}.pkl").read_bytes())
    print(f"built {', '.join(payloads)} in {time.perf_counter() - started:.1f} s", flush=True)

    _aoti_direct.beside_a_program(args.loader == "direct")  # as JIT's start sets it
    import torch._inductor

    model, inputs = _model("cuda")
    with torch.no_grad():
        ref = model(**inputs)
    took_ms: list[float] = []
    starts: list[float] = []
    kernel: list[tuple[int, float]] = []
    stop = threading.Event()
    program = threading.Thread(
        target=beside_stall._calls, args=(model, inputs, "cuda", stop, took_ms, starts, kernel)
    )
    program.start()
    time.sleep(3.0)
    alone = took_ms[len(took_ms) // 3 : len(starts)]
    median = statistics.median(alone)
    print(
        f"loader: {args.loader}; alone: {len(alone)} calls, median {median:.3f} ms, "
        f"slowest {max(alone):.3f} ms"
    )
    alone_switches = statistics.median(k[0] for k in kernel[len(kernel) // 3 : len(starts)])
    print(f"  voluntary switches per call alone: median {alone_switches:g}")
    spans: list[Any] = []
    configs = [
        (sw, sl, h, b)
        for sw in args.switch_us
        for sl in args.slice_ms
        for h in args.handover
        for b in args.between_calls
    ]
    courtesy.watch(lambda: beside_stall._IN_CALL[0])
    before = sys.getswitchinterval(), courtesy.SLICE_S, _aoti_direct.HANDOVER_CHUNK
    start_between_calls = courtesy.wait_for_call_end
    try:
        for rep in range(args.reps):
            for switch_us, slice_ms, handover, between_calls in configs:
                sys.setswitchinterval(switch_us / 1e6)
                courtesy.SLICE_S = slice_ms / 1e3
                _aoti_direct.HANDOVER_CHUNK = handover or 1 << 30
                courtesy.wait_for_call_end = (  # type: ignore[assignment]
                    start_between_calls if between_calls else lambda limit_s=0.0: 0.0
                )
                label = (
                    f"switch {switch_us:g} us, slice {slice_ms:g} ms, "
                    f"constants {handover or 'all'} at a time, "
                    f"runs start {'between calls' if between_calls else 'after their gap'}"
                )
                for p in args.precisions:
                    _install(payloads[p], p, model, inputs, ref, args.gap, spans, rep, label)
        time.sleep(args.gap)
    finally:
        sys.setswitchinterval(before[0])
        courtesy.SLICE_S = before[1]
        _aoti_direct.HANDOVER_CHUNK = before[2]
        courtesy.wait_for_call_end = start_between_calls  # type: ignore[assignment]
        courtesy.watch(None)
        stop.set()
        program.join()
    calls = list(zip(starts, took_ms, kernel, strict=False))
    rows: dict[str, dict[str, Any]] = {}
    for label, name, _rep, start, end in spans:
        hit = [(ms, k) for s, ms, k in calls if s < end and s + ms / 1e3 > start]
        row = rows.setdefault(label, {}).setdefault(
            name,
            {"step_ms": [], "calls": 0, "over_2x": 0, "slowest_ms": [], "extra_ms": 0.0,
             "switches": 0, "most_switches": 0, "cpu_ms": []},
        )  # fmt: skip
        row["step_ms"].append(round((end - start) * 1e3, 2))
        row["calls"] += len(hit)
        row["over_2x"] += sum(ms > 2 * median for ms, _ in hit)
        row["slowest_ms"].append(round(max(ms for ms, _ in hit), 2) if hit else None)
        # what the calls overlapping the step took beyond the loop's median alone
        row["extra_ms"] = round(row["extra_ms"] + sum(ms - median for ms, _ in hit), 2)
        row["switches"] += sum(k[0] for _, k in hit)
        row["most_switches"] = max([row["most_switches"], *(k[0] for _, k in hit)])
        row["cpu_ms"].append(round(max((k[1] for _, k in hit), default=0.0), 2))
    busy = [(s, e) for _, _, _, s, e in spans]
    between = [
        (ms, k)
        for s, ms, k in calls
        if s > busy[0][0] and not any(s < e and s + ms / 1e3 > b for b, e in busy)
    ]
    for label, steps in rows.items():
        print(label)
        print(
            f"  {'step':<20}{'took ms (per rep)':<26}{'calls':>6}{'>2x':>5}{'extra ms':>9}"
            f"{'waits':>7}{'most':>6}  slowest ms (per rep)"
        )
        for name, row in steps.items():
            print(
                f"  {name:<20}{row['step_ms']!s:<26}{row['calls']:>6}{row['over_2x']:>5}"
                f"{row['extra_ms']:>9.1f}{row['switches']:>7}{row['most_switches']:>6}  "
                f"{row['slowest_ms']}"
            )
    print(
        f"between steps: {len(between)} calls, "
        f"{sum(ms > 2 * median for ms, _ in between)} over 2x, "
        f"slowest {max(ms for ms, _ in between):.2f} ms, "
        f"voluntary switches per call: median {statistics.median(k[0] for _, k in between):g}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "alone_median_ms": median,
                    "alone_switches_median": alone_switches,
                    "configs": rows,
                    "between_over_2x": sum(ms > 2 * median for ms, _ in between),
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
