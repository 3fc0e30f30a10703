"""tests/test_tuning.py: honed.tune end to end: selection, correctness gate, failures, dispatch."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

import honed
from honed.backend import Backend, Sample

from conftest import TinyMLP, batches


class PassThrough(Backend):
    """A correct custom backend: returns the module itself."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return module


class SlowBackend(PassThrough):
    pass


class FastBackend(PassThrough):
    pass


class WrongBackend(Backend):
    """Returns values 1 % off: must be rejected however fast it is."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) * 1.01


class NaNBackend(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        return lambda *a, **k: module(*a, **k) * float("nan")


class RaisingBackend(Backend):
    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        raise RuntimeError("compiler exploded")


class RecordingBackend(PassThrough):
    seen: ClassVar[list[Any]] = []

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        RecordingBackend.seen = [module, example_inputs]
        return module


def _rows(report: honed.TuneReport) -> dict[str, Any]:
    return {c.name: c for g in report.graphs for c in g.candidates}


def test_picks_the_faster_backend_by_injected_timings() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([SlowBackend(), FastBackend()])
    timings = {"TorchEagerBackend": [3.0], "SlowBackend": [5.0], "FastBackend": [1.0]}
    with honed.config.patch(injected_latencies=timings):
        report = honed.tune(model, batches(4, 4), strategy=strategy)
    assert report.selected() == ["FastBackend"]
    rows = _rows(report)
    assert rows["FastBackend"].selected and not rows["SlowBackend"].selected
    assert rows["FastBackend"].median_ms == pytest.approx(1.0)
    assert rows["FastBackend"].speedup == pytest.approx(3.0)
    assert rows["SlowBackend"].speedup == pytest.approx(0.6)


def test_selection_follows_the_timings_not_the_order() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([SlowBackend(), FastBackend()])
    timings = {"TorchEagerBackend": [3.0], "SlowBackend": [1.0], "FastBackend": [5.0]}
    with honed.config.patch(injected_latencies=timings):
        report = honed.tune(model, batches(4, 4), strategy=strategy)
    assert report.selected() == ["SlowBackend"]


def test_eager_wins_when_nothing_beats_it() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([SlowBackend()])
    timings = {"TorchEagerBackend": [1.0], "SlowBackend": [4.0]}
    with honed.config.patch(injected_latencies=timings):
        report = honed.tune(model, batches(4), strategy=strategy)
    assert report.selected() == ["TorchEagerBackend"]


def test_wrong_outputs_are_rejected_even_when_fastest() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([WrongBackend(), SlowBackend()])
    timings = {"TorchEagerBackend": [3.0], "WrongBackend": [0.1], "SlowBackend": [2.0]}
    with honed.config.patch(injected_latencies=timings):
        report = honed.tune(model, batches(4, 8), strategy=strategy)
    rows = _rows(report)
    assert rows["WrongBackend"].status == "rejected"
    assert "wrong outputs" in rows["WrongBackend"].reason
    assert rows["WrongBackend"].max_abs_error is not None and rows["WrongBackend"].max_abs_error > 0
    assert report.selected() == ["SlowBackend"]
    x = batches(8, seed=3)[0]
    torch.testing.assert_close(model(x), model.module(x))


def test_nan_outputs_and_exceptions_fail_with_their_reason() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.MaxThroughputStrategy([NaNBackend(), RaisingBackend(), FastBackend()])
    with honed.config.patch(injected_latencies={"TorchEagerBackend": [2.0], "FastBackend": [1.0]}):
        report = honed.tune(model, batches(4), strategy=strategy)
    rows = _rows(report)
    assert rows["NaNBackend"].status == "rejected"
    assert rows["NaNBackend"].reason.startswith("NaN outputs")
    assert rows["RaisingBackend"].status == "failed"
    assert "RuntimeError: compiler exploded" in rows["RaisingBackend"].reason
    assert report.selected() == ["FastBackend"]


def test_one_backend_failing_leaves_the_module_eager(caplog: pytest.LogCaptureFixture) -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    with caplog.at_level(logging.WARNING, logger="honed"):
        report = honed.tune(model, batches(4), strategy=honed.OneBackendStrategy(RaisingBackend()))
    assert report.selected() == [None]
    assert not model.is_tuned
    assert "no candidate selected" in caplog.text
    x = batches(4, seed=5)[0]
    torch.testing.assert_close(model(x), model.module(x))


def test_custom_backend_receives_module_and_samples() -> None:
    inner = TinyMLP().eval()
    model = honed.Module(inner, "m")
    data = batches(2, 4)
    honed.tune(model, data, strategy=honed.OneBackendStrategy(RecordingBackend()))
    module, examples = RecordingBackend.seen
    assert module is inner
    assert [tuple(s.args[0].shape) for s in examples] == [(2, 16), (4, 16)]
    assert all(s.kwargs == {} for s in examples)
    assert model.is_tuned


def test_first_wins_takes_the_first_backend_that_beats_eager() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.FirstWinsStrategy([SlowBackend(), FastBackend()], min_speedup=1.5)
    timings = {"TorchEagerBackend": [3.0], "SlowBackend": [2.5], "FastBackend": [1.0]}
    with honed.config.patch(injected_latencies=timings):
        report = honed.tune(model, batches(4), strategy=strategy)
    assert report.selected() == ["FastBackend"]  # SlowBackend is only 1.2x: below 1.5x


def test_first_wins_reads_min_speedup_from_config() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    strategy = honed.FirstWinsStrategy([SlowBackend(), FastBackend()])
    timings = {"TorchEagerBackend": [3.0], "SlowBackend": [2.5], "FastBackend": [1.0]}
    with honed.config.patch(injected_latencies=timings, first_wins_min_speedup=1.5):
        assert strategy.min_speedup == 1.5
        report = honed.tune(model, batches(4), strategy=strategy)
    assert report.selected() == ["FastBackend"]  # SlowBackend's 1.2x is below the config's 1.5x
    assert strategy.min_speedup == 1.0  # the default again once the patch ends


def test_first_wins_given_min_speedup_overrides_config() -> None:
    strategy = honed.FirstWinsStrategy([SlowBackend()], min_speedup=2.0)
    with honed.config.patch(first_wins_min_speedup=1.5):
        assert strategy.min_speedup == 2.0
    with pytest.raises(honed.ConfigError, match="min_speedup must be > 0"):
        honed.FirstWinsStrategy(min_speedup=0)


def test_inductor_tune_matches_eager(inductor_tuned: honed.Module) -> None:
    assert inductor_tuned.is_tuned
    report = inductor_tuned.report
    assert report.selected() == ["TorchInductorBackend"]
    row = _rows(report)["TorchInductorBackend"]
    assert row.status == "ok" and row.build_s is not None and row.build_s > 0
    assert row.median_ms is not None and row.p99_ms is not None and row.p99_ms >= row.median_ms
    for b in (2, 4, 8, 5):  # 5 was never recorded but lies inside the batch profile [2, 8]
        x = batches(b, seed=7)[0]
        torch.testing.assert_close(inductor_tuned(x), inductor_tuned.module(x))


def test_unknown_signature_runs_eager_with_one_warning(
    inductor_tuned: honed.Module, caplog: pytest.LogCaptureFixture
) -> None:
    x = torch.randn(2, 3, 16)  # rank 3: a signature the tune never saw
    with caplog.at_level(logging.WARNING, logger="honed"):
        out1 = inductor_tuned(x)
        out2 = inductor_tuned(x)
    torch.testing.assert_close(out1, inductor_tuned.module(x))
    torch.testing.assert_close(out1, out2)
    assert caplog.text.count("not tuned for") == 1


def test_shape_outside_the_profile_runs_eager_and_stays_correct(
    inductor_tuned: honed.Module, caplog: pytest.LogCaptureFixture
) -> None:
    x = batches(64, seed=11)[0]
    with caplog.at_level(logging.WARNING, logger="honed"):
        out = inductor_tuned(x)
    torch.testing.assert_close(out, inductor_tuned.module(x))
    assert "outside" in caplog.text


class FailsOnOddBatches(Backend):
    """Passes the check on the recorded (even) batches, raises on an odd one at serving time,
    like torch._int_mm on CUDA for 16 rows or fewer."""

    def build(self, module: torch.nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        def run(x: torch.Tensor) -> Any:
            if x.shape[0] % 2:
                raise RuntimeError("self.size(0) needs to be greater than 16, but got 3")
            return module(x)

        return run


def test_a_variant_raising_at_serving_time_is_answered_by_eager_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = honed.Module(TinyMLP().eval(), "odd")
    strategy = honed.OneBackendStrategy(FailsOnOddBatches())
    honed.tune(model, batches(2, 4, 8), strategy=strategy)
    assert model.is_tuned and model.report.graphs[0].selected == "FailsOnOddBatches"
    with caplog.at_level(logging.WARNING, logger="honed"), torch.no_grad():
        x3, x5 = batches(3, 5, seed=2)
        torch.testing.assert_close(model(x3), model.module(x3))  # inside the profile [2, 8]
        torch.testing.assert_close(model(x5), model.module(x5))
        x4 = batches(4, seed=2)[0]
        torch.testing.assert_close(model(x4), model.module(x4))  # the variant still serves
        assert model.dispatch((x3,), {}) is not honed.module.MISS  # JIT's path: eager too
    assert caplog.text.count("raised RuntimeError: self.size(0) needs to be greater") == 1
    assert "FailsOnOddBatches" in caplog.text and "running eager" in caplog.text


def test_pipeline_with_two_modules_tunes_each_on_its_inputs() -> None:
    encoder = honed.Module(TinyMLP().eval(), "encoder")
    head = honed.Module(torch.nn.Linear(4, 2).eval(), "head")

    def pipeline(x: torch.Tensor) -> torch.Tensor:
        return head(torch.tanh(encoder(x)))

    strategy = honed.OneBackendStrategy(FastBackend())
    report = honed.tune(func=pipeline, dataset=batches(2, 6), strategy=strategy)
    assert [g.module for g in report.graphs] == ["encoder", "head"]
    assert encoder.is_tuned and head.is_tuned
    assert head.report.graphs[0].profile.startswith("in0(batch[2..6], 4)")


def test_dataset_forms() -> None:
    class TwoInputs(torch.nn.Module):
        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return x * scale

    model = honed.Module(TwoInputs(), "two")
    strategy = honed.OneBackendStrategy(FastBackend())
    x = torch.ones(2, 3)
    honed.tune(model, [(x, 2.0), {"x": x, "scale": 3.0}], strategy=strategy)
    assert len(model.variants) == 2  # positional and keyword calls are different graphs
    honed.tune(model, x, strategy=strategy)  # a single tensor is one sample
    assert len(model.variants) == 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: honed.tune(None, [torch.ones(1, 16)]), "needs a honed.Module"),
        (lambda m: honed.tune(m, []), "dataset is empty"),
        (lambda m: honed.tune(m, None), "needs a dataset"),
        (lambda m: honed.tune(m, [torch.ones(1, 16)], strategy="fast"), "strategy must be"),
        (lambda m: honed.tune(m, [torch.ones(1, 3)]), "failed before any tuning"),
        (lambda m: honed.tune(lambda x: x, [torch.ones(1, 16)]), "no honed.Module was called"),
        (lambda m: honed.tune(m, [torch.ones(2, 16)], batch_sizes=[0]), "must be positive"),
    ],
)
def test_bad_input_is_a_clear_honed_error(call: Callable[[Any], Any], message: str) -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    with pytest.raises(honed.HonedError, match=message):
        call(model)


def test_strategy_and_module_misuse_are_config_errors() -> None:
    with pytest.raises(honed.ConfigError, match="pass an instance"):
        honed.OneBackendStrategy(honed.backend.TorchInductorBackend)  # type: ignore[arg-type]
    with pytest.raises(honed.ConfigError, match="not a backend"):
        honed.MaxThroughputStrategy(["inductor"])  # type: ignore[list-item]
    with pytest.raises(honed.InputError, match=r"needs a torch\.nn\.Module"):
        honed.Module(lambda x: x)  # type: ignore[arg-type]


def test_batch_sizes_extend_the_profile() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    report = honed.tune(
        model, batches(4), batch_sizes=[1, 16], strategy=honed.OneBackendStrategy(FastBackend())
    )
    assert report.graphs[0].profile.startswith("in0(batch[1..16], 16)")


def test_batch_sweep_extends_the_profile_to_the_knee() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    report = honed.tune(
        model,
        batches(2, 4),
        batch_sweep=True,
        max_batch=16,
        strategy=honed.OneBackendStrategy(FastBackend()),
    )
    graph = report.graphs[0]
    assert graph.sweep.startswith("knee at batch ")
    knee = int(graph.sweep.split()[3])
    assert 2 <= knee <= 16
    assert graph.profile.startswith(f"in0(batch[2..{max(knee, 4)}], 16)")
    x = batches(knee, seed=2)[0]
    torch.testing.assert_close(model(x), model.module(x))


def test_batch_sweep_without_a_batch_axis_says_so() -> None:
    model = honed.Module(TinyMLP().eval(), "m")
    report = honed.tune(
        model, batches(4), batch_sweep=True, strategy=honed.OneBackendStrategy(FastBackend())
    )
    assert report.graphs[0].sweep == "no batch axis: nothing to sweep"
