"""src/honed/backend/_aoti_constants.py: AOTInductor packages that hold code, not weights.

Packages are compiled with ``aot_inductor.package_constants_in_so=False``: the library holds
the compiled code only, and the constants it names (by the FQN they had in the exported module)
are handed to it when it is loaded (``load_constants``). A constant that is one of the tuned
module's own tensors, unchanged, is stored once, in the module's weights
(``weights/<module>.safetensors``), and referred to by its key there; anything else (the module
cast to bf16 or re-laid out by a precision or memory-format candidate, a tensor constant of the
program) goes into the payload's ``constants.safetensors``. ``constants.json`` lists every
constant with where it comes from, its dtype, shape and strides (the package's kernels index
constants with the strides they were compiled for), so that Python (here) and the C++ runtime
(cpp/runtime/constants.cpp) give the package the same tensors. Format:

    {"format": 1, "constants": [{"fqn": "inner.0.weight", "source": "weights", "key": "0.weight",
      "dtype": "float32", "shape": [32, 16], "stride": [16, 1]}, ...]}

("source": "payload" names a key of constants.safetensors). A module tensor the package holds
cast (bf16 weights) is read from the weights too, with ``"cast_from": "float32"``: the loader
casts it to ``dtype`` (the same rounding as the cast it was compiled from) and lays it out, so a
precision or memory-format candidate stores no second copy of the weights.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch

from honed.errors import InputError, TuneError
from honed.pipeline.courtesy import give_way

CONSTANTS_JSON = "constants.json"
CONSTANTS_FILE = "constants.safetensors"
FILES = (CONSTANTS_JSON, CONSTANTS_FILE)
FORMAT = 1
# The inductor setting that leaves the weights out of the compiled library.
NO_CONSTANTS_IN_SO = {"aot_inductor.package_constants_in_so": False}
# FlatForward (_export.py) holds the tuned module as this attribute: the exported FQNs of the
# module's own tensors start with it.
_ROOT = "inner."
# backend/_precision.py's CastModule holds the converted copy of the module under this name.
_CAST_ROOT = "inner."


@dataclasses.dataclass
class Constants:
    """What a package needs besides its code: the list, and the tensors the weights lack."""

    entries: list[dict[str, Any]]
    payload: dict[str, torch.Tensor]  # key -> contiguous CPU tensor
    live: dict[str, torch.Tensor]  # FQN -> the compiled tensor itself (where it was compiled)

    def files(self) -> dict[str, bytes]:
        from safetensors.torch import save

        out = {CONSTANTS_JSON: json.dumps({"format": FORMAT, "constants": self.entries}).encode()}
        if self.payload:
            out[CONSTANTS_FILE] = save(self.payload)
        return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.to(b.device), b)


def plan(loader: Any, exported: Any, module: torch.nn.Module) -> Constants:
    """Where each constant of the package comes from: ``module``'s state dict when the exported
    program holds it unchanged, else the payload. ``exported``: the ExportedProgram compiled."""
    tensors: dict[str, torch.Tensor] = {**exported.constants, **exported.state_dict}
    weights = module.state_dict()
    entries: list[dict[str, Any]] = []
    payload: dict[str, torch.Tensor] = {}
    live: dict[str, torch.Tensor] = {}
    for fqn in sorted(loader.get_constant_fqns()):
        t = tensors.get(fqn)
        if not isinstance(t, torch.Tensor):
            raise TuneError(
                f"AOTInductor package names constant {fqn!r}, which the exported program does "
                "not hold; honed cannot store its weights apart from the code"
            )
        t = t.detach()
        live[fqn] = t
        key = fqn.removeprefix(_ROOT)
        if key not in weights and key.startswith(_CAST_ROOT):
            key = key.removeprefix(_CAST_ROOT)  # a precision candidate's CastModule around it
        entry: dict[str, Any] = {
            "fqn": fqn,
            "dtype": _dtype_name(t.dtype),
            "shape": list(t.shape),
            "stride": list(t.stride()),
        }
        own = weights.get(key) if fqn.startswith(_ROOT) else None
        if own is not None and _same(own, t):
            entry.update(source="weights", key=key)
        elif own is not None and own.dtype != t.dtype and _same(own.to(t.dtype), t):
            # The module's tensor cast (bf16 weights): the cast is redone at load, the weights
            # are stored once.
            entry.update(source="weights", key=key, cast_from=_dtype_name(own.dtype))
        else:
            entry.update(source="payload", key=fqn)
            payload[fqn] = t.to("cpu", copy=True).contiguous()
        entries.append(entry)
    return Constants(entries, payload, live)


def tensors(
    files: dict[str, bytes], module: torch.nn.Module, device: torch.device
) -> dict[str, torch.Tensor] | None:
    """The constants ``constants.json`` names, FQN -> tensor on ``device`` with the strides the
    package was compiled for; None for a package that holds its constants itself."""
    if CONSTANTS_JSON not in files:
        return None
    listing = json.loads(files[CONSTANTS_JSON].decode())
    if listing.get("format") != FORMAT:
        raise InputError(
            f"{CONSTANTS_JSON} has format {listing.get('format')!r}; this honed reads format "
            f"{FORMAT}: save the artifact again with this honed"
        )
    stored: dict[str, torch.Tensor] = {}
    if CONSTANTS_FILE in files:
        from safetensors.torch import load

        stored = load(files[CONSTANTS_FILE])
    weights = module.state_dict()
    target = torch.empty(0, device=device).device  # with its index
    out: dict[str, torch.Tensor] = {}
    for c in listing["constants"]:
        give_way()
        source = weights if c["source"] == "weights" else stored
        t = source.get(c["key"])
        dtype = getattr(torch, c["dtype"])
        stored_dtype = getattr(torch, c.get("cast_from", c["dtype"]))
        if t is None or t.dtype != stored_dtype or list(t.shape) != c["shape"]:
            got = "nothing" if t is None else f"{t.dtype} {list(t.shape)}"
            raise InputError(
                f"AOTInductor package constant {c['fqn']!r} should be {c['dtype']} {c['shape']} "
                f"from the {c['source']} entry {c['key']!r}, found {got}; the artifact does not "
                "belong to this module: save it again"
            )
        if _handed_as_is(t, dtype, c["stride"], target):
            out[c["fqn"]] = t
            continue
        laid_out = torch.empty_strided(c["shape"], c["stride"], dtype=dtype, device=device)
        laid_out.copy_(t)
        out[c["fqn"]] = laid_out
    return out


def _handed_as_is(
    t: torch.Tensor, dtype: torch.dtype, stride: list[int], device: torch.device
) -> bool:
    """Whether ``t`` can be handed to the package itself: ``give`` has the package copy each
    constant into a buffer of its own, from the constant's address for its storage's length.
    A tensor with the dtype, strides and device compiled for that is all of its storage needs
    no copy of ours first: for a module's unchanged weights (the fp32 candidates) an extra copy
    was as large as the module, made in the program's process beside its calls."""
    return (
        t.dtype == dtype
        and t.device == device
        and list(t.stride()) == list(stride)
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.nbytes
    )


def give(loader: Any, constants: dict[str, torch.Tensor]) -> None:
    """Hand the package its constants (every one, checked by the package), which it copies
    into a buffer of its own (not user-managed: ``tensors`` may hand over the module's own).

    The package copies a CUDA constant with ``cudaMemcpy``, which for device memory returns
    before the copy runs and queues it on the legacy default stream: in a JIT program's process
    the program's own stream, behind its queued calls. The constants laid out for the package
    are made on honed's stream (courtesy.own_stream), which is not ordered with the legacy
    stream: the copies could read them before the kernels laying them out ran, so honed's thread
    waits for its stream first (the program's thread never waits). Freed once handed over and
    noted as used on the legacy stream, their memory is handed out again only once the copies
    queued there have run; without that, honed's next allocations (the package's warm-up) could
    overwrite them before the copies read them, and the package answered garbage (docs/jit.md).
    """
    devices = {t.device for t in constants.values() if t.is_cuda}
    for device in devices:
        stream = torch.cuda.current_stream(device)
        if stream != torch.cuda.default_stream(device):
            stream.synchronize()  # without the GIL
    loader.load_constants(constants, False, True, False)
    for t in constants.values():
        if t.is_cuda:
            t.record_stream(torch.cuda.default_stream(t.device))
