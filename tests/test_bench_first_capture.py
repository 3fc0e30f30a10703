"""tests/test_bench_first_capture.py: bench/profile/first_capture.py's CPU-side parts.

The profile itself needs a GPU (docs/jit.md has its figures); here: the stack sampler sees a
stretch in which another thread held the GIL as one long gap, ended by that thread's stack, and a
build's row counts the program's calls over twice its median that overlap the build."""

from __future__ import annotations

import random
import sys
import threading
import time
from pathlib import Path

PROFILE = Path(__file__).resolve().parent.parent / "bench" / "profile"
sys.path.insert(0, str(PROFILE))

import first_capture  # noqa: E402  (bench/profile/ is a folder of scripts, put on sys.path above)


def _holds_the_gil(values: list[float]) -> None:
    values.sort()  # one C call over the whole list: no other thread runs meanwhile


def test_the_sampler_shows_a_stretch_without_the_gil_as_one_gap_ended_by_the_holders_stack() -> (
    None
):
    values = [random.random() for _ in range(3_000_000)]
    sampler = first_capture._Sampler(threading.get_ident(), 0.001)
    time.sleep(0.05)  # a few ordinary samples first
    start = time.perf_counter()
    _holds_the_gil(values)
    held_s = time.perf_counter() - start
    time.sleep(0.05)
    end = time.perf_counter()
    sampler.stop()

    seen = sampler.during(start, end)
    assert held_s > 0.02  # otherwise the list was too short to tell a gap from the period
    assert seen["longest_gap_ms"] >= 0.8 * held_s * 1e3
    assert any("_holds_the_gil" in frame for frame in seen["stack_after_gap"])
    assert seen["samples"] > 10  # the sleeps after it were sampled at the period
    assert any(
        "test_the_sampler" in " ".join(stack) for _, stack in seen["most_seen"]
    )  # the stacks seen most: this test's own, asleep


def test_a_builds_row_counts_the_programs_calls_over_twice_its_median_that_overlap_it() -> None:
    first_capture._SPANS[:] = [
        ("warm-up", 10.0, 10.5),
        ("capture_begin", 10.5, 10.51),
        ("capture_end", 10.6, 10.61),
    ]
    # call starts (s) and lengths (ms): before the build, in the warm-up, in the capture, after
    starts = [9.0, 10.1, 10.2, 10.55, 11.0]
    took_ms = [30.0, 25.0, 9.0, 80.0, 40.0]
    row = first_capture._steps(10.0, 10.7, starts, took_ms, median=10.0)

    assert row["program_calls_in_build"] == 3
    assert row["program_over_2x_in_build"] == [80.0, 25.0]
    assert row["program_slowest_in_capture_ms"] == 80.0
    assert row["forward_recorded_ms"] == 90.0
    assert "program_over_2x_in_build" not in first_capture._steps(10.0, 10.7, starts, took_ms)


def test_reserve_mib_allocates_and_frees_one_block_on_the_captures_stream_before_its_first_warm_up(
    monkeypatch,
) -> None:
    import torch

    calls: list[tuple] = []
    monkeypatch.setattr(
        torch.cuda,
        "caching_allocator_alloc",
        lambda size, device, stream: calls.append(("alloc", size, device, stream)) or 1234,
    )
    monkeypatch.setattr(
        torch.cuda, "caching_allocator_delete", lambda ptr: calls.append(("delete", ptr))
    )
    warmed: list[tuple] = []

    class Graphed:
        device, _stream = "cuda:0", "the capture's stream"

        def _warm_up(self, args, kwargs, eager_out=None):
            warmed.append((args, kwargs, eager_out, list(calls)))
            return ["dtypes"]

    Graphed._warm_up = first_capture._reserving(Graphed._warm_up, 256)
    graphed = Graphed()
    assert graphed._warm_up((1,), {"x": 2}, "out") == ["dtypes"]
    graphed._warm_up((3,), {}, None)

    reserved = [("alloc", 256 << 20, "cuda:0", "the capture's stream"), ("delete", 1234)]
    assert calls == reserved  # once, before the first warm-up, not again
    assert warmed[0] == ((1,), {"x": 2}, "out", reserved)
