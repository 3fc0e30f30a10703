"""src/honed/backend/tensorrt.py: TensorRT: the module exported to ONNX, built into an engine.

The code follows the TensorRT 10/11 Python API (``trt.Builder``, ``OnnxParser``,
``IBuilderConfig``, named-tensor execution with ``execute_async_v3``). What needs no TensorRT is
unit-tested without it (tests/test_backend_tensorrt.py): the optimization profiles, the
translation of the config into builder flags and settings, and the availability verdicts.

Build: the module is exported to ONNX (_onnx_export.py, the calling convention of _calling.py,
dynamic axes from the tuned profile), parsed by ``trt.OnnxParser`` and built with one or more
optimization profiles: the tuned min/opt/max, or with ``num_profiles > 1`` the range of the first
dynamic dimension (usually the batch) split into narrower ranges, each with its own kernels.
At run time the narrowest profile that holds the call's shapes is chosen.

Precision (``precision``): TensorRT 11 builds strongly typed networks only (its FP16/BF16/INT8/FP8
builder flags were removed), so fp16/bf16 are put into the graph itself: the module is exported
in that dtype with float32 inputs and outputs. TensorRT 10 gets the same unless
``strongly_typed=False``, which uses its (deprecated) weak-typing flags instead. int8 and fp8 need
Q/DQ nodes in the model (explicit quantization, e.g. from NVIDIA ModelOpt); TensorRT 10 can also
calibrate int8 from the recorded samples (implicit quantization, deprecated).

The payload is the serialized engine (``model.plan``) and the calling description; loading it
deserializes the engine without exporting or building again. Engines are specific to the GPU
(and TensorRT version) they were built on, unless ``hardware_compatibility_level`` says
otherwise.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from honed.backend._calling import CALLING_FILE, GuardedPayload
from honed.backend._export import FlatForward, plan
from honed.backend._onnx_export import (
    OnnxCalling,
    dtype_named,
    export_onnx,
    onnx_available,
    onnx_calling,
)
from honed.backend._precision import CastModule
from honed.backend._tensorrt_env import cc_verdict, probe
from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    eager_output,
)
from honed.errors import BackendUnavailableError, ConfigError, InputError, TuneError
from honed.pipeline.correctness import REDUCED, Tolerance

log = logging.getLogger("honed")

PAYLOAD_ENGINE = "model.plan"
PAYLOAD_CALLING = CALLING_FILE

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "int8", "fp8")
HARDWARE_COMPATIBILITY = {
    "none": "NONE",
    "ampere_plus": "AMPERE_PLUS",
    "same_compute_capability": "SAME_COMPUTE_CAPABILITY",
}
_LOW_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_WEAK_FLAGS = {"tf32": "TF32", "fp16": "FP16", "bf16": "BF16", "int8": "INT8", "fp8": "FP8"}
# Oldest TensorRT with the named-tensor API honed uses.
MIN_TENSORRT = (10, 0)
QUANTIZED = Tolerance(atol=0.1, rtol=0.1, min_cosine=0.99)
_INSTALL = "pip install tensorrt (matching your CUDA: tensorrt-cu12 or tensorrt-cu13)"


@dataclasses.dataclass
class TensorRTBackendConfig(BackendConfig):
    # Export to ONNX with torch.export (dynamo) rather than the TorchScript exporter.
    use_dynamo: bool = True
    # ONNX opset; None uses torch.onnx's default.
    opset: int | None = None
    # fp32, tf32, fp16, bf16, int8 or fp8 (see the module docstring).
    precision: str = "fp32"
    # None: strongly typed (precision in the graph); False: TensorRT 10's weak-typing flags.
    strongly_typed: bool | None = None
    # Builder workspace limit in bytes; None leaves TensorRT's default (the GPU's memory).
    workspace_size: int | None = None
    # Builder optimization level 0-5 (TensorRT's default 3; higher builds longer, may run faster).
    optimization_level: int = 3
    # none, ampere_plus or same_compute_capability: which GPUs the engine may run on.
    hardware_compatibility_level: str = "none"
    # A timing-cache file: read before the build when it exists, written after it.
    timing_cache: str | None = None
    # Optimization profiles: the tuned range of the first dynamic dimension split into this many.
    num_profiles: int = 1
    # Replay each input shape's execution as a CUDA graph.
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        name = "TensorRTBackendConfig"
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"{name}: precision {self.precision!r} is not one of {', '.join(PRECISIONS)}"
            )
        if self.hardware_compatibility_level not in HARDWARE_COMPATIBILITY:
            raise ConfigError(
                f"{name}: hardware_compatibility_level {self.hardware_compatibility_level!r} is "
                f"not one of {', '.join(HARDWARE_COMPATIBILITY)}"
            )
        if not 0 <= self.optimization_level <= 5:
            raise ConfigError(f"{name}: optimization_level={self.optimization_level} not in 0-5")
        if self.workspace_size is not None and self.workspace_size <= 0:
            raise ConfigError(f"{name}: workspace_size={self.workspace_size} must be > 0 bytes")
        if not 1 <= self.num_profiles <= 8:
            raise ConfigError(f"{name}: num_profiles={self.num_profiles} not in 1-8")


# -- availability (pure parts first) ------------------------------------------------------------
def _version_tuple(text: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in text.split(".")[:2]]
    parts += [0] * (2 - len(parts))
    return parts[0], parts[1]


def tensorrt_verdict(
    trt_version: str | None,
    import_error: str | None,
    torch_cuda: str | None,
    cuda_available: bool,
) -> Availability:
    """The verdict from what was found: TensorRT's version or import error, torch's CUDA."""
    if trt_version is None and import_error is None:
        return Availability(False, "TensorRT is not installed", _INSTALL)
    if import_error is not None:
        return Availability(
            False,
            f"tensorrt {trt_version or ''} fails to import: {import_error}".replace("  ", " "),
            "reinstall tensorrt for this CUDA (its libnvinfer must match the tensorrt wheel)",
        )
    assert trt_version is not None
    if _version_tuple(trt_version) < MIN_TENSORRT:
        return Availability(
            False,
            f"tensorrt {trt_version} is older than 10.0 (honed uses the named-tensor API)",
            "pip install -U tensorrt",
        )
    if torch_cuda is None:
        return Availability(
            False,
            f"TensorRT runs on CUDA GPUs and torch {torch.__version__} is a CPU-only build",
            "install a CUDA build of torch",
        )
    if not cuda_available:
        return Availability(
            False, "torch cannot initialize CUDA", "run honed doctor --device cuda for why"
        )
    return Availability(True)


@functools.cache
def tensorrt_available() -> Availability:
    """TensorRT imports, is new enough, and torch has CUDA; then the ONNX exporter. Cached."""
    version, error = probe("tensorrt")
    verdict = tensorrt_verdict(version, error, torch.version.cuda, _cuda_available())
    if not verdict:
        return verdict
    onnx = onnx_available()
    if not onnx:
        return Availability(False, f"TensorRTBackend exports through ONNX: {onnx.reason}", onnx.fix)
    return Availability(True)


def _cuda_available() -> bool:
    return torch.version.cuda is not None and torch.cuda.is_available()


# -- optimization profiles (pure) ---------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Profile:
    """One optimization profile: per input, its min, opt and max shape."""

    min: tuple[tuple[int, ...], ...]
    opt: tuple[tuple[int, ...], ...]
    max: tuple[tuple[int, ...], ...]


def split_range(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi] in at most ``n`` ranges with power-of-two upper ends (1-64, 3 -> 1-4 5-16 17-64)."""
    if n <= 1 or hi <= lo:
        return [(lo, hi)]
    import math

    span = math.log2(hi) - math.log2(max(lo, 1))
    ends = sorted(
        {min(hi, max(lo, 2 ** round(math.log2(max(lo, 1)) + span * (k + 1) / n))) for k in range(n)}
    )
    ends[-1] = hi
    ranges, start = [], lo
    for end in ends:
        if end >= start:
            ranges.append((start, end))
            start = end + 1
    return ranges


def optimization_profiles(
    lo: list[tuple[int, ...]],
    opt: list[tuple[int, ...]],
    hi: list[tuple[int, ...]],
    groups: list[tuple[str, ...]],
    n: int,
) -> list[Profile]:
    """Profiles from the tuned min/opt/max: the first dynamic dimension split into ``n`` ranges.

    ``groups[i][a]`` names the shared dimension of axis ``a`` of input ``i`` ("" for none): all
    axes of the split dimension take the same sub-range. Each profile's opt is the tuned opt
    where it falls in the sub-range, else the sub-range's top.
    """
    split: tuple[str, int, int] | None = None  # (group, input, axis) of the dimension to split
    for i, (a_lo, a_hi) in enumerate(zip(lo, hi, strict=True)):
        for axis, (x, y) in enumerate(zip(a_lo, a_hi, strict=True)):
            if x != y and split is None:
                group = groups[i][axis] if i < len(groups) and axis < len(groups[i]) else ""
                split = (group, i, axis)
    if split is None or n <= 1:
        return [Profile(tuple(lo), tuple(opt), tuple(hi))]
    group, si, sa = split

    def members(i: int, axis: int) -> bool:
        if group:
            return i < len(groups) and axis < len(groups[i]) and groups[i][axis] == group
        return (i, axis) == (si, sa)

    profiles = []
    for a, b in split_range(lo[si][sa], hi[si][sa], n):
        p_lo, p_opt, p_hi = [], [], []
        for i in range(len(lo)):
            s_lo, s_opt, s_hi = list(lo[i]), list(opt[i]), list(hi[i])
            for axis in range(len(s_lo)):
                if members(i, axis):
                    s_lo[axis], s_hi[axis] = a, b
                    s_opt[axis] = s_opt[axis] if a <= s_opt[axis] <= b else b
            p_lo.append(tuple(s_lo))
            p_opt.append(tuple(s_opt))
            p_hi.append(tuple(s_hi))
        profiles.append(Profile(tuple(p_lo), tuple(p_opt), tuple(p_hi)))
    return profiles


def engine_profile(per_input: list[Any]) -> Profile:
    """A Profile from ``get_tensor_profile_shape`` of each input ([min, opt, max] dims)."""
    mins, opts, maxs = [], [], []
    for lo, opt, hi in per_input:
        mins.append(tuple(int(d) for d in lo))
        opts.append(tuple(int(d) for d in opt))
        maxs.append(tuple(int(d) for d in hi))
    return Profile(tuple(mins), tuple(opts), tuple(maxs))


def choose_profile(profiles: list[Profile], shapes: list[tuple[int, ...]]) -> int | None:
    """The narrowest profile that holds ``shapes`` (its index), or None."""
    best: tuple[int, int] | None = None
    for k, p in enumerate(profiles):
        fits = all(
            all(a <= s <= b for a, s, b in zip(p_lo, shape, p_hi, strict=True))
            for p_lo, shape, p_hi in zip(p.min, shapes, p.max, strict=True)
        )
        if fits:
            width = sum(
                b - a
                for p_hi, p_lo in zip(p.max, p.min, strict=True)
                for a, b in zip(p_lo, p_hi, strict=True)
            )
            if best is None or width < best[0]:
                best = (width, k)
    return None if best is None else best[1]


# -- config -> builder settings (pure) ----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BuildSettings:
    """What the builder is told, as names of TensorRT's enums (tests check these without it)."""

    network_flags: tuple[str, ...]  # NetworkDefinitionCreationFlag names
    builder_flags: tuple[str, ...]  # BuilderFlag names
    memory_pool_limits: dict[str, int]  # MemoryPoolType name -> bytes
    optimization_level: int
    hardware_compatibility_level: str  # HardwareCompatibilityLevel name
    export_dtype: torch.dtype | None  # the module runs in this dtype inside the ONNX graph
    calibrate_int8: bool  # implicit INT8: calibrate from the recorded samples
    needs_qdq: bool  # the ONNX model must carry Q/DQ nodes


def build_settings(cfg: TensorRTBackendConfig, trt_major: int, has_qdq: bool) -> BuildSettings:
    """Translate ``cfg`` for TensorRT ``trt_major`` (10 or 11), given whether the exported model
    has Q/DQ nodes. Raises ConfigError for what that TensorRT cannot do."""
    strong = cfg.strongly_typed is not False
    if trt_major >= 11 and not strong:
        raise ConfigError(
            "TensorRTBackendConfig(strongly_typed=False): TensorRT 11 builds strongly typed "
            "networks only (its precision flags were removed); leave strongly_typed=None"
        )
    precision = cfg.precision
    quantized = precision in ("int8", "fp8")
    needs_qdq = quantized and (strong or precision == "fp8")
    if needs_qdq and not has_qdq:
        calibrate = precision == "int8" and trt_major < 11
        raise ConfigError(
            f"TensorRTBackend(precision={precision}): TensorRT "
            f"{'11 ' if trt_major >= 11 else ''}builds {precision} only from Q/DQ "
            "(QuantizeLinear/DequantizeLinear) nodes in the model, and the exported model has "
            "none: quantize it first (e.g. NVIDIA ModelOpt), use precision='fp16'/'bf16'"
            + (", or strongly_typed=False to calibrate int8 on TensorRT 10" if calibrate else "")
        )
    network_flags: tuple[str, ...] = ("STRONGLY_TYPED",) if strong and trt_major < 11 else ()
    builder_flags: list[str] = []
    export_dtype = _LOW_DTYPES.get(precision) if strong else None
    if strong and precision == "tf32" and trt_major < 11:
        builder_flags.append("TF32")  # TF32 is a math mode, not a type: still a flag on 10.x
    if not strong and precision in _WEAK_FLAGS:
        builder_flags.append(_WEAK_FLAGS[precision])
    limits = {"WORKSPACE": cfg.workspace_size} if cfg.workspace_size is not None else {}
    return BuildSettings(
        network_flags=network_flags,
        builder_flags=tuple(builder_flags),
        memory_pool_limits=limits,
        optimization_level=cfg.optimization_level,
        hardware_compatibility_level=HARDWARE_COMPATIBILITY[cfg.hardware_compatibility_level],
        export_dtype=export_dtype,
        calibrate_int8=precision == "int8" and not strong and not has_qdq,
        needs_qdq=needs_qdq,
    )


def apply_settings(trt: Any, builder: Any, config: Any, settings: BuildSettings) -> None:
    """Set ``settings`` on a TensorRT IBuilderConfig (``trt`` is the tensorrt module)."""
    for name in settings.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    for pool, limit in settings.memory_pool_limits.items():
        config.set_memory_pool_limit(getattr(trt.MemoryPoolType, pool), int(limit))
    config.builder_optimization_level = settings.optimization_level
    if settings.hardware_compatibility_level != "NONE":
        config.hardware_compatibility_level = getattr(
            trt.HardwareCompatibilityLevel, settings.hardware_compatibility_level
        )
    del builder


def network_flags(trt: Any, settings: BuildSettings) -> int:
    """The ``create_network`` flags bitmask."""
    flags = 0
    for name in settings.network_flags:
        flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
    return flags


def add_profiles(
    trt: Any, builder: Any, config: Any, names: list[str], profiles: list[Profile]
) -> list[Any]:
    """One IOptimizationProfile per Profile, each input named in ``names`` set on it."""
    made = []
    for p in profiles:
        profile = builder.create_optimization_profile()
        for name, a, o, b in zip(names, p.min, p.opt, p.max, strict=True):
            profile.set_shape(name, a, o, b)
        config.add_optimization_profile(profile)
        made.append(profile)
    del trt
    return made


def has_qdq(model: bytes) -> bool:
    """Whether an ONNX model has QuantizeLinear/DequantizeLinear nodes (explicit quantization)."""
    import onnx

    proto = onnx.load_from_string(model)
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in proto.graph.node)


# -- TensorRT at run time -------------------------------------------------------------------
_TRT_TO_TORCH = {
    "FLOAT": torch.float32,
    "HALF": torch.float16,
    "BF16": torch.bfloat16,
    "INT8": torch.int8,
    "INT32": torch.int32,
    "INT64": torch.int64,
    "BOOL": torch.bool,
    "UINT8": torch.uint8,
    "FP8": torch.float8_e4m3fn,
}


class TrtCompiled(GuardedPayload):
    """A TensorRT engine, called like the module it was exported from."""

    what = "TensorRT engine"

    def __init__(
        self, engine_bytes: bytes, calling: OnnxCalling, device: torch.device, cuda_graphs: bool
    ) -> None:
        import tensorrt as trt
        from torch.utils._pytree import treespec_loads

        super().__init__(calling.calling)
        self.engine_bytes = engine_bytes
        self.onnx_calling = calling
        self.device = device
        self.cuda_graphs = cuda_graphs
        self._trt = trt
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self._runtime.deserialize_cuda_engine(engine_bytes)
        if self.engine is None:
            raise TuneError(
                "TensorRT could not deserialize the engine (built for another GPU or TensorRT "
                "version?); rebuild with honed.load(on_incompatible='rebuild')"
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = [self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names]
        self._inputs = [n for n, inp in zip(names, is_input, strict=True) if inp]
        self._outputs = [n for n, inp in zip(names, is_input, strict=True) if not inp]
        self._feeds = [(i, n) for i, n in enumerate(calling.input_names) if n in set(self._inputs)]
        self._profiles = [
            engine_profile([self.engine.get_tensor_profile_shape(n, k) for _, n in self._feeds])
            for k in range(self.engine.num_optimization_profiles)
        ]
        self._out_dtypes = [dtype_named(d) for d in calling.out_dtypes]
        self._out_spec = treespec_loads(calling.out_spec)
        self._active: int | None = None
        self._graphs: dict[Any, Any] = {}

    def run(self, tensors: list[Any]) -> Any:
        from torch.utils._pytree import tree_unflatten

        feeds = [tensors[i].contiguous() for i, _ in self._feeds]
        shapes = [tuple(t.shape) for t in feeds]
        if self.cuda_graphs:
            outs = self._replay(feeds, shapes)
        else:
            outs = self._run(feeds, shapes)
        cast = [o if o.dtype == d else o.to(d) for o, d in zip(outs, self._out_dtypes, strict=True)]
        return tree_unflatten(cast, self._out_spec)

    def _prepare(
        self, feeds: list[torch.Tensor], shapes: list[tuple[int, ...]]
    ) -> list[torch.Tensor]:
        stream = torch.cuda.current_stream(self.device).cuda_stream
        profile = choose_profile(self._profiles, shapes) if self._profiles else 0
        if profile is None:
            raise InputError(
                f"TensorRT engine has no optimization profile for input shapes {shapes}; tune "
                "with samples that cover them"
            )
        if profile != self._active:
            self.context.set_optimization_profile_async(profile, stream)
            self._active = profile
        for (_, name), t, shape in zip(self._feeds, feeds, shapes, strict=True):
            self.context.set_input_shape(name, shape)
            self.context.set_tensor_address(name, t.data_ptr())
        outs = []
        for name in self._outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(s < 0 for s in shape):
                raise TuneError(
                    f"TensorRT output {name} has a data-dependent shape {shape}; honed's "
                    "TensorRTBackend needs output shapes known from the input shapes"
                )
            dtype = _TRT_TO_TORCH[self.engine.get_tensor_dtype(name).name]
            out = torch.empty(shape, dtype=dtype, device=self.device)
            self.context.set_tensor_address(name, out.data_ptr())
            outs.append(out)
        return outs

    def _run(self, feeds: list[torch.Tensor], shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
        outs = self._prepare(feeds, shapes)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        if not self.context.execute_async_v3(stream):
            raise TuneError("TensorRT execute_async_v3 failed (see TensorRT's log above)")
        return outs

    def _replay(
        self, feeds: list[torch.Tensor], shapes: list[tuple[int, ...]]
    ) -> list[torch.Tensor]:
        key = tuple(shapes)
        entry = self._graphs.get(key)
        if entry is None:
            static_in = [t.clone() for t in feeds]
            self._run(static_in, shapes)  # TensorRT allocates lazily on the first run
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream(self.device)
            with torch.cuda.stream(stream):
                static_out = self._prepare(static_in, shapes)
                with torch.cuda.graph(graph, stream=stream):
                    self.context.execute_async_v3(stream.cuda_stream)
            entry = self._graphs[key] = (graph, static_in, static_out)
            self._active = None  # the profile must be set again outside the capture
        graph, static_in, static_out = entry
        for dst, src in zip(static_in, feeds, strict=True):
            dst.copy_(src)
        graph.replay()
        return [o.clone() for o in static_out]


# -- the backend -------------------------------------------------------------------------------
class TensorRTBackend(Backend):
    """Exports the module to ONNX and builds a TensorRT engine with the tuned profiles."""

    config_class = TensorRTBackendConfig
    portability = 6
    saves_payload = True
    native_payload = True  # a serialized TensorRT engine
    build_cost = 3
    requires = ("tensorrt",)
    imports = ("torch._dynamo",)  # the ONNX export traces with Dynamo
    config: TensorRTBackendConfig

    @classmethod
    def available(cls) -> Availability:
        return tensorrt_available()

    def supports(self, device: torch.device) -> Availability:
        if device.type != "cuda":
            return Availability(
                False, f"TensorRT runs on CUDA GPUs, not {device.type}", "tune on a CUDA device"
            )
        if not torch.cuda.is_available():
            return Availability(False, "CUDA is not available", "run honed doctor --device cuda")
        return cc_verdict(
            torch.cuda.get_device_capability(device), self.config.hardware_compatibility_level
        )

    def tolerance(self) -> Tolerance | None:
        if self.config.precision in ("int8", "fp8"):
            return QUANTIZED
        if self.config.precision in ("fp16", "bf16", "tf32"):
            return REDUCED
        return None

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        import tensorrt as trt

        if not example_inputs:
            raise InputError("TensorRTBackend needs at least one recorded sample")
        _require(self.available())
        _require(self.supports(graph.device))
        cfg = self.config
        major = _version_tuple(trt.__version__)[0]
        # Translate once without Q/DQ knowledge to learn the export dtype (errors come later).
        strong = cfg.strongly_typed is not False
        export_dtype = _LOW_DTYPES.get(cfg.precision) if strong else None
        exported_plan = plan(example_inputs, graph, None, "TensorRTBackend")
        example = exported_plan.example
        eager_out = eager_output(module, example)
        inner = module
        if export_dtype is not None:
            leaves = torch.utils._pytree.tree_leaves(eager_out)
            out_dtypes = [t.dtype if isinstance(t, torch.Tensor) else None for t in leaves]
            inner = CastModule(copy.deepcopy(module).to(export_dtype), export_dtype, out_dtypes)
        wrapper = FlatForward(inner, exported_plan)
        name = type(module).__name__
        calling = onnx_calling(exported_plan, eager_out, name)
        model = export_onnx(wrapper, exported_plan, calling, cfg.opset, cfg.use_dynamo, name)
        settings = build_settings(cfg, major, has_qdq(model))
        lo, hi = exported_plan.lo, exported_plan.hi
        opt = list(graph.opt_shapes) if len(graph.opt_shapes) == len(lo) else hi
        profiles = optimization_profiles(
            lo, [tuple(s) for s in opt], hi, exported_plan.groups, cfg.num_profiles
        )
        tensors = exported_plan.tensors
        engine = _build_engine(trt, model, calling, settings, profiles, cfg, tensors)
        return TrtCompiled(engine, calling, graph.device, cfg.cuda_graphs)

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        if not isinstance(fn, TrtCompiled):
            raise TypeError(
                f"TensorRTBackend.export_payload takes what its build returned, got "
                f"{type(fn).__name__}"
            )
        calling = fn.onnx_calling.to_json().encode()
        return {PAYLOAD_ENGINE: fn.engine_bytes, PAYLOAD_CALLING: calling}

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        del module  # the engine holds the weights
        missing = [n for n in (PAYLOAD_ENGINE, PAYLOAD_CALLING) if n not in files]
        if missing:
            raise InputError(f"TensorRTBackend payload lacks {missing}: save it again")
        _require(self.available())
        _require(self.supports(graph.device))
        calling = OnnxCalling.from_json(files[PAYLOAD_CALLING].decode(), graph.profile)
        return TrtCompiled(files[PAYLOAD_ENGINE], calling, graph.device, self.config.cuda_graphs)


def _build_engine(
    trt: Any,
    model: bytes,
    calling: Any,
    settings: BuildSettings,
    profiles: list[Profile],
    cfg: TensorRTBackendConfig,
    examples: list[torch.Tensor],
) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(network_flags(trt, settings))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(model):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TuneError(
            f"TensorRT's ONNX parser refused the exported model: {'; '.join(errors[:3])}; "
            "try another opset or use_dynamo=False"
        )
    config = builder.create_builder_config()
    apply_settings(trt, builder, config, settings)
    present = {network.get_input(i).name for i in range(network.num_inputs)}
    feeds = [(n, i) for i, n in enumerate(calling.input_names) if n in present]
    kept = [
        Profile(
            tuple(p.min[i] for _, i in feeds),
            tuple(p.opt[i] for _, i in feeds),
            tuple(p.max[i] for _, i in feeds),
        )
        for p in profiles
    ]
    made = add_profiles(trt, builder, config, [n for n, _ in feeds], kept)
    if settings.calibrate_int8:
        config.set_calibration_profile(made[0])
        config.int8_calibrator = _calibrator(trt, [examples[i] for _, i in feeds])
    cache_path = Path(cfg.timing_cache) if cfg.timing_cache else None
    blob = cache_path.read_bytes() if cache_path is not None and cache_path.exists() else b""
    cache = config.create_timing_cache(blob)
    config.set_timing_cache(cache, ignore_mismatch=False)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise TuneError(
            "TensorRT could not build an engine (see TensorRT's log above); try a larger "
            "workspace_size, optimization_level=3 or precision='fp32'"
        )
    if cache_path is not None:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_bytes(bytes(memoryview(config.get_timing_cache().serialize())))
    return bytes(memoryview(plan))


def _calibrator(trt: Any, tensors: list[torch.Tensor]) -> Any:
    """An entropy calibrator that feeds the recorded example once (TensorRT 10's implicit INT8)."""

    class Calibrator(trt.IInt8EntropyCalibrator2):  # type: ignore[misc]  # trt: imported at run time
        def __init__(self) -> None:
            super().__init__()
            self.batches = [[t.contiguous() for t in tensors]]

        def get_batch_size(self) -> int:
            return int(tensors[0].shape[0]) if tensors and tensors[0].dim() else 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            if not self.batches:
                return None
            return [t.data_ptr() for t in self.batches.pop()]

        def read_calibration_cache(self) -> None:
            return None

        def write_calibration_cache(self, cache: Any) -> None:
            del cache

    return Calibrator()


def _require(avail: Availability) -> None:
    if not avail:
        raise BackendUnavailableError(
            f"TensorRTBackend: {avail.reason}" + (f"; {avail.fix}" if avail.fix else "")
        )
