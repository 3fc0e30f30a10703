"""src/honed/cli/dryrun.py: `honed tune --dry-run`: the candidates a tune would try here and why not
the others, without building, measuring or saving anything (the model is not even called)."""

from __future__ import annotations

from typing import Any

import torch

from honed.backend import Backend, TorchEagerBackend, builtin_backends
from honed.module import Module, find_modules
from honed.tune_strategy import MaxThroughputStrategy, TuneStrategy


def _device(model: Any, device: str | None) -> torch.device:
    if device:
        return torch.device(device)
    if isinstance(model, torch.nn.Module):
        for t in (*model.parameters(), *model.buffers()):
            return t.device
    return torch.device("cpu")


def _strategy(modules: list[Module], kwargs: dict[str, Any]) -> TuneStrategy:
    strategy = kwargs.get("strategy")
    if strategy is None and len(modules) == 1 and modules[0].strategy is not None:
        strategy = modules[0].strategy
    return strategy or MaxThroughputStrategy(kwargs.get("backends"))


def _why_not(backend: Backend, device: torch.device) -> str:
    """Why ``backend`` cannot run on ``device`` ("" when it can)."""
    try:
        available = type(backend).available()
        if not available:
            return f"unavailable: {available.reason}" + (
                f" (fix: {available.fix})" if available.fix else ""
            )
        supported = backend.supports(device)
    except Exception as e:  # available() must not raise; say so rather than stop
        return f"its availability check raised {type(e).__name__}: {e}"
    if not supported:
        return f"not on {device}: {supported.reason}" + (
            f" (fix: {supported.fix})" if supported.fix else ""
        )
    return ""


def dry_run(model: Any, kwargs: dict[str, Any], device: str | None) -> str:
    """What ``honed.tune(model, ..., **kwargs)`` would try on this machine, as text."""
    from honed.cli.doctor import quiet_imports

    with quiet_imports():  # availability checks import libraries that warn on import
        return _dry_run(model, kwargs, device)


def _dry_run(model: Any, kwargs: dict[str, Any], device: str | None) -> str:
    from honed.pipeline.graph_tuner import for_target

    modules = find_modules(model)
    names = ", ".join(repr(m.name) for m in modules) or "the honed.Modules the function calls"
    run_on = _device(model, device)
    strategy = _strategy(modules, kwargs)
    target = kwargs.get("target", "python")
    listed = strategy.backends(run_on)
    candidates, note = for_target(listed, target, names)
    lines = [
        f"honed tune --dry-run: {names} on {run_on}, {strategy.describe()}"
        + (f", target {target}" if target != "python" else "")
        + "; nothing is built, measured or saved",
        "would try:",
    ]
    width = max([len(b.name) for b in [TorchEagerBackend(), *candidates]] + [24]) + 2
    tried: list[Backend] = []
    if strategy.uses_baseline:
        lines.append(f"  {'TorchEagerBackend':<{width}}the baseline (eager PyTorch, the reference)")
    skipped: list[tuple[str, str]] = []
    for backend in candidates:
        why = _why_not(backend, run_on)
        if why:
            skipped.append((backend.name, why))
        elif not (strategy.uses_baseline and backend.name == "TorchEagerBackend"):
            lines.append(f"  {backend.name}")
            tried.append(backend)
    if not tried:
        lines.append("  (no candidate besides eager)")
    dropped = {b.name for b in listed} - {b.name for b in candidates}
    skipped += [(name, "cannot run in the C++ runtime (target cpp)") for name in sorted(dropped)]
    offered = {type(b) for b in listed}
    for cls in builtin_backends():
        if cls in offered or cls is TorchEagerBackend:
            continue
        why = _why_not(cls(), run_on)
        skipped.append(
            (
                cls.__name__,
                why
                or f"available, not a default candidate on {run_on.type} (ask for it with "
                f"--backend {cls.__name__})",
            )
        )
    if skipped:
        lines.append("not tried:")
        width = max(len(name) for name, _ in skipped) + 2
        lines += [f"  {name:<{width}}{why}" for name, why in skipped]
    return "\n".join(lines) + (f"\nnote:{note.removeprefix(' ·')}" if note else "")
