"""bench/report.py: merges suite JSONs into bench/RESULTS.md and PNG plots next to it.

    python bench/report.py [RUN.json ...] [--out-dir bench] [--device cuda|cpu]

Without files it reads every bench/results/*.json. Rows are merged by (model, batch): the latest
run that finished a row wins, so a suite split across several calls (--models/--batches) merges.
Every number in RESULTS.md, the targets included, is computed here from the JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SCHEMA = "honed-bench-suite/1"
HERE = Path(__file__).resolve().parent
SELECTION_TOLERANCE_PCT = 3.0
GEOMEAN_TARGETS = {1: 2.0, 64: 1.5}
SUITE_MODELS = ["mlp", "resnet50", "vit_b16", "bert", "gpt2"]


# -- loading and merging -----------------------------------------------------------------------
def load_runs(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """The suite runs in ``paths`` (others are skipped with a message), oldest first."""
    runs = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            print(f"report: skipping {path}: {e}", file=sys.stderr)
            continue
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            print(f"report: skipping {path}: not a {SCHEMA} file", file=sys.stderr)
            continue
        data["file"] = Path(path).name
        runs.append(data)
    runs.sort(key=lambda r: (r.get("started", ""), r["file"]))
    return runs


def pick_device(runs: list[dict[str, Any]], wanted: str | None) -> str:
    devices = {r["env"].get("device", "cpu").split(":")[0] for r in runs}
    if wanted:
        return wanted
    return "cuda" if "cuda" in devices else "cpu"


def merge(runs: list[dict[str, Any]], device: str) -> dict[str, Any]:
    """Rows, max-autotune times and overhead of ``device``: the latest good one of each wins."""
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    mat: dict[tuple[str, int], dict[str, Any]] = {}
    overhead = None
    knees: dict[str, int] = {}
    used = []
    for run in runs:
        if run["env"].get("device", "cpu").split(":")[0] != device:
            continue
        used.append(run)
        for row in run.get("rows", []):
            key = (row["model"], int(row["batch"]))
            if row["status"] == "ok" or rows.get(key, {}).get("status") != "ok":
                rows[key] = dict(row, run=run["file"], mode=run.get("args", {}).get("mode"))
        for rec in run.get("max_autotune", []):
            key = (rec["model"], int(rec["batch"]))
            if _mat_rank(rec) >= _mat_rank(mat.get(key)):
                mat[key] = dict(rec, run=run["file"])
        for model, found in (run.get("knees") or {}).items():
            if "knee" in found:
                knees[model] = int(found["knee"])
        if run.get("overhead"):
            overhead = dict(run["overhead"], run=run["file"])
    order = {m: i for i, m in enumerate(SUITE_MODELS)}
    keys = sorted(rows, key=lambda k: (order.get(k[0], len(order)), k[0], k[1]))
    return {
        "runs": used,
        "rows": [rows[k] for k in keys],
        "max_autotune": mat,
        "overhead": overhead,
        "knees": knees,
    }


def _mat_rank(rec: dict[str, Any] | None) -> int:
    """ok > timeout (a lower bound) > failed > skipped > nothing."""
    if rec is None:
        return -1
    return {"ok": 3, "timeout": 2, "failed": 1}.get(rec.get("status", ""), 0)


# -- figures of one row ------------------------------------------------------------------------
def row_metrics(row: dict[str, Any]) -> dict[str, Any]:
    """Eager, selected and independent-best figures of one finished row, and the speed-ups.

    ``speedup`` is eager fp32 over honed's selection, both from the independent round-robin
    (one loop, one process); where that check lacks either, honed's own figures (``source``).
    """
    cands = row["candidates"]
    base = next(c for c in cands if c["is_baseline"])
    chosen = next((c for c in cands if c["selected"]), base)
    check = row.get("independent") or {}
    results = check.get("results") or {}
    indep_eager = results.get(base["name"], {}).get("median_ms")
    indep_sel = results.get(chosen["name"], {}).get("median_ms")
    best = check.get("best")
    best_ms = results.get(best, {}).get("median_ms") if best else None
    out: dict[str, Any] = {
        "model": row["model"],
        "batch": int(row["batch"]),
        "eager_ms": base["median_ms"],
        "selected": chosen["name"],
        "selected_precision": chosen.get("precision", "fp32"),
        "selected_ms": chosen["median_ms"],
        "honed_speedup": _ratio(base["median_ms"], chosen["median_ms"]),
        "indep_eager_ms": indep_eager,
        "indep_selected_ms": indep_sel,
        "best": best,
        "best_ms": best_ms,
        "gap_pct": check.get("selection_gap_pct"),
        "indep_speedup": _ratio(indep_eager, indep_sel),
        "best_speedup": _ratio(indep_eager, best_ms),
        "tune_s": row.get("tune_wall_s"),
        "full": row.get("mode") == "full",
    }
    if out["indep_speedup"] is not None:
        out["speedup"], out["source"] = out["indep_speedup"], "independent"
    else:
        out["speedup"], out["source"] = out["honed_speedup"], "honed"
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# -- targets -----------------------------------------------------------------------------------
def targets(merged: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with its figures and whether it is met."""
    ok = [row_metrics(r) for r in merged["rows"] if r["status"] == "ok"]
    not_run = [r for r in merged["rows"] if r["status"] != "ok"]
    out: dict[str, Any] = {"rows_ok": len(ok), "rows_not_ok": len(not_run)}

    checked = [m for m in ok if m["gap_pct"] is not None]
    within = [m for m in checked if m["gap_pct"] <= SELECTION_TOLERANCE_PCT]
    missed = [m for m in checked if m["gap_pct"] > SELECTION_TOLERANCE_PCT]
    worst = max(checked, key=lambda m: m["gap_pct"]) if checked else None
    out["selection"] = {
        "checked": len(checked),
        "within": len(within),
        "unchecked": [(m["model"], m["batch"]) for m in ok if m["gap_pct"] is None],
        "missed": [(m["model"], m["batch"], m["gap_pct"]) for m in missed],
        "worst": (worst["model"], worst["batch"], worst["gap_pct"]) if worst else None,
        "met": bool(ok) and len(within) == len(ok),
    }
    for batch, goal in GEOMEAN_TARGETS.items():
        at = [m for m in ok if m["batch"] == batch and m["speedup"]]
        value = geomean([m["speedup"] for m in at])
        models = [m["model"] for m in at]
        out[f"geomean_b{batch}"] = {
            "value": value,
            "goal": goal,
            "models": models,
            "missing": [m for m in SUITE_MODELS if m not in models],
            "met": value is not None and value >= goal,
        }
    out["max_autotune"] = _compile_target(ok, merged["max_autotune"])
    return out


def _compile_target(ok: list[dict[str, Any]], mat: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """Per model: honed's tuning time (all its batches) next to max-autotune's compile time."""
    models = list(dict.fromkeys(m["model"] for m in ok))
    per_model = []
    for model in models:
        tune = {m["batch"]: m["tune_s"] for m in ok if m["model"] == model and m["tune_s"]}
        full = {m["batch"] for m in ok if m["model"] == model and m["full"]}
        recs = [r for (name, _), r in mat.items() if name == model]
        rec = max(recs, key=_mat_rank) if recs else None
        entry: dict[str, Any] = {"model": model, "tune_s": tune, "full": full, "max_autotune": rec}
        if rec is not None and rec["status"] in ("ok", "timeout") and rec["batch"] in tune:
            seconds = rec.get("compile_first_call_s") or rec.get("timeout_s")
            entry["ratio"] = tune[rec["batch"]] / seconds  # honed / max-autotune, same batch
            entry["lower_bound"] = rec["status"] == "timeout"
        per_model.append(entry)
    reported = [e for e in per_model if "ratio" in e]
    return {
        "per_model": per_model,
        "reported": len(reported),
        "models": len(per_model),
        "met": bool(per_model) and len(reported) == len(per_model),
    }


# -- markdown ----------------------------------------------------------------------------------
def render(merged: dict[str, Any], goals: dict[str, Any], plots: list[str], note: str) -> str:
    lines = [
        "# honed benchmark results",
        "",
        f"Generated by `python bench/report.py` from {len(merged['runs'])} suite run(s) in "
        "`bench/results/` (raw JSON, one file per run); every figure and verdict below is "
        "computed from that JSON. Do not edit by hand: rerun the suite (README, *Benchmarks*).",
        "",
        "Speed-up = eager fp32 median / median of honed's selection, both measured by the "
        "independent check: every candidate that passed honed's correctness gate rebuilt by the "
        "suite and re-measured round-robin (each call timed by itself with CUDA events, as honed "
        "times it), outside honed's selection. *Independent best* and *selection vs best* rank "
        "by what honed's strategy (MaxThroughputStrategy, the default) maximises, where the run "
        "recorded it: throughput over the host wall time of the calls (older runs: the median; "
        "see each run's method below).",
        "",
    ]
    if not merged["runs"]:
        lines += ["**No suite run yet**: run `make bench-gpu` on the GPU machine (README).", ""]
    lines += _targets_md(goals)
    lines += _summary_md(merged)
    lines += _compile_md(goals["max_autotune"])
    lines += _overhead_md(merged["overhead"])
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    if note:
        lines += [note, ""]
    lines += _details_md(merged)
    lines += _runs_md(merged["runs"])
    return "\n".join(lines).rstrip() + "\n"


def _yes(flag: bool) -> str:
    return "**met**" if flag else "**not met**"


def _targets_md(goals: dict[str, Any]) -> list[str]:
    sel = goals["selection"]
    sel_text = f"{sel['within']} of {goals['rows_ok']} rows within {SELECTION_TOLERANCE_PCT:g} %"
    if sel["worst"]:
        model, batch, gap = sel["worst"]
        sel_text += f"; worst {model} batch {batch}: {gap:+.1f} %"
    if sel["missed"]:
        sel_text += "; missed: " + ", ".join(f"{m} b{b} ({g:+.1f} %)" for m, b, g in sel["missed"])
    if sel["unchecked"]:
        sel_text += "; not checked: " + ", ".join(f"{m} b{b}" for m, b in sel["unchecked"])
    lines = [
        "## Targets",
        "",
        "| target | result | verdict |",
        "|---|---|---|",
        f"| honed's selection within {SELECTION_TOLERANCE_PCT:g} % of the independent best, "
        f"every row | {sel_text} | {_yes(sel['met'])} |",
    ]
    for batch in GEOMEAN_TARGETS:
        g = goals[f"geomean_b{batch}"]
        if g["value"] is None:
            text = "no finished row at this batch"
        else:
            text = f"{g['value']:.2f}x over {len(g['models'])} model(s): {', '.join(g['models'])}"
        if g["missing"]:
            text += f" (not run: {', '.join(g['missing'])})"
        lines.append(
            f"| geometric-mean speed-up over eager fp32 at batch {batch} >= {g['goal']:g}x | "
            f"{text} | {_yes(g['met'])} |"
        )
    mat = goals["max_autotune"]
    faster = [e for e in mat["per_model"] if "ratio" in e and e["ratio"] < 1]
    text = f"reported for {mat['reported']} of {mat['models']} model(s)"
    if mat["reported"]:
        text += f"; honed's tune faster than max-autotune's compile for {len(faster)}"
    lines.append(
        f'| tuning wall time next to torch.compile(mode="max-autotune") | {text} | '
        f"{_yes(mat['met'])} |"
    )
    incomplete = goals["rows_not_ok"]
    lines += [""]
    if incomplete:
        lines += [f"{incomplete} row(s) did not finish (failed or skipped; see *Summary*).", ""]
    return lines


def _summary_md(merged: dict[str, Any]) -> list[str]:
    lines = [
        "## Summary",
        "",
        "| model | batch | eager fp32 ms | honed's selection | precision | selected ms | "
        "speed-up | independent best | best ms | selection vs best | tune s |",
        "|---|--:|--:|---|---|--:|--:|---|--:|--:|--:|",
    ]
    for row in merged["rows"]:
        if row["status"] != "ok":
            lines.append(
                f"| {row['model']} | {row['batch']} | {row['status']}: "
                f"{_md(row.get('reason', ''))} |  |  |  |  |  |  |  |  |"
            )
            continue
        m = row_metrics(row)
        mark = "" if m["source"] == "independent" else " (honed)"
        knee = " (knee)" if merged["knees"].get(m["model"]) == m["batch"] else ""
        lines.append(
            f"| {m['model']} | {m['batch']}{knee} | "
            f"{_f(m['indep_eager_ms'] or m['eager_ms'], 3)} | "
            f"{_md(m['selected'])} | {m['selected_precision']} | "
            f"{_f(m['indep_selected_ms'] or m['selected_ms'], 3)} | "
            f"{_f(m['speedup'], 2, 'x')}{mark} | {_md(m['best'] or '-')} | {_f(m['best_ms'], 3)} | "
            f"{_f(m['gap_pct'], 1, ' %', signed=True)} | {_f(m['tune_s'], 1)}"
            f"{FULL_MARK if m['full'] else ''} |"
        )
    if any(r.get("mode") == "full" for r in merged["rows"] if r["status"] == "ok"):
        lines += ["", FULL_NOTE]
    return [*lines, ""]


FULL_MARK = " (full)"
FULL_NOTE = (
    "(full): a row of a `--full` run, whose tune tries honed's default candidates (max-autotune "
    "variants, AOTInductor) each in a worker process, on empty compile caches; the other rows "
    "tune the light candidates in-process."
)


def _compile_md(mat: dict[str, Any]) -> list[str]:
    lines = [
        '## Tuning time vs torch.compile(mode="max-autotune")',
        "",
        "honed's tune: wall time of `honed.tune` (every candidate built, checked and measured) "
        'per batch. max-autotune: `torch.compile(model, mode="max-autotune")` plus its first '
        "call, alone, in a fresh process with empty compile caches (`>` = stopped at its timeout, "
        "a lower bound).",
        "",
        "| model | honed tune s per batch | max-autotune s (batch) | honed / max-autotune |",
        "|---|---|--:|--:|",
    ]
    for e in mat["per_model"]:
        tune = (
            ", ".join(
                f"b{b}: {s:.1f}{FULL_MARK if b in e['full'] else ''}"
                for b, s in sorted(e["tune_s"].items())
            )
            or "-"
        )
        rec = e["max_autotune"]
        if rec is None:
            cell = "not measured"
        elif rec["status"] == "ok":
            cell = f"{rec['compile_first_call_s']:.1f} (b{rec['batch']})"
        elif rec["status"] == "timeout":
            cell = f"> {rec['timeout_s']:.0f} (b{rec['batch']})"
        else:
            cell = f"{rec['status']}: {_md(rec.get('reason', ''))}"
        ratio = "-"
        if "ratio" in e:
            ratio = ("<= " if e["lower_bound"] else "") + f"{e['ratio']:.2f}"
        lines.append(f"| {e['model']} | {tune} | {cell} | {ratio} |")
    return [*lines, ""]


def _overhead_md(overhead: dict[str, Any] | None) -> list[str]:
    lines = ["## honed.Module per-call overhead", ""]
    if not overhead:
        return [*lines, "Not measured in these runs.", ""]
    lines += [
        f"`bench/overhead.py` on {overhead.get('device')}: a tuned `honed.Module` against a direct "
        "call of the same variant, interleaved, one call per sample.",
        "",
        "| variant | calls each | direct µs | honed.Module µs | added µs |",
        "|---|--:|--:|--:|--:|",
    ]
    for label in ("eager variant", "inductor variant"):
        r = overhead.get(label)
        if not isinstance(r, dict):
            continue
        if "error" in r:
            lines.append(f"| {label} | failed: {_md(r['error'])} |  |  |  |")
            continue
        lines.append(
            f"| {label} | {r['calls_each']:,} | {r['direct_median_us']:.2f} | "
            f"{r['honed_median_us']:.2f} | {r['added_us']:.2f} |"
        )
    return [*lines, ""]


def _details_md(merged: dict[str, Any]) -> list[str]:
    lines = ["## Every candidate, per model and batch", ""]
    for row in merged["rows"]:
        if row["status"] != "ok":
            continue
        results = (row.get("independent") or {}).get("results") or {}
        best = (row.get("independent") or {}).get("best")
        lines += [
            f"### {row['title']}, batch {row['batch']}",
            "",
            f"{_params(row['params'])} parameters · tune {row['tune_wall_s']:.1f} s · "
            f"decision: {_md(row['decision'])}",
            "",
            "| candidate | precision | status | build s | median ms | p99 ms | throughput/s | "
            "max abs err | speed-up (honed) | independent median ms | |",
            "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
        ]
        for c in row["candidates"]:
            status = c["status"] if c["status"] == "ok" else f"{c['status']}: {c['reason']}"
            marks = ("selected" if c["selected"] else "") + (" · best" if c["name"] == best else "")
            indep = results.get(c["name"], {}).get("median_ms")
            lines.append(
                f"| {_md(c['name'])}{' (baseline)' if c['is_baseline'] else ''} | "
                f"{c.get('precision', 'fp32')} | {_md(status)} | {_f(c['build_s'], 2)} | "
                f"{_f(c['median_ms'], 3)} | {_f(c['p99_ms'], 3)} | {_f(c['throughput'], 0)} | "
                f"{_f(c['max_abs_error'], 1, style='e')} | {_f(c['speedup'], 2, 'x')} | "
                f"{_f(indep, 3)} | {marks.strip(' ·')} |"
            )
        failures = (row.get("independent") or {}).get("failures") or {}
        for name, why in failures.items():
            lines.append(f"\nindependent check could not rebuild {_md(name)}: {_md(why)}")
        lines.append("")
    return lines


def _runs_md(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "## Runs",
        "",
        "| file | started (UTC) | mode | commit | GPU | driver | torch | CUDA | triton | honed | "
        "finished | independent check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        env, args = run["env"], run.get("args", {})
        methods = {
            r["independent"].get("method", "") for r in run.get("rows", []) if r.get("independent")
        }
        lines.append(
            f"| {run['file']} | {run.get('started', '')} | {args.get('mode', '')} "
            f"({args.get('candidates', '')} candidates, isolation {args.get('isolation', '')}) | "
            f"{env.get('commit')} | {env.get('gpu') or env.get('cpu')} | {env.get('driver')} | "
            f"{env.get('torch')} | {env.get('torch_cuda')} | {env.get('triton')} | "
            f"{env.get('honed')} | {'yes' if run.get('finished') else 'no (stopped)'} "
            f"{run.get('elapsed_s', 0):.0f} s | {'; '.join(sorted(methods)) or '-'} |"
        )
    return [*lines, ""]


def _f(value: float | None, digits: int, suffix: str = "", signed: bool = False, style="f") -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    if digits == 0 and style == "f":
        return f"{value:,.0f}{suffix}"
    return f"{value:{sign}.{digits}{style}}{suffix}"


def _params(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 100_000 else f"{n:,}"


def _md(text: Any) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


# -- plots -------------------------------------------------------------------------------------
def plot(merged: dict[str, Any], out_dir: Path) -> list[str]:
    """speedup.png and latency_<model>.png in ``out_dir``; returns their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in merged["rows"] if r["status"] == "ok"]
    if not ok:
        return []
    names = [_speedup_plot(plt, ok, out_dir)]
    for model in dict.fromkeys(r["model"] for r in ok):
        names.append(_latency_plot(plt, [r for r in ok if r["model"] == model], out_dir))
    return names


def _speedup_plot(plt: Any, rows: list[dict[str, Any]], out_dir: Path) -> str:
    metrics = [row_metrics(r) for r in rows]
    models = list(dict.fromkeys(m["model"] for m in metrics))
    batches = sorted({m["batch"] for m in metrics})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(models) + 2), 4.2))
    width = 0.8 / len(batches)
    for j, batch in enumerate(batches):
        xs, ys, best = [], [], []
        for i, model in enumerate(models):
            m = next((m for m in metrics if m["model"] == model and m["batch"] == batch), None)
            if m is not None and m["speedup"]:
                xs.append(i + (j - (len(batches) - 1) / 2) * width)
                ys.append(m["speedup"])
                best.append(m["best_speedup"] or m["speedup"])
        bars = ax.bar(xs, ys, width, label=f"batch {batch}")
        ax.bar_label(bars, labels=[f"{y:.2f}x" for y in ys], fontsize=7, padding=2)
        ax.scatter(xs, best, marker="_", s=300, color="black", zorder=3)
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("speed-up over eager fp32 (x)")
    ax.set_title("honed's selection vs eager fp32 (independent round-robin; - = best)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "speedup.png", dpi=110)
    plt.close(fig)
    return "speedup.png"


def _latency_plot(plt: Any, rows: list[dict[str, Any]], out_dir: Path) -> str:
    model = rows[0]["model"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 1.2 + 0.45 * _most_candidates(rows)))
    axes = [axes] if len(rows) == 1 else list(axes)
    for ax, row in zip(axes, rows, strict=True):
        cands = [c for c in row["candidates"] if c.get("samples_ms")]
        data = [c["samples_ms"] for c in cands]
        labels = [_short(c["name"]) + (" *" if c["selected"] else "") for c in cands]
        if data:
            _hboxplot(ax, data)
            ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=7)
            ax.set_xscale("log")
        ax.set_title(f"{model}, batch {row['batch']} (* = selected)", fontsize=9)
        ax.set_xlabel("latency per call, ms (honed's measurement samples)", fontsize=8)
    fig.tight_layout()
    name = f"latency_{model}.png"
    fig.savefig(out_dir / name, dpi=110)
    plt.close(fig)
    return name


def _hboxplot(ax: Any, data: list[list[float]]) -> None:
    style = {"showfliers": True, "flierprops": {"markersize": 2}}
    try:
        ax.boxplot(data, orientation="horizontal", **style)  # matplotlib >= 3.10
    except TypeError:
        ax.boxplot(data, vert=False, **style)


def _most_candidates(rows: list[dict[str, Any]]) -> int:
    return sum(max(1, len(r["candidates"])) for r in rows)


def _short(name: str) -> str:
    return (
        name.replace("Backend", "")
        .replace("autocast_enabled=True, autocast_dtype=bfloat16", "bf16")
        .replace("autocast_enabled=True", "autocast")
    )


# -- main --------------------------------------------------------------------------------------
def generate(paths: list[Path], out_dir: Path, device: str | None = None) -> dict[str, Any]:
    """Write RESULTS.md (and the plots) into ``out_dir``; returns the merged data and targets."""
    runs = load_runs(paths)
    merged = merge(runs, pick_device(runs, device)) if runs else merge([], "cuda")
    goals = targets(merged)
    out_dir.mkdir(parents=True, exist_ok=True)
    note = ""
    try:
        plots = plot(merged, out_dir)
    except ImportError as e:
        plots, note = [], f"Plots not drawn: matplotlib is missing ({e}); `pip install matplotlib`."
    (out_dir / "RESULTS.md").write_text(render(merged, goals, plots, note), encoding="utf-8")
    return {"merged": merged, "targets": goals, "plots": plots}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--out-dir", type=Path, default=HERE)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    args = p.parse_args(argv)
    files = args.files or sorted((HERE / "results").glob("*.json"))
    result = generate(files, args.out_dir, args.device)
    goals = result["targets"]
    print(f"report: {args.out_dir / 'RESULTS.md'} ({len(result['merged']['rows'])} rows)")
    for key in ("selection", "geomean_b1", "geomean_b64", "max_autotune"):
        print(f"  {key}: {'met' if goals[key]['met'] else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
