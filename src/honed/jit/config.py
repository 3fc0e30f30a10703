"""src/honed/jit/config.py: honed.jit.config, JIT mode's settings (defaults from honed.config)."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from honed import config as _flags
from honed.errors import ConfigError

if TYPE_CHECKING:
    from honed.backend.base import Backend
    from honed.tune_strategy import TuneStrategy


# Re-tunes of one module for new shapes (retune_on_new_shapes); then new shapes stay eager.
MAX_RETUNES = 3


def _copy(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value


@dataclasses.dataclass
class JitConfig:
    """What JIT tuning does; every field starts from its HONED_JIT_* flag in honed.config.

    Attributes:
        min_samples: calls of a module recorded before it is tried.
        batch_axis_required: try a module only once its samples show a batch axis.
        max_depth_level: deepest module level tried (0: top modules only).
        min_parameters: modules with fewer parameters are SKIPPED.
        detect_graph_breaks: check with torch._dynamo.explain first; a break sends JIT to the
            module's children instead of compiling it whole.
        skip_modules: class names never tuned (their children still may be).
        device: the device to tune for (None: the module's own).
        dry_run: record and log what would be tuned, without tuning.
        backends: the backends to try (instances); JIT measures them all and keeps the fastest
            (MaxThroughputStrategy). None: the default candidates.
        strategy: a honed strategy instead of ``backends`` (e.g. OneBackendStrategy(...)).
        cache_dir: the persistent tuning cache (None: honed.config.cache_dir), so a second run
            of the same script reuses the first run's results.
        max_samples: samples kept per module (bounded; new shapes may take up to twice this).
        retune_on_new_shapes: a TUNED module runs shapes outside its tuned profile eager; with
            this on (the default), a new batch size of a tuned signature widens the tuned range
            at once, and ``min_samples`` calls of a new signature re-tune over the shapes tuned
            before and the new ones; in the background, at most ``MAX_RETUNES`` per module, the
            history recording each.
        wait: the call that starts a check or tune waits until JIT is idle (batch jobs that
            prefer a tuned model to an early answer); by default nothing waits.
        time_budget_s: seconds each tune may spend trying candidates (the tune's
            ``time_budget_s``; 0: none).
        batch_headroom: when the samples show a batch axis, also tune batches up to this
            factor times the largest one recorded (a power of two; 1: only those recorded).
        live_choice: while the program calls, its own calls measure the tune's candidates in
            turns (the workers only build and check them); a tune whose workers measured ends
            with a trial of the pick and its runners-up on those calls, a runner-up replacing
            the pick when they show it faster with evidence (timed with the host clock on the
            CPU, CUDA events on CUDA; honed.jit.live).
        promote: while the program calls, a candidate built while others still build is
            installed at once and, when the program's calls show it faster than what answers
            them, answers them until the tune ends (honed.jit.live.ProgramCalls.promote).
        stand_in: the same for the candidates that compile nothing (CUDA graphs over eager)
            even with ``promote`` off: they are ready seconds into a tune, and answer the
            program's calls while the compiling candidates build (off by default: the capture
            records eager's forward in the program's process, and the program's synchronize
            waits for the whole recording, docs/jit.md).
        stand_in_early: with ``stand_in``, the first stand-in is captured in the program's
            process as soon as the module's calls are recorded, checked against the program's
            own outputs and tried on its calls, before any worker is up (off by default: its
            build in the program's process still holds a call or two past twice eager's time,
            docs/jit.md).
        stability_tolerance: how far the medians of a measurement's last windows may differ
            in a JIT tune (when larger than honed.config.stability_tolerance): the program's
            own calls share the device with the measuring worker.
    """

    min_samples: int = dataclasses.field(default_factory=lambda: _copy(_flags.jit_min_samples))
    batch_axis_required: bool = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_batch_axis_required)
    )
    max_depth_level: int = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_max_depth_level)
    )
    min_parameters: int = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_min_parameters)
    )
    detect_graph_breaks: bool = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_detect_graph_breaks)
    )
    skip_modules: list[str] = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_skip_modules)
    )
    device: str | None = dataclasses.field(default_factory=lambda: _flags.jit_device or None)
    dry_run: bool = dataclasses.field(default_factory=lambda: _copy(_flags.jit_dry_run))
    backends: list[Backend] | None = dataclasses.field(default_factory=lambda: _named_backends())
    strategy: TuneStrategy | None = None
    cache_dir: str | None = dataclasses.field(default_factory=lambda: _flags.jit_cache_dir or None)
    max_samples: int = dataclasses.field(default_factory=lambda: _copy(_flags.jit_max_samples))
    retune_on_new_shapes: bool = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_retune_on_new_shapes)
    )
    wait: bool = dataclasses.field(default_factory=lambda: _copy(_flags.jit_wait))
    time_budget_s: float = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_time_budget_s)
    )
    batch_headroom: int = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_batch_headroom)
    )
    live_choice: bool = dataclasses.field(default_factory=lambda: _copy(_flags.jit_live_choice))
    promote: bool = dataclasses.field(default_factory=lambda: _copy(_flags.jit_promote))
    stand_in: bool = dataclasses.field(default_factory=lambda: _copy(_flags.jit_stand_in))
    stand_in_early: bool = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_stand_in_early)
    )
    stability_tolerance: float = dataclasses.field(
        default_factory=lambda: _copy(_flags.jit_stability_tolerance)
    )

    def tune_strategy(self) -> TuneStrategy:
        """The strategy JIT tunes with: ``strategy``, else measure ``backends`` (or defaults)."""
        from honed.tune_strategy import MaxThroughputStrategy, TuneStrategy

        if self.strategy is not None:
            if self.backends is not None:
                raise ConfigError(
                    "honed.jit.config: set either strategy or backends, not both "
                    "(a strategy carries its own backends)"
                )
            if not isinstance(self.strategy, TuneStrategy):
                raise ConfigError(
                    f"honed.jit.config.strategy must be a honed strategy such as "
                    f"honed.MaxThroughputStrategy(), got {type(self.strategy).__name__}"
                )
            return self.strategy
        if self.backends is None:
            from honed.jit.strategy import JitDefaultStrategy

            return JitDefaultStrategy()
        return MaxThroughputStrategy(self.backends)

    def reset(self) -> None:
        """Every field back to its default (from honed.config's HONED_JIT_* flags)."""
        fresh = JitConfig()
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(fresh, f.name))

    @contextlib.contextmanager
    def patch(self, **changes: Any) -> Iterator[JitConfig]:
        """Set fields for the duration of a ``with`` block; unknown names are an error."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise AttributeError(
                f"honed.jit.config has no field(s) {sorted(unknown)}; fields: {sorted(names)}"
            )
        saved = {name: getattr(self, name) for name in changes}
        for name, value in changes.items():
            setattr(self, name, value)
        try:
            yield self
        finally:
            for name, value in saved.items():
                setattr(self, name, value)


def _named_backends() -> list[Backend] | None:
    """HONED_JIT_BACKENDS (class names) as backend instances with default configs."""
    names = list(_flags.jit_backends)
    if not names:
        return None
    from honed.backend.registry import builtin_backends

    classes = {cls.__name__: cls for cls in builtin_backends()}
    unknown = [n for n in names if n not in classes]
    if unknown:
        raise ConfigError(
            f"HONED_JIT_BACKENDS names unknown backend(s) {unknown}; known: {sorted(classes)}"
        )
    return [classes[n]() for n in names]


config = JitConfig()

__all__ = ["MAX_RETUNES", "JitConfig", "config"]
