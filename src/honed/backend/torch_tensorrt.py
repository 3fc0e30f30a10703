"""src/honed/backend/torch_tensorrt.py: Torch-TensorRT, just in time and ahead of time.

The code follows the torch_tensorrt 2.x API; what needs no Torch-TensorRT is unit-tested without
it (config translation, version verdicts; tests/test_backend_tensorrt.py).

  TorchTensorRTJitBackend  ``torch.compile(backend="torch_tensorrt", options=compile_config)``:
                           engines are built on the first call; nothing is stored (honed.load
                           compiles again).
  TorchTensorRTAotBackend  ``torch_tensorrt.dynamo.compile`` of the ``torch.export``-ed module
                           (``ir="dynamo"``), with min/opt/max input shapes from the tuned
                           profile. The result is stored as an exported program
                           (``torch_tensorrt.save(..., output_format="exported_program")``, the
                           engines inside as serialized bytes) and loaded with
                           ``torch.export.load``: never a pickle. ``ir="ts"``/``"fx"`` results
                           have no such format: they are rebuilt on load.

``compile_config`` takes Torch-TensorRT's ``CompilationSettings`` (as in the seed) or a dict of
its fields; it is kept as a dict of the fields that differ from the defaults, so the recipe is
plain JSON. The seed's ``pickle_protocol`` is accepted and ignored (nothing is pickled).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import io
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from honed.backend._calling import CALLING_FILE, Calling, GuardedPayload
from honed.backend._export import FlatForward, plan
from honed.backend._tensorrt_env import cc_verdict, probe
from honed.backend.base import Availability, Backend, BackendConfig, GraphInfo, Sample
from honed.errors import BackendUnavailableError, ConfigError, InputError, TuneError
from honed.pipeline.correctness import REDUCED, Tolerance

log = logging.getLogger("honed")

IRS = ("dynamo", "ts", "fx")
PAYLOAD_PROGRAM = "model.ep"
PAYLOAD_CALLING = CALLING_FILE
_INSTALL = "pip install torch-tensorrt=={minor}.* (the release made for torch {minor})"
# Settings whose value is a set in CompilationSettings (JSON keeps them as lists).
_SET_FIELDS = ("enabled_precisions", "torch_executed_ops")


# -- compile_config: CompilationSettings or dict <-> JSON-able dict (pure) ----------------------
def settings_dict(compile_config: Any) -> dict[str, Any]:
    """``compile_config`` as a JSON-able dict: a dict as it is, a CompilationSettings dataclass
    as the fields that differ from its defaults. Sets become sorted lists, torch_tensorrt
    dtypes torch dtypes; anything else that JSON cannot hold is a ConfigError."""
    if compile_config is None:
        return {}
    if isinstance(compile_config, dict):
        items = dict(compile_config)
    elif dataclasses.is_dataclass(compile_config) and not isinstance(compile_config, type):
        defaults = type(compile_config)()
        items = {
            f.name: getattr(compile_config, f.name)
            for f in dataclasses.fields(compile_config)
            if getattr(compile_config, f.name) != getattr(defaults, f.name)
        }
    else:
        raise ConfigError(
            "compile_config must be torch_tensorrt.dynamo.CompilationSettings or a dict of its "
            f"fields, got {type(compile_config).__name__}"
        )
    return {str(k): _json_value(str(k), v) for k, v in items.items()}


def _json_value(name: str, value: Any) -> Any:
    if isinstance(value, set | frozenset):
        return sorted((_json_value(name, v) for v in value), key=str)
    if isinstance(value, list | tuple):
        return [_json_value(name, v) for v in value]
    if isinstance(value, torch.dtype) or value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return value
    if isinstance(value, enum.Enum):
        to = getattr(value, "to", None)
        if callable(to):  # torch_tensorrt.dtype -> torch.dtype
            try:
                converted = to(torch.dtype)
                if isinstance(converted, torch.dtype):
                    return converted
            except Exception as e:  # an enum that does not convert: keep its name
                log.debug("honed: %s=%r does not convert to a torch dtype: %s", name, value, e)
        return value.name
    raise ConfigError(
        f"compile_config field {name}={value!r} ({type(value).__name__}) cannot be stored in "
        "the recipe; pass compile_config as a dict with plain values (numbers, strings, torch "
        "dtypes, lists)"
    )


def compile_kwargs(settings: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments Torch-TensorRT takes, from a stored settings dict."""
    out = dict(settings)
    for name in _SET_FIELDS:
        if isinstance(out.get(name), list):
            out[name] = set(out[name])
    return out


def reduced_precision(settings: dict[str, Any]) -> bool:
    """Whether the settings let TensorRT run below fp32 (fp16/bf16/int8/fp8 kernels)."""
    precisions = settings.get("enabled_precisions") or []
    return any(p not in (torch.float32, "f32", "float32") for p in precisions)


# -- availability -------------------------------------------------------------------------------
def _minor(version: str) -> tuple[int, int]:
    parts = [
        int("".join(c for c in p if c.isdigit()) or 0) for p in version.split("+")[0].split(".")[:2]
    ]
    parts += [0] * (2 - len(parts))
    return parts[0], parts[1]


def torch_tensorrt_verdict(
    version: str | None,
    import_error: str | None,
    torch_version: str,
    torch_cuda: str | None,
    cuda_available: bool,
) -> Availability:
    """Torch-TensorRT X.Y is built for torch X.Y only; then CUDA."""
    minor = ".".join(map(str, _minor(torch_version)))
    install = _INSTALL.format(minor=minor)
    if version is None and import_error is None:
        return Availability(False, "Torch-TensorRT is not installed", install)
    if version is not None and _minor(version) != _minor(torch_version):
        return Availability(
            False,
            f"torch_tensorrt {version} is built for torch "
            f"{'.'.join(map(str, _minor(version)))}, but this is torch {torch_version}",
            install,
        )
    if import_error is not None:
        return Availability(
            False,
            f"torch_tensorrt {version or ''} fails to import with torch {torch_version}: "
            f"{import_error}".replace("  ", " "),
            f"{install}, with the TensorRT it requires",
        )
    if torch_cuda is None:
        return Availability(
            False,
            f"Torch-TensorRT runs on CUDA GPUs and torch {torch_version} is a CPU-only build",
            "install a CUDA build of torch",
        )
    if not cuda_available:
        return Availability(
            False, "torch cannot initialize CUDA", "run honed doctor --device cuda for why"
        )
    return Availability(True)


@functools.cache
def torch_tensorrt_available() -> Availability:
    """Cached verdict for this machine."""
    version, error = probe("torch_tensorrt")
    return torch_tensorrt_verdict(
        version,
        error,
        torch.__version__,
        torch.version.cuda,
        torch.version.cuda is not None and torch.cuda.is_available(),
    )


def _supports(device: torch.device) -> Availability:
    if device.type != "cuda":
        return Availability(
            False, f"Torch-TensorRT runs on CUDA GPUs, not {device.type}", "tune on a CUDA device"
        )
    if not torch.cuda.is_available():
        return Availability(False, "CUDA is not available", "run honed doctor --device cuda")
    return cc_verdict(torch.cuda.get_device_capability(device), "none")


def _require(name: str, avail: Availability) -> None:
    if not avail:
        raise BackendUnavailableError(
            f"{name}: {avail.reason}" + (f"; {avail.fix}" if avail.fix else "")
        )


# -- JIT ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class TorchTensorRTJitBackendConfig(BackendConfig):
    # CompilationSettings (or a dict of its fields), passed as torch.compile's options.
    compile_config: Any = None
    # torch.compile's dynamic; None: dynamic where the tuned profile has dynamic axes.
    dynamic: bool | None = None

    def __post_init__(self) -> None:
        self.compile_config = settings_dict(self.compile_config)


class _TorchTensorRTBackend(Backend):
    """What the JIT and AOT Torch-TensorRT backends share: availability, devices, tolerance."""

    requires = ("torch_tensorrt",)
    imports = ("torch._dynamo",)  # both compile or export through Dynamo
    config: TorchTensorRTJitBackendConfig | TorchTensorRTAotBackendConfig

    @classmethod
    def available(cls) -> Availability:
        return torch_tensorrt_available()

    def supports(self, device: torch.device) -> Availability:
        return _supports(device)

    def tolerance(self) -> Tolerance | None:
        return REDUCED if reduced_precision(self.config.compile_config) else None


class TorchTensorRTJitBackend(_TorchTensorRTBackend):
    """``torch.compile(backend="torch_tensorrt")``: TensorRT engines built on the first call."""

    config_class = TorchTensorRTJitBackendConfig
    portability = 6
    jit = True
    build_cost = 3
    config: TorchTensorRTJitBackendConfig

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        _require(type(self).__name__, self.available())
        _require(type(self).__name__, self.supports(graph.device))
        import torch_tensorrt  # noqa: F401  (registers the "torch_tensorrt" torch.compile backend)

        del example_inputs
        dynamic = self.config.dynamic
        if dynamic is None and graph.has_dynamic_axes:
            dynamic = True
        compiled: Callable[..., Any] = torch.compile(
            module,
            backend="torch_tensorrt",
            dynamic=dynamic,
            options=compile_kwargs(self.config.compile_config),
        )
        return compiled


# -- AOT ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class TorchTensorRTAotBackendConfig(BackendConfig):
    # Intermediate representation: dynamo (stored as an exported program), ts or fx.
    ir: str = "dynamo"
    # CompilationSettings (or a dict of its fields), passed to the compile.
    compile_config: Any = None
    # Accepted for the seed's snippets and ignored: honed stores exported programs, no pickles.
    pickle_protocol: int | None = None

    def __post_init__(self) -> None:
        if self.ir not in IRS:
            raise ConfigError(
                f"TorchTensorRTAotBackendConfig: ir {self.ir!r} is not one of {', '.join(IRS)}"
            )
        self.compile_config = settings_dict(self.compile_config)
        if self.pickle_protocol is not None:
            log.info(
                "honed: TorchTensorRTAotBackendConfig.pickle_protocol is ignored: the result is "
                "stored as an exported program, never pickled"
            )


def trt_inputs(
    lo: list[tuple[int, ...]],
    hi: list[tuple[int, ...]],
    dtypes: list[torch.dtype],
    opt_shapes: tuple[tuple[int, ...], ...],
) -> list[dict[str, Any]]:
    """Per tensor input, torch_tensorrt.Input's min/opt/max shapes and dtype (pure)."""
    opts = list(opt_shapes) if len(opt_shapes) == len(lo) else hi
    out = []
    for low, opt, high, dtype in zip(lo, opts, hi, dtypes, strict=True):
        clamped = tuple(min(max(o, a), b) for a, o, b in zip(low, opt, high, strict=True))
        out.append(
            {
                "min_shape": tuple(low),
                "opt_shape": clamped,
                "max_shape": tuple(high),
                "dtype": dtype,
            }
        )
    return out


class TorchTrtCompiled(GuardedPayload):
    """A Torch-TensorRT compiled module, called like the module it was compiled from."""

    what = "Torch-TensorRT module"

    def __init__(self, module: Any, calling: Calling, program: bytes | None) -> None:
        super().__init__(calling)
        self.module = module
        self.program = program

    def run(self, tensors: list[Any]) -> Any:
        return self.module(*tensors)


class TorchTensorRTAotBackend(_TorchTensorRTBackend):
    """Compiles the exported module with Torch-TensorRT ahead of time (an exported program)."""

    config_class = TorchTensorRTAotBackendConfig
    portability = 6
    saves_payload = True
    native_payload = True  # TensorRT engines inside an exported program
    build_cost = 3
    config: TorchTensorRTAotBackendConfig

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        name = type(self).__name__
        if not example_inputs:
            raise InputError(f"{name} needs at least one recorded sample")
        _require(name, self.available())
        _require(name, self.supports(graph.device))
        import torch_tensorrt

        cfg = self.config
        exported_plan = plan(example_inputs, graph, None, name)
        wrapper = FlatForward(module, exported_plan).eval()
        tensors = exported_plan.tensors
        dtypes = [t.dtype for t in tensors]
        specs = trt_inputs(exported_plan.lo, exported_plan.hi, dtypes, graph.opt_shapes)
        inputs = [torch_tensorrt.Input(**spec) for spec in specs]
        kwargs = compile_kwargs(cfg.compile_config)
        try:
            if cfg.ir == "dynamo":
                exported = torch.export.export(
                    wrapper, tuple(tensors), dynamic_shapes=(tuple(exported_plan.dims),)
                )
                compiled = torch_tensorrt.dynamo.compile(exported, arg_inputs=inputs, **kwargs)
                program = _save_program(torch_tensorrt, compiled, tensors)
            else:
                compiled = torch_tensorrt.compile(wrapper, ir=cfg.ir, inputs=inputs, **kwargs)
                program = None
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TuneError(
                f"Torch-TensorRT could not compile {type(module).__name__} with ir={cfg.ir} "
                f"({type(e).__name__}: {first}); try TorchTensorRTJitBackend (it falls back to "
                "PyTorch for unsupported ops) or another backend"
            ) from e
        return TorchTrtCompiled(compiled, exported_plan.calling, program)

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        if not isinstance(fn, TorchTrtCompiled):
            raise TypeError(f"{type(self).__name__}.export_payload takes what its build returned")
        if fn.program is None:  # ir="ts"/"fx": no exported program; honed.load rebuilds
            return {}
        return {PAYLOAD_PROGRAM: fn.program, PAYLOAD_CALLING: fn.calling.to_json().encode()}

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        del module  # the program holds the engines and weights
        name = type(self).__name__
        missing = [n for n in (PAYLOAD_PROGRAM, PAYLOAD_CALLING) if n not in files]
        if missing:
            raise InputError(f"{name} payload lacks {missing}: save it again")
        _require(name, self.available())
        _require(name, self.supports(graph.device))
        import torch_tensorrt  # noqa: F401  (registers the TensorRT engine ops the program calls)

        program = files[PAYLOAD_PROGRAM]
        loaded = torch.export.load(io.BytesIO(program)).module()
        calling = Calling.from_json(files[PAYLOAD_CALLING].decode(), graph.profile)
        return TorchTrtCompiled(loaded, calling, program)


def _save_program(torch_tensorrt: Any, compiled: Any, tensors: list[torch.Tensor]) -> bytes:
    with tempfile.TemporaryDirectory(prefix="honed-trt-") as tmp:
        path = Path(tmp) / PAYLOAD_PROGRAM
        torch_tensorrt.save(
            compiled, str(path), output_format="exported_program", arg_inputs=list(tensors)
        )
        return path.read_bytes()
