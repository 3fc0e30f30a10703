"""tests/test_module.py: honed.Module keeps eager's meaning (training, autograd) and binds calls."""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

import honed
from honed.backend import Backend, Sample
from honed.calls import CallBinder, split_sample


class Frozen(Backend):
    """Like an exported graph (ONNX, AOTInductor): a frozen eval-mode copy, no autograd."""

    calls: ClassVar[int] = 0

    def build(self, module: nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        frozen = copy.deepcopy(module).eval()

        def run(*args: Any, **kwargs: Any) -> Any:
            Frozen.calls += 1
            with torch.no_grad():
                return frozen(*args, **kwargs)

        return run


class Counting(Backend):
    """Runs the module itself and counts the calls that reach it."""

    calls: ClassVar[int] = 0

    def build(self, module: nn.Module, example_inputs: list[Sample]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            Counting.calls += 1
            return module(*args, **kwargs)

        return run


class CountingAutograd(Counting):
    keeps_autograd = True


def _bn_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    with torch.no_grad():  # running statistics far from a batch's own, so the modes differ
        model[1].running_mean.fill_(3.0)
        model[1].running_var.fill_(9.0)
    return model.eval()


def _tuned(backend: Backend, model: nn.Module, **kwargs: Any) -> honed.Module:
    tuned = honed.Module(model, "bn", **kwargs)
    data = [torch.randn(b, 8) for b in (4, 8)]
    honed.tune(tuned, data, strategy=honed.OneBackendStrategy(backend))
    assert tuned.is_tuned and tuned.variants[0].backend.name == backend.name
    Frozen.calls = Counting.calls = 0
    return tuned


def test_batchnorm_outputs_equal_the_plain_module_in_train_and_eval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plain = _bn_model()
    tuned = _tuned(Frozen(), copy.deepcopy(plain))
    x = torch.randn(8, 8)
    with torch.no_grad():
        eval_out = plain(x)
        assert torch.equal(tuned(x), eval_out)
    assert Frozen.calls == 1  # eval mode under no_grad: the tuned variant answers

    tuned.train()
    plain.train()
    with caplog.at_level(logging.WARNING, logger="honed"), torch.no_grad():
        outs = [tuned(x), tuned(x)]
        wants = [plain(x), plain(x)]
    for out, want in zip(outs, wants, strict=True):
        assert torch.allclose(out, want, atol=1e-6)
    assert not torch.allclose(outs[0], eval_out, atol=1e-2)  # the two modes do differ here
    assert Frozen.calls == 1  # training mode ran eager
    training = [r.getMessage() for r in caplog.records if "training mode" in r.getMessage()]
    assert len(training) == 1 and ".eval()" in training[0] and "'bn'" in training[0]

    tuned.eval()
    plain.eval()
    with torch.no_grad():
        assert torch.allclose(tuned(x), plain(x), atol=1e-6)  # running stats moved alike
    assert Frozen.calls == 2


def test_a_training_step_through_the_tuned_module_changes_the_parameters(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tuned = _tuned(Frozen(), _bn_model())
    tuned.train()
    before = [p.detach().clone() for p in tuned.parameters()]
    optimizer = torch.optim.SGD(tuned.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="honed"):
        loss = tuned(torch.randn(8, 8)).pow(2).mean()
        loss.backward()
    optimizer.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, tuned.parameters(), strict=True))
    assert Frozen.calls == 0


def test_grad_enabled_runs_eager_with_one_warning_naming_no_grad(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tuned = _tuned(Frozen(), _bn_model())
    x = torch.randn(4, 8)
    with caplog.at_level(logging.WARNING, logger="honed"):
        first, second = tuned(x), tuned(x)
    assert first.grad_fn is not None and second.grad_fn is not None
    assert Frozen.calls == 0
    (message,) = [r.getMessage() for r in caplog.records if "autograd" in r.getMessage()]
    assert "torch.no_grad()" in message and "torch.inference_mode()" in message
    assert "inference_only=True" in message
    with torch.inference_mode():
        tuned(x)
    assert Frozen.calls == 1


def test_frozen_parameters_use_the_variant_unless_an_input_requires_grad() -> None:
    tuned = _tuned(Frozen(), _bn_model())
    for p in tuned.parameters():  # frozen after install, one by one: read at each call
        p.requires_grad = False
    x = torch.randn(4, 8)
    assert tuned(x).grad_fn is None
    assert Frozen.calls == 1
    out = tuned(x.clone().requires_grad_())
    assert out.grad_fn is not None
    assert Frozen.calls == 1


def test_inference_only_keeps_the_variant_with_grad_enabled() -> None:
    tuned = _tuned(Frozen(), _bn_model(), inference_only=True)
    out = tuned(torch.randn(4, 8))
    assert Frozen.calls == 1
    assert out.grad_fn is None and not out.requires_grad
    tuned.train()  # training mode still runs eager: batch statistics are part of the meaning
    tuned(torch.randn(4, 8))
    assert Frozen.calls == 1


def test_a_variant_that_keeps_autograd_stays_tuned_in_training() -> None:
    tuned = _tuned(CountingAutograd(), _bn_model())
    tuned.train()
    out = tuned(torch.randn(4, 8))
    assert out.grad_fn is not None
    assert CountingAutograd.calls == 1


def test_which_builtin_backends_keep_autograd() -> None:
    from honed import backend as b

    keeps = {cls.__name__: cls.keeps_autograd for cls in b.builtin_backends()}
    assert keeps["TorchEagerBackend"] and keeps["TorchInductorBackend"]
    for name in (
        "TorchInductorAotBackend",
        "ONNXRuntimeBackend",
        "CudaGraphsBackend",
        "TensorRTBackend",
        "TorchAOBackend",
        "TorchTensorRTJitBackend",
        "TorchTensorRTAotBackend",
    ):
        assert keeps[name] is False, name
    assert Backend.keeps_autograd is False  # custom backends: safe unless they say otherwise


def test_help_of_init_is_honeds() -> None:
    doc = honed.Module.__init__.__doc__ or ""
    assert "inference_only" in doc and "dynamic_shapes" in doc


# -- call binding ---------------------------------------------------------------------------------
class Scaled(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
        return (x + y) * scale


def _xy(batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 8), torch.randn(batch, 8)


def test_every_spelling_of_a_call_runs_the_graph_tuned_from_keyword_samples(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tuned = honed.Module(Scaled().eval(), "scaled")
    data = [dict(x=x, y=y, scale=0.5) for x, y in (_xy(2), _xy(4))]
    honed.tune(tuned, data, strategy=honed.OneBackendStrategy(Counting()))
    assert tuned.is_tuned
    Counting.calls = 0
    x, y = _xy(3)
    want = (x + y) * 0.5
    with caplog.at_level(logging.WARNING, logger="honed"), torch.no_grad():
        outs = [
            tuned(x, y, 0.5),
            tuned(x, y=y, scale=0.5),
            tuned(x=x, y=y, scale=0.5),
            tuned(x, y),
            tuned(y=y, x=x),
        ]
    assert all(torch.equal(o, want) for o in outs)
    assert Counting.calls == 5
    assert not [r for r in caplog.records if "running eager" in r.getMessage()]


def test_a_dataset_may_mix_spellings_and_args_kwargs_samples() -> None:
    tuned = honed.Module(Scaled().eval(), "scaled")
    (x2, y2), (x4, y4) = _xy(2), _xy(4)
    data = [(x2, y2), dict(x=x4, y=y4), ((x2,), {"y": y2, "scale": 0.5})]
    report = honed.tune(tuned, data, strategy=honed.OneBackendStrategy(Counting()))
    assert len(report.graphs) == 1  # one graph: every spelling bound to one form


def test_split_sample_rules() -> None:
    x, y = torch.ones(1), torch.zeros(1)
    assert split_sample(((x,), {"y": y})) == ((x,), {"y": y})
    assert split_sample(Sample((x,), {"y": y})) == ((x,), {"y": y})
    pair = ((x, y), {"k": 1})  # a tuple and a dict as two positional arguments, spelled out
    assert split_sample((pair, {})) == (pair, {})
    assert split_sample((x, y)) == ((x, y), {})
    assert split_sample(((x,), {1: y})) == (((x,), {1: y}), {})  # not string keys: positional
    assert split_sample({"x": x}) == ((), {"x": x})
    assert split_sample(x) == ((x,), {})


def test_binder_canonical_form() -> None:
    class M(nn.Module):
        def forward(self, a: Any, b: Any = 2, *rest: Any, c: Any = 3, **more: Any) -> Any:
            return a

    bind = CallBinder(M().forward).bind
    assert bind((1,), {}) == ((1, 2), {"c": 3})
    assert bind((1, 2), {"c": 3}) == ((1, 2), {"c": 3})
    assert bind((), {"b": 2, "a": 1}) == ((1, 2), {"c": 3})
    assert bind((1, 2, 9), {"z": 0, "y": 1}) == ((1, 2, 9), {"c": 3, "y": 1, "z": 0})
    assert bind((), {"nope": 1}) == ((), {"nope": 1})  # does not bind: left to the module


@pytest.mark.slow
def test_an_inductor_variant_trains_like_the_module() -> None:
    plain = _bn_model()
    tuned = _tuned(honed.backend.TorchInductorBackend(), copy.deepcopy(plain))
    tuned.train()
    plain.train()
    x = torch.randn(8, 8)
    out, want = tuned(x), plain(x)
    assert torch.allclose(out, want, atol=1e-5)
    out.pow(2).mean().backward()
    want.pow(2).mean().backward()
    for got, ref in zip(tuned.parameters(), plain.parameters(), strict=True):
        assert got.grad is not None and torch.allclose(got.grad, ref.grad, atol=1e-5)


# -- guidance at tune start -----------------------------------------------------------------------
def _tune_messages(caplog: pytest.LogCaptureFixture, model: nn.Module, data: Any, **kw: Any) -> str:
    with caplog.at_level(logging.WARNING, logger="honed"):
        honed.tune(honed.Module(model, "m"), data, backends=[Counting()], **kw)
    return "\n".join(r.getMessage() for r in caplog.records)


def test_tuning_a_model_in_training_mode_names_eval(caplog: pytest.LogCaptureFixture) -> None:
    text = _tune_messages(caplog, nn.Linear(8, 2), [torch.randn(b, 8) for b in (2, 4)])
    assert text.count("is in training mode; call .eval()") == 1
    caplog.clear()
    text = _tune_messages(caplog, nn.Linear(8, 2).eval(), [torch.randn(b, 8) for b in (2, 4)])
    assert "training mode" not in text


def test_one_shape_says_the_shapes_are_fixed_and_how_to_widen(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = _tune_messages(caplog, nn.Linear(8, 2).eval(), torch.randn(8, 8))
    (line,) = [t for t in text.splitlines() if "same shapes" in t]
    assert "(8, 8)" in line and "batch_sizes=" in line and "BatchDim" in line
    caplog.clear()
    text = _tune_messages(caplog, nn.Linear(8, 2).eval(), torch.randn(8, 8), batch_sizes=[1, 4])
    assert "same shapes" not in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_graphs_variant_keeps_train_and_autograd_meaning() -> None:
    plain = _bn_model().cuda()
    tuned = honed.Module(copy.deepcopy(plain), "bn-cuda")
    data = [torch.randn(b, 8, device="cuda") for b in (4, 8)]
    honed.tune(tuned, data, strategy=honed.OneBackendStrategy(honed.backend.CudaGraphsBackend()))
    assert tuned.is_tuned and tuned.variants[0].backend.name == "CudaGraphsBackend"
    x = torch.randn(8, 8, device="cuda")
    with torch.no_grad():
        assert torch.allclose(tuned(x), plain(x), atol=1e-5)
    tuned.train()
    plain.train()
    out, want = tuned(x), plain(x)
    assert torch.allclose(out, want, atol=1e-5) and out.grad_fn is not None
    before = [p.detach().clone() for p in tuned.module.parameters()]
    for model, y in ((tuned, out), (plain, want)):
        y.pow(2).mean().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    # The step moved the parameters exactly as it moved eager's (a bias just before batch norm
    # gets no gradient in training mode, so not every tensor moves).
    after = list(tuned.module.parameters())
    assert all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(after, plain.parameters(), strict=True)
    )
    assert not torch.equal(before[-2], after[-2])  # the last layer's weight moved


def test_graphs_recorded_before_binding_still_serve_their_spelling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An artifact saved by an older honed keyed its graphs by the call as spelled."""
    tuned = honed.Module(Scaled().eval(), "scaled")
    with monkeypatch.context() as m:
        m.setattr(tuned._binder, "bind", lambda args, kwargs: (args, kwargs))
        data = [dict(x=x, y=y, scale=0.5) for x, y in (_xy(2), _xy(4))]
        honed.tune(tuned, data, strategy=honed.OneBackendStrategy(Counting()))
    Counting.calls = 0
    x, y = _xy(3)
    with torch.no_grad():
        assert torch.equal(tuned(x=x, y=y, scale=0.5), (x + y) * 0.5)
    assert Counting.calls == 1


def _reads_keywords(forward: Callable[..., Any]) -> Callable[..., Any]:
    """Like transformers' forward decorators: a (*args, **kwargs) wrapper that adds a keyword
    when the caller did not pass it by keyword, so a position for it would be passed twice."""

    @functools.wraps(forward)
    def wrapper(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("scale", 0.5)
        return forward(self, *args, **kwargs)

    return wrapper


class Wrapped(nn.Module):
    @_reads_keywords
    def forward(self, x: torch.Tensor, y: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
        return (x + y) * scale


def test_a_decorated_forward_keeps_its_spelling() -> None:
    tuned = honed.Module(Wrapped().eval(), "wrapped")
    data = [dict(x=x, y=y) for x, y in (_xy(2), _xy(4))]
    honed.tune(tuned, data, strategy=honed.OneBackendStrategy(Counting()))
    Counting.calls = 0
    x, y = _xy(3)
    with torch.no_grad():
        assert torch.equal(tuned(y=y, x=x), (x + y) * 0.5)
    assert Counting.calls == 1
    assert tuned.bind((x,), {"y": y}) == ((x,), {"y": y})  # not turned into positions
