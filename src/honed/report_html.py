"""src/honed/report_html.py: the tuning report as one self-contained HTML page with SVG plots.

Nothing is fetched: the CSS, the plots (inline SVG drawn here) and a few lines of script (sortable
tables) are all in the page, so it can be mailed, attached to an issue or opened offline. Every
piece of text from the report goes through html.escape.
"""

from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING

from honed import _core
from honed._version import __version__

if TYPE_CHECKING:
    from honed.report import CandidateReport, GraphReport, TuneReport

LABEL_W = 240  # px left of every plot for the candidate names
PLOT_W = 300  # px of the plotting area (two plots side by side fit a 1280 px wide window)
ROW_H = 26  # px per candidate in a plot
COLOURS = {"selected": "#2e7d32", "baseline": "#9e9e9e", "other": "#1565c0", "bad": "#c62828"}

CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 24px;
       color: #212121; background: #fafafa; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 18px; margin: 0 0 6px; }
.meta { color: #616161; margin-bottom: 12px; }
section.graph { background: #fff; border: 1px solid #e0e0e0; border-radius: 6px; padding: 16px;
                margin: 18px 0; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { border-bottom: 1px solid #eeeeee; padding: 4px 8px; text-align: right;
         vertical-align: top; }
th { background: #f5f5f5; cursor: pointer; user-select: none; white-space: nowrap; }
td.text, th.text { text-align: left; } td.reason { max-width: 420px; color: #b71c1c; }
tr.selected td { background: #e8f5e9; font-weight: 600; }
.decision { border-left: 4px solid #2e7d32; background: #f1f8e9; padding: 6px 10px; margin: 8px 0; }
.sweep { border-left: 4px solid #1565c0; background: #e3f2fd; padding: 6px 10px; margin: 8px 0; }
.plots { display: flex; flex-wrap: wrap; gap: 24px; }
.plots figure { margin: 0; } figcaption { color: #616161; font-size: 12px; }
.unstable { color: #e65100; font-weight: 600; } .env td:first-child { color: #616161; }
svg text { font: 12px system-ui, sans-serif; fill: #212121; }
"""

# Sortable tables, and a marker that the script ran to the end (the headless-browser test reads it).
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
document.body.dataset.honedReady = "1";
"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def render_html(report: TuneReport) -> str:
    """The whole page."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>honed tuning report ({_e(report.device)})</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>honed tuning report</h1>",
        f'<div class="meta">device <b>{_e(report.device)}</b> · strategy {_e(report.strategy)} · '
        f"{report.wall_s:.1f} s · {len(report.graphs)} graph(s)</div>",
        _environment(report),
    ]
    parts += [_graph(g, i) for i, g in enumerate(report.graphs)]
    parts += [
        f'<div class="meta">written by honed {_e(__version__)}</div>',
        f"<script>{SCRIPT}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _environment(report: TuneReport) -> str:
    rows = "".join(
        f'<tr><td class="text">{_e(k)}</td><td class="text">{_e(v)}</td></tr>'
        for k, v in report.environment.items()
    )
    return f'<h2>Environment</h2><table class="env">{rows}</table>'


COLUMNS = (
    "candidate",
    "status",
    "build s",
    "median ms",
    "p99 ms",
    "throughput/s",
    "CV",
    "stable",
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
    return (
        f'<section class="graph" id="graph-{index}">'
        f"<h2>{_e(g.module)} / batch {g.batch_size}</h2>"
        f'<div class="meta">graph <code>{_e(g.graph)}</code> · {g.samples} sample(s) · '
        f"{_e(g.profile)}</div>"
        f'<div class="decision"><b>selected: {chosen}</b> — {_e(g.decision)}</div>{sweep}'
        f'<table class="sortable"><thead><tr>{header}</tr></thead><tbody>{rows}</tbody></table>'
        '<div class="plots">'
        f"<figure>{_speedup_svg(g)}<figcaption>speed-up over eager (median latency ratio; "
        "dashed line: eager)</figcaption></figure>"
        f"<figure>{_latency_svg(g)}<figcaption>latency distribution (log scale): whiskers "
        "min–max, box median–p90, tick p99 (median–p99 only where no samples were kept)"
        "</figcaption></figure>"
        "</div></section>"
    )


def _row(c: CandidateReport) -> str:
    status = _e(c.status) if c.status == "ok" else f"<b>{_e(c.status)}</b>: {_e(c.reason)}"
    stable = (
        "-" if c.stable is None else ("yes" if c.stable else '<span class="unstable">no</span>')
    )
    name = _e(c.name) + (" <i>(baseline)</i>" if c.is_baseline else "")
    name += " <i>(cached)</i>" if c.cached else ""
    cells = [
        (f'class="text" title="{_e(c.backend)}"', name),
        ('class="text reason"' if c.status != "ok" else 'class="text"', status),
        _num(c.build_s, "{:.2f}"),
        _num(c.median_ms, "{:.3f}"),
        _num(c.p99_ms, "{:.3f}"),
        _num(c.throughput, "{:,.0f}"),
        _num(c.cv, "{:.1%}"),
        ("", stable),
        _num(c.speedup, "{:.2f}x"),
        _num(c.max_abs_error, "{:.1e}"),
        _num(c.max_rel_error, "{:.1e}"),
        _num(c.cosine, "{:.6f}"),
        ("", "✔" if c.selected else ""),
    ]
    tds = "".join(f"<td {attrs}>{text}</td>" for attrs, text in cells)
    return f'<tr class="{"selected" if c.selected else ""}">{tds}</tr>'


def _num(value: float | None, pattern: str) -> tuple[str, str]:
    if value is None:
        return 'data-v="-1e308"', "-"
    return f'data-v="{value!r}"', _e(pattern.format(value))


# -- plots -------------------------------------------------------------------------------------
def _colour(c: CandidateReport) -> str:
    if c.selected:
        return COLOURS["selected"]
    return COLOURS["baseline"] if c.is_baseline else COLOURS["other"]


def _label(c: CandidateReport, y: float) -> str:
    short = c.name if len(c.name) <= 34 else c.name[:33] + "…"
    return (
        f'<text x="{LABEL_W - 8}" y="{y:.1f}" text-anchor="end" dominant-baseline="middle">'
        f"<title>{_e(c.name)}</title>{_e(short)}</text>"
    )


def _svg_open(rows: int, title: str) -> tuple[str, int]:
    height = 30 + rows * ROW_H + 30
    return (
        f'<svg width="{LABEL_W + PLOT_W + 20}" height="{height}" role="img" '
        f'aria-label="{_e(title)}" viewBox="0 0 {LABEL_W + PLOT_W + 20} {height}">'
        f'<text x="{LABEL_W}" y="16" font-weight="600">{_e(title)}</text>',
        height,
    )


def _axis(hi: float, top: float, bottom: float, unit: str) -> str:
    """Vertical grid lines and labels for 0..hi along the plotting area."""
    out = []
    for t in _ticks(hi):
        x = LABEL_W + PLOT_W * t / hi
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{bottom}" stroke="#e0e0e0"/>'
            f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{t:g}{unit}</text>'
        )
    return "".join(out)


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


def _speedup_svg(g: GraphReport) -> str:
    svg, height = _svg_open(len(g.candidates), "speed-up vs eager")
    top, bottom = 26, height - 28
    hi = max([c.speedup for c in g.candidates if c.speedup is not None] + [1.0]) * 1.15
    parts = [svg, _axis(hi, top, bottom, "x")]
    for i, c in enumerate(g.candidates):
        y = top + i * ROW_H + ROW_H / 2
        parts.append(_label(c, y))
        if c.speedup is None:
            why = c.status if c.status != "ok" else "not measured"
            parts.append(
                f'<text x="{LABEL_W + 4}" y="{y:.1f}" dominant-baseline="middle" '
                f'fill="{COLOURS["bad"]}" style="fill:{COLOURS["bad"]}">{_e(why)}</text>'
            )
            continue
        w = PLOT_W * c.speedup / hi
        parts.append(
            f'<rect class="bar" x="{LABEL_W}" y="{y - 8:.1f}" width="{w:.1f}" height="16" '
            f'fill="{_colour(c)}"><title>{_e(c.name)}: {c.speedup:.2f}x</title></rect>'
            f'<text x="{LABEL_W + w + 4:.1f}" y="{y:.1f}" dominant-baseline="middle">'
            f"{c.speedup:.2f}x</text>"
        )
    x1 = LABEL_W + PLOT_W / hi
    parts.append(
        f'<line x1="{x1:.1f}" y1="{top}" x2="{x1:.1f}" y2="{bottom}" stroke="#424242" '
        'stroke-dasharray="4 3"/></svg>'
    )
    return "".join(parts)


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


def _latency_svg(g: GraphReport) -> str:
    svg, height = _svg_open(len(g.candidates), "latency per call (ms, log scale)")
    top, bottom = 26, height - 28
    spreads = [_spread(c) for c in g.candidates]
    values = [max(v, 1e-6) for s in spreads if s is not None for v in s.values()] or [1.0]
    lo, hi = min(values) / 1.25, max(values) * 1.25

    def at(v: float) -> float:
        return LABEL_W + PLOT_W * math.log(max(v, 1e-6) / lo) / math.log(hi / lo)

    parts = [svg]
    for t in _log_ticks(lo, hi):
        parts.append(
            f'<line x1="{at(t):.1f}" y1="{top}" x2="{at(t):.1f}" y2="{bottom}" stroke="#e0e0e0"/>'
            f'<text x="{at(t):.1f}" y="{bottom + 14}" text-anchor="middle">{t:g}</text>'
        )
    for i, (c, s) in enumerate(zip(g.candidates, spreads, strict=True)):
        y = top + i * ROW_H + ROW_H / 2
        parts.append(_label(c, y))
        if s is None:
            parts.append(
                f'<text x="{LABEL_W + 4}" y="{y:.1f}" dominant-baseline="middle" '
                f'style="fill:{COLOURS["bad"]}">{_e(c.status)}</text>'
            )
            continue
        parts.append(_box(c, s, {k: at(v) for k, v in s.items()}, y))
    parts.append("</svg>")
    return "".join(parts)


def _box(c: CandidateReport, s: dict[str, float], x: dict[str, float], y: float) -> str:
    """One candidate's whiskers (min-max), box (median-p90) and p99 tick."""
    tip = ", ".join(f"{k} {v:.3f} ms" for k, v in s.items())
    colour = _colour(c)
    box_w = max(x["p90"] - x["median"], 1.0)
    return (
        f'<g class="box"><title>{_e(c.name)}: {_e(tip)}</title>'
        f'<line x1="{x["min"]:.1f}" y1="{y:.1f}" x2="{x["max"]:.1f}" y2="{y:.1f}" '
        f'stroke="{colour}"/>'
        f'<rect x="{x["median"]:.1f}" y="{y - 7:.1f}" width="{box_w:.1f}" '
        f'height="14" fill="{colour}" fill-opacity="0.35" stroke="{colour}"/>'
        f'<line x1="{x["median"]:.1f}" y1="{y - 8:.1f}" x2="{x["median"]:.1f}" '
        f'y2="{y + 8:.1f}" stroke="{colour}" stroke-width="3"/>'
        f'<line x1="{x["p99"]:.1f}" y1="{y - 5:.1f}" x2="{x["p99"]:.1f}" y2="{y + 5:.1f}" '
        f'stroke="{colour}" stroke-width="2"/>'
        "</g>"
    )
