"""bench/plots.py: the plots of bench/RESULTS.md, drawn from the merged suite rows.

speedup.png           per row, each variant's speed-up over eager fp32 (grouped bars)
latency_<model>.png   per model and batch, each variant's latency samples (box plots)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VARIANTS = ("oneliner", "expert", "honed")
LABELS = {"eager": "eager fp32", "oneliner": "one-liner", "expert": "expert hand", "honed": "honed"}


def draw(merged: dict[str, Any], out_dir: Path) -> list[str]:
    """speedup.png and latency_<model>.png in ``out_dir``; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in merged["rows"] if r["status"] == "ok"]
    if not ok:
        return []
    names = [_speedup(plt, ok, out_dir)]
    for model in dict.fromkeys(r["model"] for r in ok):
        names.append(_latency(plt, [r for r in ok if r["model"] == model], out_dir))
    return names


def _median(row: dict[str, Any], variant: str) -> float | None:
    v = row["variants"].get(variant) or {}
    return v.get("median_ms") if v.get("status") == "ok" else None


def _speedup(plt: Any, rows: list[dict[str, Any]], out_dir: Path) -> str:
    labels = [f"{r['model']}\nb{r['batch']}" for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(rows) + 2), 4.4))
    width = 0.8 / len(VARIANTS)
    for j, variant in enumerate(VARIANTS):
        xs, ys = [], []
        for i, row in enumerate(rows):
            eager, mine = _median(row, "eager"), _median(row, variant)
            if eager and mine:
                xs.append(i + (j - (len(VARIANTS) - 1) / 2) * width)
                ys.append(eager / mine)
        bars = ax.bar(xs, ys, width, label=LABELS[variant])
        ax.bar_label(bars, labels=[f"{y:.1f}" for y in ys], fontsize=6, padding=1)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("speed-up over eager fp32 (x)")
    ax.set_title("Side by side, one process (suite's round-robin medians)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "speedup.png", dpi=110)
    plt.close(fig)
    return "speedup.png"


def _latency(plt: Any, rows: list[dict[str, Any]], out_dir: Path) -> str:
    model = rows[0]["model"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(8, 0.6 + 1.7 * len(rows)))
    axes = [axes] if len(rows) == 1 else list(axes)
    for ax, row in zip(axes, rows, strict=True):
        named = [(LABELS[v], row["variants"].get(v) or {}) for v in ("eager", *VARIANTS)]
        shown = [(label, v["samples_ms"]) for label, v in named if v.get("samples_ms")]
        if shown:
            style = {"showfliers": True, "flierprops": {"markersize": 2}}
            data = [s for _, s in shown]
            try:
                ax.boxplot(data, orientation="horizontal", **style)  # matplotlib >= 3.10
            except TypeError:
                ax.boxplot(data, vert=False, **style)
            ax.set_yticks(range(1, len(shown) + 1), [label for label, _ in shown], fontsize=7)
            ax.set_xscale("log")
        ax.set_title(f"{model}, batch {row['batch']}", fontsize=9)
        ax.set_xlabel("latency per call, ms", fontsize=8)
    fig.tight_layout()
    name = f"latency_{model}.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name
