"""src/honed/cli/exporting.py: `honed export`: the winner's native payload out of a .honed artifact.

An artifact keeps, for each tuned graph whose backend saves one, the payload it loads without
rebuilding: an ONNX model (ONNXRuntimeBackend), an AOTInductor package (TorchInductorAotBackend)
or a TensorRT engine plan (TensorRTBackend). ``export`` writes one of them as a plain file, for
tools that do not know honed (onnxruntime, ``torch._inductor.aoti_load_package``, trtexec).
Reading an artifact here only copies bytes: nothing in it is loaded or run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from honed.errors import ArtifactError, InputError

# format -> (the payload file name inside the artifact, the backend that makes it)
FORMATS: dict[str, tuple[str, str]] = {
    "onnx": ("model.onnx", "ONNXRuntimeBackend"),
    "pt2": ("model.pt2", "TorchInductorAotBackend"),
    "plan": ("model.plan", "TensorRTBackend"),
}


def _formats_of(payload: dict[str, str]) -> list[str]:
    return [fmt for fmt, (file, _) in FORMATS.items() if file in payload]


def _held(manifest: dict[str, Any]) -> str:
    """What the artifact's graphs hold, for the error when the asked format is missing."""
    parts = []
    for m in manifest.get("modules", []):
        graphs = m.get("graphs") or []
        if not graphs:
            parts.append(f"module {m.get('name')!r}: never tuned (weights only)")
        for i, g in enumerate(graphs):
            backend = (g.get("backend") or {}).get("backend", "?")
            formats = _formats_of(g.get("payload") or {})
            what = ", ".join(formats) if formats else "no exportable payload"
            parts.append(f"module {m.get('name')!r} graph {i}: {backend} ({what})")
    return "; ".join(parts) or "no modules"


def find_payload(
    manifest: dict[str, Any], fmt: str, module: str | None = None, graph: int | None = None
) -> tuple[str, int, str]:
    """``(module name, graph index, artifact entry)`` of the one ``fmt`` payload asked for."""
    if fmt not in FORMATS:
        raise InputError(f"export format {fmt!r} is not one of {', '.join(FORMATS)}")
    file, maker = FORMATS[fmt]
    found = []
    for m in manifest.get("modules", []):
        if module is not None and m.get("name") != module:
            continue
        for i, g in enumerate(m.get("graphs") or []):
            payload = g.get("payload") or {}
            if (graph is None or graph == i) and file in payload:
                found.append((str(m.get("name")), i, str(payload[file])))
    if not found:
        which = "" if module is None and graph is None else " for the module/graph asked for"
        raise ArtifactError(
            f"the artifact has no {fmt} payload{which}; it holds: {_held(manifest)}. Tune with "
            f"{maker} among the candidates to get one"
        )
    if len(found) > 1:
        listed = ", ".join(f"--module {m} --graph {i}" for m, i, _ in found)
        raise InputError(f"the artifact holds {len(found)} {fmt} payloads; pick one: {listed}")
    return found[0]


def export(
    artifact: str | os.PathLike[str],
    fmt: str,
    out: str | os.PathLike[str],
    *,
    module: str | None = None,
    graph: int | None = None,
    force: bool = False,
) -> tuple[Path, str, int]:
    """Write the ``fmt`` payload of ``artifact`` to ``out``; returns (out, module, graph)."""
    from honed.artifact import read_artifact

    target = Path(out)
    check_output_path(target, force, "--out")
    manifest, entries = read_artifact(artifact)  # every entry's hash checked
    name, index, entry = find_payload(manifest, fmt, module, graph)
    write_atomically(target, entries[entry])
    return target, name, index


def check_output_path(path: Path, force: bool, flag: str) -> None:
    """A file path that may be written: not a folder, and not an existing file unless forced."""
    if path.is_dir():
        raise InputError(f"{flag} {path} is a folder; give a file path such as {path / 'out'}")
    if path.exists() and not force:
        raise InputError(f"{path} exists; pass --force to overwrite it, or give another {flag}")


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` whole or not at all (a partial file never takes its name)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
