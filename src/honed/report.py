"""src/honed/report.py: what a tune found, as data, a console table, markdown, JSON and HTML.

``honed.tune`` returns a TuneReport: every module and graph, every candidate with its status or
failure reason, build time, latency, throughput, speed-up over eager, error against eager, and
the selection with its one-line reason. ``honed.save`` stores it in the artifact and
``load_report`` (``honed report ARTIFACT``) reads it back. The HTML page is report_html.py.

Every format shows the same figures the same way: a graph is named by its real input shapes,
throughput is samples per second (a sample is one row of the batch axis), the CV is a
percentage with the measurement's own stable/unstable flag (``cv_text``), the figure the decision
ranked by is named, and a busy machine is said to be busy.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
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
    cv_percent: float | None = None  # cv as a percentage (set from cv; for readers of the JSON)
    # Where its figures were measured ("cuda:1": another GPU of the host, when the tune spread
    # its measuring; "" when measured in the tune's own process or taken from the cache).
    measured_on: str = ""

    def __post_init__(self) -> None:
        self.cv_percent = None if self.cv is None else round(self.cv * 100, 2)


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
    input_shapes: str = ""  # the measured call's tensor shapes, e.g. "8x128, 8x128"
    batch_axis: str = ""  # where batch_size comes from (figures.py: inferred or the leading axis)
    ranked_by: str = ""  # the figure the decision ranked by: "throughput", "median latency", ...

    @property
    def title(self) -> str:
        """ "module / 8x128, 8x128": the graph by its real input shapes."""
        return f"{self.module} / {self.input_shapes or f'batch {self.batch_size}'}"

    @property
    def measured(self) -> str:
        """One line: the batch and where it comes from, and the figure ranked by."""
        batch = f"batch {self.batch_size}" + (f" ({self.batch_axis})" if self.batch_axis else "")
        return f"{batch} · {_ranking(self.ranked_by)}" if self.ranked_by else batch


@dataclasses.dataclass
class TuneReport:
    graphs: list[GraphReport]
    device: str
    strategy: str
    wall_s: float
    environment: dict[str, Any] = dataclasses.field(default_factory=dict)
    target: str = "python"  # honed.tune(target=): "cpp" restricted candidates to the C++ runtime
    machine: dict[str, Any] = dataclasses.field(default_factory=dict)  # machine.describe()

    @property
    def busy(self) -> str:
        """ "" on a quiet (or unchecked) machine, else the busy verdict, e.g. "busy: load ..."."""
        return str(self.machine.get("load", "busy")) if self.machine.get("busy") else ""

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
        if self.machine:
            lines += ["", "## Machine", "", "| key | value |", "|---|---|"]
            lines += [f"| {_md(k)} | {_md(str(v))} |" for k, v in self.machine.items()]
        if self.busy:
            lines[4:4] = [f"**busy machine:** {_md(self.busy)}", ""]
        for g in self.graphs:
            lines += ["", f"## {_md(g.title)}", ""]
            lines += [f"graph `{g.graph}` · {g.samples} sample(s) · {_md(g.profile)}  "]
            lines += [_md(g.measured), ""]
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

    def table(self, width: int = 160) -> Any:
        """A rich Table with one row per candidate, its columns chosen to fit ``width``: below
        110 columns the status moves under the candidate's name and only the central figures
        stay; the full reasons are in the markdown, JSON and HTML formats."""
        from rich.table import Table

        table = Table(title=f"honed tune on {self.device} ({self.strategy}, {self.wall_s:.1f} s)")
        columns = [c for c in CONSOLE_COLUMNS if c[2] <= width < c[3]]
        for name, justify, _, _ in columns:
            wraps = name in ("candidate", "status")
            table.add_column(
                name,
                justify=justify,  # type: ignore[arg-type]
                overflow="fold",
                no_wrap=not wraps,
                ratio=(3 if name == "candidate" else 2) if wraps else None,
            )
        compact = not any(name == "status" for name, _, _, _ in columns)
        for index, g in enumerate(self.graphs):
            if index:
                table.add_section()
            table.add_row(f"[bold]{_escape(g.title)}[/bold]", *[""] * (len(columns) - 1))
            for c in g.candidates:
                cells = dict(zip(MARKDOWN_COLUMNS, _cells(c), strict=True))
                cells["status"] = _brief(cells["status"])
                if compact:
                    mark = "✔ " if c.selected else ""
                    status = "" if c.status == "ok" else f"\n{cells['status']}"
                    cells["candidate"] = mark + cells["candidate"] + status
                table.add_row(*[_escape(cells[name]) for name, _, _, _ in columns])
        table.caption = _escape("\n".join(self._caption()))
        table.caption_justify = "left"
        return table

    def _caption(self) -> list[str]:
        lines = [f"busy machine: {self.busy}"] if self.busy else []
        logs = [c.build_log for g in self.graphs for c in g.candidates if c.build_log]
        if logs:
            lines.append(f"compiler output: {len(logs)} build.log file(s) in {_common_dir(logs)}")
        for g in self.graphs:
            lines.append(f"{g.title}: {g.measured}")
            if g.sweep:
                lines.append(f"{g.module} batch sweep: {g.sweep}")
            lines.append(f"{g.title} decision: {g.decision}")
        return lines

    def render(self, width: int | None = None) -> str:
        """The console table at ``width`` columns (default: the terminal's width; COLUMNS, else
        120 when not writing to a terminal)."""
        from rich.console import Console

        width = width or shutil.get_terminal_size((120, 24)).columns
        buf = io.StringIO()
        Console(file=buf, width=width, force_terminal=False).print(self.table(width))
        return buf.getvalue()

    def __str__(self) -> str:
        return self.render()


MARKDOWN_COLUMNS = (
    "candidate",
    "status",
    "build s",
    "median ms",
    "p99 ms",
    "samples/s",
    "CV",
    "speed-up",
    "max err",
    "cosine",
    "selected",
)

# The console table's columns: name, alignment, and the terminal widths it is shown at [from, to).
WIDE = 110
CONSOLE_COLUMNS = (
    ("candidate", "left", 0, 1 << 30),
    ("status", "left", WIDE, 1 << 30),
    ("build s", "right", WIDE, 1 << 30),
    ("median ms", "right", 0, 1 << 30),
    ("p99 ms", "right", WIDE, 1 << 30),
    ("samples/s", "right", 0, 1 << 30),
    ("CV", "right", 0, 1 << 30),
    ("speed-up", "right", 0, 1 << 30),
    ("max err", "right", 150, 1 << 30),
    ("cosine", "right", 150, 1 << 30),
    ("selected", "center", WIDE, 1 << 30),
)


def _brief(text: str, limit: int = 120) -> str:
    """A status for the console: its first line, at most ``limit`` characters."""
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def cv_text(cv: float | None, stable: bool | None) -> str:
    """The CV as every format shows it: a percentage and the measurement's own flag,
    e.g. "3.6% (stable)"; "-" when there is no measurement."""
    if cv is None:
        return "-"
    flag = "" if stable is None else (" (stable)" if stable else " (unstable)")
    return f"{cv:.1%}{flag}"


def _ranking(figure: str) -> str:
    """What the speed-up column means, from the figure the decision ranked by."""
    if figure == "throughput":
        return "ranked by throughput (samples/s); speed-up = throughput over eager's"
    return f"ranked by {figure}; speed-up = eager's {figure} over the candidate's"


def _cells(c: CandidateReport) -> list[str]:
    """One candidate's row of the markdown table (and the console one)."""
    return [
        c.name + (" (baseline)" if c.is_baseline else "") + (" (cached)" if c.cached else ""),
        c.status if c.status == "ok" else f"{c.status}: {c.reason}",
        _fmt(c.build_s, "{:.2f}"),
        _fmt(c.median_ms, "{:.3f}"),
        _fmt(c.p99_ms, "{:.3f}"),
        _fmt(c.throughput, "{:,.0f}"),
        cv_text(c.cv, c.stable),
        _fmt(c.speedup, "{:.2f}x"),
        _fmt(c.max_abs_error, "{:.1e}"),
        _fmt(c.cosine, "{:.6f}"),
        "✔" if c.selected else "",
    ]


def _escape(text: str) -> str:
    """Text shown as it is by rich (no [markup])."""
    from rich.markup import escape

    return escape(text)


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
        machine=reports[0].machine or dict(manifest.get("machine", {})),
    )
