"""bench/profile/check_handover.py: what handing JIT's graph-break check to a worker costs the
program's process, with the module sent whole or as shapes only (honed.pipeline.sharing).

For Hugging Face BERT-base (batch 8, sequence 128) on the given device: per way, the time to make
the check's context and one worker's payload (``IsolatedCheck``'s work on JIT's thread, in the
program's process), the payload's bytes, and how many tensors went as CUDA IPC handles. Each way
is timed ``--rounds`` times, alternating; medians printed, and JSON with ``--out``.

    python bench/profile/check_handover.py [--device cuda] [--rounds 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from honed.pipeline import isolation, sharing


def _model(device: str) -> tuple[Any, tuple[tuple[Any, ...], dict[str, Any]]]:
    from transformers import BertConfig, BertModel

    model = BertModel(BertConfig()).to(device).eval()
    ids = torch.randint(0, 30000, (8, 128), device=device)
    return model, ((), {"input_ids": ids, "attention_mask": torch.ones_like(ids)})


def _handover(module: Any, sample: Any, shapes: bool) -> tuple[float, int, int]:
    """(seconds, payload bytes, CUDA tensors shared) for one way of sending the check."""
    started = time.perf_counter()
    if shapes:
        fields = {"module_shapes": sharing.dumps_shapes(module), "sample": sample}
    else:
        fields = {"module": module, "sample": sample}
    context = isolation.shared_context(fields, "the check")
    payload = context.payload()
    seconds = time.perf_counter() - started
    size = sum(memoryview(frame).nbytes for frame in payload)
    shared = sharing.Shared(fields).cuda_tensors
    return seconds, size, shared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    module, sample = _model(args.device)
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
