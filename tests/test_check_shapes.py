"""The graph-break check's first trace needs the module's shapes, not its weights.

A worker gets the module as shapes only (``sharing.dumps_shapes``) and answers where Dynamo
traces it whole without running a graph (``graph_breaks.traced_whole``); the module itself
follows only where that cannot answer (``IsolatedCheck``)."""

from __future__ import annotations

import concurrent.futures
import pickle
from typing import Any

import pytest
import torch
from torch import nn

from honed.pipeline import graph_breaks, isolation, sharing
from honed.pipeline.pool import JobResult


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(64, 64)
        self.second = nn.Linear(64, 64, bias=False)
        self.second.weight = self.first.weight  # one Parameter, twice
        self.register_buffer("positions", torch.arange(64).view(1, 64))
        self.first.bias.requires_grad_(False)
        self.scale = 0.5  # Python values travel as they are

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x)) * self.scale + self.positions


class _Counts(nn.Module):
    """One graph; each run of it adds one to ``runs``."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.register_buffer("runs", torch.zeros((), dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs.add_(1)
        return self.proj(x)


class _Breaks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        if y.sum().item() > 0:
            return y + 1
        return y - 1


def test_a_module_as_shapes_keeps_its_structure_and_none_of_its_weights() -> None:
    """Every tensor comes back uninitialised with its size, strides, dtype, device, grad flag
    and Parameter type; one Parameter used twice is one again; Python values are kept; and
    the blob does not grow with the weights."""
    module = _Tied()
    blob = sharing.dumps_shapes(module)
    loaded = pickle.loads(blob)
    assert isinstance(loaded, _Tied) and loaded.scale == 0.5
    assert loaded.second.weight is loaded.first.weight
    mine, theirs = dict(module.named_parameters()), dict(loaded.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, p in mine.items():
        q = theirs[name]
        assert type(q) is nn.Parameter, name
        assert (q.shape, q.stride(), q.dtype, q.device, q.requires_grad) == (
            p.shape,
            p.stride(),
            p.dtype,
            p.device,
            p.requires_grad,
        ), name
        assert q.data_ptr() != p.data_ptr()
    positions = loaded.positions
    assert type(positions) is torch.Tensor and positions.dtype == torch.int64
    assert positions.shape == (1, 64)

    big = nn.Linear(1024, 1024)  # 4 MiB of weights
    assert len(sharing.dumps_shapes(big)) < 4096 < len(pickle.dumps(big))


class _Marked(torch.Tensor):
    """A tensor subclass: what it carries besides its values is its own."""


def test_a_tensor_without_an_empty_stand_in_is_refused() -> None:
    holder = nn.Module()
    holder.q = torch.ones(4).as_subclass(_Marked)  # type: ignore[assignment]
    with pytest.raises(sharing.NotShapesOnly, match="has no empty stand-in"):
        sharing.dumps_shapes(holder)
    sparse = nn.Module()
    sparse.s = torch.eye(3).to_sparse()  # type: ignore[assignment]
    with pytest.raises(sharing.NotShapesOnly):
        sharing.dumps_shapes(sparse)


def test_a_module_of_shapes_answers_for_one_traced_whole_without_a_run() -> None:
    """traced_whole: (0, []) for a module Dynamo traces whole, none of its graphs run; None
    where it breaks, and None where a graph would have to run (its outputs cannot be made
    empty), the graph not run."""
    sample = ((torch.ones(2, 3),), {})
    counts = _Counts()
    assert graph_breaks.traced_whole(counts, sample) == (0, [])
    assert int(counts.runs) == 0
    shapes = pickle.loads(sharing.dumps_shapes(_Counts()))
    assert graph_breaks.traced_whole(shapes, sample) == (0, [])
    assert graph_breaks.traced_whole(_Breaks(), sample) is None
    # the module itself gives Dynamo's answer
    assert graph_breaks.explain(_Breaks(), sample)[0] == 1


def test_a_graph_that_would_run_is_not_run_on_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph_breaks, "_dry", lambda gm: None)  # no empty outputs for any graph
    counts = _Counts()
    assert graph_breaks.traced_whole(counts, ((torch.ones(2, 3),), {})) is None
    assert int(counts.runs) == 0
    # the check that may run graphs runs it, as before
    assert graph_breaks.explain(counts, ((torch.ones(2, 3),), {})) == (0, [])
    assert int(counts.runs) >= 1


class _Pool:
    """Answers each check job with the reply explain_job gives in a worker, and keeps what
    each job's context held."""

    def __init__(self) -> None:
        self.contexts: list[dict[str, Any]] = []

    def submit(self, job: Any) -> Any:
        context = sharing.loads(job.context.payload())
        self.contexts.append(context)
        future: Any = concurrent.futures.Future()
        future.set_result(JobResult(reply=graph_breaks.explain_job(context)))
        return future


@pytest.mark.parametrize(
    ("module", "expected", "jobs"), [(_Counts(), (0, []), 1), (_Breaks(), 1, 2)]
)
def test_the_check_sends_the_weights_only_where_the_shapes_cannot_answer(
    module: nn.Module, expected: Any, jobs: int
) -> None:
    pool = _Pool()
    check = isolation.IsolatedCheck(module, ((torch.ones(2, 3),), {}), "cpu", lambda n: pool)
    answer = check.run()
    assert not isinstance(answer, str)
    assert (answer if jobs == 1 else answer[0]) == expected
    assert len(pool.contexts) == jobs
    first = pool.contexts[0]
    assert "module" not in first and isinstance(first["module_shapes"], bytes)
    if jobs == 2:
        sent = pool.contexts[1]["module"]
        assert torch.equal(sent.proj.weight, module.proj.weight)  # the weights themselves


def test_a_module_with_a_tensor_shapes_cannot_stand_in_for_goes_whole() -> None:
    module = _Counts()
    module.marked = torch.ones(4).as_subclass(_Marked)  # type: ignore[assignment]
    pool = _Pool()
    check = isolation.IsolatedCheck(module, ((torch.ones(2, 3),), {}), "cpu", lambda n: pool)
    assert check.run() == (0, [])
    (context,) = pool.contexts
    assert "module_shapes" not in context and isinstance(context["module"], _Counts)


def test_shapes_that_do_not_load_in_the_worker_ask_for_the_module() -> None:
    """Where the module's shapes cannot be made in the worker (here bytes that are not a
    pickle), its reply asks for the module itself instead of failing the check."""
    context = {"module_shapes": b"not a pickle", "sample": ((torch.ones(2, 3),), {})}
    assert graph_breaks.explain_job(context) == {"weights_needed": True}
