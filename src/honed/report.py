"""src/honed/report.py: what a tune found, as data and as one table.

``honed.tune`` returns a TuneReport: every module and graph, every candidate with its status or
failure reason, build time, latency, throughput, speed-up over eager, error against eager, and
the selection with its one-line reason.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os.path
from typing import Any


@dataclasses.dataclass
class CandidateReport:
    name: str
    backend: str
    status: str  # "ok", "failed" or "rejected" (ran, but outputs differ from eager)
    reason: str = ""
    is_baseline: bool = False
    selected: bool = False
    cached: bool = False  # the figures came from the tuning cache
    build_s: float | None = None
    median_ms: float | None = None
    p99_ms: float | None = None
    throughput: float | None = None
    cv: float | None = None
    stable: bool | None = None
    speedup: float | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    cosine: float | None = None
    build_log: str | None = None  # the candidate's third-party compiler output (buildlog.py)


@dataclasses.dataclass
class GraphReport:
    module: str
    graph: str
    samples: int
    batch_size: int
    profile: str
    candidates: list[CandidateReport]
    selected: str | None
    decision: str
    sweep: str = ""  # the batch sweep's outcome, when one ran


@dataclasses.dataclass
class TuneReport:
    graphs: list[GraphReport]
    device: str
    strategy: str
    wall_s: float
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)

    def selected(self, module: str | None = None) -> list[str | None]:
        """The selected candidate of every graph (of one module when named)."""
        return [g.selected for g in self.graphs if module is None or g.module == module]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def table(self) -> Any:
        """A rich Table with one row per candidate."""
        from rich.table import Table

        table = Table(title=f"honed tune on {self.device} ({self.strategy}, {self.wall_s:.1f} s)")
        for col, justify in [
            ("module/graph", "left"),
            ("candidate", "left"),
            ("status", "left"),
            ("build s", "right"),
            ("median ms", "right"),
            ("p99 ms", "right"),
            ("throughput/s", "right"),
            ("speedup", "right"),
            ("max err", "right"),
            ("selected", "center"),
        ]:
            table.add_column(col, justify=justify)  # type: ignore[arg-type]
        for g in self.graphs:
            where = f"{g.module} / batch {g.batch_size}" if g.batch_size else g.module
            for c in g.candidates:
                table.add_row(
                    where,
                    c.name + (" (baseline)" if c.is_baseline else ""),
                    c.status if c.status == "ok" else f"{c.status}: {c.reason}",
                    _fmt(c.build_s, "{:.2f}"),
                    _fmt(c.median_ms, "{:.3f}"),
                    _fmt(c.p99_ms, "{:.3f}"),
                    _fmt(c.throughput, "{:,.0f}"),
                    _fmt(c.speedup, "{:.2f}x"),
                    _fmt(c.max_abs_error, "{:.1e}"),
                    "✔" if c.selected else "",
                )
                where = ""
        lines = []
        logs = [c.build_log for g in self.graphs for c in g.candidates if c.build_log]
        if logs:
            lines.append(f"compiler output: {len(logs)} build.log file(s) in {_common_dir(logs)}")
        for g in self.graphs:
            if g.sweep:
                lines.append(f"{g.module} batch sweep: {g.sweep}")
            lines.append(f"{g.module} / batch {g.batch_size} decision: {g.decision}")
        table.caption = "\n".join(lines)
        table.caption_justify = "left"
        return table

    def render(self, width: int = 160) -> str:
        from rich.console import Console

        buf = io.StringIO()
        Console(file=buf, width=width, force_terminal=False).print(self.table())
        return buf.getvalue()

    def __str__(self) -> str:
        return self.render()


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _common_dir(paths: list[str]) -> str:
    return os.path.commonpath([os.path.dirname(p) for p in paths])
