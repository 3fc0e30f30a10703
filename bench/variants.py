"""bench/variants.py: what the suite measures side by side, each built the way its user would.

    eager     the model as built: fp32, eager
    oneliner  the user's one line: torch.compile(model, mode="max-autotune"), called under bf16
              autocast
    expert    the expert hand: weights cast to bf16, channels_last for convnets (inputs likewise),
              torch.compile(mode="reduce-overhead"); outputs stay bf16 (compared in fp32)
    honed     honed's selection: the artifact honed.save wrote, installed with honed.load
    candidate every candidate honed's tune tried and passed, rebuilt from its recipe through the
              public backend contract (Backend.build), for the exhaustive check

Every builder returns a ``Built``: a zero-argument callable (one call of the variant on the row's
input) and the seconds its build and first call took. ``compare`` gives the correctness of a
variant's outputs against eager fp32 (max abs error and cosine over every output tensor, the KV
cache of a transformers Cache included).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

import honed
from honed.backend import Sample, backend_from_recipe

AUTOCAST_DTYPE = torch.bfloat16


@dataclasses.dataclass
class Built:
    """One variant, ready to call: ``fn()`` runs it on the row's input."""

    fn: Callable[[], Any]
    build_s: float  # build (compile) plus the first call, waited for


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_call(fn: Callable[[], Any], device: torch.device, started: float) -> Built:
    with torch.no_grad():
        fn()
    sync(device)
    return Built(fn, time.perf_counter() - started)


def eager(model: nn.Module, x: torch.Tensor) -> Built:
    return _first_call(lambda: model(x), x.device, time.perf_counter())


def oneliner(model: nn.Module, x: torch.Tensor, compile_backend: str = "inductor") -> Built:
    """torch.compile(model, mode="max-autotune") under bf16 autocast: what a user types first."""
    started = time.perf_counter()
    compiled = torch.compile(model, mode="max-autotune", backend=compile_backend)
    device_type = x.device.type

    def call() -> Any:
        with torch.autocast(device_type, dtype=AUTOCAST_DTYPE):
            return compiled(x)

    return _first_call(call, x.device, started)


def expert(
    model: nn.Module, x: torch.Tensor, convnet: bool, compile_backend: str = "inductor"
) -> Built:
    """bf16 weights, channels_last for convnets, reduce-overhead (CUDA graphs on a GPU).

    A copy of the model is cast, so the eager fp32 reference stays as it is.
    """
    started = time.perf_counter()
    cast = copy.deepcopy(model).to(AUTOCAST_DTYPE)
    xin = x.to(AUTOCAST_DTYPE) if x.is_floating_point() else x
    if convnet:
        cast = cast.to(memory_format=torch.channels_last)
        xin = xin.contiguous(memory_format=torch.channels_last)
    compiled = torch.compile(cast, mode="reduce-overhead", backend=compile_backend)
    return _first_call(lambda: compiled(xin), x.device, started)


def candidate(recipe: dict[str, Any], model: nn.Module, x: torch.Tensor) -> Built:
    """One of honed's candidates, rebuilt from its recipe with the public Backend.build."""
    started = time.perf_counter()
    backend = backend_from_recipe(recipe)
    if backend is None:
        raise ValueError(f"no backend for recipe {recipe}")
    with torch.no_grad():
        fn = backend.build(model, [Sample((x,), {})])
    return _first_call(lambda: fn(x), x.device, started)


def honed_loaded(model: nn.Module, name: str, artifact: Path, x: torch.Tensor) -> Built:
    """honed's selection as a deployment gets it: honed.load of the artifact honed.save wrote."""
    started = time.perf_counter()
    module = honed.Module(model, name)
    options: dict[str, Any] = {}
    if "trust_native_code" in inspect.signature(honed.load).parameters:
        options["trust_native_code"] = True  # the suite made this artifact itself, moments ago
    honed.load(module, artifact, **options)
    return _first_call(lambda: module(x), x.device, started)


@contextlib.contextmanager
def dynamo_limits(limit: int = 64) -> Iterator[None]:
    """Room for every variant's compile of the same forward: past Dynamo's recompile limit a
    compile would silently run eager, and the row would time eager under another name."""
    config = torch._dynamo.config
    names = [
        n
        for n in (
            "recompile_limit",
            "cache_size_limit",
            "accumulated_recompile_limit",
            "accumulated_cache_size_limit",
        )
        if hasattr(config, n)
    ]
    saved = {n: getattr(config, n) for n in names}
    for n in names:
        setattr(config, n, max(limit, saved[n]))
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(config, n, v)


# -- correctness -------------------------------------------------------------------------------
def output_tensors(output: Any) -> list[torch.Tensor]:
    """Every tensor of a model's output, in order: pytree leaves, and for a transformers Cache
    (a leaf to pytree) the keys and values of each of its layers."""
    tensors: list[torch.Tensor] = []
    for leaf in pytree.tree_leaves(output):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
        elif hasattr(leaf, "layers"):  # transformers >= 5: Cache.layers[i].keys / .values
            for layer in leaf.layers:
                tensors += [t for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)]
    return tensors


def snapshot(fn: Callable[[], Any]) -> list[torch.Tensor]:
    """The output tensors of one call, copied to fp32 on the host (a CUDA graph's outputs are
    overwritten by its next replay)."""
    with torch.no_grad():
        return [t.detach().float().cpu().clone() for t in output_tensors(fn())]


def compare(reference: list[torch.Tensor], outputs: list[torch.Tensor]) -> dict[str, Any]:
    """Max abs error and cosine similarity of ``outputs`` against ``reference`` (all tensors
    together); ``error`` names a structural mismatch instead."""
    if len(outputs) != len(reference):
        return {"error": f"{len(outputs)} output tensors, eager has {len(reference)}"}
    for i, (r, o) in enumerate(zip(reference, outputs, strict=True)):
        if r.shape != o.shape:
            return {"error": f"output {i} has shape {tuple(o.shape)}, eager {tuple(r.shape)}"}
    if not reference:
        return {"max_abs_error": 0.0, "cosine": 1.0, "finite": True}
    r = torch.cat([t.double().flatten() for t in reference])
    o = torch.cat([t.double().flatten() for t in outputs])
    finite = bool(torch.isfinite(o).all())
    both = torch.isfinite(r) & torch.isfinite(o)
    diff = (o[both] - r[both]).abs()
    cosine = float(torch.nn.functional.cosine_similarity(r[both], o[both], dim=0))
    return {
        "max_abs_error": float(diff.max()) if diff.numel() else 0.0,
        "max_ref": float(r[both].abs().max()) if diff.numel() else 0.0,
        "cosine": cosine,
        "finite": finite,
    }
