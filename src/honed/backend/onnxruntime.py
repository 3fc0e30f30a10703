"""src/honed/backend/onnxruntime.py: ONNX Runtime: torch.onnx.export, then an InferenceSession.

The module is exported with ``torch.onnx.export(dynamo=True)`` (dynamic axes from the tuned
profile as ``torch.export.Dim``s, axes named alike sharing one Dim) and run by an
``onnxruntime.InferenceSession`` with the requested execution provider. The model is stored in
the artifact as ``model.onnx`` (weights included) and loads back without exporting again.

Calling convention: the AOTInductor backend's (see torch_inductor_aot.py). What is exported takes
the tensor inputs in flatten order of ``(args, kwargs)`` as ``input_0``, ``input_1``, ...;
non-tensor inputs are fixed at their recorded values. Every call is checked against what was
exported (structure, constants, tensor ranks, dtypes and shape ranges) and refused with an
InputError otherwise. Outputs come back as torch tensors of eager's dtypes, in eager's structure
(its pytree spec is recorded at build time).

I/O binding (``io_binding=True``, CUDA and TensorRT providers): the torch tensors' memory is
bound as the session's inputs (no copy), ONNX Runtime allocates the outputs on the GPU and they
become torch tensors through DLPack (no copy). The current torch stream is synchronized before
the run, since ONNX Runtime reads the inputs on its own stream. On CPU, plain ``session.run`` is
used: torch CPU tensors and numpy arrays share memory both ways, so it copies nothing either,
and it measured faster than binding here. ``io_binding=False`` uses plain ``session.run``
everywhere (CUDA tensors then go through host memory).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from typing import Any

import torch

from honed.backend.base import Availability, Backend, BackendConfig, GraphInfo, Sample
from honed.backend.torch_inductor_aot import (
    Calling,
    _check_tensors,
    _FlatForward,
    _Plan,
    _plan,
    _TensorCheck,
)
from honed.errors import BackendUnavailableError, ConfigError, InputError, TuneError

PAYLOAD_MODEL = "model.onnx"
PAYLOAD_CALLING = "calling.json"
_CALLING_FORMAT = 1

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"
_PROVIDERS = (CPU_PROVIDER, CUDA_PROVIDER, TENSORRT_PROVIDER)
_OPT_LEVELS = ("disabled", "basic", "extended", "all")
_MIN_DYNAMO_OPSET = 18

# Oldest versions known to work with torch.onnx.export(dynamo=True) as honed calls it.
_MIN_VERSIONS = {"onnx": (1, 16), "onnxruntime": (1, 17), "onnxscript": (0, 2)}
_MIN_TORCH = (2, 6)
_INSTALL = "pip install onnx onnxruntime onnxscript (or: pip install 'honed[onnx]')"


@dataclasses.dataclass
class ONNXRuntimeBackendConfig(BackendConfig):
    # The execution provider: CPUExecutionProvider, CUDAExecutionProvider (onnxruntime-gpu) or
    # TensorrtExecutionProvider (onnxruntime-gpu built with TensorRT; profiles from the tune).
    provider: str = CPU_PROVIDER
    # ONNX opset to export; None uses torch.onnx's default.
    opset: int | None = None
    # ONNX Runtime graph optimizations: disabled, basic, extended or all.
    graph_optimization_level: str = "all"
    # Threads for one operator; 0 lets ONNX Runtime choose.
    intra_op_threads: int = 0
    # CUDA/TensorRT: bind the torch tensors' memory as inputs and take outputs through DLPack
    # (no copies). CPU always uses plain run, which is zero-copy there and faster.
    io_binding: bool = True
    # Export with torch.export (dynamo) rather than the TorchScript exporter.
    dynamo: bool = True

    def __post_init__(self) -> None:
        if self.provider not in _PROVIDERS:
            raise ConfigError(
                f"ONNXRuntimeBackendConfig: provider {self.provider!r} is not supported; use one "
                f"of {', '.join(_PROVIDERS)}"
            )
        if self.graph_optimization_level not in _OPT_LEVELS:
            raise ConfigError(
                "ONNXRuntimeBackendConfig: graph_optimization_level "
                f"{self.graph_optimization_level!r} is not one of {', '.join(_OPT_LEVELS)}"
            )
        if self.intra_op_threads < 0:
            raise ConfigError(
                f"ONNXRuntimeBackendConfig: intra_op_threads={self.intra_op_threads} must be >= 0 "
                "(0 lets ONNX Runtime choose)"
            )
        if self.opset is not None and self.dynamo and self.opset < _MIN_DYNAMO_OPSET:
            raise ConfigError(
                f"ONNXRuntimeBackendConfig: opset={self.opset} is too old for the dynamo "
                f"exporter; use opset >= {_MIN_DYNAMO_OPSET}, None, or dynamo=False"
            )


# -- availability -------------------------------------------------------------------------------
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
    import importlib

    torch_version = torch.__version__
    if _version_tuple(torch_version) < _MIN_TORCH:
        wanted = ".".join(map(str, _MIN_TORCH))
        return Availability(
            False,
            f"torch {torch_version} has no torch.onnx.export(dynamo=True) as honed uses it",
            f"install torch {wanted} or newer",
        )
    for name, minimum in _MIN_VERSIONS.items():
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                return Availability(False, f"{name} is not installed", _INSTALL)
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


# -- the calling description stored next to the model -----------------------------------------
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
    def from_json(cls, text: str) -> OnnxCalling:
        data = json.loads(text)
        if data.get("format") != _CALLING_FORMAT:
            raise InputError(
                f"ONNX {PAYLOAD_CALLING} has format {data.get('format')!r}; this honed reads "
                f"format {_CALLING_FORMAT}: re-tune and save with this honed version"
            )
        return cls(
            Calling.from_json(json.dumps(data["calling"])),
            tuple(data["input_names"]),
            str(data["out_spec"]),
            tuple(data["out_dtypes"]),
        )


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"ONNX payload names an unknown dtype {name!r}; save it again")
    return dtype


# -- the callable ------------------------------------------------------------------------------
class OnnxCompiled:
    """An ONNX Runtime session, called like the module it was exported from."""

    def __init__(
        self, session: Any, model: bytes, calling: OnnxCalling, device: torch.device, bind: bool
    ) -> None:
        from torch.utils._pytree import tree_structure, treespec_loads

        self.session = session
        self.model = model
        self.calling = calling
        self.device = device
        self.io_binding = bind
        inner = calling.calling
        self._in_spec = treespec_loads(inner.in_spec) if inner.in_spec is not None else None
        self._checks = [_TensorCheck(g) for g in inner.guards]
        n = len(inner.tensor_positions)
        # Plain: the module takes n positional tensors and nothing else (no flattening needed).
        self._plain = inner.num_leaves == n and self._in_spec == tree_structure(((0,) * n, {}))
        self._out_spec = treespec_loads(calling.out_spec)
        self._out_dtypes = [_dtype(d) for d in calling.out_dtypes]
        # The exporter may drop an input the graph never reads: feed only the ones it has.
        present = {i.name for i in session.get_inputs()}
        self._feeds = [(i, n) for i, n in enumerate(calling.input_names) if n in present]
        self._outputs = [o.name for o in session.get_outputs()]
        if len(self._outputs) != len(self._out_dtypes):
            raise TuneError(
                f"the ONNX model has {len(self._outputs)} outputs but eager returns "
                f"{len(self._out_dtypes)} tensors; this is a honed bug: report it"
            )
        # On CPU, plain run is already zero-copy (torch and numpy share memory both ways) and
        # measured faster than I/O binding (about 28 vs 47 us per call for a tiny MLP), so
        # binding is used for CUDA tensors only.
        self._bind = bind and device.type != "cpu"
        self._bind_device = "cpu" if device.type == "cpu" else "cuda"
        self._device_id = device.index or 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils._pytree import tree_unflatten

        if self._plain and not kwargs and len(args) == len(self._checks):
            tensors = list(args)
        else:
            tensors = self._flatten(args, kwargs)
        try:
            _check_tensors(self._checks, tensors)
        except InputError as e:  # the shared check names AOTInductor; say what was called
            raise InputError(str(e).replace("AOTInductor package", "ONNX model", 1)) from None
        outs = self._run_bound(tensors) if self._bind else self._run_plain(tensors)
        cast = [
            t if t.dtype == want else t.to(want)
            for t, want in zip(outs, self._out_dtypes, strict=True)
        ]
        return tree_unflatten(cast, self._out_spec)

    def _flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        inner = self.calling.calling
        if len(leaves) != inner.num_leaves or (self._in_spec is not None and spec != self._in_spec):
            raise InputError(
                "ONNX model called with inputs structured differently from the ones it was "
                f"exported for (expected {self._in_spec or f'{inner.num_leaves} leaves'}, got "
                f"{spec}); call it like the recorded samples or tune with samples like these"
            )
        for pos, value in inner.constants.items():
            if leaves[pos] != value:
                raise InputError(
                    f"ONNX model was exported for non-tensor input {pos} == {value!r}, got "
                    f"{leaves[pos]!r}; tune with samples that use this value"
                )
        return [leaves[i] for i in inner.tensor_positions]

    def _run_bound(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        binding = self.session.io_binding()
        keep = []  # contiguous copies must outlive the run
        for i, name in self._feeds:
            t = tensors[i].contiguous()
            keep.append(t)
            binding.bind_input(
                name,
                self._bind_device,
                self._device_id,
                _numpy_dtype(t.dtype),
                tuple(t.shape),
                t.data_ptr(),
            )
        for name in self._outputs:
            binding.bind_output(name, self._bind_device, self._device_id)
        if self._bind_device == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        self.session.run_with_iobinding(binding)
        return [torch.from_dlpack(v) for v in binding.get_outputs()]

    def _run_plain(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        feeds = {name: tensors[i].detach().cpu().numpy() for i, name in self._feeds}
        outs = self.session.run(self._outputs, feeds)
        if self.device.type == "cpu":
            return [torch.from_numpy(o) for o in outs]
        return [torch.from_numpy(o).to(self.device) for o in outs]


@functools.cache
def _numpy_dtype(dtype: torch.dtype) -> Any:
    try:
        return torch.empty(0, dtype=dtype).numpy().dtype
    except TypeError as e:
        raise InputError(
            f"ONNX Runtime's Python API cannot bind {dtype} tensors (numpy has no such dtype); "
            "cast the input to float32/float16 before calling, or use another backend"
        ) from e


# -- the backend -------------------------------------------------------------------------------
class ONNXRuntimeBackend(Backend):
    """Exports the module to ONNX and runs it with ONNX Runtime on the configured provider."""

    requires = ("onnx", "onnxruntime", "onnxscript")

    config_class = ONNXRuntimeBackendConfig
    portability = 3
    saves_payload = True
    native_payload = False  # an ONNX graph: operators, no code
    build_cost = 1  # an export (a trace) and a session: no code generation
    config: ONNXRuntimeBackendConfig

    @classmethod
    def available(cls) -> Availability:
        try:
            return onnx_available()
        except Exception as e:  # never raise from available()
            return Availability(False, f"checking ONNX Runtime failed: {e}", _INSTALL)

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        if not example_inputs:
            raise InputError("ONNXRuntimeBackend needs at least one recorded sample")
        _require(onnx_available())
        cfg = self.config
        _check_provider(cfg.provider, graph.device)
        plan = _plan(example_inputs, graph, None)
        wrapper = _FlatForward(module, plan.calling, plan.spec, plan.template)
        wrapper.train(module.training)
        with torch.no_grad():
            eager_out = module(*plan.example.args, **plan.example.kwargs)
        calling = _onnx_calling(plan, eager_out, type(module).__name__)
        model = _export(wrapper, plan, calling, cfg, type(module).__name__)
        session = _session(model, cfg, graph, calling)
        return OnnxCompiled(session, model, calling, graph.device, cfg.io_binding)

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        if not isinstance(fn, OnnxCompiled):
            raise TypeError(
                "ONNXRuntimeBackend.export_payload takes what its build returned, got "
                f"{type(fn).__name__}"
            )
        return {PAYLOAD_MODEL: fn.model, PAYLOAD_CALLING: fn.calling.to_json().encode()}

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        del module  # the .onnx holds the weights and the shapes it serves
        missing = [n for n in (PAYLOAD_MODEL, PAYLOAD_CALLING) if n not in files]
        if missing:
            raise InputError(
                f"ONNXRuntimeBackend payload lacks {missing}; the artifact is incomplete: save "
                "it again"
            )
        _require(onnx_available())
        cfg = self.config
        _check_provider(cfg.provider, graph.device)
        calling = OnnxCalling.from_json(files[PAYLOAD_CALLING].decode())
        model = files[PAYLOAD_MODEL]
        session = _session(model, cfg, graph, calling)
        return OnnxCompiled(session, model, calling, graph.device, cfg.io_binding)


def _require(avail: Availability) -> None:
    if not avail:
        raise BackendUnavailableError(f"ONNXRuntimeBackend: {avail.reason}; {avail.fix}")


def _check_provider(provider: str, device: torch.device) -> None:
    import onnxruntime

    have = list(onnxruntime.get_available_providers())
    if provider not in have:
        package = "onnxruntime" if provider == CPU_PROVIDER else "onnxruntime-gpu"
        raise BackendUnavailableError(
            f"ONNXRuntimeBackend: execution provider {provider} is not available in onnxruntime "
            f"{onnxruntime.__version__} (it has {', '.join(have)}); install {package} with "
            f"{provider} support (only one onnxruntime package at a time), or pick one of those"
        )
    on_cpu = provider == CPU_PROVIDER
    if on_cpu != (device.type == "cpu"):
        raise ConfigError(
            f"ONNXRuntimeBackend: {provider} cannot serve a graph whose tensors are on "
            f"{device}; use {CPU_PROVIDER} for CPU tensors and {CUDA_PROVIDER} or "
            f"{TENSORRT_PROVIDER} for CUDA tensors"
        )


def _onnx_calling(plan: _Plan, eager_out: Any, model: str) -> OnnxCalling:
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


def _export(
    wrapper: _FlatForward,
    plan: _Plan,
    calling: OnnxCalling,
    cfg: ONNXRuntimeBackendConfig,
    model: str,
) -> bytes:
    names = list(calling.input_names)
    try:
        with torch.no_grad():
            if cfg.dynamo:
                program = torch.onnx.export(
                    wrapper,
                    tuple(plan.tensors),
                    None,
                    dynamic_shapes=(tuple(plan.dims),),
                    input_names=names,
                    opset_version=cfg.opset,
                    dynamo=True,
                    verbose=False,
                )
                if program is None:
                    raise TuneError("torch.onnx.export returned no ONNXProgram")
                return bytes(program.model_proto.SerializeToString())
            return _export_torchscript(wrapper, plan, calling, cfg.opset)
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
    wrapper: _FlatForward, plan: _Plan, calling: OnnxCalling, opset: int | None
) -> bytes:
    """The TorchScript exporter (dynamo=False): dynamic axes named by their shared dimension."""
    import tempfile
    from pathlib import Path

    names = list(calling.input_names)
    axes = {
        name: {a: g for a, g in enumerate(guard.groups) if g}
        for name, guard in zip(names, calling.calling.guards, strict=True)
    }
    with tempfile.TemporaryDirectory(prefix="honed-onnx-") as tmp:
        path = Path(tmp) / PAYLOAD_MODEL
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


_OPT_LEVEL_NAMES = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def _session(
    model: bytes, cfg: ONNXRuntimeBackendConfig, graph: GraphInfo, calling: OnnxCalling
) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = getattr(
        onnxruntime.GraphOptimizationLevel, _OPT_LEVEL_NAMES[cfg.graph_optimization_level]
    )
    options.intra_op_num_threads = cfg.intra_op_threads
    options.log_severity_level = 3  # errors only: ORT's warnings go to stderr otherwise
    providers = provider_list(cfg.provider, graph, calling)
    try:
        return onnxruntime.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TuneError(
            f"ONNX Runtime could not load the exported model with {cfg.provider} "
            f"({type(e).__name__}: {first}); try graph_optimization_level='basic', another "
            "opset, or another provider"
        ) from e


def provider_list(provider: str, graph: GraphInfo, calling: OnnxCalling) -> list[Any]:
    """ONNX Runtime's providers argument: the chosen one first, with its options.

    The TensorRT provider gets optimization profiles from the tuned min/opt/max shapes; CUDA and
    TensorRT fall back to the CPU provider for operators they lack (ONNX Runtime's own rule).
    """
    if provider == CPU_PROVIDER:
        return [CPU_PROVIDER]
    device = {"device_id": graph.device.index or 0}
    cuda = (CUDA_PROVIDER, dict(device))
    if provider == CUDA_PROVIDER:
        return [cuda, CPU_PROVIDER]
    return [
        (TENSORRT_PROVIDER, {**device, **tensorrt_profiles(graph, calling)}),
        cuda,
        CPU_PROVIDER,
    ]


def tensorrt_profiles(graph: GraphInfo, calling: OnnxCalling) -> dict[str, str]:
    """TensorRT provider options ``trt_profile_{min,opt,max}_shapes`` ("name:2x16,...")."""
    guards = calling.calling.guards
    if all(g.lo == g.hi for g in guards):
        return {}
    opt = list(graph.opt_shapes) if len(graph.opt_shapes) == len(guards) else [g.hi for g in guards]

    def spec(shapes: list[tuple[int, ...]]) -> str:
        return ",".join(
            f"{name}:{'x'.join(map(str, shape))}"
            for name, shape in zip(calling.input_names, shapes, strict=True)
        )

    return {
        "trt_profile_min_shapes": spec([g.lo for g in guards]),
        "trt_profile_opt_shapes": spec([tuple(s) for s in opt]),
        "trt_profile_max_shapes": spec([g.hi for g in guards]),
    }
