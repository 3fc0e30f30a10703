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


def test_a_build_of_several_captures_sums_their_steps_and_counts_calls_in_any_of_them() -> None:
    first_capture._SPANS[:] = [
        ("warm-up", 10.0, 10.1),
        ("capture_begin", 10.1, 10.11),
        ("capture_end", 10.13, 10.14),  # the first piece recorded 20 ms
        ("warm-up", 10.2, 10.3),
        ("capture_begin", 10.3, 10.31),
        ("capture_end", 10.36, 10.37),  # the second 50 ms
    ]
    # in the first capture, between the two (a warm-up's), in the second, after the build
    starts = [10.12, 10.2, 10.32, 10.5]
    took_ms = [30.0, 25.0, 9.0, 40.0]
    row = first_capture._steps(10.0, 10.4, starts, took_ms, median=10.0)

    assert row["pieces"] == 2
    assert row["warm_up_ms"] == 200.0
    assert row["forward_recorded_ms"] == 70.0
    assert row["slowest_piece_recorded_ms"] == 50.0
    assert row["program_calls_in_capture"] == 2
    assert row["program_slowest_in_capture_ms"] == 30.0
    assert row["program_calls_in_build"] == 3
    assert row["program_over_2x_in_build"] == [30.0, 25.0]


def test_each_encoder_layer_is_given_the_call_it_got_and_what_it_returned() -> None:
    import torch
    from beside_stall import _model

    model, inputs = _model("cpu", small=True)
    calls = first_capture._layer_calls(model, inputs)

    assert [layer for layer, _, _ in calls] == list(model.encoder.layer)
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        hidden = calls[0][1].args[0]
        for layer, sample, out in calls:  # each layer's recorded call gives what it returned
            got = layer(*sample.args, **sample.kwargs)
            got = got[0] if isinstance(got, tuple) else got
            torch.testing.assert_close(got, out[0] if isinstance(out, tuple) else out)
            assert sample.args[0].shape == hidden.shape
            hidden = got
    torch.testing.assert_close(hidden, want)
    assert not any(layer._forward_hooks or layer._forward_pre_hooks for layer, _, _ in calls)


def test_the_pieces_answer_their_layers_in_a_call_and_only_then() -> None:
    import warnings

    import torch
    from beside_stall import _model

    model, inputs = _model("cpu", small=True)
    calls = first_capture._layer_calls(model, inputs)
    answered: list[int] = []

    def piece(i: int, layer: torch.nn.Module) -> object:
        plain = type(layer).forward

        def graphed(*args: object, **kwargs: object) -> object:
            answered.append(i)
            return plain(layer, *args, **kwargs)

        return graphed

    built = [piece(i, layer) for i, (layer, _, _) in enumerate(calls)]
    run = first_capture._with_pieces(model, calls, built)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # autocast for CUDA on a machine without it
        got = run(**inputs).last_hidden_state
        assert answered == list(range(len(calls)))
        torch.testing.assert_close(got, model(**inputs).last_hidden_state)
    assert answered == list(range(len(calls)))  # the plain call after it: eager layers
    assert not any("forward" in vars(layer) for layer, _, _ in calls)
