"""bench/profile/sdpa_capture.py: what one attention call costs to capture, the first time.

bench/profile/first_capture.py found a process's first CUDA-graph capture of BERT-base under
bf16 autocast spending most of its recorded forward in its first ``aten::_cudnn_attention_forward``
(cuDNN's fused attention, which torch's ``scaled_dot_product_attention`` picks on Hopper), though
the warm-up calls had run the same attention with the same shapes on the same thread and stream.
This profile takes BERT's own attention arguments (one eager call under autocast, recorded) and,
in a fresh process, runs ``scaled_dot_product_attention`` on them with one SDPA backend (three
warm-up calls on a side stream, as CudaGraphed does), then captures it twice, each into a new
graph, timing each capture's recorded call. ``--first-shape`` captures the attention at another
sequence length first, to tell a once-per-process cost from a once-per-shape one; ``--replays``
times the captured graph's replay against the eager call.

    python bench/profile/sdpa_capture.py [--backend cudnn|efficient|flash|math]
        [--first-shape 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import beside_stall  # the BERT model (this folder: run as a script)
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "math": SDPBackend.MATH,
}


def _bert_attention_args() -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of BERT-base's first attention call under bf16 autocast (b8, s128)."""
    model, inputs = beside_stall._model("cuda", small=False)
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    plain = torch.nn.functional.scaled_dot_product_attention

    def record(*args: Any, **kwargs: Any) -> Any:
        if not seen:
            seen.append((args, kwargs))
        return plain(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = record
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(**inputs)
    finally:
        torch.nn.functional.scaled_dot_product_attention = plain
    torch.cuda.synchronize()
    args, kwargs = seen[0]
    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args), {
        k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()
    }


def _at_length(args: tuple[Any, ...], kwargs: dict[str, Any], length: int) -> Any:
    """The same call with the sequence axis (-2 of q, k, v; the mask's last two) cut."""
    cut = tuple(a[..., :length, :].contiguous() for a in args[:3]) + args[3:]
    kw = dict(kwargs)
    mask = kw.get("attn_mask")
    if isinstance(mask, torch.Tensor):
        kw["attn_mask"] = mask[..., :length, :length].contiguous()
    return cut, kw


def _described(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    out = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(f"{a.dtype} {tuple(a.shape)} stride {a.stride()}")
        else:
            out.append(repr(a))
    return out


def _captures(args: tuple[Any, ...], kwargs: dict[str, Any], backend: Any) -> dict[str, Any]:
    f = torch.nn.functional.scaled_dot_product_attention
    stream = torch.cuda.Stream()
    row: dict[str, Any] = {"seq": args[0].shape[-2]}
    with torch.no_grad(), sdpa_kernel(backend):
        stream.wait_stream(torch.cuda.current_stream())
        start = time.perf_counter()
        with torch.cuda.stream(stream):
            for _ in range(3):
                f(*args, **kwargs)
        stream.synchronize()
        row["warm_up_ms"] = round((time.perf_counter() - start) * 1e3, 2)
        graphs = []
        for n in range(2):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(stream):
                graph.capture_begin(capture_error_mode="thread_local")
                start = time.perf_counter()
                out = f(*args, **kwargs)
                row[f"capture_{n}_recorded_ms"] = round((time.perf_counter() - start) * 1e3, 2)
                graph.capture_end()
            graphs.append((graph, out))
        torch.cuda.synchronize()
        ms = []
        for timed in (lambda: graphs[-1][0].replay(), lambda: f(*args, **kwargs)):
            for _ in range(10):
                timed()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(200):
                timed()
            torch.cuda.synchronize()
            ms.append((time.perf_counter() - start) / 200 * 1e3)
        row["replay_ms"], row["eager_ms"] = round(ms[0], 4), round(ms[1], 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=sorted(_BACKENDS), default="cudnn")
    parser.add_argument("--first-shape", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    call_args, call_kwargs = _bert_attention_args()
    backend = _BACKENDS[args.backend]
    rows = []
    if args.first_shape:
        rows.append(_captures(*_at_length(call_args, call_kwargs, args.first_shape), backend))
        print(json.dumps(rows[-1]), flush=True)
    rows.append(_captures(call_args, call_kwargs, backend))
    print(json.dumps(rows[-1]), flush=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "backend": args.backend,
        "call": _described(call_args, call_kwargs),
        "rows": rows,
    }
    print(json.dumps(result["call"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
