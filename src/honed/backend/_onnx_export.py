"""src/honed/backend/_onnx_export.py: export to ONNX, shared by ONNX Runtime and TensorRT.

The ONNX exporter's availability (onnx, onnxruntime and onnxscript at versions that work with
this torch), the export itself (``torch.onnx.export`` of _export.py's FlatForward with the
plan's Dims, or the TorchScript exporter), and ``OnnxCalling``: the Calling of _calling.py plus
the model's input names and eager's output structure and dtypes, stored next to the model.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

import torch

from honed.backend._calling import CALLING_FILE as PAYLOAD_CALLING
from honed.backend._calling import Calling
from honed.backend._export import FlatForward, Plan
from honed.backend.base import Availability
from honed.errors import InputError, TuneError

_CALLING_FORMAT = 1
# Oldest versions known to work with torch.onnx.export(dynamo=True) as honed calls it.
_MIN_VERSIONS = {"onnx": (1, 16), "onnxruntime": (1, 17), "onnxscript": (0, 2)}
_MIN_TORCH = (2, 6)
INSTALL = "pip install onnx onnxruntime onnxscript (or: pip install 'honed[onnx]')"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _dist_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "(version unknown)"


@functools.cache
def onnx_available() -> Availability:
    """onnx, onnxruntime and onnxscript import, at versions that work with this torch. Cached."""
    torch_version = torch.__version__
    if _version_tuple(torch_version) < _MIN_TORCH:
        wanted = ".".join(map(str, _MIN_TORCH))
        return Availability(
            False,
            f"torch {torch_version} has no torch.onnx.export(dynamo=True) as honed uses it",
            f"install torch {wanted} or newer",
        )
    return _importable(_MIN_VERSIONS)


@functools.cache
def runtime_available() -> Availability:
    """onnxruntime imports, at a version honed works with: all a stored model's load needs. The
    exporter's packages (onnx, onnxscript) stay unimported: hundreds of modules, which a JIT
    program imported on its own thread at a winner's install, beside its calls. Cached."""
    return _importable({"onnxruntime": _MIN_VERSIONS["onnxruntime"]})


def _importable(packages: Mapping[str, tuple[int, ...]]) -> Availability:
    import importlib

    torch_version = torch.__version__
    for name, minimum in packages.items():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                return Availability(False, f"{name} is not installed", INSTALL)
            return _import_failure(name, e, torch_version)
        except Exception as e:  # any import crash makes only this backend unavailable
            return _import_failure(name, e, torch_version)
        version = str(getattr(module, "__version__", "") or _dist_version(name))
        if _version_tuple(version) < minimum:
            wanted = ".".join(map(str, minimum))
            return Availability(
                False,
                f"{name} {version} is too old for torch {torch_version}'s ONNX exporter "
                f"(needs {name} >= {wanted})",
                f"pip install -U '{name}>={wanted}'",
            )
    return Availability(True)


def _import_failure(name: str, error: BaseException, torch_version: str) -> Availability:
    first = (str(error).strip().splitlines() or [""])[0]
    wanted = ".".join(map(str, _MIN_VERSIONS[name]))
    return Availability(
        False,
        f"{name} {_dist_version(name)} fails to import (with torch {torch_version}): "
        f"{type(error).__name__}: {first}",
        f"install a {name} release (>= {wanted}) built for this torch and numpy, e.g. "
        f"pip install -U {name}; or uninstall {name} to hide this backend",
    )


@dataclasses.dataclass(frozen=True)
class OnnxCalling:
    """How calls map to the ONNX model's inputs and its outputs back to eager's structure."""

    calling: Calling
    input_names: tuple[str, ...]  # one per tensor input, in flatten order
    out_spec: str  # treespec_dumps of eager's output
    out_dtypes: tuple[str, ...]  # eager's dtype per output leaf

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _CALLING_FORMAT,
                "calling": json.loads(self.calling.to_json()),
                "input_names": list(self.input_names),
                "out_spec": self.out_spec,
                "out_dtypes": list(self.out_dtypes),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str, stored: Any = None) -> OnnxCalling:
        """Read it back; ``stored``: the graph's stored profile (see Calling.from_json)."""
        data = json.loads(text)
        if data.get("format") != _CALLING_FORMAT:
            raise InputError(
                f"ONNX {PAYLOAD_CALLING} has format {data.get('format')!r}; this honed reads "
                f"format {_CALLING_FORMAT}: re-tune and save with this honed version"
            )
        return cls(
            Calling.from_json(json.dumps(data["calling"]), stored),
            tuple(data["input_names"]),
            str(data["out_spec"]),
            tuple(data["out_dtypes"]),
        )


def dtype_named(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"ONNX payload names an unknown dtype {name!r}; save it again")
    return dtype


def onnx_calling(plan: Plan, eager_out: Any, model: str) -> OnnxCalling:
    from torch.utils._pytree import tree_flatten, treespec_dumps

    leaves, out_spec = tree_flatten(eager_out)
    bad = [type(v).__name__ for v in leaves if not isinstance(v, torch.Tensor)]
    if bad or not leaves:
        raise TuneError(
            f"{model} returns {', '.join(bad) or 'no tensors'}; ONNX models return tensors only: "
            "return tensors (or containers of them), or use another backend"
        )
    try:
        spec_text = str(treespec_dumps(out_spec))
    except Exception as e:
        raise TuneError(
            f"{model}'s output structure {out_spec} cannot be stored ({e}); return tuples, lists "
            "or dicts of tensors, or use another backend"
        ) from e
    names = tuple(f"input_{i}" for i in range(len(plan.tensors)))
    return OnnxCalling(plan.calling, names, spec_text, tuple(str(t.dtype) for t in leaves))


def export_onnx(
    wrapper: FlatForward,
    plan: Plan,
    calling: OnnxCalling,
    opset: int | None,
    dynamo: bool,
    model: str,
) -> bytes:
    """The ONNX model of ``wrapper``: torch.onnx.export with the plan's Dims (dynamo), or the
    TorchScript exporter with the plan's named dynamic axes."""
    names = list(calling.input_names)
    try:
        with torch.no_grad():
            if dynamo:
                program = torch.onnx.export(
                    wrapper,
                    tuple(plan.tensors),
                    None,
                    dynamic_shapes=(tuple(plan.dims),),
                    input_names=names,
                    opset_version=opset,
                    dynamo=True,
                    verbose=False,
                )
                if program is None:
                    raise TuneError("torch.onnx.export returned no ONNXProgram")
                return bytes(program.model_proto.SerializeToString())
            return _export_torchscript(wrapper, plan, calling, opset)
    except TuneError:
        raise
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TuneError(
            f"torch.onnx.export could not export {model} ({type(e).__name__}: {first}); the "
            "exporter needs one graph of ops ONNX knows: replace data-dependent Python control "
            "flow with torch.cond or tensor ops, or use TorchInductorBackend"
        ) from e


def _export_torchscript(
    wrapper: FlatForward, plan: Plan, calling: OnnxCalling, opset: int | None
) -> bytes:
    """The TorchScript exporter (dynamo=False): dynamic axes named by their shared dimension."""
    import tempfile
    from pathlib import Path

    names = list(calling.input_names)
    axes = {
        name: {a: g for a, g in enumerate(groups) if g}
        for name, groups in zip(names, plan.groups, strict=True)
    }
    with tempfile.TemporaryDirectory(prefix="honed-onnx-") as tmp:
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(
            wrapper,
            tuple(plan.tensors),
            str(path),
            input_names=names,
            dynamic_axes={n: a for n, a in axes.items() if a},
            opset_version=opset,
            dynamo=False,
        )
        return path.read_bytes()
