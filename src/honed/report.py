"""src/honed/report.py: what a tune found, as data, a console table, markdown, JSON and HTML.

``honed.tune`` returns a TuneReport: every module and graph, every candidate with its status or
failure reason, build time, latency, throughput, speed-up over eager, error against eager, and
the selection with its one-line reason. ``honed.save`` stores it in the artifact and
``load_report`` (``honed report ARTIFACT``) reads it back. The HTML page is report_html.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
from pathlib import Path
from typing import Any

from honed.errors import ArtifactError, InputError


@dataclasses.dataclass
class CandidateReport:
    name: str
    backend: str
    # "ok", "failed", "rejected" (ran, but outputs differ from eager) or "not tried" (left out by
    # the plan or the time budget; docs/tuning.md)
    status: str
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
    samples_ms: list[float] | None = None  # raw latencies (capped), for the distribution plots


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
    install_s: float = 0.0  # building (or loading) the winner here after it was chosen elsewhere


@dataclasses.dataclass
class TuneReport:
    graphs: list[GraphReport]
    device: str
    strategy: str
    wall_s: float
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    target: str = "python"  # honed.tune(target=): "cpp" restricted candidates to the C++ runtime

    def selected(self, module: str | None = None) -> list[str | None]:
        """The selected candidate of every graph (of one module when named)."""
        return [g.selected for g in self.graphs if module is None or g.module == module]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TuneReport:
        """The report that ``to_dict`` (or ``json.loads(to_json())``) described."""
        try:
            graphs = []
            for g in _kwargs(cls, data).get("graphs", []):
                candidates = [
                    CandidateReport(**_kwargs(CandidateReport, c))
                    for c in _kwargs(GraphReport, g).get("candidates", [])
                ]
                graphs.append(GraphReport(**{**_kwargs(GraphReport, g), "candidates": candidates}))
            return cls(**{**_kwargs(cls, data), "graphs": graphs})
        except TypeError as e:
            raise InputError(
                f"TuneReport.from_dict: the report data is incomplete ({e}); pass the output of "
                "TuneReport.to_dict()"
            ) from e

    def to_markdown(self) -> str:
        """Environment, one table per graph and each graph's decision, as markdown."""
        lines = [
            "# honed tuning report",
            "",
            f"device `{self.device}` · strategy {_md(self.strategy)} · {self.wall_s:.1f} s"
            + (f" · target {_md(self.target)}" if self.target != "python" else ""),
            "",
            "## Environment",
            "",
            "| key | value |",
            "|---|---|",
        ]
        lines += [f"| {_md(k)} | {_md(str(v))} |" for k, v in self.environment.items()]
        for g in self.graphs:
            lines += ["", f"## {_md(g.module)} / batch {g.batch_size}", ""]
            lines += [f"graph `{g.graph}` · {g.samples} sample(s) · {_md(g.profile)}", ""]
            lines.append("| " + " | ".join(MARKDOWN_COLUMNS) + " |")
            aligns = ["---" if i < 2 else "--:" for i in range(len(MARKDOWN_COLUMNS))]
            lines.append("|" + "|".join(aligns) + "|")
            for c in g.candidates:
                lines.append("| " + " | ".join(_md(cell) for cell in _cells(c)) + " |")
            lines.append("")
            if g.sweep:
                lines.append(f"**batch sweep:** {_md(g.sweep)}  ")
            lines.append(f"**decision:** {_md(g.decision)}")
        return "\n".join(lines) + "\n"

    def to_html(self) -> str:
        """One self-contained HTML page (inline CSS and SVG plots, nothing fetched)."""
        from honed.report_html import render_html

        return render_html(self)

    def save_html(self, path: str | os.PathLike[str]) -> Path:
        """Write ``to_html()`` to ``path`` and return it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_html(), encoding="utf-8")
        return path

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
            ("cosine", "right"),
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
                    _fmt(c.cosine, "{:.6f}"),
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


MARKDOWN_COLUMNS = (
    "candidate",
    "status",
    "build s",
    "median ms",
    "p99 ms",
    "throughput/s",
    "CV",
    "speed-up",
    "max err",
    "cosine",
    "selected",
)


def _cells(c: CandidateReport) -> list[str]:
    """One candidate's row of the markdown table (and the HTML one)."""
    stability = "" if c.stable is None else (" (stable)" if c.stable else " (unstable)")
    return [
        c.name + (" (baseline)" if c.is_baseline else "") + (" (cached)" if c.cached else ""),
        c.status if c.status == "ok" else f"{c.status}: {c.reason}",
        _fmt(c.build_s, "{:.2f}"),
        _fmt(c.median_ms, "{:.3f}"),
        _fmt(c.p99_ms, "{:.3f}"),
        _fmt(c.throughput, "{:,.0f}"),
        _fmt(c.cv, "{:.1%}") + (stability if c.cv is not None else ""),
        _fmt(c.speedup, "{:.2f}x"),
        _fmt(c.max_abs_error, "{:.1e}"),
        _fmt(c.cosine, "{:.6f}"),
        "✔" if c.selected else "",
    ]


def _md(text: str) -> str:
    """Text safe inside a markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _common_dir(paths: list[str]) -> str:
    return os.path.commonpath([os.path.dirname(p) for p in paths])


def _kwargs(cls: type[Any], data: Any) -> dict[str, Any]:
    """The entries of ``data`` that are fields of the dataclass ``cls``."""
    if not isinstance(data, dict):
        raise InputError(
            f"TuneReport.from_dict: expected a JSON object for {cls.__name__}, got "
            f"{type(data).__name__}; pass the output of TuneReport.to_dict()"
        )
    fields = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in data.items() if k in fields}


def load_report(path: str | os.PathLike[str]) -> TuneReport:
    """The tuning report stored in an artifact, every module's graphs in one TuneReport."""
    from honed.artifact import read_artifact

    manifest, _ = read_artifact(path)
    reports = [TuneReport.from_dict(m["report"]) for m in manifest["modules"] if m.get("report")]
    if not reports:
        raise ArtifactError(
            f"honed report: {path} holds no tuning report (it was saved by an older honed, or "
            "from modules loaded rather than tuned); tune the model and honed.save it again"
        )
    strategies = list(dict.fromkeys(r.strategy for r in reports))
    return TuneReport(
        graphs=[g for r in reports for g in r.graphs],
        device=reports[0].device,
        strategy="; ".join(strategies),
        wall_s=max(r.wall_s for r in reports),
        environment=reports[0].environment or dict(manifest.get("environment", {})),
    )
