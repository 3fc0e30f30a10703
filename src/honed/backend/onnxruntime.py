"""src/honed/backend/onnxruntime.py: ONNX Runtime: torch.onnx.export, then an InferenceSession.

The module is exported with ``torch.onnx.export(dynamo=True)`` (dynamic axes from the tuned
profile as ``torch.export.Dim``s, axes named alike sharing one Dim) and run by an
``onnxruntime.InferenceSession`` with the requested execution provider. The model is stored in
the artifact as ``model.onnx`` (weights included) and loads back without exporting again.

Calling convention: that of every payload backend (see _calling.py). What is exported takes the
tensor inputs in flatten order of ``(args, kwargs)`` as ``input_0``, ``input_1``, ...; non-tensor
inputs are fixed at their recorded values; the engine's guard refuses other calls with an
InputError. Outputs come back as torch tensors of eager's dtypes, in eager's structure (its
pytree spec is recorded at build time).

I/O binding (``io_binding=True``, CUDA and TensorRT providers): the torch tensors' memory is
bound as the session's inputs (no copy), ONNX Runtime allocates the outputs on the GPU and they
become torch tensors through DLPack (no copy). The current torch stream is synchronized before
the run, since ONNX Runtime reads the inputs on its own stream. On CPU, plain ``session.run`` is
used: torch CPU tensors and numpy arrays share memory both ways, so it copies nothing either,
and it skips binding's per-call bookkeeping. ``io_binding=False`` uses plain ``session.run``
everywhere (CUDA tensors then go through host memory).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.dlpack import from_dlpack

from honed.backend._calling import CALLING_FILE, GuardedPayload
from honed.backend._export import FlatForward, plan
from honed.backend._onnx_export import (
    OnnxCalling,
    dtype_named,
    export_onnx,
    onnx_available,
    onnx_calling,
    runtime_available,
)
from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    eager_output,
)
from honed.errors import BackendUnavailableError, ConfigError, InputError, TuneError

PAYLOAD_MODEL = "model.onnx"
PAYLOAD_CALLING = CALLING_FILE

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"
_PROVIDERS = (CPU_PROVIDER, CUDA_PROVIDER, TENSORRT_PROVIDER)
_OPT_LEVELS = ("disabled", "basic", "extended", "all")
_MIN_DYNAMO_OPSET = 18


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
    # Whether those threads spin between calls, waiting for work (ONNX Runtime's own default).
    # Off here: spinning threads take the cores from torch's threads in the same process, the
    # program's own and those of the candidates measured beside this one (docs/backends.md).
    spinning: bool = False
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


# -- the callable ------------------------------------------------------------------------------
class OnnxCompiled(GuardedPayload):
    """An ONNX Runtime session, called like the module it was exported from."""

    what = "ONNX model"

    def __init__(
        self, session: Any, model: bytes, calling: OnnxCalling, device: torch.device, bind: bool
    ) -> None:
        from torch.utils._pytree import treespec_loads

        super().__init__(calling.calling)
        self.session = session
        self.model = model
        self.onnx_calling = calling
        self.device = device
        self.io_binding = bind
        self._out_spec = treespec_loads(calling.out_spec)
        self._out_dtypes = [dtype_named(d) for d in calling.out_dtypes]
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
        # costs less per call than binding, so binding is used for CUDA tensors only.
        self._bind = bind and device.type != "cpu"
        self._bind_device = "cpu" if device.type == "cpu" else "cuda"
        self._device_id = device.index or 0

    def run(self, tensors: list[Any]) -> Any:
        from torch.utils._pytree import tree_unflatten

        outs = self._run_bound(tensors) if self._bind else self._run_plain(tensors)
        cast = [
            t if t.dtype == want else t.to(want)
            for t, want in zip(outs, self._out_dtypes, strict=True)
        ]
        return tree_unflatten(cast, self._out_spec)

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
        return [from_dlpack(v) for v in binding.get_outputs()]

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
    imports = ("torch._dynamo",)  # the export traces with Dynamo
    runs_with = ("onnxruntime",)  # the session, where the package is installed
    native_payload = False  # an ONNX graph: operators, no code
    build_cost = 1  # an export (a trace) and a session: no code generation
    config: ONNXRuntimeBackendConfig

    @classmethod
    def available(cls) -> Availability:
        return onnx_available()

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        if not example_inputs:
            raise InputError("ONNXRuntimeBackend needs at least one recorded sample")
        _require(runtime_available())
        cfg = self.config
        _check_provider(cfg.provider, graph.device)
        exported_plan = plan(example_inputs, graph, None, "ONNXRuntimeBackend")
        wrapper = FlatForward(module, exported_plan)
        wrapper.train(module.training)
        example = exported_plan.example
        calling = onnx_calling(exported_plan, eager_output(module, example), type(module).__name__)
        model = export_onnx(
            wrapper, exported_plan, calling, cfg.opset, cfg.dynamo, type(module).__name__
        )
        session = _session(model, cfg, graph, calling)
        return OnnxCompiled(session, model, calling, graph.device, cfg.io_binding)

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        if not isinstance(fn, OnnxCompiled):
            raise TypeError(
                "ONNXRuntimeBackend.export_payload takes what its build returned, got "
                f"{type(fn).__name__}"
            )
        return {PAYLOAD_MODEL: fn.model, PAYLOAD_CALLING: fn.onnx_calling.to_json().encode()}

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
        _require(runtime_available())
        cfg = self.config
        _check_provider(cfg.provider, graph.device)
        calling = OnnxCalling.from_json(files[PAYLOAD_CALLING].decode(), graph.profile)
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
    options.add_session_config_entry(
        "session.intra_op.allow_spinning", "1" if cfg.spinning else "0"
    )
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
    lo, hi = calling.calling.min_shapes(), calling.calling.max_shapes()
    if lo == hi:
        return {}
    opt = list(graph.opt_shapes) if len(graph.opt_shapes) == len(lo) else hi

    def spec(shapes: list[tuple[int, ...]]) -> str:
        return ",".join(
            f"{name}:{'x'.join(map(str, shape))}"
            for name, shape in zip(calling.input_names, shapes, strict=True)
        )

    return {
        "trt_profile_min_shapes": spec(lo),
        "trt_profile_opt_shapes": spec([tuple(s) for s in opt]),
        "trt_profile_max_shapes": spec(hi),
    }
