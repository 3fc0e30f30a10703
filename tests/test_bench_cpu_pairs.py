"""tests/test_bench_cpu_pairs.py: bench/cpu_pairs.py reads CPU sets and writes one row per CPU;
bench/profile/cpu_escape.py runs each policy on each set.

Their figures are the host's (docs/jit.md); here: the CPU-set syntax, that a busy CPU's spinner
really runs there and stops, that a short run writes a ratio for every other CPU and a drift
slice for every quarter second, and the escape profile's two halves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import cpu_pairs  # noqa: E402  (bench/ is a folder of scripts, put on sys.path above)


def test_cpu_sets_read_as_taskset_writes_them() -> None:
    assert sorted(cpu_pairs.cpu_list("0-3,7,9-10")) == [0, 1, 2, 3, 7, 9, 10]
    assert sorted(cpu_pairs.cpu_list("5")) == [5]


def test_a_busy_cpus_spinner_runs_while_the_block_does_and_stops_after() -> None:
    cpu = max(os.sched_getaffinity(0))
    others = set(_children())  # what earlier tests in this process left running
    with cpu_pairs._busy([cpu]):
        spinners = set(_children()) - others
        assert len(spinners) == 1
        (spinner,) = spinners
        deadline = time.monotonic() + 10  # a loaded machine gives it a share of its CPU only
        while _cpu_seconds(spinner) < 0.05 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cpu_seconds(spinner) >= 0.05  # it spins while this process sleeps
        assert _last_cpu(spinner) == cpu
    assert spinner not in _children()


def test_a_short_run_writes_a_ratio_for_every_other_cpu_and_the_drift_slices(
    tmp_path: Path,
) -> None:
    allowed = sorted(os.sched_getaffinity(0))
    probe = allowed[0]
    out = tmp_path / "pairs.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCH / "cpu_pairs.py"),
            "--probe",
            str(probe),
            "--seconds",
            "0.05",
            "--drift",
            "0.5",
            "--load",
            str(allowed[-1]),
            "--set",
            ",".join(map(str, allowed)),
            "--out",
            str(out),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    result = json.loads(out.read_text())
    row = result["probes"][str(probe)]
    assert sorted(map(int, row["one_busy"])) == [c for c in allowed if c != probe]
    assert all(0 < r < 10 for r in row["one_busy"].values())
    assert list(row["sets_busy"]) == [",".join(map(str, allowed))]
    assert len(row["alone"]) == len(allowed) + 1  # before the first row, and after each
    for drift in (result["drift"], result["drift_loaded"]):
        slices = drift[str(probe)]["slices_per_s"]
        assert len(slices) == 2 and all(s > 0 for s in slices)
        assert drift[str(probe)]["min_over_best"] <= 1.0


def _children() -> list[int]:
    me = os.getpid()
    path = f"/proc/{me}/task/{me}/children"
    if not os.path.exists(path):
        pytest.skip("this kernel does not list a task's children")
    with open(path) as f:
        return [int(p) for p in f.read().split()]


def _stat(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def _cpu_seconds(pid: int) -> float:
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _last_cpu(pid: int) -> int:
    return int(_stat(pid)[36])  # field 39, "processor"


def test_the_escape_profile_runs_each_policy_on_each_set(tmp_path: Path) -> None:
    """bench/profile/cpu_escape.py: two halves, the sets swapped between the policies; the
    thread that stays never moves."""
    allowed = sorted(os.sched_getaffinity(0))
    a, b = str(allowed[0]), str(allowed[-1])
    out = tmp_path / "escape.json"
    subprocess.run(
        [
            sys.executable,
            str(BENCH / "profile" / "cpu_escape.py"),
            "--cpus-a",
            a,
            "--cpus-b",
            b,
            "--seconds",
            "0.3",
            "--work",
            "2000",
            "--out",
            str(out),
        ],
        check=True,
        timeout=120,
        capture_output=True,
    )
    halves = json.loads(out.read_text())["halves"]
    assert [(h["stays"]["cpus"], h["moves"]["cpus"]) for h in halves] == [
        ([int(a)], [int(b)]),
        ([int(b)], [int(a)]),
    ]
    for h in halves:
        assert h["stays"]["moves"] == 0
        for policy in h.values():
            assert policy["calls"] > 10
            assert policy["quickest_tenth_ms"] <= policy["median_ms"]
            assert policy["over_2x"] <= policy["over_1_5x"] <= policy["calls"]
