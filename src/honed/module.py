"""src/honed/module.py: honed.Module records inputs while tuning, then dispatches to variants.

Every call after a tune goes through the engine's dispatcher (one C++ call): a known signature
inside a tuned shape profile runs its variant; anything else runs eager with a one-time warning.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from honed import _core, config
from honed.backend.base import Backend, Sample
from honed.errors import InputError

if TYPE_CHECKING:
    from honed.tune_strategy import TuneStrategy

log = logging.getLogger("honed")

_core.set_tensor_type(torch.Tensor)
_MISS = _core.MISS
MISS = _MISS  # what Module.dispatch returns for inputs no tuned variant covers


@dataclasses.dataclass
class Variant:
    """A tuned graph of a module: its shape profile, backend and callable."""

    profile: Any  # _core.GraphProfile
    backend: Backend
    fn: Callable[..., Any]
    figures: dict[str, Any]
    warm_sample: Sample | None = None


class GraphRecording:
    """The samples one graph (one input signature class) received while recording."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.signatures: list[Any] = []
        self.samples: list[Sample] = []
        self.shapes_seen: set[tuple[tuple[int, ...], ...]] = set()
        self.calls = 0

    def add(self, sig: Any, sample: Sample) -> None:
        self.calls += 1
        shapes = tuple(tuple(s) for s in sig.tensor_shapes)
        cap = config.max_samples_per_graph
        new_shape = shapes not in self.shapes_seen
        if len(self.samples) < cap or (new_shape and len(self.samples) < 2 * cap):
            self.signatures.append(sig)
            self.samples.append(sample)
            self.shapes_seen.add(shapes)


# While a tune records (in this thread or context), the modules that recorded something, in
# first-call order; None otherwise. A context variable, so a tune in a background thread (JIT)
# and the program's own calls never see each other's recording.
_RECORDING: contextvars.ContextVar[list[Module] | None] = contextvars.ContextVar(
    "honed_recording", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[Module]]:
    """Every honed.Module called in this ``with`` block records what it receives."""
    modules: list[Module] = []
    token = _RECORDING.set(modules)
    try:
        yield modules
    finally:
        _RECORDING.reset(token)


def _detach(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


class Module(torch.nn.Module):
    """Wraps a torch.nn.Module so honed can tune it; behaves like the module it wraps.

    Args:
        module: the model (or part of a pipeline) to tune.
        name: a name unique within the artifact; defaults to the module's class name.
        strategy: how to pick among backends (default: MaxThroughputStrategy over the
            available backends).
        dynamic_shapes: axes to treat as dynamic, overriding inference: a list aligned with
            the tensor inputs (in flatten order) of dicts ``{axis: int | DynamicDim |
            BatchDim}``, or a dict keyed by ``(tensor_index, axis)`` (see honed.shapes).
        strategies: per-graph strategies, keyed by the graph's index (0, 1, ... in the order
            the graphs were first seen) or by its graph key (``report.graphs[i].graph``); a
            graph not named here uses ``strategy``.
    """

    name: str

    def __init__(
        self,
        module: torch.nn.Module,
        name: str | None = None,
        strategy: TuneStrategy | None = None,
        dynamic_shapes: Any = None,
        strategies: dict[int | str, TuneStrategy] | None = None,
    ) -> None:
        if isinstance(module, Module):
            raise InputError(
                f"honed.Module({module.name!r}) is already wrapped; wrap the inner model once"
            )
        if not isinstance(module, torch.nn.Module):
            raise InputError(
                f"honed.Module needs a torch.nn.Module, got {type(module).__name__}; wrap a "
                "plain function's model instead, or pass the function to honed.tune(func=...)"
            )
        super().__init__()
        self.module = module
        self.name = name or type(module).__name__
        self.strategy = strategy
        self.strategies = dict(strategies or {})
        self.dynamic_shapes = dynamic_shapes
        self.graphs: dict[str, GraphRecording] = {}
        self.variants: list[Variant] = []
        self.report: Any = None
        self._dispatcher: Any = None
        self._warned: set[str] = set()

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dispatcher = self._dispatcher
        if dispatcher is not None:
            try:
                out = dispatcher.call(args, kwargs)  # lookup + the variant's call, in C++
            except Exception as e:  # a backend failing at serving time: eager answers instead
                return self._variant_raised(e, args, kwargs)
            if out is not _MISS:
                return out
            return self._fallback(args, kwargs)
        recorded = _RECORDING.get()
        if recorded is not None:
            return self._record(args, kwargs, recorded)
        return self.module(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any], recorded: list[Module]) -> Any:
        sig = _core.signature(args, kwargs)
        key = sig.graph_key
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = GraphRecording(key)
            if self not in recorded:
                recorded.append(self)
        graph.add(sig, Sample(_detach(args), _detach(kwargs)))
        return self.module(*args, **kwargs)

    def dispatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The tuned variant's output for these inputs, or ``MISS`` when none covers them.

        No eager fallback and no warning for a miss: for callers (JIT) that handle misses
        themselves; ``miss_reason`` says why the inputs were not covered. A variant that raises
        is answered by eager, with a warning, as in ``__call__``.
        """
        if self._dispatcher is None:
            return _MISS
        try:
            return self._dispatcher.call(args, kwargs)
        except Exception as e:
            return self._variant_raised(e, args, kwargs)

    def miss_reason(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self._dispatcher is None:
            return "not tuned"
        return str(self._dispatcher.explain(args, kwargs))

    def _fallback(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        index = self._dispatcher.lookup(args, kwargs)
        why = self._dispatcher.explain(args, kwargs)
        if why not in self._warned:
            self._warned.add(why)
            what = "a signature it was not tuned for" if index == -1 else "a shape outside"
            log.warning(
                "honed: module %r got %s (%s); running eager for these inputs. "
                "Tune with samples like these to cover them.",
                self.name,
                what if index == -1 else f"{what} its tuned profile",
                why,
            )
        return self.module(*args, **kwargs)

    def _variant_raised(
        self, error: Exception, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """A tuned variant raised: warn once per variant and error, and answer with eager.

        The check at tune time ran every sample, but serving can reach inputs it never saw
        (another batch size inside the profile); eager's answer is always correct. If eager
        raises too, the input itself is at fault and that error reaches the caller.
        """
        index = self._dispatcher.lookup(args, kwargs)
        backend = self.variants[index].backend.name if 0 <= index < len(self.variants) else "?"
        first = (str(error).strip().splitlines() or [""])[0]
        why = f"{type(error).__name__}: {first}" if first else type(error).__name__
        if f"raised|{backend}|{why}" not in self._warned:
            self._warned.add(f"raised|{backend}|{why}")
            log.warning(
                "honed: module %r: its tuned variant (%s) raised %s; running eager for these "
                "inputs (correct, not tuned). Tune with samples like these inputs, or leave that "
                "backend out.",
                self.name,
                backend,
                why,
            )
        return self.module(*args, **kwargs)

    def strategy_for(self, index: int, key: str) -> TuneStrategy | None:
        """The per-graph strategy for graph number ``index`` (or with graph key ``key``)."""
        return self.strategies.get(key) or self.strategies.get(index)

    # -- tuned state ---------------------------------------------------------------------------
    @property
    def is_tuned(self) -> bool:
        return self._dispatcher is not None and len(self.variants) > 0

    def install(self, variants: list[Variant]) -> None:
        """Dispatch to ``variants`` from now on (an empty list means eager)."""
        dispatcher = _core.Dispatcher()
        for i, v in enumerate(variants):
            dispatcher.add(v.profile, i)
        dispatcher.set_targets([v.fn for v in variants])
        self.variants = list(variants)
        self._warned = set()
        self._dispatcher = dispatcher if variants else None

    def reset(self) -> None:
        """Forget tuned variants and recordings; the module runs eager again."""
        self.install([])
        self.graphs = {}
        self.report = None

    def extra_repr(self) -> str:
        state = f"tuned, {len(self.variants)} variant(s)" if self.is_tuned else "eager"
        return f"name={self.name!r}, {state}"


def find_modules(obj: Any) -> list[Module]:
    """The honed.Modules inside ``obj`` (itself, an nn.Module tree, or a pipeline's attributes)."""
    found: list[Module] = []
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if id(value) in seen or depth > 3:
            return
        seen.add(id(value))
        if isinstance(value, Module):
            found.append(value)
            return
        if isinstance(value, torch.nn.Module):
            for sub in value.modules():
                if isinstance(sub, Module) and id(sub) not in seen:
                    seen.add(id(sub))
                    found.append(sub)
            return
        attrs = getattr(value, "__dict__", None)
        if isinstance(attrs, dict):
            for v in attrs.values():
                if isinstance(v, torch.nn.Module):
                    visit(v, depth + 1)

    visit(obj, 0)
    return found
