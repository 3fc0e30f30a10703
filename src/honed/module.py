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
from honed.backend._calling import dispatch_target
from honed.backend.base import Backend, Sample
from honed.calls import CallBinder
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

    profile: _core.GraphProfile
    backend: Backend
    fn: Callable[..., Any]
    figures: dict[str, Any]
    warm_sample: Sample | None = None


class GraphRecording:
    """The samples one graph (one input signature class) received while recording."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.signatures: list[_core.Signature] = []
        self.samples: list[Sample] = []
        # Per sample: eager's output for it where the caller saw it (JIT: the program's own
        # call), else None; the tune computes the rest (GraphTuner.references).
        self.outputs: list[Any] = []
        self.shapes_seen: set[tuple[tuple[int, ...], ...]] = set()
        self.calls = 0

    def add(self, sig: _core.Signature, sample: Sample, output: Any = None) -> None:
        """Note one call; ``output``: eager's output for it, as observed (default: none)."""
        self.calls += 1
        shapes = tuple(tuple(s) for s in sig.tensor_shapes)
        cap = config.max_samples_per_graph
        new_shape = shapes not in self.shapes_seen
        if len(self.samples) < cap or (new_shape and len(self.samples) < 2 * cap):
            self.signatures.append(sig)
            self.samples.append(sample)
            self.outputs.append(output)
            self.shapes_seen.add(shapes)

    def observed_output(self, index: int) -> Any:
        """Eager's observed output for sample ``index``, or None."""
        return self.outputs[index] if index < len(self.outputs) else None


# While a tune records (in this thread or context), the modules that recorded something, in
# first-call order; None otherwise. A context variable, so a tune in a background thread (JIT)
# and the program's own calls never see each other's recording.
_RECORDING: contextvars.ContextVar[list[Module] | None] = contextvars.ContextVar(
    "honed_recording", default=None
)


# Whether a recording module also runs its call (the caller needs its output, or a nested
# honed.Module must see the call) or only notes what it received.
_RECORD_RUNS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "honed_record_runs", default=True
)


# While a recording that does not run the module notes one call: eager's output for that call,
# as the caller saw it (JIT records the program's calls and their outputs), else None.
_OBSERVED_OUTPUT: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "honed_observed_output", default=None
)


@contextlib.contextmanager
def observed_output(output: Any) -> Iterator[None]:
    """Inside ``recording(run=False)``: the call made in this block returned ``output`` when
    the caller ran it eagerly (the tune's check compares with it instead of running eager)."""
    token = _OBSERVED_OUTPUT.set(output)
    try:
        yield
    finally:
        _OBSERVED_OUTPUT.reset(token)


@contextlib.contextmanager
def recording(run: bool = True) -> Iterator[list[Module]]:
    """Every honed.Module called in this ``with`` block records what it receives; with
    ``run=False`` a call returns None without running the module (the caller needs only the
    recording)."""
    modules: list[Module] = []
    token, runs = _RECORDING.set(modules), _RECORD_RUNS.set(run)
    try:
        yield modules
    finally:
        _RECORD_RUNS.reset(runs)
        _RECORDING.reset(token)


def _detach(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


class Module(torch.nn.Module):
    """Wraps a torch.nn.Module so honed can tune it; behaves like the module it wraps.

    After a tune, a call runs the tuned variant for its input signature and shape profile, and
    eager otherwise (with a one-time warning naming why). A call is bound to the module's
    ``forward`` signature first, so positional, keyword and mixed spellings of one call run the
    same variant (see ``honed.calls``).

    Tuned variants are for inference. The module runs eager, with one warning naming why and
    the fix, when it is in training mode, or when autograd is on (not under ``torch.no_grad()``
    or ``torch.inference_mode()``) while its parameters or inputs require grad, unless the
    variant keeps eager's meaning there (its backend's ``keeps_autograd``: eager and
    ``torch.compile``/Inductor variants do; AOTInductor, ONNX Runtime, CUDA graphs, TensorRT and
    TorchAO do not). ``inference_only=True`` keeps the tuned variant when autograd is on.
    """

    name: str
    _inner: torch.nn.Module  # the same object as self.module (see __setattr__)

    def __init__(
        self,
        module: torch.nn.Module,
        name: str | None = None,
        strategy: TuneStrategy | None = None,
        dynamic_shapes: Any = None,
        strategies: dict[int | str, TuneStrategy] | None = None,
        inference_only: bool = False,
    ) -> None:
        """Wrap ``module`` for tuning with honed.tune; until then it runs eager.

        Args:
            module: the model (or part of a pipeline) to tune.
            name: a name unique within the artifact; defaults to the module's class name.
            strategy: how to pick among backends (default: MaxThroughputStrategy over the
                available backends).
            dynamic_shapes: axes to treat as dynamic, overriding inference: a list aligned with
                the tensor inputs (in flatten order of the call bound to ``forward``'s
                signature: positional parameters in signature order, then keyword-only ones)
                of dicts ``{axis: int | DynamicDim | BatchDim}``, or a dict keyed by
                ``(tensor_index, axis)`` (see honed.shapes).
            strategies: per-graph strategies, keyed by the graph's index (0, 1, ... in the
                order the graphs were first seen) or by its graph key
                (``report.graphs[i].graph``); a graph not named here uses ``strategy``.
            inference_only: for serving code that never trains: keep running the tuned variant
                when autograd is on. Its outputs then carry no autograd history (no
                ``grad_fn``; ``backward()`` through them does not reach the parameters). By
                default such calls run eager (with one warning) so that training through the
                module stays correct. Training mode runs eager either way.
        """
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
        self.module = module  # also kept as _inner (see __setattr__)
        self.name = name or type(module).__name__
        self.strategy = strategy
        self.strategies = dict(strategies or {})
        self.dynamic_shapes = dynamic_shapes
        self.inference_only = bool(inference_only)
        self.graphs: dict[str, GraphRecording] = {}
        self.variants: list[Variant] = []
        self.report: Any = None
        self._dispatcher: _core.Dispatcher | None = None
        self._warned: set[str] = set()
        self._binder = CallBinder(module.forward)
        self._arity = self._binder.arity
        self._keeps_meaning = True  # every installed variant keeps autograd and training mode
        self._params: tuple[torch.nn.Parameter, ...] = ()

    # -- calling -------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        dispatcher = self._dispatcher
        if dispatcher is not None:
            if kwargs or len(args) != self._arity:
                bargs, bkwargs = self._binder.bind(args, kwargs)
            else:
                bargs, bkwargs = args, kwargs
            if not self._keeps_meaning and (
                self._inner.training or (torch.is_grad_enabled() and not self.inference_only)
            ):
                why = self._eager_because(bargs, bkwargs)
                if why:
                    return self._eager(why, args, kwargs)
            try:
                out = dispatcher.call(bargs, bkwargs)  # lookup + the variant's call, in C++
            except Exception as e:  # a backend failing at serving time: eager answers instead
                return self._variant_raised(e, args, kwargs, bargs, bkwargs)
            if out is not _MISS:
                return out
            return self._miss(args, kwargs, bargs, bkwargs)
        recorded = _RECORDING.get()
        if recorded is not None:
            return self._record(args, kwargs, recorded)
        return self.module(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self(*args, **kwargs)

    def bind(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The canonical spelling of a call (bound to ``forward``'s signature; honed.calls)."""
        return self._binder.bind(args, kwargs)

    def _record(self, args: tuple[Any, ...], kwargs: dict[str, Any], recorded: list[Module]) -> Any:
        bargs, bkwargs = self._binder.bind(args, kwargs)
        sig = _core.signature(bargs, bkwargs)
        key = sig.graph_key
        graph = self.graphs.get(key)
        if graph is None:
            graph = self.graphs[key] = GraphRecording(key)
            if self not in recorded:
                recorded.append(self)
        if _RECORD_RUNS.get():
            graph.add(sig, Sample(_detach(bargs), _detach(bkwargs)))
            return self.module(*args, **kwargs)
        graph.add(sig, Sample(_detach(bargs), _detach(bkwargs)), _OBSERVED_OUTPUT.get())
        return None

    def dispatch(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The tuned variant's output for these inputs, or ``MISS`` when none covers them.

        No eager fallback and no warning for a miss: for callers (JIT) that handle misses
        themselves; ``miss_reason`` says why the inputs were not covered. A variant that raises,
        or one that would change the meaning of the call (training mode, autograd), is answered
        by eager, with a warning, as in ``__call__``.
        """
        if self._dispatcher is None:
            return _MISS
        bargs, bkwargs = self._binder.bind(args, kwargs)
        if not self._keeps_meaning:
            why = self._eager_because(bargs, bkwargs)
            if why:
                return self._eager(why, args, kwargs)
        try:
            out = self._dispatcher.call(bargs, bkwargs)
        except Exception as e:
            return self._variant_raised(e, args, kwargs, bargs, bkwargs)
        if out is _MISS and (bargs is not args or bkwargs is not kwargs):
            return self._call_as_spelled(args, kwargs)
        return out

    def miss_reason(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self._dispatcher is None:
            return "not tuned"
        return str(self._dispatcher.explain(*self._binder.bind(args, kwargs)))

    # -- eager semantics -----------------------------------------------------------------------
    def _eager_because(self, bargs: tuple[Any, ...], bkwargs: dict[str, Any]) -> str:
        """Why the variant for this call would change its meaning ("" when it would not)."""
        training = self.module.training
        if training:
            why = "training"
        elif not torch.is_grad_enabled() or self.inference_only:
            return ""
        elif any(p.requires_grad for p in self._params):
            why = "grad-params"
        elif _inputs_require_grad(bargs, bkwargs):
            why = "grad-inputs"
        else:
            return ""
        assert self._dispatcher is not None  # only reached once tuned
        index = self._dispatcher.lookup(bargs, bkwargs)
        if 0 <= index < len(self.variants) and self.variants[index].backend.keeps_autograd:
            return ""
        return why if index >= 0 else ""  # a miss runs eager anyway, with its own warning

    def _eager(self, why: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if why not in self._warned:
            self._warned.add(why)
            backends = sorted(
                {v.backend.name for v in self.variants if not v.backend.keeps_autograd}
            )
            variant = f"its tuned variant ({', '.join(backends)})"
            if why == "training":
                log.warning(
                    "honed: module %r is in training mode and %s runs in inference mode only; "
                    "running eager so that dropout, batch-norm statistics and autograd behave as "
                    "in training. Call .eval() on it (and run under torch.no_grad() or "
                    "torch.inference_mode()) to use the tuned variant.",
                    self.name,
                    variant,
                )
            else:
                what = "its parameters" if why == "grad-params" else "its inputs"
                log.warning(
                    "honed: module %r is called with autograd on while %s require grad, and %s "
                    "returns outputs without autograd history; running eager so that gradients "
                    "stay correct. Call it under torch.no_grad() or torch.inference_mode() to "
                    "use the tuned variant (or wrap it with honed.Module(..., "
                    "inference_only=True) if it never trains).",
                    self.name,
                    what,
                    variant,
                )
        return self.module(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name == "module":
            # The per-call check reads the wrapped module's training flag through a plain
            # attribute: nn.Module's __getattr__ for submodules costs a Python call.
            self.__dict__["_inner"] = value

    def train(self, mode: bool = True) -> Module:
        out = super().train(mode)
        self._refresh_params()
        return out

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        out = super().requires_grad_(requires_grad)
        self._refresh_params()
        return out

    def _apply(self, *args: Any, **kwargs: Any) -> Any:
        out = super()._apply(*args, **kwargs)  # type: ignore[no-untyped-call]  # torch: unannotated
        self._refresh_params()
        return out

    def _refresh_params(self) -> None:
        """The parameters whose ``requires_grad`` a call with autograd on reads (the set of
        parameters is kept; their flags are read live, so freezing after install is seen)."""
        if "module" in self._modules:
            self._params = tuple(self.module.parameters())

    # -- misses and failures -------------------------------------------------------------------
    def _miss(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        bargs: tuple[Any, ...],
        bkwargs: dict[str, Any],
    ) -> Any:
        if bargs is not args or bkwargs is not kwargs:
            out = self._call_as_spelled(args, kwargs)
            if out is not _MISS:
                return out
        return self._fallback(args, kwargs, bargs, bkwargs)

    def _call_as_spelled(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The variant for the call as spelled, or ``MISS``: an artifact saved before calls were
        bound keys its graphs that way. Eager answers where the variant would change the
        meaning of the call, or raises."""
        if not self._keeps_meaning:
            why = self._eager_because(args, kwargs)
            if why:
                return self._eager(why, args, kwargs)
        assert self._dispatcher is not None  # only reached once tuned
        try:
            return self._dispatcher.call(args, kwargs)
        except Exception as e:
            return self._variant_raised(e, args, kwargs, args, kwargs)

    def _fallback(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        bargs: tuple[Any, ...],
        bkwargs: dict[str, Any],
    ) -> Any:
        assert self._dispatcher is not None  # only reached once tuned
        index = self._dispatcher.lookup(bargs, bkwargs)
        why = self._dispatcher.explain(bargs, bkwargs)
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
        self,
        error: Exception,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        bargs: tuple[Any, ...],
        bkwargs: dict[str, Any],
    ) -> Any:
        """A tuned variant raised: warn once per variant and error, and answer with eager.

        The check at tune time ran every sample, but serving can reach inputs it never saw
        (another batch size inside the profile); eager's answer is always correct. If eager
        raises too, the input itself is at fault and that error reaches the caller.
        """
        assert self._dispatcher is not None  # only reached once tuned
        index = self._dispatcher.lookup(bargs, bkwargs)
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
        # A payload guarded by the very profile the dispatcher checks skips its second check.
        dispatcher.set_targets([dispatch_target(v.fn, v.profile) for v in variants])
        self.variants = list(variants)
        self._warned = set()
        self._keeps_meaning = all(v.backend.keeps_autograd for v in variants)
        self._refresh_params()
        self._dispatcher = dispatcher if variants else None

    def reset(self) -> None:
        """Forget tuned variants and recordings; the module runs eager again."""
        self.install([])
        self.graphs = {}
        self.report = None

    def extra_repr(self) -> str:
        state = f"tuned, {len(self.variants)} variant(s)" if self.is_tuned else "eager"
        return f"name={self.name!r}, {state}"


def _inputs_require_grad(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                return True
        elif isinstance(value, list | tuple | dict) and any(
            isinstance(t, torch.Tensor) and t.requires_grad
            for t in torch.utils._pytree.tree_leaves(value)
        ):
            return True
    return False


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
