"""src/honed/inspecting.py: honed.inspect(): the module tree, time per module, tuning candidates.

``honed.inspect(model, dataset)`` runs the dataset once, eager and under ``torch.no_grad``, with
forward hooks on every submodule (after an untimed warm-up pass over every sample), and
returns an InspectReport: for each module its parameter count, calls, inclusive wall time and
share of the whole, the distinct graphs (input signatures, as ``honed.tune`` keys them) it
received, and whether it is worth wrapping in ``honed.Module``.

Where the modules are found, for ``obj``:
- a torch.nn.Module: that module (the root, named ``""``) and its submodules;
- a honed.Module: the module it wraps (a tuned honed.Module runs its variants, so inspect a
  model before tuning it);
- any other callable (an inference function or pipeline object): the torch.nn.Modules held
  directly by its attributes (``vars(obj)``), by the attributes of ``obj.__self__`` for a bound
  method (or ``__self__`` itself when it is a module), and by its closure cells. Each is a tree
  named after its attribute or free variable, listed in the order the pipeline first calls them;
  a module found inside another one's tree is listed there only. Module-level globals,
  containers (lists, dicts) and ``functools.partial`` arguments are not scanned: pass the
  model, or an object holding it.
"""

from __future__ import annotations

import dataclasses
import io
import json
import time
from collections.abc import Callable
from typing import Any

import torch

from honed import _core
from honed.errors import InputError
from honed.module import Module
from honed.pipeline.tuner import _call, _normalize_dataset

_core.set_tensor_type(torch.Tensor)

# A module worth tuning takes at least this share of the root's time; below it, a compiled
# variant cannot save much of the whole.
MIN_SHARE = 0.10

# A module worth tuning receives at most this many distinct graphs (input signatures); each graph
# is tuned and compiled separately, so more means inputs whose ranks, dtypes or constants vary.
MAX_GRAPHS = 4

# Test hook (STYLE.md rule 6): the clock every module call is timed with, in seconds. Tests
# replace it with a fake clock so time shares are exact.
clock: Callable[[], float] = time.perf_counter


@dataclasses.dataclass
class ModuleRow:
    """One module of the inspected tree, with what running the dataset found about it."""

    name: str  # qualified name from obj ("" for the root module)
    cls: str  # class name
    depth: int  # 0 for the root (or a pipeline's top-level modules)
    parent: str | None  # the parent's qualified name; None at depth 0
    own_parameters: int  # parameters registered on this module itself
    parameters: int  # parameters of this module and all its submodules
    calls: int = 0
    time_ms: float = 0.0  # inclusive wall time over all calls
    share: float = 0.0  # time_ms / the whole run's time (the root's, for a module)
    graphs: list[str] = dataclasses.field(default_factory=list)  # distinct graph keys seen
    recommended: bool = False
    verdict: str = ""  # "tune", "covered", "too small", "many graphs" or "never called"
    reason: str = ""  # the verdict as one line


@dataclasses.dataclass
class InspectReport:
    """What ``honed.inspect`` found: one row per module, in tree order."""

    modules: list[ModuleRow]
    device: str
    samples: int
    total_ms: float  # the time shares are relative to
    min_parameters: int = 0

    def recommended(self) -> list[str]:
        """Qualified names of the modules worth wrapping in honed.Module ("" is the root)."""
        return [m.name for m in self.modules if m.recommended]

    def row(self, name: str) -> ModuleRow:
        """The row of the module with qualified name ``name``."""
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(f"honed.inspect: no module named {name!r} in this report")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self) -> Any:
        """A rich Table with one row per module, indented by depth."""
        from rich.table import Table

        table = Table(
            title=f"honed inspect on {self.device} ({self.samples} samples, {self.total_ms:.2f} ms)"
        )
        for col, justify in [
            ("module", "left"),
            ("class", "left"),
            ("params", "right"),
            ("calls", "right"),
            ("time ms", "right"),
            ("share %", "right"),
            ("graphs", "right"),
            ("verdict", "left"),
        ]:
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for m in self.modules:
            label = m.name.rsplit(".", 1)[-1] if m.name else "(root)"
            table.add_row(
                "  " * m.depth + label,
                m.cls,
                human_count(m.parameters),
                str(m.calls),
                f"{m.time_ms:.3f}",
                f"{100 * m.share:.1f}",
                str(len(m.graphs)),
                ("✔ " if m.recommended else "") + m.reason,
            )
        names = ", ".join(_label(m) for m in self.modules if m.recommended) or "none"
        table.caption = f"worth wrapping in honed.Module: {names}"
        table.caption_justify = "left"
        return table

    def render(self, width: int = 160) -> str:
        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=width, force_terminal=False).print(self.table())
        return buf.getvalue()

    def describe(self) -> None:
        """Print the table to the console."""
        from rich.console import Console

        Console().print(self.table())

    def __str__(self) -> str:
        return self.render()


def inspect(
    obj: Any,
    dataset: Any,
    *,
    max_depth: int | None = None,
    min_parameters: int = 0,
    device: str | torch.device | None = None,
) -> InspectReport:
    """Run ``dataset`` through ``obj`` once and report where the time goes, module by module.

    Args:
        obj: a torch.nn.Module, a honed.Module, or an inference function/pipeline whose
            attributes, ``__self__`` or closure hold the modules (see the module docstring).
        dataset: the samples, as for ``honed.tune`` (honed.calls): ``(args, kwargs)``, a
            tuple of positional arguments, a dict of keyword arguments, or the single argument.
        max_depth: list (and time) modules down to this depth only; 0 is the root.
        min_parameters: a module with fewer parameters is "too small" to recommend.
        device: the device the model should be on ("cuda", "cpu"); checked, never changed.

    Returns:
        An InspectReport; ``.recommended()`` names the highest modules worth tuning.
    """
    if not callable(obj):
        raise InputError(
            f"honed.inspect needs a module or an inference function, got {type(obj).__name__}"
        )
    if max_depth is not None and max_depth < 0:
        raise InputError(f"honed.inspect: max_depth must be 0 or more, got {max_depth}")
    samples = _normalize_dataset(dataset)
    roots = _roots(obj)
    target = _check_device(device, roots)
    rows, modules = _tree(roots, max_depth)
    stats = _run(obj, samples, modules, rows)
    whole = stats.pop(id(None))
    if isinstance(obj, torch.nn.Module):  # the root's time, as the hooks saw it
        whole = stats.get(id(modules[0]), whole)
    for row, module in zip(rows, modules, strict=True):
        s = stats.get(id(_measured(module)))
        if s is not None:
            row.calls, row.time_ms, row.graphs = s.calls, s.seconds * 1e3, list(s.graphs)
            row.share = s.seconds / whole.seconds if whole.seconds > 0 else 0.0
    rows = _in_call_order(rows, modules, stats)
    _recommend(rows, min_parameters)
    return InspectReport(rows, str(target), len(samples), whole.seconds * 1e3, min_parameters)


# -- finding the modules ---------------------------------------------------------------------------
def _roots(obj: Any) -> list[tuple[str, torch.nn.Module]]:
    if isinstance(obj, Module):
        return [("", obj.module)]
    if isinstance(obj, torch.nn.Module):
        return [("", obj)]
    found: list[tuple[str, torch.nn.Module]] = []
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        found.append(("", owner.module if isinstance(owner, Module) else owner))
    elif owner is not None:
        found += _module_attrs(owner)
    found += _module_attrs(obj)
    code = getattr(obj, "__code__", None)
    cells = getattr(obj, "__closure__", None) or ()
    for name, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell: the variable is not bound yet
            continue
        if isinstance(value, torch.nn.Module):
            found.append((name, value))
    roots = _outermost(found)
    if not roots:
        raise InputError(
            f"honed.inspect found no torch.nn.Module in {_describe(obj)}: pass the model itself, "
            "a bound method of it, a function that closes over it, or an object holding it as an "
            "attribute (module-level globals and containers are not scanned)"
        )
    return roots


def _module_attrs(value: Any) -> list[tuple[str, torch.nn.Module]]:
    attrs = getattr(value, "__dict__", None)
    if not isinstance(attrs, dict):
        return []
    return [(k, v) for k, v in attrs.items() if isinstance(v, torch.nn.Module)]


def _outermost(found: list[tuple[str, torch.nn.Module]]) -> list[tuple[str, torch.nn.Module]]:
    """``found`` without duplicates and without modules inside another found module's tree."""
    inner: set[int] = set()
    for _, m in found:
        inner.update(id(sub) for sub in m.modules() if sub is not m)
    roots: list[tuple[str, torch.nn.Module]] = []
    seen: set[int] = set()
    for name, m in found:
        if id(m) in seen or id(m) in inner:
            continue
        seen.add(id(m))
        roots.append((name, m.module if isinstance(m, Module) else m))
    return roots


def _describe(obj: Any) -> str:
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{name!s}"


def _check_device(
    device: str | torch.device | None, roots: list[tuple[str, torch.nn.Module]]
) -> torch.device:
    tensors = (t for _, m in roots for t in (*m.parameters(), *m.buffers()))
    first = next(tensors, None)
    found = first.device if first is not None else torch.device("cpu")
    if device is None:
        return found
    wanted = torch.device(device)
    if wanted.type == "cuda" and not torch.cuda.is_available():
        raise InputError(
            f"honed.inspect: device={str(wanted)!r} was asked for but torch cannot use CUDA here "
            f"(torch {torch.__version__}); run `honed doctor` for the reason, or use device='cpu'"
        )
    if wanted.type != found.type:
        raise InputError(
            f"honed.inspect: device={str(wanted)!r} but the model is on {found}; move the model "
            f"and its inputs with .to({str(wanted)!r}) first"
        )
    return found


def _tree(
    roots: list[tuple[str, torch.nn.Module]], max_depth: int | None
) -> tuple[list[ModuleRow], list[torch.nn.Module]]:
    """One row per module in tree order (depth first), down to ``max_depth``."""
    rows: list[ModuleRow] = []
    modules: list[torch.nn.Module] = []
    seen: set[int] = set()

    def visit(name: str, module: torch.nn.Module, depth: int, parent: str | None) -> None:
        if id(module) in seen or (max_depth is not None and depth > max_depth):
            return
        seen.add(id(module))
        own = sum(p.numel() for p in module.parameters(recurse=False))
        total = sum(p.numel() for p in module.parameters())
        rows.append(ModuleRow(name, type(module).__name__, depth, parent, own, total))
        modules.append(module)
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child, depth + 1, name)

    for name, root in roots:
        visit(name, root, 0, None)
    return rows, modules


def _measured(module: torch.nn.Module) -> torch.nn.Module:
    """The module whose hooks fire for ``module``: a honed.Module's calls bypass its own hooks."""
    return module.module if isinstance(module, Module) else module


# -- running the dataset ---------------------------------------------------------------------------
class _Stats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls = 0
        self.first = -1  # the order of its first call among all modules; -1 if never called
        self.seconds = 0.0
        self.graphs: dict[str, None] = {}  # an ordered set


@dataclasses.dataclass
class _Frame:
    module: torch.nn.Module
    started: float
    cuda: torch.device | None


def _run(
    obj: Any, samples: list[Any], modules: list[torch.nn.Module], rows: list[ModuleRow]
) -> dict[int, _Stats]:
    """Run every sample with hooks on ``modules``; the stats by module id (id(None): the whole)."""
    stats: dict[int, _Stats] = {id(None): _Stats()}
    names: dict[int, str] = {}
    for row, module in zip(rows, modules, strict=True):
        target = _measured(module)
        stats.setdefault(id(target), _Stats())
        names.setdefault(id(target), row.name or "(root)")
    stack: list[_Frame] = []
    first_calls: list[torch.nn.Module] = []

    def before(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        s = stats[id(module)]
        if s.calls == 0:
            s.first = len(first_calls)
            first_calls.append(module)
        s.calls += 1
        s.graphs[_core.signature(args, kwargs).graph_key] = None
        cuda = _cuda_device((args, kwargs))
        _sync(cuda)
        stack.append(_Frame(module, clock(), cuda))

    def after(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        while stack:  # frames of modules whose forward raised and was caught are dropped
            frame = stack.pop()
            if frame.module is module:
                _sync(frame.cuda)
                stats[id(module)].seconds += clock() - frame.started
                return

    def run(i: int, sample: Any) -> None:
        cuda = _cuda_device(sample)
        _sync(cuda)
        started = clock()
        try:
            _call(obj, sample)
        except Exception as e:
            where = ""
            if stack:
                module = stack[-1].module
                where = f" in module {names[id(module)]!r} ({type(module).__name__})"
            raise InputError(
                f"honed.inspect: running sample {i} failed{where}: {type(e).__name__}: {e}. "
                "Check that each sample matches the model's forward()"
            ) from e
        _sync(cuda)
        stats[id(None)].seconds += clock() - started

    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:
        for module in {id(_measured(m)): _measured(m) for m in modules}.values():
            handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
            handles.append(module.register_forward_hook(after))
        with torch.no_grad():
            for i, sample in enumerate(samples):  # warm-up: first calls at each shape pay
                run(i, sample)  # for lazy initialization and kernel selection, untimed
            for s in stats.values():
                s.reset()
            first_calls.clear()
            for i, sample in enumerate(samples):
                run(i, sample)
    finally:
        for handle in handles:
            handle.remove()
    return stats


def _cuda_device(value: Any) -> torch.device | None:
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor) and leaf.is_cuda:
            return leaf.device
    return None


def _sync(device: torch.device | None) -> None:
    if device is not None:
        torch.cuda.synchronize(device)


def _in_call_order(
    rows: list[ModuleRow], modules: list[torch.nn.Module], stats: dict[int, _Stats]
) -> list[ModuleRow]:
    """A pipeline's top-level trees in the order it first called them (never called: last)."""
    trees: list[tuple[float, list[ModuleRow]]] = []
    for row, module in zip(rows, modules, strict=True):
        if row.depth == 0:
            first = stats[id(_measured(module))].first
            trees.append((first if first >= 0 else float("inf"), []))
        trees[-1][1].append(row)
    trees.sort(key=lambda tree: tree[0])  # stable: never-called trees keep their order
    return [row for _, tree in trees for row in tree]


# -- recommending ----------------------------------------------------------------------------------
def _recommend(rows: list[ModuleRow], min_parameters: int) -> None:
    """Recommend the highest modules that qualify; mark what they cover and why others do not."""
    chosen: set[str] = set()
    covered: set[str] = set()
    for row in rows:  # tree order: a parent comes before its children
        if row.parent is not None and (row.parent in chosen or row.parent in covered):
            covered.add(row.name)
            row.verdict, row.reason = "covered", "covered by its parent"
        elif row.calls == 0:
            row.verdict, row.reason = "never called", "never called"
        elif row.share < MIN_SHARE:
            row.verdict = "too small"
            row.reason = f"too small: {100 * row.share:.1f} % of the time"
        elif row.parameters < min_parameters:
            row.verdict = "too small"
            row.reason = f"too small: {human_count(row.parameters)} parameters"
        elif len(row.graphs) > MAX_GRAPHS:
            row.verdict = "many graphs"
            row.reason = f"many graphs ({len(row.graphs)}): shapes or types vary call to call"
        else:
            chosen.add(row.name)
            row.recommended = True
            row.verdict = "tune"
            row.reason = (
                f"worth tuning: {100 * row.share:.1f} % of the time, "
                f"{len(row.graphs)} graph{'s' if len(row.graphs) > 1 else ''}"
            )


def _label(row: ModuleRow) -> str:
    """A module as the caption names it: its qualified name and class, the root by its class."""
    return f"{row.name!r} ({row.cls})" if row.name else f"the whole model ({row.cls})"


def human_count(n: int) -> str:
    """``n`` the short way: 950, 9.4K, 11.7M, 1.2B."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


__all__ = ["InspectReport", "ModuleRow", "inspect"]
