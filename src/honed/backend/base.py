"""src/honed/backend/base.py: the backend contract every backend (built-in or the user's) follows.

A backend turns a module plus example inputs into a callable with the module's signature:

    class MyBackend(honed.backend.Backend):
        def build(self, module, example_inputs):
            return my_engine.compile(module)

``example_inputs`` is a list of ``Sample(args, kwargs)`` recorded for one graph. Correctness,
measurement, selection and saving apply to every backend alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import enum
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from honed import _core
from honed.errors import ConfigError
from honed.pipeline.correctness import Tolerance


class Sample(NamedTuple):
    """One recorded call of a module: positional and keyword arguments."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


# Eager's outputs the tune already holds for its samples (the recorded calls returned them, or
# its reference runs did), while a backend builds: see eager_output.
_KNOWN_OUTPUTS: contextvars.ContextVar[tuple[Sequence[Sample], Sequence[Any]] | None] = (
    contextvars.ContextVar("honed_known_outputs", default=None)
)


@contextlib.contextmanager
def known_outputs(samples: Sequence[Sample], outputs: Sequence[Any]) -> Iterator[None]:
    """While building: ``outputs[i]`` is eager's output for ``samples[i]`` (eager_output)."""
    token = _KNOWN_OUTPUTS.set((samples, outputs))
    try:
        yield
    finally:
        _KNOWN_OUTPUTS.reset(token)


def known_output(sample: Sample) -> tuple[bool, Any]:
    """(True, eager's output for ``sample``) where the tune holds it (``known_outputs``),
    else (False, None): nothing is run."""
    known = _KNOWN_OUTPUTS.get()
    if known is not None:
        for s, out in zip(*known, strict=False):
            if s is sample:
                return True, out
    return False, None


def eager_output(module: torch.nn.Module, sample: Sample) -> Any:
    """Eager's output of ``module`` for ``sample``, for what a build learns from it (output
    dtypes, structure): the one the tune holds when ``sample`` is one of its samples, else one
    eager run. Beside a program on a GPU such a run holds the program's calls back for as long
    as it lasts (the GPU time-slices the worker's context with the program's)."""
    found, out = known_output(sample)
    if found:
        return out
    with torch.no_grad():
        return module(*sample.args, **sample.kwargs)


class Availability(NamedTuple):
    """Whether a backend can run here; when not, why and what to do."""

    ok: bool
    reason: str = ""
    fix: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclasses.dataclass(frozen=True)
class GraphInfo:
    """What the tuner knows about the graph a backend is built for."""

    device: torch.device
    has_dynamic_axes: bool = False
    min_shapes: tuple[tuple[int, ...], ...] = ()
    opt_shapes: tuple[tuple[int, ...], ...] = ()
    max_shapes: tuple[tuple[int, ...], ...] = ()
    # Per tensor input, per axis, the profile's axis name (e.g. "batch"); axes named alike are
    # one dimension (always equal). Empty when unknown; static axes may have any name.
    axis_names: tuple[tuple[str, ...], ...] = ()
    # The engine's profile of the graph when the tuner knows it; payload backends accept exactly
    # the inputs it allows (see _calling.py).
    profile: _core.GraphProfile | None = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass
class BackendConfig:
    """Base of every backend's config dataclass; fields are the backend's knobs."""

    def to_json(self) -> dict[str, Any]:
        return {f.name: _to_json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def describe(self) -> list[str]:
        """Name parts for the fields that differ from the defaults, e.g. ``mode=max-autotune``;
        a field may say it in words (its ``describe`` metadata, e.g. "bf16 weights")."""
        defaults = type(self)()
        parts = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name):
                continue
            words = f.metadata.get("describe")
            if words is not None:
                parts.append(words(value))
            else:
                shown = str(value).removeprefix("torch.") if value is not None else "None"
                parts.append(f"{f.name}={shown}")
        return [p for p in parts if p]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BackendConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ConfigError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
        return cls(**{k: _from_json_value(v) for k, v in data.items()})


def _to_json_value(value: Any) -> Any:
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value).removeprefix("torch.")}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): _to_json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_to_json_value(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise ConfigError(f"config value {value!r} of type {type(value).__name__} cannot be stored")


def _from_json_value(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__dtype__"}:
            return getattr(torch, value["__dtype__"])
        return {k: _from_json_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_json_value(v) for v in value]
    return value


# Every Backend subclass defined in this process, by qualified name (module.QualName): the
# recipes of backends that are not registered under a name (see registry.py) name them so.
_SUBCLASSES: dict[str, type[Backend]] = {}


class Backend:
    """Base class of every backend. Subclasses implement ``build``.

    Class attributes a backend may set:
      config_class  its config dataclass (None for config-less custom backends)
      portability   rank used to break ties: lower is simpler and more portable
      jit           True when the first call compiles (its time counts as build time)
    """

    config_class: ClassVar[type[BackendConfig] | None] = None
    portability: ClassVar[int] = 5
    jit: ClassVar[bool] = False
    # True when the built callable can be stored as files in the artifact (e.g. an AOTInductor
    # .pt2) and loaded back without rebuilding; see export_payload / load_payload.
    saves_payload: ClassVar[bool] = False
    # True when the saved payload is native code that loading runs (a shared library, a TensorRT
    # engine): honed.load then needs a trusted signature (docs/trust.md). Payload backends count
    # as native unless they declare otherwise.
    native_payload: ClassVar[bool] = True
    # True when its build compiles nothing: its variant is the module's own kernels, captured in
    # a moment (CUDA graphs over eager). Beside a calling program (JIT), such a candidate may
    # answer the program's calls while the compiling ones build (honed.jit.config.stand_in).
    stands_in: ClassVar[bool] = False
    # True when the C++ runtime (libhoned_runtime, honed-run) can run the saved payload;
    # honed.tune(target="cpp") keeps only such backends.
    cpp_runnable: ClassVar[bool] = False
    # True when the built callable keeps eager's meaning beyond inference: it reads the module's
    # own parameters and its training flag at each call and records autograd history (eager,
    # torch.compile). False (the safe default) makes honed.Module run eager in training mode or
    # when autograd is on with parameters or inputs that require grad.
    keeps_autograd: ClassVar[bool] = False
    # Import names of the optional libraries available() imports (the doctor probes those in a
    # subprocess first, so a library that crashes on import cannot take it down).
    requires: ClassVar[tuple[str, ...]] = ()
    # Modules its builds import (Inductor: seconds of a core): a tune's worker imports them
    # before the build's clock starts, so the figure is the build's, and a worker whose
    # candidates need none never imports them.
    imports: ClassVar[tuple[str, ...]] = ()
    # Modules its built callable needs in the process that calls it (ONNX Runtime's session):
    # JIT imports those that are installed in the program's first call, where installing a
    # finalist would otherwise import them beside the program's calls, holding the GIL.
    runs_with: ClassVar[tuple[str, ...]] = ()
    # Expected cost of build_graph, for the tuner's cheap-first order (docs/tuning.md): 0 none
    # (the module runs as it is), 1 seconds (a trace or a capture), 2 a compile, 3 a long one
    # (autotuning, an AOT package, an engine). A config may change it: expected_build_cost().
    build_cost: ClassVar[int] = 2

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _SUBCLASSES[f"{cls.__module__}.{cls.__qualname__}"] = cls

    def __init__(self, config: BackendConfig | None = None) -> None:
        if config is None and self.config_class is not None:
            config = self.config_class()
        if (
            config is not None
            and self.config_class is not None
            and not isinstance(config, self.config_class)
        ):
            raise ConfigError(
                f"{type(self).__name__} takes a {self.config_class.__name__}, "
                f"got {type(config).__name__}"
            )
        self.config = config

    # -- what a backend implements -------------------------------------------------------------
    @classmethod
    def available(cls) -> Availability:
        """Whether this backend can run here; cheap, and cached where it is not. The registry's
        ``availability()`` asks it: whatever it raises becomes an "unavailable" verdict there."""
        return Availability(True)

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        """Return a callable that computes what ``module`` computes, faster.

        Built-in backends implement ``build_graph``; called directly, ``build`` gives them the
        device of the module (or of its inputs) as the graph's device.
        """
        if type(self).build_graph is Backend.build_graph:
            raise NotImplementedError(
                f"{type(self).__name__} must implement build(module, example_inputs)"
            )
        return self.build_graph(
            module, example_inputs, GraphInfo(device=device_of(module, example_inputs))
        )

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        """Files that hold the built ``fn`` (name -> bytes), for backends with saves_payload."""
        raise NotImplementedError(f"{type(self).__name__} does not store a payload")

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        """Load what ``export_payload`` stored; must not recompile."""
        raise NotImplementedError(f"{type(self).__name__} does not store a payload")

    def supports(self, device: torch.device) -> Availability:
        """Whether this backend, as configured, can run on ``device`` (e.g. a quantization scheme
        that needs a newer GPU). ``available()`` says whether the library works at all."""
        del device
        return Availability(True)

    def expected_build_cost(self) -> int:
        """This candidate's build cost on the ``build_cost`` scale (configs may raise it)."""
        return type(self).build_cost

    def precision(self) -> str:
        """What it computes in: "fp32", or the autocast dtype of its config ("bf16", "fp16")."""
        config = getattr(self, "config", None)
        if not getattr(config, "autocast_enabled", False):
            return "fp32"
        dtype = getattr(config, "autocast_dtype", None) or torch.bfloat16
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))

    def build_identity(self, graph: GraphInfo) -> dict[str, Any]:
        """What it builds for ``graph``: candidates with equal identities build the same thing
        (the tuner tries one of them). Configs whose defaults resolve per graph override it."""
        del graph
        return self.recipe()

    def tolerance(self) -> Tolerance | None:
        """The correctness tolerance for this backend's outputs; None uses the per-dtype default.

        Backends that change numerics on purpose (quantization) return a looser one.
        """
        return None

    # -- what the tuner calls ------------------------------------------------------------------
    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        """Build for one graph. Built-in backends use ``graph``; custom ones get ``build``."""
        del graph
        return self.build(module, example_inputs)

    @property
    def name(self) -> str:
        """A readable, stable candidate name, e.g. ``TorchInductorBackend(mode=max-autotune)``."""
        config = getattr(self, "config", None)
        parts = config.describe() if isinstance(config, BackendConfig) else []
        return f"{type(self).__name__}({', '.join(parts)})" if parts else type(self).__name__

    @property
    def expected_cost(self) -> float:
        """Rough build cost, in units of one torch.compile in its default mode (eager: 0). A
        tuner may order or prune candidates by it and by ``expected_gain``."""
        return 1.0

    @property
    def expected_gain(self) -> float:
        """Rough prior speed-up over eager on the devices this backend targets (1.0: none)."""
        return 1.0

    def recipe(self) -> dict[str, Any]:
        """How to rebuild this backend: its registered name (else its qualified class name) and
        its config as JSON (no pickle)."""
        from honed.backend.registry import registered_name

        cls = type(self)
        config = getattr(self, "config", None)
        return {
            "backend": registered_name(cls) or f"{cls.__module__}.{cls.__qualname__}",
            "config": config.to_json() if isinstance(config, BackendConfig) else None,
        }

    def __repr__(self) -> str:
        return self.name


def backend_from_recipe(recipe: dict[str, Any]) -> Backend | None:
    """The backend a recipe names, or None when that class is not loaded in this process.

    Registered names (built-ins, plugins) come from the registry; other names are qualified
    class names of backends defined in this process. Recipes of older honed versions named a
    user's class by its bare name: such a name is accepted when exactly one loaded class has it.
    """
    cls = _recipe_class(str(recipe.get("backend")))
    if cls is None:
        return None
    config_json = recipe.get("config")
    if cls.config_class is not None and config_json is not None:
        return cls(cls.config_class.from_json(config_json))
    return cls()


def _recipe_class(name: str) -> type[Backend] | None:
    from honed.backend.registry import find_backend

    found = find_backend(name) or _SUBCLASSES.get(name)
    if found is not None:
        return found
    bare = [cls for cls in _SUBCLASSES.values() if cls.__name__ == name]
    return bare[0] if len(bare) == 1 else None


def device_of(module: torch.nn.Module, example_inputs: list[Sample]) -> torch.device:
    """Where ``module`` runs: its first parameter's device, else its inputs', else the CPU."""
    for p in module.parameters():
        return p.device
    for sample in example_inputs:
        for leaf in torch.utils._pytree.tree_leaves((sample.args, sample.kwargs)):
            if isinstance(leaf, torch.Tensor):
                return leaf.device
    return torch.device("cpu")
