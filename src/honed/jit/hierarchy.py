"""src/honed/jit/hierarchy.py: the modules JIT discovered, their states, and the tree printout."""

from __future__ import annotations

import enum
import weakref
from typing import Any

import torch


class State(enum.Enum):
    """The seed's PatchedModule states, with their markers."""

    INIT = "⏳"  # before the first forward call has finished; hierarchy not resolved yet
    RECORDING = "🔴"  # hierarchy resolved; collecting samples
    TUNED = "🎯"  # forwards through a tuned backend
    EAGER = "⚠️"  # tuning failed or was not possible; runs the original module
    SKIPPED = "🚫"  # skip_modules, too small, or too deep: left alone
    DETACHED = "☑️"  # a parent was tuned, so this module is unpatched

    @property
    def label(self) -> str:
        return f"{self.name.lower()}{self.value}"


def format_count(n: int) -> str:
    """11.7M, 9.4K, 128: the seed's parameter counts."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}"
    return str(n)


class Node:
    """One module instance JIT has seen (the seed's PatchedModule)."""

    def __init__(self, module: torch.nn.Module, parent: Node | None) -> None:
        self._module = weakref.ref(module)
        self.name = type(module).__name__
        self.parameters = sum(p.numel() for p in module.parameters())
        self.parent = parent
        self.level: int = 0 if parent is None else parent.level + 1
        self.children: list[Node] = []
        self.state = State.INIT
        self.call_count = 0
        self.samples: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.outputs: list[Any] = []  # the program's output for each sample (eager's)
        self.shapes_seen: set[Any] = set()
        self.tried = False  # JIT has decided about this node (whatever the outcome)
        self.backend: str | None = None  # the tuned variant's backend, when TUNED
        self.tuned: Any = None  # the honed.Module calls route through, when TUNED
        self.reason = ""  # why EAGER or SKIPPED
        self.report: Any = None  # the TuneReport, when tuned
        self.from_cache = False  # the tune reused the cached decision (nothing measured)
        self.decision_s = 0.0  # tuning time spent deciding (or reading the cached decision)
        self.rebuild_s = 0.0  # tuning time spent building the winner in this process
        self.tuned_samples: list[tuple[tuple[Any, ...], dict[str, Any]]] = []  # for re-tunes
        self.new_samples: list[tuple[tuple[Any, ...], dict[str, Any]]] = []  # outside profile
        self.outside_seen: set[str] = set()
        self.retunes = 0
        self.busy = False  # a check or tune of this module is queued or running (background.py)
        self.queued_at_call = 0  # call_count when its latest check or tune was queued
        self.tuner: Any = None  # the honed.pipeline.tuner.Tuner of its latest tune
        self.trial: Any = None  # a live trial of two variants on its calls (honed.jit.live)
        self.tuned_keys: set[str] = set()  # graph keys of the signatures it was tuned on
        if parent is not None:
            parent.children.append(self)

    @property
    def module(self) -> torch.nn.Module | None:
        return self._module()

    def short(self) -> str:
        return f"{self.name} 📊{format_count(self.parameters)}"

    def describe(self) -> str:
        extra = ""
        if self.state is State.TUNED and self.backend:
            extra = f" ({self.backend}{', from cache' if self.from_cache else ''})"
        if self.retunes:
            extra += f" retunes={self.retunes}"
        return (
            f"{self.short()} level={self.level}🪜 state={self.state.label}{extra} "
            f"call_count={self.call_count}"
        )

    def descendants(self) -> list[Node]:
        out: list[Node] = []
        for child in self.children:
            out.append(child)
            out += child.descendants()
        return out


def render(roots: list[Node]) -> str:
    """The tree, one module a line, indented by level, as in the seed's example."""
    lines = ["JIT Tuning Hierarchy:"]

    def visit(node: Node) -> None:
        busy = " (tuning in the background)" if node.busy else ""
        lines.append(f"{'   ' * node.level}├─ {node.describe()}{busy}")
        for child in node.children:
            visit(child)

    for root in roots:
        visit(root)
    return "\n".join(lines)


__all__ = ["Node", "State", "format_count", "render"]
