"""src/honed/backend/torch_inductor_aot.py: AOTInductor: torch.export, then a compiled .pt2.

The module is exported with ``torch.export.export`` (dynamic axes from the tuned profile as
``torch.export.Dim``s; see _export.py), compiled ahead of time with
``torch._inductor.aoti_compile_and_package`` and loaded with libtorch's package loader (see
_aoti_env.py). The package is stored in the artifact as ``model.pt2`` next to ``calling.json``
(see _calling.py) and loads back without compiling, in Python or in the C++ runtime.

Precision: autocast is entered inside the exported forward, which torch.export records and
Inductor compiles; ``precision="bf16"``/``"fp16"`` exports the module cast to that dtype with
the input and output casts inside the graph, so the package takes and returns what eager does
(and the C++ runtime runs it as it is). TF32 is not offered: it is a setting of the calling
process, which the C++ runtime does not make.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from honed.backend import _aoti_constants, _aoti_direct, _aoti_env
from honed.backend._calling import CALLING_FILE, Calling, GuardedPayload
from honed.backend._export import FlatForward, export_program, plan
from honed.backend._inductor_env import cpu_available, left_to_the_worker
from honed.backend._precision import (
    check_config,
    converted,
    flag_field,
    memory_format_field,
    precision_field,
    tolerance,
)
from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    eager_output,
)
from honed.backend.cuda_graphs import CudaGraphed, CudaGraphsBackendConfig
from honed.errors import ConfigError, InputError, TuneError
from honed.pipeline.correctness import Tolerance

PAYLOAD_PACKAGE = _aoti_env.PACKAGE_NAME
PAYLOAD_CALLING = CALLING_FILE
_PRECISIONS = ("fp32", "bf16", "fp16")


@dataclasses.dataclass
class TorchInductorAotBackendConfig(BackendConfig):
    # AOTInductor settings, passed as ``inductor_configs`` to aoti_compile_and_package (e.g.
    # {"max_autotune": True}); None uses Inductor's defaults.
    options: dict[str, Any] | None = None
    # None: dynamic axes where the tuned profile has them, else static; True: the profile's
    # dynamic axes, and an error when it has none; False: static at the example's shapes.
    dynamic: bool | None = None
    # torch.export's strict mode (trace with TorchDynamo) instead of the default non-strict one.
    strict: bool = False
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None
    # Check every call against the profile the package was compiled for (the package itself
    # does not check: a wrong shape would read out of bounds).
    check_inputs: bool = True
    # fp32, bf16 or fp16 (bf16/fp16 cast the weights); see backend/_precision.py.
    precision: str = precision_field()
    # None (the module's own) or "channels_last" (image models).
    memory_format: str | None = memory_format_field()
    # Inductor's max_autotune (benchmarks GEMM and convolution templates while compiling).
    max_autotune: bool = flag_field("max-autotune")
    # CUDA only: each input shape's call captured in a CUDA graph on first sight (the recorded
    # samples' at build) and replayed afterwards, as the C++ runtime does by default; the
    # package's kernel launches leave the call path.
    cuda_graphs: bool = flag_field("CUDA graphs")

    def __post_init__(self) -> None:
        check_config(
            "TorchInductorAotBackendConfig",
            self.precision,
            self.memory_format,
            self.autocast_enabled,
            self.autocast_dtype,
            _PRECISIONS,
        )
        if self.options is not None and not isinstance(self.options, dict):
            raise ConfigError(
                "TorchInductorAotBackendConfig: options must be a dict of Inductor settings, "
                f"got {type(self.options).__name__}"
            )

    def inductor_configs(self, device_type: str) -> dict[str, Any]:
        """What aoti_compile_and_package gets as ``inductor_configs`` for a graph on
        ``device_type``; the user's ``options`` win over every default set here."""
        configs: dict[str, Any] = {}
        if device_type == "cpu" and not _aoti_env.precompiled_header_pays():
            # Making the header costs more than it saves on one compile (docs/tuning.md).
            configs["aot_inductor.precompile_headers"] = False
        configs.update(self.options or {})
        configs.update(_aoti_constants.NO_CONSTANTS_IN_SO)  # weights stored once (see there)
        if self.max_autotune:
            configs["max_autotune"] = True
        return _aoti_env.link_options(configs)


def aot_available() -> Availability:
    """torch.export and AOTInductor present, and a C++ compiler (its wrapper is always C++).
    Importing AOTInductor imports TorchDynamo: where imports are deferred and neither is
    imported yet, only the compiler is checked here (``left_to_the_worker``)."""
    if left_to_the_worker("torch._inductor"):
        return _has_compiler()
    try:
        import torch._inductor
        import torch.export
    except Exception as e:  # an import failure is a reason, not a crash
        return Availability(
            False, f"torch.export/AOTInductor cannot be imported: {e}", "reinstall torch"
        )
    missing = [
        name
        for owner, name in (
            (torch.export, "export"),
            (torch.export, "Dim"),
            (torch._inductor, "aoti_compile_and_package"),
            (torch._inductor, "aoti_load_package"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        return Availability(
            False,
            f"torch {torch.__version__} lacks {', '.join(missing)}",
            "install torch 2.6 or newer",
        )
    return _has_compiler()


def _has_compiler() -> Availability:
    compiler = cpu_available()
    if not compiler:
        return Availability(
            False, "AOTInductor compiles a C++ wrapper and no C++ compiler was found", compiler.fix
        )
    return Availability(True)


class AotCompiled(GuardedPayload):
    """A loaded AOTInductor package, called like the module it was compiled from."""

    what = "AOTInductor package"

    def __init__(
        self,
        runner: Any,
        package: bytes,
        calling: Calling,
        check_inputs: bool = True,
        constants: dict[str, bytes] | None = None,
        graphs_on: torch.device | None = None,
    ) -> None:
        from torch.utils._pytree import treespec_loads

        super().__init__(calling, check_inputs)
        self.runner = runner
        self.package = package
        self.constants = constants or {}  # constants.json (+ .safetensors) for the payload
        # graphs_on: calls replayed from CUDA graphs on that device (the runner single-threaded).
        self.graphed: CudaGraphed | None = None
        if graphs_on is not None:
            self.graphed = CudaGraphed(
                self._flat_run,
                graphs_on,
                CudaGraphsBackendConfig(warmup_iters=2),
                what="the AOTInductor package",
            )
        # The fast path skips AOTICompiledModel.__call__, which parses its call spec as JSON on
        # every call; its inputs are exactly our flat tensors.
        loader: Any = getattr(runner, "loader", None)
        self._boxed_run: Callable[[list[torch.Tensor]], list[Any]] | None = None
        self._out_spec: Any = None
        self._single_output = False
        if hasattr(loader, "boxed_run") and hasattr(loader, "get_call_spec"):
            self._boxed_run = loader.boxed_run
            self._out_spec = treespec_loads(loader.get_call_spec()[1])
            self._single_output = bool(self._out_spec.is_leaf())

    def run(self, tensors: list[Any]) -> Any:
        if self.graphed is not None:
            return self.graphed(*tensors)
        return self._plain_run(tensors)

    def capture(self, sample: Sample) -> None:
        """Capture the graph of this sample's shapes now (a no-op without CUDA graphs)."""
        if self.graphed is not None:
            self.graphed.capture_for(tuple(self.flatten(sample.args, sample.kwargs)), {})

    def _flat_run(self, *tensors: Any) -> Any:
        return self._plain_run(list(tensors))

    def _plain_run(self, tensors: list[Any]) -> Any:
        if self._boxed_run is None:
            return self.runner(*tensors)
        outs = self._boxed_run(tensors)
        if self._single_output:
            return outs[0]
        from torch.utils._pytree import tree_unflatten

        return tree_unflatten(outs, self._out_spec)


class TorchInductorAotBackend(Backend):
    """Exports the module with torch.export and compiles it ahead of time with AOTInductor."""

    config_class = TorchInductorAotBackendConfig
    portability = 2
    build_cost = 3
    saves_payload = True
    imports = ("torch._inductor.compile_fx",)
    native_payload = True  # model.pt2 holds the compiled .so
    cpp_runnable = True  # cpp/runtime loads model.pt2 + calling.json with libtorch
    config: TorchInductorAotBackendConfig

    @classmethod
    def available(cls) -> Availability:
        return aot_available()

    @property
    def expected_cost(self) -> float:
        return 8.0 if self.config.max_autotune else 2.0

    @property
    def expected_gain(self) -> float:
        reduced = self.config.precision != "fp32" or self.config.autocast_enabled
        return (1.5 if reduced else 1.2) * (1.3 if self.config.cuda_graphs else 1.0)

    def tolerance(self) -> Tolerance | None:
        return tolerance(self.config.precision)

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        if not example_inputs:
            raise InputError("TorchInductorAotBackend needs at least one recorded sample")
        cfg = self.config
        graphs_on = _graphs_device(cfg, graph)  # refused before anything compiles
        exported_plan = plan(example_inputs, graph, cfg.dynamic, "TorchInductorAotBackend")
        example = exported_plan.example
        inner = converted(module, example_inputs, cfg.precision, cfg.memory_format, self.name)
        wrapper = FlatForward(inner, exported_plan)
        if cfg.autocast_enabled:
            wrapper.set_autocast(
                graph.device.type,
                cfg.autocast_dtype or torch.bfloat16,
                eager_output(module, example),
            )
        _aoti_env.check_probe(graph.device.type)  # known not to load here: fail before compiling
        exported = export_program(
            wrapper, exported_plan, cfg.strict, type(module).__name__, "AOTInductor"
        )
        package = _compile(exported, cfg.inductor_configs(graph.device.type))
        runner = _aoti_env.load_package(package, graph.device.type, graphs_on is not None)
        constants = _aoti_constants.plan(runner.loader, exported, module)
        _aoti_constants.give(runner.loader, constants.live)
        fn = AotCompiled(
            runner, package, exported_plan.calling, cfg.check_inputs, constants.files(), graphs_on
        )
        for sample in example_inputs:  # the recorded shapes are captured now: build time
            fn.capture(sample)
        return fn

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        if not isinstance(fn, AotCompiled):
            raise TypeError(
                f"TorchInductorAotBackend.export_payload takes what its build returned, got "
                f"{type(fn).__name__}"
            )
        return {
            PAYLOAD_PACKAGE: fn.package,
            PAYLOAD_CALLING: fn.calling.to_json().encode(),
            **fn.constants,
        }

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        missing = [n for n in (PAYLOAD_PACKAGE, PAYLOAD_CALLING) if n not in files]
        if missing:
            raise InputError(
                f"TorchInductorAotBackend payload lacks {missing}; the artifact is incomplete: "
                "save it again"
            )
        graphs_on = _graphs_device(self.config, graph)
        package = files[PAYLOAD_PACKAGE]
        calling = Calling.from_json(files[PAYLOAD_CALLING].decode(), graph.profile)
        runner = _aoti_env.load_package(package, graph.device.type, graphs_on is not None)
        # Packages saved before the weights were stored apart hold their constants themselves.
        constants = _aoti_constants.tensors(files, module, graph.device)
        if constants is not None:
            try:
                _aoti_constants.give(runner.loader, constants)
            except Exception as e:
                if not isinstance(runner, _aoti_direct.DirectRunner):
                    raise
                # The GIL-free loader could not hand them over: torch's loader does instead.
                first = (str(e).splitlines() or [type(e).__name__])[0]
                _aoti_direct.LOADS[f"torch: constants: {first}"] += 1
                runner = _aoti_env.load_package(
                    package, graph.device.type, graphs_on is not None, direct=False
                )
                _aoti_constants.give(runner.loader, constants)
        kept = {n: files[n] for n in _aoti_constants.FILES if n in files}
        return AotCompiled(runner, package, calling, self.config.check_inputs, kept, graphs_on)


def _graphs_device(cfg: TorchInductorAotBackendConfig, graph: GraphInfo) -> torch.device | None:
    """The device whose CUDA graphs replay the package's calls, None without ``cuda_graphs``."""
    if not cfg.cuda_graphs:
        return None
    if graph.device.type != "cuda":
        raise InputError(
            f"TorchInductorAotBackend(cuda_graphs=True) replays CUDA graphs, but this graph runs "
            f"on {graph.device}; set cuda_graphs=False, or move the model and its inputs to CUDA"
        )
    return graph.device


def _compile(exported: Any, inductor_configs: dict[str, Any]) -> bytes:
    import torch._inductor

    with tempfile.TemporaryDirectory(prefix="honed-aot-") as tmp:
        path = Path(tmp) / PAYLOAD_PACKAGE
        try:
            _aoti_env.absolute_cache_dirs()
            with _aoti_env.vec_isa_known():
                torch._inductor.aoti_compile_and_package(
                    exported, package_path=str(path), inductor_configs=inductor_configs
                )
            _aoti_env.compiled_here()
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TuneError(
                f"AOTInductor could not compile the exported graph ({type(e).__name__}: {first}); "
                "check the C++ compiler (CXX) and the options given, or use TorchInductorBackend"
            ) from e
        return path.read_bytes()
