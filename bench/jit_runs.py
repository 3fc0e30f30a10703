"""bench/jit_runs.py: stored `bench/jit_bert.py` runs side by side, and their calls over 2x
eager by the host's speed.

    python bench/jit_runs.py bench/results/jit/jit-bert-h200-20261130{gb,gc,gd,ha,hb,hc,hd}-*.json
    python bench/jit_runs.py --fast-ns 40 --json out.json FILE...

One row per run's cold loop: the pure-Python call's median over that loop (a few hundred ns of
Python timed on the thread's CPU clock after each call: the speed of the vCPU the program got),
its calls over 2x eager's median and the slowest against that median, the tune's length, when
the loop reached its tuned speed, its steady speed over eager, and the warm restart's figures.

A run counts as on a fast host where that median is at most ``--fast-ns``. The summary says how
many runs on fast and on slow hosts had no call over 2x: whether the calls over 2x follow the
host rather than the code is a claim these counts make or do not make, run by run, from the
stored files.

Each row also sets the cold loop's calls over 2x against eager alone's on the same host (its
own loop, nothing of honed running): eager alone's count and calls, the calls the cold loop made
at eager speed while the tune ran, and ``p``, the chance that at eager alone's rate that many
calls would have gone over 2x or more. It is the one-sided exact test of two Poisson counts: given
both loops' calls over 2x together, how they split follows the binomial with the tune's share of
the calls. A small ``p`` says the tune's calls went over 2x more often than the host makes them
by itself; a large one says the counts cannot tell the two apart (eager alone's loop short, or
the host as slow alone), not that honed caused none. The cold count includes the few calls
after the tune, so ``p`` leans against honed.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

_TUNE_S = re.compile(r" in ([0-9.]+)s:")
_EAGER_CALLS = re.compile(r"; ([0-9]+) call\(s\) ran eager meanwhile")


def above_own_rate(alone_over: int, alone_calls: int, over: int, calls: int) -> float | None:
    """The chance that, going over 2x at eager alone's rate (``alone_over`` of ``alone_calls``),
    ``over`` or more of ``calls`` would: one-sided, exact given both counts' sum (module
    docstring). None without calls on either side."""
    if alone_calls <= 0 or calls <= 0:
        return None
    both = alone_over + over
    share = calls / (alone_calls + calls)
    # in logs: a CPU run's thousands of calls over 2x put the binomial's terms past a float
    log_share, log_rest = math.log(share), math.log1p(-share)
    top = math.lgamma(both + 1)
    return min(
        1.0,
        math.fsum(
            math.exp(
                top
                - math.lgamma(k + 1)
                - math.lgamma(both - k + 1)
                + k * log_share
                + (both - k) * log_rest
            )
            for k in range(over, both + 1)
        ),
    )


def row(path: Path) -> dict[str, Any] | None:
    """The figures of one stored run, or None for a file without a cold loop's calls over 2x
    (a run cut short, another benchmark's JSON)."""
    got, _ = _read(path)
    return got


def _read(path: Path) -> tuple[dict[str, Any] | None, str]:
    """``row``'s answer, and why there is none ("" where there is)."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        return None, f"cannot be read ({e.strerror or e})"
    except ValueError:
        return None, "is not JSON"
    cold = data.get("cold") if isinstance(data, dict) else None
    if not isinstance(cold, dict) or "over_2x" not in cold:
        return None, "has no cold loop's calls over 2x"
    warm = data.get("warm") if isinstance(data.get("warm"), dict) else {}
    tunes = [t for t in cold.get("tunes") or [] if isinstance(t, str)]
    match = _TUNE_S.search(tunes[0]) if tunes else None
    during = _EAGER_CALLS.search(tunes[0]) if tunes else None
    tune_calls = int(during.group(1)) if during else None
    eager = data.get("eager") if isinstance(data.get("eager"), dict) else {}
    alone_over, alone_calls = eager.get("over_2x"), eager.get("calls")
    p = (
        above_own_rate(alone_over, alone_calls, cold["over_2x"], tune_calls)
        if None not in (alone_over, alone_calls, tune_calls)
        else None
    )
    name = path.name.removesuffix(".json")
    return {
        "run": name.split("-", 3)[-1] if name.startswith("jit-bert-") else name,
        "python_ns": cold.get("python_ns_median"),
        "over_2x": cold["over_2x"],
        "slowest_x": cold.get("slowest_vs_eager_median"),
        "tune_s": float(match.group(1)) if match else None,
        "tuned_after_s": cold.get("seconds_to_tuned_speed"),
        "steady_x": cold.get("steady_speedup_vs_eager"),
        "warm_over_2x": warm.get("over_2x"),
        "warm_tuned_after_s": warm.get("seconds_to_tuned_speed"),
        "eager_alone_over_2x": alone_over,
        "eager_alone_calls": alone_calls,
        "tune_eager_calls": tune_calls,
        "p_above_eager_alone": p,
    }, ""


def summary(rows: list[dict[str, Any]], fast_ns: float) -> dict[str, Any]:
    """Runs on fast and on slow hosts (unknown speed: neither), how many of each had no call
    over 2x, and how many of the runs set against eager alone went over 2x beyond its rate."""
    out: dict[str, Any] = {"fast_ns": fast_ns}
    for key, pick in (
        ("fast", lambda ns: ns is not None and ns <= fast_ns),
        ("slow", lambda ns: ns is not None and ns > fast_ns),
    ):
        runs = [r for r in rows if pick(r["python_ns"])]
        out[key] = {
            "runs": len(runs),
            "none_over_2x": sum(1 for r in runs if r["over_2x"] == 0),
            "over_2x": [r["over_2x"] for r in runs],
        }
    out["unknown_speed"] = sum(1 for r in rows if r["python_ns"] is None)
    judged = [r for r in rows if r.get("p_above_eager_alone") is not None]
    out["against_eager_alone"] = {
        "runs": len(judged),
        "above_at_p_0_01": sum(1 for r in judged if r["p_above_eager_alone"] < 0.01),
    }
    return out


def _cell(value: Any, fmt: str = "{}") -> str:
    return "-" if value is None else fmt.format(value)


def _alone(r: dict[str, Any]) -> str:
    if r["eager_alone_over_2x"] is None or r["eager_alone_calls"] is None:
        return "-"
    return f"{r['eager_alone_over_2x']} of {r['eager_alone_calls']}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| run | pure-Python call | cold over 2x | slowest | tune | tuned speed after | steady"
        " | warm over 2x | warm tuned after | eager alone over 2x | tune's eager calls | p |"
        "\n| --- |" + " --: |" * 11
    )
    lines = [
        f"| {r['run']} | {_cell(r['python_ns'], '{:.0f} ns')} | {r['over_2x']} "
        f"| {_cell(r['slowest_x'], '{:.2f}x')} | {_cell(r['tune_s'], '{:.1f} s')} "
        f"| {_cell(r['tuned_after_s'], '{:.1f} s')} | {_cell(r['steady_x'], '{:.2f}x')} "
        f"| {_cell(r['warm_over_2x'])} | {_cell(r['warm_tuned_after_s'], '{:.2f} s')} "
        f"| {_alone(r)} | {_cell(r['tune_eager_calls'])} "
        f"| {_cell(r['p_above_eager_alone'], '{:.3g}')} |"
        for r in rows
    ]
    return "\n".join([head, *lines])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="bench/jit_bert.py JSON files")
    parser.add_argument(
        "--fast-ns",
        type=float,
        default=40.0,
        help="a pure-Python call at most this many ns over the cold loop: a fast host (40)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows and the summary here")
    args = parser.parse_args(argv)
    if args.fast_ns <= 0:
        parser.error(
            f"--fast-ns must be above 0 (got {args.fast_ns:g}); 40 splits the H200's hosts"
        )
    rows, skipped = [], []
    for path in args.files:
        got, why = _read(path)
        if got is None:
            skipped.append(f"skipped {path}: it {why}")
        else:
            rows.append(got)
    if not rows:
        print(
            "no bench/jit_bert.py run with a cold loop among the files given; pass its JSON files",
            *skipped,
            sep="\n",
            file=sys.stderr,
        )
        return 2
    print(table(rows))
    for line in skipped:
        print(line)
    result = summary(rows, args.fast_ns)
    for key in ("fast", "slow"):
        part = result[key]
        side = "at most" if key == "fast" else "over"
        print(
            f"{key} hosts (pure-Python call {side} {args.fast_ns:g} ns): {part['runs']} run(s), "
            f"{part['none_over_2x']} with no call over 2x (calls over 2x: {part['over_2x']})"
        )
    if result["unknown_speed"]:
        print(f"{result['unknown_speed']} run(s) without the host's speed (older runs)")
    judged = result["against_eager_alone"]
    print(
        f"against eager alone on the same host: {judged['runs']} run(s) judged, "
        f"{judged['above_at_p_0_01']} with more calls over 2x than its rate explains (p < 0.01)"
    )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": result}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
