"""src/honed/report_html.py: the tuning report as one self-contained, responsive HTML page.

Nothing is fetched: the CSS, the charts (HTML elements placed by percentages, so they span the
page at any width and candidate names wrap in full) and a few lines of script (sortable tables)
are all in the page, so it can be mailed, attached to an issue or opened offline. Below 800 px
the candidate table turns into one card per candidate, so nothing scrolls sideways. Every piece
of text from the report goes through html.escape.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

from honed import _core
from honed._version import __version__
from honed.report import cv_text

if TYPE_CHECKING:
    from honed.report import CandidateReport, GraphReport, TuneReport

COLOURS = {"selected": "#2e7d32", "baseline": "#9e9e9e", "other": "#1565c0", "bad": "#c62828"}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 16px;
       color: #212121; background: #fafafa; overflow-wrap: break-word; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 0 0 6px; }
.meta { color: #616161; margin-bottom: 12px; }
.busy { border-left: 4px solid #e65100; background: #fff3e0; padding: 6px 10px; margin: 8px 0; }
section.graph { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 16px;
                margin: 18px 0; }
table { border-collapse: collapse; margin: 8px 0; }
table.sortable { width: 100%; }
th, td { border-bottom: 1px solid #eeeeee; padding: 4px 8px; text-align: right;
         vertical-align: top; }
th { background: #f5f5f5; cursor: pointer; user-select: none; }
td.text, th.text { text-align: left; } td.reason { color: #b71c1c; }
td.name { min-width: 12em; overflow-wrap: anywhere; }
tr.selected td { background: #e8f5e9; font-weight: 600; }
.decision { border-left: 4px solid #2e7d32; background: #f1f8e9; padding: 6px 10px; margin: 8px 0; }
.sweep { border-left: 4px solid #1565c0; background: #e3f2fd; padding: 6px 10px; margin: 8px 0; }
.unstable { color: #e65100; font-weight: 600; } .env td:first-child { color: #616161; }
figure.chart { margin: 16px 0 0; width: 100%; }
figcaption { color: #616161; font-size: 12px; }
.chart .title { font-weight: 600; margin-bottom: 4px; }
.chart .row { display: grid; grid-template-columns: minmax(8em, 28%) 1fr; gap: 10px;
              align-items: center; min-height: 22px; }
.chart .label { text-align: right; font-size: 12px; line-height: 1.25; }
.chart .track { position: relative; height: 22px; }
.chart .grid { position: absolute; top: 0; bottom: 0; border-left: 1px solid #e0e0e0; }
.chart .ref { position: absolute; top: 0; bottom: 0; border-left: 2px dashed #424242; }
.chart .bar { position: absolute; left: 0; top: 4px; height: 14px; }
.chart .value { position: absolute; top: 2px; font-size: 12px; white-space: nowrap;
                padding-left: 7px; }
.chart .note { position: absolute; left: 4px; top: 2px; font-size: 12px; color: #c62828; }
.chart .tick { position: absolute; top: 0; font-size: 11px; color: #616161;
               transform: translateX(-50%); white-space: nowrap; }
.chart .whisker { position: absolute; top: 10px; height: 2px; }
.chart .iqr { position: absolute; top: 4px; height: 14px; opacity: 0.35; min-width: 1px; }
.chart .mid { position: absolute; top: 2px; height: 18px; width: 3px; margin-left: -1px; }
.chart .p99 { position: absolute; top: 6px; height: 10px; width: 2px; margin-left: -1px; }
@media (max-width: 800px) {
  table.sortable thead { display: none; }
  table.sortable tr { display: block; border: 1px solid #e0e0e0; border-radius: 4px;
                      margin: 0 0 8px; }
  table.sortable td { display: flex; justify-content: space-between; gap: 1em;
                      text-align: right; border-bottom: 1px solid #f5f5f5; min-width: 0; }
  table.sortable td::before { content: attr(data-label); color: #616161; font-weight: 400;
                              text-align: left; flex: none; }
  .chart .row { grid-template-columns: minmax(6em, 34%) 1fr; }
}
"""

# Sortable tables; then markers the headless-browser test reads: the script ran to its end, and
# the layout (whether the page scrolls sideways, the narrowest chart as a share of its section).
SCRIPT = """
document.querySelectorAll("table.sortable th").forEach(function (th, col) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var up = th.dataset.dir !== "up";
    th.dataset.dir = up ? "up" : "down";
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.v || a.cells[col].textContent;
      var y = b.cells[col].dataset.v || b.cells[col].textContent;
      var nx = parseFloat(x), ny = parseFloat(y);
      var c = (isNaN(nx) || isNaN(ny)) ? x.localeCompare(y) : nx - ny;
      return up ? c : -c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
var root = document.documentElement, share = 100;
document.querySelectorAll("figure.chart").forEach(function (f) {
  var inner = f.parentElement.clientWidth - 32;
  share = Math.min(share, Math.round(100 * f.getBoundingClientRect().width / inner));
});
document.body.dataset.honedScrollsSideways = String(root.scrollWidth > root.clientWidth);
document.body.dataset.honedChartShare = String(share);
document.body.dataset.honedReady = "1";
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def render_html(report: TuneReport) -> str:
    """The whole page."""
    busy = f'<div class="busy"><b>busy machine:</b> {_e(report.busy)}</div>' if report.busy else ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>honed tuning report ({_e(report.device)})</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>honed tuning report</h1>",
        f'<div class="meta">device <b>{_e(report.device)}</b> · strategy {_e(report.strategy)} · '
        f"{report.wall_s:.1f} s · {len(report.graphs)} graph(s)</div>",
        busy,
        _pairs("Environment", report.environment),
        _pairs("Machine", report.machine) if report.machine else "",
    ]
    parts += [_graph(g, i) for i, g in enumerate(report.graphs)]
    parts += [
        f'<div class="meta">written by honed {_e(__version__)}</div>',
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"


def _pairs(title: str, values: dict[str, object]) -> str:
    rows = "".join(
        f'<tr><td class="text">{_e(k)}</td><td class="text">{_e(v)}</td></tr>'
        for k, v in values.items()
    )
    return f'<h2>{_e(title)}</h2><table class="env">{rows}</table>'


COLUMNS = (
    "candidate",
    "status",
    "build s",
    "median ms",
    "p99 ms",
    "samples/s",
    "CV",
    "speed-up",
    "max abs err",
    "max rel err",
    "cosine",
    "selected",
)


def _graph(g: GraphReport, index: int) -> str:
    header = "".join(
        f'<th class="{"text" if i < 2 else ""}">{_e(c)}</th>' for i, c in enumerate(COLUMNS)
    )
    rows = "".join(_row(c) for c in g.candidates)
    sweep = f'<div class="sweep"><b>batch sweep:</b> {_e(g.sweep)}</div>' if g.sweep else ""
    chosen = _e(g.selected) if g.selected else "eager (nothing selected)"
    ranked = g.ranked_by or "median latency"
    return (
        f'<section class="graph" id="graph-{index}">'
        f"<h2>{_e(g.title)}</h2>"
        f'<div class="meta">graph <code>{_e(g.graph)}</code> · {g.samples} sample(s) · '
        f"{_e(g.profile)}<br>{_e(g.measured)}</div>"
        f'<div class="decision"><b>selected: {chosen}</b> — {_e(g.decision)}</div>{sweep}'
        f'<table class="sortable"><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>'
        f"{_speedup_chart(g)}"
        f"<figcaption>speed-up over eager by {_e(ranked)} (dashed line: eager)</figcaption>"
        f"{_latency_chart(g)}"
        "<figcaption>latency per call (ms, log scale): whiskers min–max, box median–p90, tick "
        "p99 (median–p99 only where no samples were kept)</figcaption>"
        "</section>"
    )


def _row(c: CandidateReport) -> str:
    status = _e(c.status) if c.status == "ok" else f"<b>{_e(c.status)}</b>: {_e(c.reason)}"
    cv = _e(cv_text(c.cv, c.stable)).replace(
        "(unstable)", '<span class="unstable">(unstable)</span>'
    )
    name = _e(c.name) + (" <i>(baseline)</i>" if c.is_baseline else "")
    name += " <i>(cached)</i>" if c.cached else ""
    cells = [
        (f'class="text name" title="{_e(c.backend)}"', name),
        ('class="text reason"' if c.status != "ok" else 'class="text"', status),
        _num(c.build_s, "{:.2f}"),
        _num(c.median_ms, "{:.3f}"),
        _num(c.p99_ms, "{:.3f}"),
        _num(c.throughput, "{:,.0f}"),
        (f'data-v="{c.cv!r}"' if c.cv is not None else 'data-v="-1e308"', cv),
        _num(c.speedup, "{:.2f}x"),
        _num(c.max_abs_error, "{:.1e}"),
        _num(c.max_rel_error, "{:.1e}"),
        _num(c.cosine, "{:.6f}"),
        ("", "✔" if c.selected else ""),
    ]
    tds = "".join(
        f'<td data-label="{_e(label)}" {attrs}><span>{text}</span></td>'
        for label, (attrs, text) in zip(COLUMNS, cells, strict=True)
    )
    return f'<tr class="{"selected" if c.selected else ""}">{tds}</tr>'


def _num(value: float | None, pattern: str) -> tuple[str, str]:
    if value is None:
        return 'data-v="-1e308"', "-"
    return f'data-v="{value!r}"', _e(pattern.format(value))


# -- charts ------------------------------------------------------------------------------------
def _colour(c: CandidateReport) -> str:
    if c.selected:
        return COLOURS["selected"]
    return COLOURS["baseline"] if c.is_baseline else COLOURS["other"]


def _pct(x: float) -> str:
    return f"{min(max(x, 0.0), 1.0) * 100:.2f}%"


def _chart_row(label: str, track: str) -> str:
    return (
        f'<div class="row"><div class="label">{label}</div><div class="track">{track}</div></div>'
    )


def _chart(title: str, rows: list[tuple[str, str]], ticks: list[tuple[float, str]]) -> str:
    """A chart: a title, one row per candidate and an axis row, every position a share."""
    grid = "".join(f'<span class="grid" style="left:{_pct(x)}"></span>' for x, _ in ticks)
    axis = "".join(f'<span class="tick" style="left:{_pct(x)}">{_e(t)}</span>' for x, t in ticks)
    body = "".join(_chart_row(label, grid + track) for label, track in rows)
    return (
        f'<figure class="chart" aria-label="{_e(title)}"><div class="title">{_e(title)}</div>'
        f"{body}{_chart_row('', axis)}</figure>"
    )


def _label(c: CandidateReport) -> str:
    return _e(c.name) + (" <i>(baseline)</i>" if c.is_baseline else "")


def _ticks(hi: float) -> list[float]:
    """About five round tick values from 0 to hi."""
    if hi <= 0 or not math.isfinite(hi):
        return [0.0]
    step = 10 ** math.floor(math.log10(hi / 5))
    for mult in (1, 2, 5, 10):
        if hi / (step * mult) <= 6:
            step *= mult
            break
    return [round(i * step, 12) for i in range(int(hi / step) + 1)]


def _speedup_chart(g: GraphReport) -> str:
    hi = max([c.speedup for c in g.candidates if c.speedup is not None] + [1.0]) * 1.15
    ref = f'<span class="ref" style="left:{_pct(1 / hi)}"></span>'
    rows = []
    for c in g.candidates:
        if c.speedup is None:
            why = c.status if c.status != "ok" else "not measured"
            rows.append((_label(c), f'<span class="note">{_e(why)}</span>'))
            continue
        w = c.speedup / hi
        rows.append(
            (
                _label(c),
                f'<span class="bar" style="width:{_pct(w)};background:{_colour(c)}" '
                f'title="{_e(c.name)}: {c.speedup:.2f}x"></span>{ref}'
                f'<span class="value" style="left:{_pct(w)}">{c.speedup:.2f}x</span>',
            )
        )
    ticks = [(t / hi, f"{t:g}x") for t in _ticks(hi)]
    return _chart(f"speed-up vs eager ({g.ranked_by or 'median latency'})", rows, ticks)


def _spread(c: CandidateReport) -> dict[str, float] | None:
    """min, median, p90, p99, max of a candidate (from its samples; else median and p99)."""
    if c.samples_ms:
        s = _core.stats([float(v) for v in c.samples_ms])
        return {
            "min": s.min_ms,
            "median": s.median_ms,
            "p90": s.p90_ms,
            "p99": s.p99_ms,
            "max": s.max_ms,
        }
    if c.median_ms is None:
        return None
    p99 = c.p99_ms if c.p99_ms is not None else c.median_ms
    return {"min": c.median_ms, "median": c.median_ms, "p90": p99, "p99": p99, "max": p99}


def _log_ticks(lo: float, hi: float) -> list[float]:
    """1-2-5 tick values between lo and hi (only the powers of ten when that makes too many)."""
    ticks = []
    for k in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1):
        ticks += [d * 10.0**k for d in (1, 2, 5) if lo <= d * 10.0**k <= hi]
    if len(ticks) > 8:
        ticks = [t for t in ticks if math.isclose(10 ** round(math.log10(t)), t)]
    return ticks


def _latency_chart(g: GraphReport) -> str:
    spreads = [_spread(c) for c in g.candidates]
    values = [max(v, 1e-6) for s in spreads if s is not None for v in s.values()] or [1.0]
    lo, hi = min(values) / 1.25, max(values) * 1.25

    def at(v: float) -> float:
        return math.log(max(v, 1e-6) / lo) / math.log(hi / lo)

    rows = []
    for c, s in zip(g.candidates, spreads, strict=True):
        if s is None:
            rows.append((_label(c), f'<span class="note">{_e(c.status)}</span>'))
        else:
            rows.append((_label(c), _box(c, s, {k: at(v) for k, v in s.items()})))
    ticks = [(at(t), f"{t:g}") for t in _log_ticks(lo, hi)]
    return _chart("latency per call (ms, log scale)", rows, ticks)


def _box(c: CandidateReport, s: dict[str, float], x: dict[str, float]) -> str:
    """One candidate's whiskers (min-max), box (median-p90) and p99 tick."""
    tip = ", ".join(f"{k} {v:.3f} ms" for k, v in s.items())
    colour = _colour(c)
    return (
        f'<span class="box" title="{_e(c.name)}: {_e(tip)}">'
        f'<span class="whisker" style="left:{_pct(x["min"])};width:{_pct(x["max"] - x["min"])};'
        f'background:{colour}"></span>'
        f'<span class="iqr" style="left:{_pct(x["median"])};'
        f'width:{_pct(x["p90"] - x["median"])};background:{colour}"></span>'
        f'<span class="mid" style="left:{_pct(x["median"])};background:{colour}"></span>'
        f'<span class="p99" style="left:{_pct(x["p99"])};background:{colour}"></span>'
        "</span>"
    )
