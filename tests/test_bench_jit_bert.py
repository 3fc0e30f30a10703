"""tests/test_bench_jit_bert.py: bench/jit_bert.py's figures and its handling of a failed run.

The benchmark itself needs minutes (and a GPU for its real figures); its pure parts are checked
here: warm JIT over AOT across processes, JIT over the one-liner, and a run that may fail."""

from __future__ import annotations

import argparse
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import jit_bert  # noqa: E402  (bench/ is a folder of scripts, put on sys.path above)


def run_of(ms: float, spread: float = 0.01, calls: int = 40) -> dict[str, Any]:
    """A run's record as the program writes it: [start s, ms, ...] per call."""
    return {"calls": [[i * 0.01, ms * (1 + spread * ((i % 5) - 2))] for i in range(calls)]}


def test_warm_over_aot_across_processes_takes_one_median_per_process() -> None:
    warms = [run_of(2.0), run_of(2.2), run_of(1.8)]
    aots = [run_of(1.0), run_of(1.1)]
    v = jit_bert.between_processes(warms, aots)
    assert v["warm_ms"] == [pytest.approx(2.0), pytest.approx(2.2), pytest.approx(1.8)]
    assert v["aot_ms"] == [pytest.approx(1.0), pytest.approx(1.1)]
    assert v["ratio"] == pytest.approx(2.0 / 1.05, rel=1e-3)  # medians of the processes' medians
    lo, hi = v["ci99"]
    assert lo <= v["ratio"] <= hi and hi - lo > 0.1  # the processes' spread is in the interval


def test_jit_over_the_one_liner_is_the_one_liners_time_over_each_runs() -> None:
    v = jit_bert.against_one_liner({"warm": run_of(1.0), "warm_after": None}, run_of(5.0))
    assert v["runs"] == ["warm"]  # a run that did not happen is left out
    assert v["speedup"] == [pytest.approx(5.0, rel=1e-3)]


def test_each_call_over_2x_is_listed_with_its_host_and_cpu_time() -> None:
    """summarize lists every call after the first over twice eager's median: its index, start,
    time, time until it returned and its thread's CPU time, and counts them by phase."""
    calls = [[i * 0.01, 1.0, 0.2, 0.2] for i in range(20)]
    calls[0] = [0.0, 50.0, 49.0, 49.0]  # the first call never counts
    calls[5] = [0.05, 9.0, 8.9, 8.8]  # ran slow on the host
    calls[12] = [0.12, 7.0, 0.3, 0.3]  # waited for the GPU
    calls[15] = [0.15, 2.0, 0.2, 0.2]  # exactly 2x: not over
    data = {
        "calls": calls,
        "wall_s": 1.0,
        "stderr": "",
        "phases": [[0.1, "Candidate", "build"]],
    }
    out = jit_bert.summarize(data, eager_ms=1.0)
    assert out["over_2x"] == 2
    assert out["over_2x_calls"] == [[5, 0.05, 9.0, 8.9, 8.8], [12, 0.12, 7.0, 0.3, 0.3]]
    assert out["over_2x_by_phase"] == {"before the tune": 1, "Candidate: build": 1}
    assert out["slowest_after_first_ms"] == 9.0


@pytest.mark.parametrize(
    "record",
    [
        "Tuned M (first tune) beside the program in 9.00s: tried ...; selected A on the "
        "program's calls; 40 call(s) ran meanwhile: eager until call 10, then CudaGraphs(bf16)",
        "Tuned M (first tune) beside the program in 9.00s: tried ...; selected A on the "
        "program's calls; 40 call(s) ran eager until call 10, then CudaGraphs(bf16), meanwhile",
    ],
)
def test_the_calls_a_stand_in_answered_are_summed_up(record: str) -> None:
    """A tune's record that says a variant answered from call K on (both wordings): the calls
    after K until the tune's final turns began, their median, slowest and count over 2x."""
    calls = [[i * 0.1, 7.0] for i in range(10)] + [[1.0 + i * 0.1, 1.5] for i in range(20)]
    calls[15][1] = 16.0  # a stand-in's call over 2x eager
    calls += [[3.0 + i * 0.1, 0.9] for i in range(10)]  # the final turns and the winner
    data = {
        "calls": calls,
        "wall_s": 4.0,
        "stderr": record,
        "phases": [[0.2, "CudaGraphs(bf16)", "build"], [3.0, "finalists", "on the calls"]],
    }
    out = jit_bert.summarize(data, eager_ms=7.0)
    assert out["stand_in"] == {
        "label": "CudaGraphs(bf16)",
        "from_call": 10,
        "from_s": 1.0,
        "until_s": 2.9,
        "calls": 20,
        "median_ms": 1.5,
        "slowest_ms": 16.0,
        "over_2x": 1,
    }
    data["stderr"] = (
        "Tuned M (first tune) beside the program in 9.00s: ...; 40 call(s) ran eager meanwhile"
    )
    assert "stand_in" not in jit_bert.summarize(data, eager_ms=7.0)


def test_a_slow_calls_cpu_and_kernel_counts_and_the_workers_cpus_are_kept() -> None:
    """Where the program kept them, each call over 2x also carries the CPU it ended on and its
    thread's minor faults, involuntary and voluntary switches; JIT's worker CPUs and the
    physical cores come along, to tell whether a slow call shared a CPU with a worker."""
    calls = [[i * 0.01, 1.0, 0.2, 0.2, 0, 0, 0, 1] for i in range(10)]
    calls[4] = [0.04, 5.0, 4.9, 3.0, 3, 2, 1, 150]  # stopped 150 times: waited (the GIL)
    data = {
        "calls": calls,
        "wall_s": 1.0,
        "stderr": "",
        "worker_cpus": [2, 3],
        "cores": [[0], [1], [2], [3]],
    }
    out = jit_bert.summarize(data, eager_ms=1.0)
    assert out["over_2x_calls"] == [[4, 0.04, 5.0, 4.9, 3.0, 3, 2, 1, 150]]
    assert out["worker_cpus"] == [2, 3] and out["cores"] == [[0], [1], [2], [3]]
    assert "worker_cpus" not in jit_bert.summarize(dict(data, worker_cpus=None), eager_ms=1.0)


def test_a_slow_calls_pure_python_probe_is_kept_beside_the_runs_usual() -> None:
    """Each call carries the ns of a pure-Python call just after it, on the thread's CPU clock:
    a call over 2x keeps it, and the run's median comes along, to tell a CPU that ran slow
    from waits for the GIL or the GPU."""
    calls = [[i * 0.01, 1.0, 0.2, 0.2, 0, 0, 0, 1, 70.0 + i % 3] for i in range(10)]
    calls[6] = [0.06, 5.0, 4.9, 4.8, 3, 0, 0, 2, 150.0]  # its CPU ran at half speed
    out = jit_bert.summarize({"calls": calls, "wall_s": 1.0, "stderr": ""}, eager_ms=1.0)
    assert out["over_2x_calls"] == [[6, 0.06, 5.0, 4.9, 4.8, 3, 0, 0, 2, 150.0]]
    assert out["python_ns_median"] == 71.0
    older = [c[:8] for c in calls]  # a run recorded before the probe: no median claimed
    assert "python_ns_median" not in jit_bert.summarize(
        {"calls": older, "wall_s": 1.0, "stderr": ""}, eager_ms=1.0
    )


def test_a_slow_calls_gpu_round_trip_is_kept_beside_the_runs_usual() -> None:
    """On a GPU each call also carries the µs of a tiny kernel's round trip just after it: a
    call over 2x keeps it and the run's median comes along (a GPU time-sliced with another
    process holds the round trip up; a CPU that ran slow does not)."""
    calls = [[i * 0.01, 1.0, 0.2, 0.2, 0, 0, 0, 1, 70.0, 20.0 + i % 3] for i in range(10)]
    calls[3] = [0.03, 5.0, 4.9, 4.8, 3, 0, 0, 2, 71.0, 2400.0]  # waited for a slice
    out = jit_bert.summarize({"calls": calls, "wall_s": 1.0, "stderr": ""}, eager_ms=1.0)
    assert out["over_2x_calls"] == [[3, 0.03, 5.0, 4.9, 4.8, 3, 0, 0, 2, 71.0, 2400.0]]
    assert out["gpu_us_median"] == 21.0 and out["python_ns_median"] == 70.0
    on_cpu = [c[:9] for c in calls]  # a CPU run has no round trip: no median claimed
    assert "gpu_us_median" not in jit_bert.summarize(
        {"calls": on_cpu, "wall_s": 1.0, "stderr": ""}, eager_ms=1.0
    )


def test_each_window_says_how_many_of_its_calls_ran_on_the_workers_cpus() -> None:
    """Per 5 s window the timeline keeps the share of calls that ended on a CPU of JIT's
    workers (where they run on CPUs of their own), so a slow window can be told to be one
    whose calls shared a CPU with a compile; with no workers placed it claims none."""
    calls = [[i * 1.0, 1.0, 0.2, 0.2, 15 if i in (1, 2, 6) else 0] for i in range(10)]
    data = {"calls": calls, "wall_s": 10.0, "stderr": "", "worker_cpus": [8, 15]}
    out = jit_bert.summarize(data, eager_ms=1.0)
    assert [w[0] for w in out["timeline"]] == [0, 5]
    assert [w[-1] for w in out["timeline"]] == [0.4, 0.2]
    unplaced = jit_bert.summarize(dict(data, worker_cpus=None), eager_ms=1.0)
    assert [len(w) for w in unplaced["timeline"]] == [5, 5]


@pytest.mark.parametrize(
    ("statuses", "tuned_after"),
    # installed at call 20: calls 18-22 are the first five whose median is the tuned speed
    [(["running"], None), (["cancelled"], None), (["installed"], 0.18), (["eager"], 0.0)],
)
def test_a_run_whose_tune_did_not_end_claims_no_tuned_speed(
    statuses: list[str], tuned_after: float | None
) -> None:
    """A loop that ended before its tune did runs eager to its end: its steady median is
    eager's, and where the calls first reach it is no "tuned speed after"."""
    calls = [[i * 0.01, 5.0, 5.0, 5.0] for i in range(20)]
    if statuses == ["installed"]:
        calls[20:] = [[0.2 + i * 0.01, 1.0, 1.0, 1.0] for i in range(20)]
    data = {"calls": calls, "wall_s": 1.0, "stderr": "", "tune_status": statuses}
    out = jit_bert.summarize(data, eager_ms=5.0)
    assert out["seconds_to_tuned_speed"] == tuned_after
    assert out["tune_status"] == statuses


def _run_args(tmp_path: Path) -> argparse.Namespace:
    """The arguments ``run_program`` reads: a small CPU run writing into ``tmp_path``."""
    return argparse.Namespace(
        small=True,
        device="cpu",
        calls=1,
        out=str(tmp_path / "out.json"),
        watch_ms=0,
        routes=False,
        aot_busy=False,
        timeout=60.0,
    )


def test_a_run_that_may_fail_reports_its_last_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        jit_bert,
        "PROGRAM",
        "import sys\nprint('Traceback (most recent call last):', file=sys.stderr)\n"
        "print('RuntimeError: the pool broke', file=sys.stderr)\nsys.exit(1)\n",
    )
    args = _run_args(tmp_path)
    failed = jit_bert.run_program(args, tmp_path, "oneliner", {}, 1.0, "oneliner", may_fail=True)
    assert failed["failed"] == "RuntimeError: the pool broke" and failed["failed_after_s"] >= 0
    with pytest.raises(SystemExit, match="oneliner run failed"):
        jit_bert.run_program(args, tmp_path, "oneliner", {}, 1.0, "oneliner")


def test_the_hosts_busy_and_stolen_shares_line_up_with_the_calls_over_2x() -> None:
    """/proc/stat's counters between samples give each period's busy and stolen shares, in the
    loop's seconds; each call over 2x eager's median is reported with its period's figures."""
    sampler = jit_bert.HostSampler()
    sampler.stop()
    # user nice system idle iowait irq softirq steal
    sampler.samples = [
        (100.0, [0, 0, 0, 0, 0, 0, 0, 0]),
        (100.5, [50, 0, 0, 50, 0, 0, 0, 0]),  # half busy, nothing stolen
        (101.0, [80, 0, 0, 70, 0, 0, 0, 50]),  # 30 + 50 of 100 busy, 50 stolen
    ]
    host = sampler.since(100.0)
    assert host == [[0.0, 0.5, 0.5, 0.0], [0.5, 1.0, 0.8, 0.5]]
    data = {
        "calls": [[0.0, 100.0, 100.0, 100.0], [0.1, 5.0, 5.0, 5.0], [0.7, 20.0, 20.0, 19.0]],
        "wall_s": 1.0,
        "host": host,
        "stderr": "",
    }
    out = jit_bert.summarize(data, eager_ms=5.0)
    assert out["over_2x_host"] == [[2, 0.8, 0.5]]
    assert out["host_stolen_max"] == 0.5


def test_each_call_over_2x_names_the_marked_functions_that_ran_during_it() -> None:
    """--marks: a marked function's span [start, end] in the loop's seconds is put beside each
    call over 2x it overlaps; a span that ended before the call began, or began after it
    ended, is not."""
    calls = [[0.0, 50.0, 50.0, 50.0], [0.1, 1.0, 1.0, 1.0], [0.2, 9.0, 9.0, 9.0]]
    calls.append([0.3, 4.0, 4.0, 4.0])
    data = {
        "calls": calls,
        "wall_s": 1.0,
        "stderr": "",
        "marks": [
            ["before", "honed-tune", 0.10, 0.19],  # ended before call 2 began
            ["inside", "honed-tune", 0.201, 0.202],
            ["across", "honed-jit", 0.15, 0.35],
            ["after", "honed-tune", 0.2095, 0.301],  # began after call 2 ended (0.209)
        ],
    }
    out = jit_bert.summarize(data, eager_ms=1.0)
    assert out["over_2x_marks"] == {"2": ["across", "inside"], "3": ["across", "after"]}
    assert out["marks"] == data["marks"]


def test_the_default_marks_name_honeds_functions_as_they_are() -> None:
    """--marks default names module:Qualified.name of honed's own functions (and of Inductor's
    benchmarker, whose GPU runs a worker's compile makes); a rename in honed or torch must show
    here, not as a failed device run."""
    import importlib

    for item in (jit_bert.DEFAULT_MARKS + "," + jit_bert.DEFAULT_WORKER_MARKS).split(","):
        where, sep, qualname = item.partition(":")
        assert sep and where.split(".")[0] in ("honed", "torch"), item
        owner: Any = importlib.import_module(where)
        for part in qualname.split("."):
            owner = getattr(owner, part)
        assert callable(owner), item


def test_a_workers_marks_are_read_in_the_loops_seconds(tmp_path: Path) -> None:
    """Each worker writes its marks (monotonic clock) to a file of its own; they are read back
    in the program's loop seconds, named by process and thread."""
    (tmp_path / "123.txt").write_text("loads\tMainThread\t100.5\t100.75\n")
    (tmp_path / "456.txt").write_text("_compile\tMainThread\t101.0\t103.0\n")
    assert jit_bert.worker_marks(tmp_path, 100.0) == [
        ["loads", "worker 123 MainThread", 0.5, 0.75],
        ["_compile", "worker 456 MainThread", 1.0, 3.0],
    ]
    assert jit_bert.worker_marks(tmp_path, None) == []
    assert jit_bert.worker_marks(tmp_path / "none", 100.0) == []


def test_the_workers_sitecustomize_marks_only_a_jit_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sitecustomize written for --marks default is valid Python, and does nothing in a
    process that is not `python -m honed.pipeline._worker` (the program, Inductor's helpers)."""
    code = compile(jit_bert.WORKER_SITE, "sitecustomize.py", "exec")
    monkeypatch.setenv("JIT_BERT_WORKER_MARKS", "honed.pipeline.sharing:loads")
    monkeypatch.setenv("JIT_BERT_MARKS_DIR", str(tmp_path))
    from honed.pipeline import sharing

    before = sharing.loads
    exec(code, {})  # this process is pytest: nothing is wrapped
    assert sharing.loads is before
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "honed.pipeline._worker"])
    monkeypatch.setattr(sharing, "loads", before)  # put back after the test
    exec(code, {})
    assert sharing.loads is not before and sharing.loads.__wrapped__ is before
    assert sharing.loads([pickle.dumps(7)]) == 7
    (line,) = next(tmp_path.glob("*.txt")).read_text().splitlines()
    assert line.split("\t")[:2] == ["loads", "MainThread"]


def test_a_slow_calls_stack_of_the_programs_own_thread_is_kept_apart() -> None:
    text = (
        "@@ 7 thread 140: wait (threading.py:355) < _loop (pool.py:407)\n"
        "@@ 7 program: run (aoti.py:12) < __call__ (module.py:80) < <module> (plain_bert.py:3)\n"
        "@@ 7 took 16.900 ms at 62.071 s\n"
    )
    (call,) = jit_bert.slow_call_stacks(text)
    assert call["program"] == [
        "run (aoti.py:12)",
        "__call__ (module.py:80)",
        "<module> (plain_bert.py:3)",
    ]
    assert call["others"] == [["wait (threading.py:355)", "_loop (pool.py:407)"]]
    assert (call["ms"], call["at_s"]) == (16.9, 62.071)


def test_cpu_lists_read_as_taskset_writes_them() -> None:
    assert jit_bert.cpu_list("0-3,6") == {0, 1, 2, 3, 6}
    assert jit_bert.cpu_list("5") == {5}
    assert jit_bert.cpu_list("") == set()


def test_a_pinned_run_runs_on_its_cpus_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--warm-cpus``: the run's process starts with the affinity asked for."""
    mine = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(
        jit_bert,
        "PROGRAM",
        "import json, os, sys\n"
        "json.dump({'calls': [], 'affinity': sorted(os.sched_getaffinity(0))}, "
        "open(sys.argv[5], 'w'))\n",
    )
    args = _run_args(tmp_path)
    run = jit_bert.run_program(args, tmp_path, "warm-cpus-0", {}, 1.0, cpus=str(mine[-1]))
    assert run["affinity"] == [mine[-1]]
    unpinned = jit_bert.run_program(args, tmp_path, "warm", {}, 1.0)
    assert unpinned["affinity"] == mine
