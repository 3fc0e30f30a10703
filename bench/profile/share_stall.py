"""bench/profile/share_stall.py: what pickling a CUDA model for workers costs the program's calls.

A JIT tune pickles the graph's context once per worker (honed.pipeline.sharing: CUDA tensors as
IPC handles). Here the program is a loop of BERT-base eager calls on the main thread, each
synchronized and timed; beside it a thread pickles the context for eight workers, and a worker
process loads each blob (as the pool's workers do, which lets torch release the shares). Printed:
per blob, its time and its tensors' reduce times; the program's calls meanwhile (median,
slowest) against the same loop alone; for each way of pickling: on the program's current stream
or on a side stream of its own, at a given switch interval, and giving way (before each tensor,
waiting while the program is inside a call).

    python bench/profile/share_stall.py [--blobs 8] [--batch 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import torch
from beside_stall import _IN_CALL, _calls  # the program loop, shared with that profile

from honed.pipeline import sharing

_LOADER = """
import sys
from honed.pipeline.sharing import loads
while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    body = sys.stdin.buffer.read(int.from_bytes(head, "little"))
    loads([body])
    torch = sys.modules["torch"]
    torch.cuda.synchronize()
    sys.stdout.write("ok\\n")
    sys.stdout.flush()
"""


def _model(batch: int) -> tuple[Any, dict[str, Any]]:
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).cuda().eval()
    ids = torch.randint(0, 30000, (batch, 128), device="cuda")
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _run(
    model: Any, inputs: dict[str, Any], blobs: int, side: bool, give_way: bool
) -> dict[str, Any]:
    reduce_ms: list[float] = []
    real = sharing._Pickler.reducer_override

    def timed(self: Any, obj: Any) -> Any:
        if not sharing._shareable(obj):
            return real(self, obj)
        waited = time.perf_counter()
        while give_way and _IN_CALL[0] and time.perf_counter() - waited < 0.05:
            time.sleep(0.0002)
        start = time.perf_counter()
        try:
            return real(self, obj)
        finally:
            reduce_ms.append((time.perf_counter() - start) * 1e3)

    sharing._Pickler.reducer_override = timed  # type: ignore[method-assign]
    loader = subprocess.Popen(
        [sys.executable, "-c", _LOADER], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    shared = sharing.Shared({"module": model, "samples": [inputs]})
    calls: list[float] = []
    stop = threading.Event()
    program = threading.Thread(target=_calls, args=(model, inputs, "cuda", stop, calls))
    program.start()
    time.sleep(1.0)
    quiet = list(calls)
    per_blob: list[tuple[float, float, int]] = []
    stream = torch.cuda.Stream() if side else None
    mark = len(calls)
    for _ in range(blobs):
        before = len(reduce_ms)
        start = time.perf_counter()
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                (blob,) = shared.blob()
        else:
            (blob,) = shared.blob()
        took = (time.perf_counter() - start) * 1e3
        got = reduce_ms[before:]
        per_blob.append((took, max(got, default=0.0), len(got)))
        assert loader.stdin is not None and loader.stdout is not None
        loader.stdin.write(len(blob).to_bytes(8, "little") + bytes(blob))
        loader.stdin.flush()
        loader.stdout.readline()
    during = calls[mark:]
    stop.set()
    program.join()
    assert loader.stdin is not None
    loader.stdin.close()
    loader.wait()
    sharing._Pickler.reducer_override = real  # type: ignore[method-assign]
    return {"quiet": quiet[5:], "during": during, "blobs": per_blob}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blobs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    model, inputs = _model(args.batch)
    ways = [  # (side stream, switch interval s, give way)
        (False, 5e-5, False),
        (True, 5e-5, False),
        (True, 1e-5, False),
        (True, 5e-6, False),
        (True, 5e-5, True),
        (False, 5e-5, False),
        (True, 5e-5, True),
    ]
    for side, interval, give_way in ways:
        sys.setswitchinterval(interval)
        r = _run(model, inputs, args.blobs, side, give_way)
        where = f"{'side' if side else 'current'} stream, interval {interval * 1e6:g} us" + (
            ", giving way" if give_way else ""
        )
        print(
            f"{where}: calls alone median {statistics.median(r['quiet']):.2f} ms, "
            f"max {max(r['quiet']):.2f}; while pickling median "
            f"{statistics.median(r['during']):.2f} ms, max {max(r['during']):.2f} "
            f"({len(r['during'])} calls); slowest five "
            + ", ".join(f"{v:.1f}" for v in sorted(r["during"])[-5:])
        )
        print(
            "  blobs (ms, slowest reduce ms, tensors): "
            + "; ".join(f"{t:.1f}, {m:.2f}, {n}" for t, m, n in r["blobs"])
        )


if __name__ == "__main__":
    main()
