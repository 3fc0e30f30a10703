"""bench/profile/check_handover.py: what handing JIT's graph-break check to a worker costs the
program's process, with the module sent whole or as shapes only (honed.pipeline.sharing).

For Hugging Face BERT-base (batch 8, sequence 128) on the given device: per way, the time to make
the check's context and one worker's payload (``IsolatedCheck``'s work on JIT's thread, in the
program's process), the payload's bytes, and how many tensors went as CUDA IPC handles. Each way
is timed ``--rounds`` times, alternating; medians printed, and JSON with ``--out``.

With ``--beside``, the program is a loop of the model's calls on the main thread (timed, as
``beside_stall.py``'s), the hand-overs run on a thread beside it, and a loader process loads each
payload as a worker does (which lets torch release the IPC shares); printed per way: the
program's calls during its hand-overs and loads (median, slowest, how many over twice the
median of the loop alone).

    python bench/profile/check_handover.py [--device cuda] [--rounds 5] [--beside] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import torch
from beside_stall import _calls  # the program loop, shared with that profile

from honed.pipeline import isolation, sharing


def _model(device: str) -> tuple[Any, tuple[tuple[Any, ...], dict[str, Any]]]:
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).to(device).eval()
    ids = torch.randint(0, 30000, (8, 128), device=device)
    return model, ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


_LOADER = """
import pickle, sys
from honed.pipeline.sharing import loads
while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    frames = pickle.loads(sys.stdin.buffer.read(int.from_bytes(head, "little")))
    context = loads(frames)
    if "module_shapes" in context:  # as the check's worker makes the module
        pickle.loads(context["module_shapes"])
    torch = sys.modules["torch"]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    sys.stdout.write("ok\\n")
    sys.stdout.flush()
"""


def _payload(module: Any, sample: Any, shapes: bool) -> tuple[float, list[Any], int]:
    """(seconds, one worker's payload, CUDA tensors shared) for one way of sending the check."""
    started = time.perf_counter()
    if shapes:
        fields = {"module_shapes": sharing.dumps_shapes(module), "sample": sample}
    else:
        fields = {"module": module, "sample": sample}
    payload = isolation.shared_context(fields, "the check").payload()
    seconds = time.perf_counter() - started
    return seconds, payload, sharing.Shared(fields).cuda_tensors


def _handover(module: Any, sample: Any, shapes: bool) -> tuple[float, int, int]:
    """(seconds, payload bytes, CUDA tensors shared) for one way of sending the check."""
    seconds, payload, shared = _payload(module, sample, shapes)
    return seconds, sum(memoryview(frame).nbytes for frame in payload), shared


def _beside(module: Any, sample: Any, device: str, rounds: int) -> dict[str, Any]:
    """The program's calls while each way's hand-overs and loads run beside them."""
    loader = subprocess.Popen(
        [sys.executable, "-c", _LOADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert loader.stdin is not None and loader.stdout is not None
    calls: list[float] = []
    starts: list[float] = []
    stop = threading.Event()
    windows: dict[str, list[tuple[float, float]]] = {"whole": [], "shapes": []}

    def hand_over() -> None:
        time.sleep(3.0)  # the loop alone first
        for _ in range(rounds):
            for way in windows:
                began = time.perf_counter()
                _, payload, _ = _payload(module, sample, way == "shapes")
                body = pickle.dumps([bytes(frame) for frame in payload])
                loader.stdin.write(len(body).to_bytes(8, "little") + body)  # type: ignore[union-attr]
                loader.stdin.flush()  # type: ignore[union-attr]
                loader.stdout.readline()  # type: ignore[union-attr]
                windows[way].append((began, time.perf_counter()))
                time.sleep(1.0)
        stop.set()

    thread = threading.Thread(target=hand_over)
    thread.start()
    _calls(module, sample[1], device, stop, calls, starts)
    thread.join()
    loader.stdin.close()
    loader.wait()
    first = windows["whole"][0][0]
    alone = statistics.median(ms for ms, t in zip(calls[2:], starts[2:], strict=True) if t < first)
    out: dict[str, Any] = {"alone_median_ms": alone}
    for way, spans in windows.items():
        during = [
            ms
            for ms, t in zip(calls, starts, strict=True)
            if any(a <= t + ms / 1e3 and t <= b for a, b in spans)
        ]
        out[way] = {
            "calls": len(during),
            "median_ms": statistics.median(during) if during else None,
            "slowest_ms": max(during, default=None),
            "over_2x": sum(ms > 2 * alone for ms in during),
            "seconds": [b - a for a, b in spans],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--beside", action="store_true", help="with the program's calls beside")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    module, sample = _model(args.device)
    if args.beside:
        got = _beside(module, sample, args.device, args.rounds)
        print(f"the program's calls alone: median {got['alone_median_ms']:.3f} ms")
        for way in ("whole", "shapes"):
            r = got[way]
            print(
                f"{way:>6}: {r['calls']} calls during its hand-overs and loads, median "
                f"{r['median_ms']:.3f} ms, slowest {r['slowest_ms']:.3f} ms, {r['over_2x']} "
                f"over 2x; hand-over and load {statistics.median(r['seconds']) * 1e3:.1f} ms "
                "(median)"
            )
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"device": args.device, "torch": torch.__version__, **got}, f, indent=1)
        return
    rows: dict[str, list[tuple[float, int, int]]] = {"whole": [], "shapes": []}
    for _ in range(args.rounds):
        for way in rows:
            rows[way].append(_handover(module, sample, way == "shapes"))
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
    out: dict[str, Any] = {"device": args.device, "torch": torch.__version__, "ways": {}}
    for way, got in rows.items():
        ms = statistics.median(r[0] for r in got) * 1e3
        out["ways"][way] = {
            "median_ms": ms,
            "ms": [r[0] * 1e3 for r in got],
            "payload_bytes": got[-1][1],
            "cuda_tensors_shared": got[-1][2],
        }
        print(
            f"{way:>6}: {ms:9.2f} ms (median of {len(got)}), payload {got[-1][1] / 1e6:9.3f} MB, "
            f"{got[-1][2]} CUDA tensor(s) shared"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
