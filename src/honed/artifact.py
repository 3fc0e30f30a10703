"""src/honed/artifact.py: honed.save / honed.load and the .honed file.

One zip of stored (uncompressed) entries: ``manifest.json`` and payloads. The manifest holds the
format version, honed version, creation time, environment fingerprint, every module and graph
(input profile, chosen backend recipe, measured figures), each module's tuning report (read back by
honed.report.load_report) and a SHA-256 for every other entry.
Weights and samples are safetensors; nothing is pickled, so loading runs no code but honed's.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch.utils import _pytree as pytree

from honed import _core
from honed._version import __version__
from honed.backend.base import Sample, backend_from_recipe
from honed.environment import fingerprint
from honed.errors import ArtifactError, IncompatibleArtifactError, InputError
from honed.module import Module, Variant, find_modules
from honed.shapes import graph_info

log = logging.getLogger("honed")

FORMAT = "honed"
FORMAT_VERSION = _core.ARTIFACT_FORMAT_VERSION  # the engine reads this version (artifact.h)
MANIFEST = "manifest.json"
ON_INCOMPATIBLE = ("error", "rebuild", "eager")


# -- save --------------------------------------------------------------------------------------
def save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Save the tuned modules inside ``obj`` (a honed.Module, a model or a pipeline) to ``path``.

    The file is written to a temporary name and renamed, so a failure leaves nothing partial.
    """
    modules = _modules_of(obj, "save")
    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"honed.save: {path} is a directory; give a file name such as {path / 'model.honed'}"
        )
    entries: dict[str, bytes] = {}
    manifest_modules = []
    for module in modules:
        manifest_modules.append(_save_module(module, entries))
    device = _device_of(modules[0])
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "honed_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": fingerprint(device),
        "modules": manifest_modules,
        "entries": {name: hashlib.sha256(data).hexdigest() for name, data in entries.items()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w", zipfile.ZIP_STORED) as zf:
            zf.writestr(MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))
            for name, data in entries.items():
                zf.writestr(name, data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _modules_of(obj: Any, verb: str) -> list[Module]:
    modules = find_modules(obj)
    if not modules:
        raise InputError(
            f"honed.{verb}: no honed.Module found in {type(obj).__name__}; wrap the model with "
            "honed.Module(model, 'name') (and tune it) first"
        )
    names = [m.name for m in modules]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InputError(
            f"honed.{verb}: several honed.Modules share the name(s) {dupes}; give each a unique "
            "name: honed.Module(model, 'unique-name')"
        )
    return modules


def _device_of(module: Module) -> torch.device:
    for p in module.module.parameters():
        return p.device
    return torch.device("cpu")


def _save_module(module: Module, entries: dict[str, bytes]) -> dict[str, Any]:
    weights_entry = f"weights/{module.name}.safetensors"
    state = {
        k: v.detach().to("cpu", copy=True).contiguous()
        for k, v in module.module.state_dict().items()
    }
    entries[weights_entry] = st_save(state)
    graphs = []
    for i, variant in enumerate(module.variants):
        graph: dict[str, Any] = {
            "graph_key": variant.profile.graph_key,
            "profile": json.loads(variant.profile.to_json()),
            "backend": variant.backend.recipe(),
            "figures": _jsonable(variant.figures),
            "runnable_from_cpp": bool(getattr(variant.backend, "cpp_runnable", False)),
            "samples": None,
            "outputs": None,
            "payload": None,
        }
        if variant.backend.saves_payload:
            files = variant.backend.export_payload(variant.fn)
            graph["payload"] = {}
            for name, data in files.items():
                entry = f"payloads/{module.name}/{i}/{name}"
                entries[entry] = data
                graph["payload"][name] = entry
        if variant.warm_sample is not None:
            encoded = _encode_sample(variant.warm_sample)
            if encoded is not None:
                entry = f"samples/{module.name}/{i}.safetensors"
                spec, tensors = encoded
                entries[entry] = st_save(tensors, metadata={"treespec": spec})
                graph["samples"] = entry
                outputs = _eager_outputs(module, variant.warm_sample)
                if outputs is not None:
                    entry = f"samples/{module.name}/{i}.outputs.safetensors"
                    entries[entry] = st_save(outputs)
                    graph["outputs"] = entry
        graphs.append(graph)
    return {
        "name": module.name,
        "class": f"{type(module.module).__module__}.{type(module.module).__qualname__}",
        "weights": weights_entry,
        "num_parameters": sum(p.numel() for p in module.module.parameters()),
        "graphs": graphs,
        "report": _jsonable(module.report.to_dict()) if module.report is not None else None,
    }


def _eager_outputs(module: Module, sample: Sample) -> dict[str, torch.Tensor] | None:
    """Eager PyTorch's outputs for a stored sample ("out<i>" in flatten order), for checks such
    as ``honed-run --check``; None when an output is not a tensor."""
    with torch.no_grad():
        out = module.module(*sample.args, **sample.kwargs)
    leaves = pytree.tree_leaves(out)
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        return None
    return {f"out{i}": t.detach().to("cpu", copy=True).contiguous() for i, t in enumerate(leaves)}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=lambda v: None))


def _encode_sample(sample: Sample) -> tuple[str, dict[str, torch.Tensor]] | None:
    leaves, spec = pytree.tree_flatten((sample.args, sample.kwargs))
    tensors: dict[str, torch.Tensor] = {}
    constants: list[Any] = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor):
            tensors[f"leaf{i}"] = leaf.detach().to("cpu", copy=True).contiguous()
            constants.append({"tensor": i})
        elif leaf is None or isinstance(leaf, bool | int | float | str):
            constants.append({"value": leaf})
        else:
            return None  # not storable without pickle: the graph warms up on first use instead
    try:
        spec_json = pytree.treespec_dumps(spec)
    except Exception:
        return None
    return json.dumps({"spec": spec_json, "leaves": constants}), tensors


def _decode_sample(data: bytes, device: torch.device) -> Sample:

    tensors = st_load(data)
    meta = json.loads(_safetensors_metadata(data)["treespec"])
    leaves = []
    for i, leaf in enumerate(meta["leaves"]):
        if "tensor" in leaf:
            leaves.append(tensors[f"leaf{i}"].to(device))
        else:
            leaves.append(leaf["value"])
    args, kwargs = pytree.tree_unflatten(leaves, pytree.treespec_loads(meta["spec"]))
    return Sample(tuple(args), dict(kwargs))


def _safetensors_metadata(data: bytes) -> dict[str, str]:
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    return dict(header.get("__metadata__", {}))


# -- load --------------------------------------------------------------------------------------
def load(
    obj: Any,
    path: str | os.PathLike[str],
    on_incompatible: str = "error",
) -> Any:
    """Load weights and tuned graphs from ``path`` into the honed.Modules inside ``obj``.

    Every entry's SHA-256 is verified first. ``on_incompatible`` decides what happens when the
    artifact was made for another device or torch: "error" raises, "rebuild" rebuilds each graph
    from its stored recipe here, "eager" loads the weights and runs eager.
    """
    if on_incompatible not in ON_INCOMPATIBLE:
        raise InputError(f"honed.load: on_incompatible must be one of {ON_INCOMPATIBLE}")
    modules = {m.name: m for m in _modules_of(obj, "load")}
    manifest, entries = read_artifact(path)
    problem = _incompatibility(manifest)
    mode = "load"
    if problem:
        if on_incompatible == "error":
            raise IncompatibleArtifactError(
                f"honed.load: {path} was made for {problem}. Re-tune here, or pass "
                "on_incompatible='rebuild' (rebuild from the stored recipes) or 'eager'"
            )
        log.warning(
            "honed.load: %s was made for %s; %s",
            path,
            problem,
            "rebuilding" if on_incompatible == "rebuild" else "running eager",
        )
        mode = on_incompatible
    for entry in manifest["modules"]:
        module = modules.get(entry["name"])
        if module is None:
            raise ArtifactError(
                f"honed.load: {path} holds module {entry['name']!r}, but the object has "
                f"honed.Module(s) {sorted(modules)}; load it into the model it was saved from"
            )
        _load_module(module, entry, entries, mode, str(path))
    return obj


def read_artifact(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The manifest and every verified entry of an artifact; raises ArtifactError on damage.

    Reading and verifying is the engine's (cpp/src/artifact.cpp), shared with the C++ runtime.
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"honed.load: {path} does not exist (or is not a file)")
    try:
        manifest_json, entries = _core.read_artifact(str(path))
    except _core.IncompatibleArtifactError as e:
        raise IncompatibleArtifactError(f"honed.load: {e}") from None
    except _core.ArtifactError as e:
        raise ArtifactError(f"honed.load: {e}") from None
    return json.loads(manifest_json), entries


def _incompatibility(manifest: dict[str, Any]) -> str:
    """Why this artifact cannot be loaded as it is here ("" when it can); the engine's rules."""
    gpu, cc = "", ""
    here_cuda = torch.cuda.is_available()
    if here_cuda and str(manifest["environment"].get("device", "cpu")).startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, cc = props.name, f"{props.major}.{props.minor}"
    return str(
        _core.artifact_incompatibility(json.dumps(manifest), torch.__version__, here_cuda, gpu, cc)
    )


def _load_module(
    module: Module, entry: dict[str, Any], entries: dict[str, bytes], mode: str, where: str
) -> None:
    """Weights, then each graph: "load" payloads, "rebuild" from recipes, or "eager" (none)."""
    state = st_load(entries[entry["weights"]])
    try:
        module.module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ArtifactError(
            f"honed.load: the weights in {where} do not fit module {entry['name']!r} "
            f"(saved from {entry.get('class')}): {str(e).splitlines()[0]}; load it into the "
            "same model class it was saved from"
        ) from e
    device = _device_of(module)
    variants: list[Variant] = []
    for graph in entry["graphs"] if mode != "eager" else []:
        variant = _rebuild(module, graph, entries, device, use_payload=mode == "load")
        if variant is not None:
            variants.append(variant)
    module.install(variants)


def _rebuild(
    module: Module,
    graph: dict[str, Any],
    entries: dict[str, bytes],
    device: torch.device,
    use_payload: bool,
) -> Variant | None:
    """A graph's variant: its stored payload loaded as it is, or rebuilt from its recipe."""
    backend = backend_from_recipe(graph["backend"])
    name = graph["backend"].get("backend")
    if backend is None:
        log.warning(
            "honed.load: module %r graph uses backend %s, which is not defined in this process; "
            "import the module that defines it before honed.load. Running eager for that graph.",
            module.name,
            name,
        )
        return None
    profile = _core.GraphProfile.from_json(json.dumps(graph["profile"]))
    sample = _decode_sample(entries[graph["samples"]], device) if graph.get("samples") else None
    info = graph_info(profile, device)
    examples = [sample] if sample is not None else []
    payload = graph.get("payload") or {}
    try:
        with torch.no_grad():
            if payload and backend.saves_payload and use_payload:
                files = {name: entries[entry] for name, entry in payload.items()}
                fn = backend.load_payload(files, module.module, info)
            else:
                fn = backend.build_graph(module.module, examples, info)
            if sample is not None:
                fn(*sample.args, **sample.kwargs)  # warm up (a JIT backend compiles here)
    except Exception as e:
        log.warning(
            "honed.load: rebuilding %s for module %r failed (%s: %s); running eager",
            name,
            module.name,
            type(e).__name__,
            e,
        )
        return None
    return Variant(profile, backend, fn, graph.get("figures") or {}, sample)
