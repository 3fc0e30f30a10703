"""bench/tune_cost.py: what a default tune costs against the one line it replaces.

For each model, each step in a fresh Python process:

  oneliner  torch.compile(model, mode="max-autotune") + its first call, empty Inductor cache
  cold      honed.tune(model, dataset) with the default candidates, empty honed and Inductor caches
  warm      the same tune again in a new process: the honed cache (and Inductor's) from `cold`
  exhaust   every default candidate, none left out by honed's planning rules, in a new process
            with its own caches: the cold selection's throughput there against the best one's
            (goal: within 3 %)

and prints/writes cold / oneliner (goal <= 1.5) and the warm re-tune's time (goal <= 5 s plus
installing the winner). Timings start after `import torch, honed` (each process pays those
alike) and include everything honed does, worker processes included. Models: the demo model
(`honed demo`'s DemoNet, batches 4/16/32) and a small transformer block (width 64, 4 heads,
about 33 K parameters, batches 2/8 of 16 tokens).

    python bench/tune_cost.py [--models demo,block] [--device cpu] [--out DIR]

Each record carries the commit, torch, the CPU count and the load average before and after
(the figures of a shared machine depend on what else runs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = ("demo", "block")


def _model(name: str, device: str) -> tuple[Any, list[Any]]:
    import torch

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if name == "demo":
        from honed.demo import DemoNet, dataset

        return DemoNet().eval().to(device), dataset(torch.device(device))
    if name == "block":
        model = _block(64, 4, 128).eval().to(device)
        return model, [torch.randn(b, 16, 64, generator=g).to(device) for b in (2, 8)]
    raise SystemExit(f"unknown model {name!r}; use one of {MODELS}")


def _block(dim: int, heads: int, ff: int) -> Any:
    """A pre-LayerNorm transformer block: attention (SDPA) and an MLP, each residual."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
            self.fc1, self.fc2 = nn.Linear(dim, ff), nn.Linear(ff, dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            qkv = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            h = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
            x = x + self.proj(h.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    return Block()


def _step(step: str, name: str, device: str) -> dict[str, Any]:
    """One step, in this (fresh) process; returns its figures."""
    import torch

    import honed

    model, data = _model(name, device)
    if step == "oneliner":
        started = time.perf_counter()
        with torch.no_grad():
            compiled = torch.compile(model, mode="max-autotune")
            compiled(data[0])
        return {"wall_s": time.perf_counter() - started}
    wrapped = honed.Module(model, name)
    strategy = None
    if step == "exhaust":

        class Exhaustive(honed.MaxThroughputStrategy):
            """The default candidates, as if the user had listed them: nothing is pruned."""

            uses_defaults = False  # type: ignore[assignment]

        strategy = Exhaustive()
    started = time.perf_counter()
    report = honed.tune(wrapped, data, device=device, strategy=strategy)
    wall = time.perf_counter() - started
    graphs = report.graphs
    return {
        "wall_s": wall,
        "selected": report.selected(),
        "install_s": sum(g.install_s for g in graphs),
        "candidates": [
            {
                "name": c.name,
                "status": c.status,
                "reason": c.reason,
                "cached": c.cached,
                "build_s": c.build_s,
                "median_ms": c.median_ms,
                "throughput": c.throughput,
                # the exhaustive step compares the selection with its best on these
                "samples_ms": list(c.samples_ms or []) if step == "exhaust" else [],
            }
            for g in graphs
            for c in g.candidates
        ],
    }


def _run_step(step: str, name: str, device: str, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--step",
            step,
            "--models",
            name,
            "--device",
            device,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("STEP ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{step} {name} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1][5:])
    return result


def _commit() -> str:
    sys.path.insert(0, str(HERE))
    from provenance import commit

    return commit()


def measure(name: str, device: str) -> dict[str, Any]:
    """The three steps of one model, each in a fresh process with its own caches."""
    with tempfile.TemporaryDirectory(prefix="honed-tune-cost-") as tmp:
        base = dict(os.environ, HONED_PROGRESS="off")
        # Inductor keeps some things under the temporary folder whatever its cache folder is
        # (precompiled headers): each side gets its own, empty one, and the re-tune cold's.
        for side in ("oneliner", "honed"):
            os.makedirs(f"{tmp}/tmp-{side}")
        one = _run_step(
            "oneliner",
            name,
            device,
            dict(base, TORCHINDUCTOR_CACHE_DIR=f"{tmp}/oneliner", TMPDIR=f"{tmp}/tmp-oneliner"),
        )
        env = dict(
            base,
            TORCHINDUCTOR_CACHE_DIR=f"{tmp}/inductor",
            HONED_CACHE_DIR=f"{tmp}/honed",
            TMPDIR=f"{tmp}/tmp-honed",
        )
        cold = _run_step("cold", name, device, env)
        warm = _run_step("warm", name, device, env)
        os.makedirs(f"{tmp}/tmp-exhaust")
        exhaust = _run_step(
            "exhaust",
            name,
            device,
            dict(
                base,
                TORCHINDUCTOR_CACHE_DIR=f"{tmp}/exhaust-inductor",
                HONED_CACHE_DIR=f"{tmp}/exhaust-honed",
                TMPDIR=f"{tmp}/tmp-exhaust",
            ),
        )
    return {
        "model": name,
        "device": device,
        "oneliner_s": one["wall_s"],
        "cold_s": cold["wall_s"],
        "ratio": cold["wall_s"] / one["wall_s"],
        "warm_s": warm["wall_s"],
        "warm_install_s": warm["install_s"],
        "cold_selected": cold["selected"],
        "warm_selected": warm["selected"],
        "cold_candidates": cold["candidates"],
        **_against_exhaustive(cold["selected"], exhaust["candidates"]),
    }


def _against_exhaustive(selected: list[Any], candidates: list[dict[str, Any]]) -> dict[str, Any]:
    """The cold selection's throughput in the exhaustive run against that run's best (one
    graph: the models here have one), with the 99 % bootstrap interval of that gap.

    Throughput is batch / mean latency, and both are measured at the same batch, so the gap is
    the ratio of their mean latencies, resampled from the calls the exhaustive tune timed (the
    finalists' side-by-side re-measure, where both are finalists). A gap whose interval reaches
    down to the 3 % goal is not evidence of a worse selection: the noise of the calls allows it.
    """
    from honed import _core

    passed = [c for c in candidates if c["status"] == "ok" and c.get("throughput")]
    best = max(passed, key=lambda c: c["throughput"], default=None)
    mine = next((c for c in passed if selected and c["name"] == selected[0]), None)
    gap = lo = hi = None
    if best is not None and mine is not None:
        gap = (best["throughput"] / mine["throughput"] - 1.0) * 100.0
        if mine is not best and mine.get("samples_ms") and best.get("samples_ms"):
            ci = _core.compare(
                mine["samples_ms"], best["samples_ms"], confidence=0.99, statistic="mean"
            )
            lo, hi = (ci.lo - 1.0) * 100.0, (ci.hi - 1.0) * 100.0
        elif mine is best:
            lo = hi = 0.0
    return {
        "exhaustive_best": best["name"] if best else None,
        "selection_gap_pct": gap,
        "selection_gap_ci_pct": [lo, hi] if lo is not None else None,
        "exhaustive_candidates": candidates,
    }


def gap_text(record: dict[str, Any]) -> str:
    """The selection's gap to the exhaustive best, e.g. "8.3 % (-2.1 to 15.0 %)"."""
    gap = record.get("selection_gap_pct")
    if gap is None:
        return "-"
    text = f"{max(gap, 0.0):.1f} %"
    ci = record.get("selection_gap_ci_pct")
    if ci and gap > 0:
        text += f" ({ci[0]:.1f} to {ci[1]:.1f} %)"
    return text


def _table(records: list[dict[str, Any]]) -> str:
    lines = [
        "| model | one-liner s | cold tune s | cold / one-liner | warm re-tune s "
        "| of which install s | selected | exhaustive best | selection behind it (99 % CI) |",
        "|---|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    for r in records:
        selected = ", ".join(map(str, r["cold_selected"]))
        behind = gap_text(r)
        lines.append(
            f"| {r['model']} | {r['oneliner_s']:.1f} | {r['cold_s']:.1f} | {r['ratio']:.2f} | "
            f"{r['warm_s']:.1f} | {r['warm_install_s']:.1f} | {selected} | "
            f"{r.get('exhaustive_best') or '-'} | {behind} |"
        )
    lines.append("")
    for r in records:
        for run in ("cold", "exhaustive"):
            lines.append(f"{r['model']}, {run} tune candidates:")
            for c in r.get(f"{run}_candidates", []):
                build = f"{c['build_s']:.1f} s" if c["build_s"] is not None else "-"
                median = f"{c['median_ms']:.3f} ms" if c["median_ms"] is not None else "-"
                per_s = f"{c['throughput']:.4g}/s" if c.get("throughput") else "-"
                why = f" ({c['reason']})" if c["reason"] else ""
                lines.append(
                    f"  {c['name']}: {c['status']}{why}, build {build}, median {median}, "
                    f"throughput {per_s}"
                )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: demo,block")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "tune_cost")
    parser.add_argument(
        "--step", choices=["oneliner", "cold", "warm", "exhaust"], help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m]
    if args.step:
        print("STEP " + json.dumps(_step(args.step, names[0], args.device)), flush=True)
        return 0
    load_before = os.getloadavg()
    records = []
    for name in names:
        records.append(measure(name, args.device))
        print(_table(records[-1:]), flush=True)
    run = {
        "bench": "tune_cost",
        "commit": _commit(),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "python": platform.python_version(),
        "torch": __import__("torch").__version__,
        "records": records,
    }
    table = _table(records)
    print(table)
    print(f"load average before {load_before}, after {run['loadavg_after']}")
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = args.out / f"tune_cost-{args.device}-{stamp}-{run['commit']}.json"
    path.write_text(json.dumps(run, indent=2))
    path.with_suffix(".md").write_text(table + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
