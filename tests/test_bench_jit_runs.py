"""tests/test_bench_jit_runs.py: bench/jit_runs.py reads stored bench/jit_bert.py runs and
counts their calls over 2x by the host's speed."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import jit_runs  # noqa: E402  (bench/ is a folder of scripts, put on sys.path above)


def _run(folder: Path, name: str, python_ns: float | None, over: int, **cold: Any) -> Path:
    figures: dict[str, Any] = {
        "over_2x": over,
        "slowest_vs_eager_median": 1.5 + over / 10,
        "seconds_to_tuned_speed": 60.0,
        "steady_speedup_vs_eager": 8.25,
        "tunes": [
            "Tuned BertModel 📊109.5M (first tune, budget 100s) beside the program in 51.36s: tried"
        ],
        **cold,
    }
    if python_ns is not None:
        figures["python_ns_median"] = python_ns
    path = folder / f"jit-bert-h200-{name}.json"
    path.write_text(
        json.dumps({"cold": figures, "warm": {"over_2x": 1, "seconds_to_tuned_speed": 1.25}})
    )
    return path


def test_runs_are_counted_by_the_hosts_speed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        _run(tmp_path, "20261130xa-abc", 31.0, 0),
        _run(tmp_path, "20261130xb-abc", 40.0, 3),  # at the bound: fast
        _run(tmp_path, "20261130xc-abc", 55.5, 7),
        _run(tmp_path, "20261130xd-abc", 48.0, 0),
        _run(tmp_path, "20261130xe-old", None, 2),  # stored before the probe existed
    ]
    other = tmp_path / "suite.log.txt"
    other.write_text("77 passed")
    out = tmp_path / "rows.json"
    assert jit_runs.main([*map(str, files), str(other), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert (
        "| 20261130xc-abc | 56 ns | 7 | 2.20x | 51.4 s | 60.0 s | 8.25x | 1 | 1.25 s | - | - | - |"
        in printed
    )
    assert "| 20261130xe-old | - | 2 |" in printed
    assert f"skipped {other}: it is not JSON" in printed
    assert (
        "fast hosts (pure-Python call at most 40 ns): 2 run(s), 1 with no call over 2x" in printed
    )
    assert "slow hosts (pure-Python call over 40 ns): 2 run(s), 1 with no call over 2x" in printed
    assert "1 run(s) without the host's speed" in printed
    stored = json.loads(out.read_text())
    assert [r["run"] for r in stored["rows"]] == [
        f"20261130x{c}-{'old' if c == 'e' else 'abc'}" for c in "abcde"
    ]
    assert stored["rows"][0]["tune_s"] == 51.36
    assert stored["summary"]["fast"] == {"runs": 2, "none_over_2x": 1, "over_2x": [0, 3]}
    assert stored["summary"]["slow"] == {"runs": 2, "none_over_2x": 1, "over_2x": [7, 0]}
    # a lower bound moves the 40 ns run to the slow side
    assert jit_runs.summary(stored["rows"], 35.0)["slow"]["over_2x"] == [3, 7, 0]


def test_a_run_without_a_tune_line_or_a_warm_loop_still_makes_a_row(tmp_path: Path) -> None:
    path = _run(tmp_path, "20261130ya-abc", 30.0, 0, tunes=[])
    data = json.loads(path.read_text())
    del data["warm"]
    path.write_text(json.dumps(data))
    got = jit_runs.row(path)
    assert got is not None
    assert got["tune_s"] is None and got["warm_over_2x"] is None
    assert (
        "| 20261130ya-abc | 30 ns | 0 | 1.50x | - | 60.0 s | 8.25x | - | - | - | - | - |"
        in jit_runs.table([got])
    )


def test_no_run_among_the_files_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"eager": {"median_ms": 7.0}}))
    missing = tmp_path / "missing.json"
    assert jit_runs.main([str(other), str(missing)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "no bench/jit_bert.py run with a cold loop among the files given; pass its JSON files",
        f"skipped {other}: it has no cold loop's calls over 2x",
        f"skipped {missing}: it cannot be read (No such file or directory)",
    ]
    with pytest.raises(SystemExit):
        jit_runs.main([str(other), "--fast-ns", "0"])
    assert "--fast-ns must be above 0 (got 0)" in capsys.readouterr().err


def test_the_tunes_calls_over_2x_are_set_against_eager_alones_on_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tune = (
        "Tuned BertModel (first tune, budget 100s) beside the program in 50.00s: tried ...; "
        "selected X on the program's calls; {} call(s) ran eager meanwhile"
    )
    files = []
    for name, alone, over in (("za", (0, 1000), 9), ("zb", (0, 8000), 9), ("zc", (4, 1000), 1)):
        path = _run(tmp_path, f"20261130{name}-abc", 33.0, over, tunes=[tune.format(8000)])
        data = json.loads(path.read_text())
        data["eager"] = {"over_2x": alone[0], "calls": alone[1], "median_ms": 7.2}
        path.write_text(json.dumps(data))
        files.append(path)
    rows = [jit_runs.row(f) for f in files]
    assert all(r is not None for r in rows)
    za, zb, zc = (r for r in rows if r is not None)
    assert (za["eager_alone_over_2x"], za["eager_alone_calls"], za["tune_eager_calls"]) == (
        0,
        1000,
        8000,
    )
    # 0 of 1000 alone cannot tell 9 of 8000 from the host's rate: (8/9)^9
    assert za["p_above_eager_alone"] == pytest.approx((8 / 9) ** 9, rel=1e-9)
    # the same 9 against 0 in as many calls alone: (1/2)^9
    assert zb["p_above_eager_alone"] == pytest.approx(0.5**9, rel=1e-9)
    # fewer than the host's own rate: nothing to explain
    assert zc["p_above_eager_alone"] > 0.99
    assert jit_runs.above_own_rate(0, 1000, 0, 8000) == 1.0
    # a CPU run's counts: thousands over 2x on each side, the same rate
    assert jit_runs.above_own_rate(1200, 6000, 2400, 12000) == pytest.approx(0.5, abs=0.02)
    # past a float's range term by term (comb(1200, 600) is about 1e359): against the exact
    # sum in integers, with the tune's share of the calls 2/3
    exact = sum(math.comb(1200, k) * 2**k for k in range(840, 1201)) / 3**1200
    assert 1e-5 < exact < 1e-2
    assert jit_runs.above_own_rate(360, 6000, 840, 12000) == pytest.approx(exact, rel=1e-6)
    assert jit_runs.above_own_rate(3, 0, 1, 8000) is None
    assert jit_runs.main(list(map(str, files))) == 0
    printed = capsys.readouterr().out
    assert "| 0 of 1000 | 8000 | 0.346 |" in printed
    assert (
        "against eager alone on the same host: 3 run(s) judged, 1 with more calls over 2x "
        "than its rate explains (p < 0.01)" in printed
    )
