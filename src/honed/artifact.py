"""src/honed/artifact.py: honed.save / honed.load and the .honed file.

The format belongs to the engine (cpp/include/honed/artifact.h): one zip of stored
(uncompressed) entries, ``manifest.json`` (format version, honed version, creation time,
environment fingerprint, every module and graph with its input profile, backend recipe, figures
and tuning report, and a SHA-256 for every other entry), ``manifest.sig`` (an Ed25519 signature of
the manifest, when saved with a signing key) and the payloads. This file builds the typed
``_core.Manifest`` and hands it and the entries to ``_core.write_artifact``; ``_core.read_artifact``
verifies a file (CRC-32, sizes, names, every SHA-256) before anything here reads it.

Weights and samples are safetensors; nothing is pickled. Native code (a compiled payload) is
loaded only from an artifact signed by a trusted key, or with ``trust_native_code=True``
(docs/trust.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch.utils import _pytree as pytree

from honed import _core, trust
from honed._version import __version__
from honed.backend.base import Backend, Sample, backend_from_recipe
from honed.environment import fingerprint, machine_section
from honed.errors import (
    ArtifactError,
    IncompatibleArtifactError,
    InputError,
    UntrustedArtifactError,
)
from honed.module import Module, Variant, find_modules
from honed.pipeline.candidate import float_tolerance
from honed.pipeline.signals import terminate_like_interrupt
from honed.pipeline.sweep import resize_sample
from honed.shapes import graph_info

log = logging.getLogger("honed")

FORMAT = "honed"
FORMAT_VERSION = _core.ARTIFACT_FORMAT_VERSION  # the engine reads this version (artifact.h)
MANIFEST = _core.MANIFEST_ENTRY
ON_INCOMPATIBLE = ("error", "rebuild", "eager")


# -- save --------------------------------------------------------------------------------------
def save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """Save the tuned modules inside ``obj`` (a honed.Module, a model or a pipeline) to ``path``.

    The file is written to a temporary name and renamed (mode 0666 minus the umask, like any file
    the user creates), so a failure leaves nothing partial. The manifest is signed with the user's
    key (HONED_SIGNING_KEY, else the config folder's, made by ``honed keygen`` or on first save).
    """
    modules = _modules_of(obj, "save")
    path = Path(path)
    if path.is_dir():
        raise InputError(
            f"honed.save: {path} is a directory; give a file name such as {path / 'model.honed'}"
        )
    entries: dict[str, bytes] = {}
    manifest = _core.Manifest()
    manifest.honed_version = __version__
    manifest.created = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    manifest.environment = _jsonable(fingerprint(_device_of(modules[0])))
    manifest.machine = _jsonable(machine_section(modules, _device_of(modules[0])))
    manifest.modules = [_save_module(module, entries) for module in modules]
    key = trust.key_for_save()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with terminate_like_interrupt():  # SIGTERM waits for the write: no partial file stays
            _core.write_artifact(str(path), manifest, entries, key or "")
    except _core.ArtifactError as e:
        raise ArtifactError(f"honed.save: {e}") from None
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


def _save_module(module: Module, entries: dict[str, bytes]) -> Any:
    weights_entry = f"weights/{module.name}.safetensors"
    state = {
        k: v.detach().to("cpu", copy=True).contiguous()
        for k, v in module.module.state_dict().items()
    }
    entries[weights_entry] = st_save(state)
    graphs = []
    for i, variant in enumerate(module.variants):
        graph = _core.ManifestGraph()
        graph.profile = variant.profile
        graph.backend = variant.backend.recipe()
        # With the bar the tune's correctness check held float32 outputs to (bf16 weights, TF32):
        # honed-run --check compares the stored eager outputs with the same one.
        tol = float_tolerance(variant.backend, module.module, _device_of(module))
        graph.figures = {**_jsonable(variant.figures), "check_tolerance": dataclasses.asdict(tol)}
        graph.runnable_from_cpp = bool(getattr(variant.backend, "cpp_runnable", False))
        if variant.backend.saves_payload:
            payload = {}
            for name, data in variant.backend.export_payload(variant.fn).items():
                entry = f"payloads/{module.name}/{i}/{name}"
                entries[entry] = data
                payload[name] = entry
            graph.payload = payload
        if variant.warm_sample is not None:
            stored, repeat = _stored_sample(variant.warm_sample, variant.profile)
            encoded = _encode_sample(stored, repeat)
            if encoded is not None:
                entry = f"samples/{module.name}/{i}.safetensors"
                spec, tensors = encoded
                entries[entry] = st_save(tensors, metadata={"treespec": spec})
                graph.samples = entry
                # Eager's outputs for the sample as a reader rebuilds it (stored items repeated).
                full = stored if repeat is None else resize_sample(stored, repeat[1], repeat[0])
                outputs = _eager_outputs(module, full)
                if outputs is not None:
                    entry = f"samples/{module.name}/{i}.outputs.safetensors"
                    entries[entry] = st_save(outputs)
                    graph.outputs = entry
        graphs.append(graph)
    saved = _core.ManifestModule()
    saved.name = module.name
    saved.class_name = f"{type(module.module).__module__}.{type(module.module).__qualname__}"
    saved.weights = weights_entry
    saved.num_parameters = sum(p.numel() for p in module.module.parameters())
    saved.graphs = graphs
    saved.report = _jsonable(module.report.to_dict()) if module.report is not None else None
    return saved


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


# A graph's stored sample (its warm-up input and honed-run --check's) holds at most this many
# bytes of inputs: above it, only as many items along the batch axes as fit are stored, repeated
# in turn up to the sample's batch when read (sweep.resize_sample, _core.batch_indices), so that
# a batch of images does not outweigh the compiled code in the artifact.
SAMPLE_MAX_BYTES = 2 << 20


def _stored_sample(
    sample: Sample, profile: _core.GraphProfile
) -> tuple[Sample, tuple[int, list[int]] | None]:
    """The sample to store, and the batch and axes a reader repeats it along (None: whole).

    The axes are the profile's batch axes, or for a graph of static shapes the leading axis of
    every input as long as the first one's."""
    tensors = [
        t for t in pytree.tree_leaves((sample.args, sample.kwargs)) if isinstance(t, torch.Tensor)
    ]
    total = sum(t.numel() * t.element_size() for t in tensors)
    if total <= SAMPLE_MAX_BYTES or not tensors:
        return sample, None
    axes = [int(a) for a in profile.batch_axes][: len(tensors)]
    axes += [-1] * (len(tensors) - len(axes))
    if not any(a >= 0 for a in axes) and tensors[0].dim() > 0:
        lead = tensors[0].shape[0]
        axes = [0 if t.dim() > 0 and t.shape[0] == lead else -1 for t in tensors]
    batched = [(t, a) for t, a in zip(tensors, axes, strict=True) if a >= 0]
    if not batched:
        return sample, None
    batch = int(batched[0][0].shape[batched[0][1]])
    per_item = sum(t.numel() * t.element_size() for t, _ in batched) / max(batch, 1)
    fixed = total - per_item * batch
    keep = max(1, int((SAMPLE_MAX_BYTES - fixed) // per_item)) if per_item else batch
    if keep >= batch:
        return sample, None
    return resize_sample(sample, axes, keep), (batch, axes)


def _encode_sample(
    sample: Sample, repeat: tuple[int, list[int]] | None = None
) -> tuple[str, dict[str, torch.Tensor]] | None:
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
    meta: dict[str, Any] = {"spec": spec_json, "leaves": constants}
    if repeat is not None:  # the stored items are repeated up to this batch when read
        meta["batch"], meta["batch_axes"] = repeat
    return json.dumps(meta), tensors


# -- load --------------------------------------------------------------------------------------
def load(
    obj: Any,
    path: str | os.PathLike[str],
    on_incompatible: str = "error",
    trust_native_code: bool = False,
) -> Any:
    """Load weights and tuned graphs from ``path`` into the honed.Modules inside ``obj``.

    The file is verified first (every entry's CRC and SHA-256). ``on_incompatible`` decides what
    happens when the artifact was made for another device or torch: "error" raises, "rebuild"
    rebuilds each graph from its stored recipe here, "eager" loads the weights and runs eager.
    A graph whose payload is native code (``Backend.native_payload``) is loaded only when a
    trusted key signed the artifact (``honed trust``), or with ``trust_native_code=True``; this is
    checked before any payload is written out or loaded (docs/trust.md). Each loaded graph is run
    once at every batch size of its stored profile, so the first calls are not slow.
    """
    if on_incompatible not in ON_INCOMPATIBLE:
        raise InputError(f"honed.load: on_incompatible must be one of {ON_INCOMPATIBLE}")
    modules = {m.name: m for m in _modules_of(obj, "load")}
    artifact = open_artifact(path)
    manifest = artifact.manifest
    for entry in manifest.modules:
        if entry.name not in modules:
            raise ArtifactError(
                f"honed.load: {path} holds module {entry.name!r}, but the object has "
                f"honed.Module(s) {sorted(modules)}; load it into the model it was saved from"
            )
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
    if mode == "load":
        _check_native_code(artifact, trust_native_code)
    for entry in manifest.modules:
        _load_module(modules[entry.name], entry, artifact, mode)
    return obj


def open_artifact(path: str | os.PathLike[str], who: str = "honed.load") -> _core.Artifact:
    """The verified ``_core.Artifact`` at ``path``; ArtifactError (prefixed ``who``) otherwise."""
    try:
        return _core.read_artifact(os.fspath(path))
    except _core.IncompatibleArtifactError as e:
        raise IncompatibleArtifactError(f"{who}: {e}") from None
    except _core.ArtifactError as e:
        raise ArtifactError(f"{who}: {e}") from None


class _Entries(Mapping[str, bytes]):
    """An artifact's verified entries, each read (copied out of the mapping) when asked for."""

    def __init__(self, artifact: _core.Artifact) -> None:
        self._artifact = artifact
        self._names = list(artifact.entries)

    def __getitem__(self, name: str) -> bytes:
        if name not in self._names:
            raise KeyError(name)
        return bytes(self._artifact.read(name))

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def read_artifact(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Mapping[str, bytes]]:
    """The manifest (as stored in manifest.json) and the verified entries of an artifact.

    For tools that read the file as data; honed.load works on the typed ``_core.Manifest``.
    """
    artifact = open_artifact(path)
    return dict(artifact.manifest.to_dict()), _Entries(artifact)


def _native_backend(graph: Any) -> Backend | None:
    """The backend whose payload loading would run native code, or None."""
    try:
        backend = backend_from_recipe(graph.backend)
    except Exception:
        return None  # an unusable recipe loads no payload (_rebuild reports it)
    if backend is None or not graph.payload or not backend.saves_payload:
        return None
    return backend if type(backend).native_payload else None


def _check_native_code(artifact: _core.Artifact, trust_native_code: bool) -> None:
    """Refuse native payloads that no trusted key signed, before anything is written or loaded."""
    native = [
        (graph, backend)
        for module in artifact.manifest.modules
        for graph in module.graphs
        if (backend := _native_backend(graph)) is not None
    ]
    keys = trust.trusted_public_keys()
    state, signer = artifact.trust(keys)
    if not native:
        if state == "bad-signature":
            log.warning(
                "honed.load: the signature of %s (key %s) does not match its manifest; it holds "
                "no native code, so it loads as an unsigned artifact",
                artifact.path,
                signer,
            )
        return
    if trust_native_code or state == "trusted":
        return
    graph, backend = native[0]
    names = ", ".join(repr(e) for e in sorted(graph.payload.values()))
    entry = f"{type(backend).__name__} payload {names}"
    message = artifact.untrusted_message(keys, entry, "honed.load(..., trust_native_code=True)")
    raise UntrustedArtifactError(f"honed.load: {message}")


def _incompatibility(manifest: _core.Manifest) -> str:
    """Why this artifact cannot be loaded as it is here ("" when it can); the engine's rules."""
    gpu, cc = "", ""
    here_cuda = torch.cuda.is_available()
    if here_cuda and str(manifest.environment.get("device") or "cpu").startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu, cc = props.name, f"{props.major}.{props.minor}"
    return str(_core.artifact_incompatibility(manifest, torch.__version__, here_cuda, gpu, cc))


def _load_module(
    module: Module, entry: _core.ManifestModule, artifact: _core.Artifact, mode: str
) -> None:
    """Weights, then each graph: "load" payloads, "rebuild" from recipes, or "eager" (none)."""
    where = artifact.path
    if not entry.weights:
        raise ArtifactError(
            f"honed.load: {where}: module {entry.name!r} names no weights entry; the file is "
            "crafted or damaged: re-save it"
        )
    state, _ = _safetensors(artifact, entry.weights)
    try:
        module.module.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ArtifactError(
            f"honed.load: the weights in {where} do not fit module {entry.name!r} "
            f"(saved from {entry.class_name}): {str(e).splitlines()[0]}; load it into the "
            "same model class it was saved from"
        ) from e
    device = _device_of(module)
    variants: list[Variant] = []
    for graph in entry.graphs if mode != "eager" else []:
        variant = _rebuild(module, graph, artifact, device, use_payload=mode == "load")
        if variant is not None:
            variants.append(variant)
    module.install(variants)


def _safetensors(
    artifact: _core.Artifact, entry: str
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors entry; ArtifactError naming it when malformed."""
    data = bytes(artifact.read(entry)) if entry in artifact.entries else None
    if data is None:
        raise ArtifactError(
            f"honed.load: {artifact.path}: the manifest names entry {entry!r}, which the file "
            "does not hold; it is crafted or damaged: re-save it"
        )
    try:
        header_len = int.from_bytes(data[:8], "little")
        if len(data) < 8 or header_len > len(data) - 8:
            raise ValueError(f"header of {header_len} bytes in a {len(data)}-byte entry")
        header = json.loads(data[8 : 8 + header_len])
        if not isinstance(header, dict):
            raise ValueError("the header is not a JSON object")
        metadata = header.get("__metadata__") or {}
        tensors = st_load(data)
    except Exception as e:
        raise ArtifactError(
            f"honed.load: {artifact.path}: entry {entry!r} is not a valid safetensors file "
            f"(bad header: {_first_line(e)}); re-save it"
        ) from None
    return tensors, dict(metadata)


def _decode_sample(artifact: _core.Artifact, entry: str, device: torch.device) -> Sample:
    """The stored sample of a graph: tensors, constants and the treespec that nests them, its
    items repeated up to the batch it was taken at when only some were stored."""
    tensors, metadata = _safetensors(artifact, entry)
    try:
        meta = json.loads(metadata["treespec"])
        spec = pytree.treespec_loads(meta["spec"])
        leaves = [
            tensors[f"leaf{i}"].to(device) if "tensor" in leaf else leaf["value"]
            for i, leaf in enumerate(meta["leaves"])
        ]
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        sample = Sample(tuple(args), dict(kwargs))
        if meta.get("batch") is not None:
            axes = [int(a) for a in meta["batch_axes"]]
            sample = resize_sample(sample, axes, int(meta["batch"]))
        return sample
    except Exception as e:
        raise ArtifactError(
            f"honed.load: {artifact.path}: entry {entry!r} has a bad treespec "
            f"({type(e).__name__}: {_first_line(e)}); re-save it"
        ) from None


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else type(e).__name__


def _rebuild(
    module: Module,
    graph: _core.ManifestGraph,
    artifact: _core.Artifact,
    device: torch.device,
    use_payload: bool,
) -> Variant | None:
    """A graph's variant: its stored payload loaded as it is, or rebuilt from its recipe, then
    run once at every batch size of its profile."""
    name = graph.backend_name
    try:
        backend = backend_from_recipe(graph.backend)
    except Exception as e:
        raise ArtifactError(
            f"honed.load: {artifact.path}: the recipe of backend {name!r} in module "
            f"{module.name!r} is malformed ({_first_line(e)}); re-save it"
        ) from None
    if backend is None:
        log.warning(
            "honed.load: module %r graph uses backend %s, which is not defined in this process; "
            "import the module that defines it before honed.load. Running eager for that graph.",
            module.name,
            name,
        )
        return None
    profile = graph.profile
    sample = _decode_sample(artifact, graph.samples, device) if graph.samples else None
    info = graph_info(profile, device)
    examples = [sample] if sample is not None else []
    payload = graph.payload
    files = {n: bytes(artifact.read(e)) for n, e in payload.items()} if use_payload else {}
    try:
        with torch.no_grad():
            if payload and backend.saves_payload and use_payload:
                fn = backend.load_payload(files, module.module, info)
            else:
                fn = backend.build_graph(module.module, examples, info)
            for warm in _warm_samples(sample, profile):
                fn(*warm.args, **warm.kwargs)  # a JIT backend compiles here, not on first use
    except Exception as e:
        log.warning(
            "honed.load: rebuilding %s for module %r failed (%s: %s); running eager",
            name,
            module.name,
            type(e).__name__,
            e,
        )
        return None
    return Variant(profile, backend, fn, dict(graph.figures or {}), sample)


def _warm_samples(sample: Sample | None, profile: _core.GraphProfile) -> list[Sample]:
    """The stored sample resized to each batch size of the profile (min, opt, max)."""
    if sample is None:
        return []
    axes = list(profile.batch_axes)
    if not any(a >= 0 for a in axes):
        return [sample]
    sizes = sorted({int(profile.min_batch), int(profile.opt_batch), int(profile.max_batch)})
    return [resize_sample(sample, axes, b) for b in sizes if b > 0]
