"""tests/test_jit_stalls.py: what JIT keeps out of the program's process while it tunes beside it.

The graph-break check runs in a worker process (its answer cached as before); a CUDA module
goes to the workers as IPC handles that each worker copies from as it loads them, never as
bytes copied in the program's process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import honed
import honed.jit
from honed.jit import State
from honed.pipeline import sharing
from honed.pipeline.isolation import GraphJobs, NotIsolatable, shared_context

from conftest import TinyMLP, batches

pytestmark = pytest.mark.integration  # worker processes that import torch


class Branchy(nn.Module):
    """A graph break: forward branches on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.child_a = nn.Linear(16, 20)
        self.child_b = nn.Linear(16, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.child_a(x)
        return self.child_b(x)


class DiesElsewhere(nn.Module):
    """Runs in the process that built it; kills any other process that runs it (a worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.owner = os.getpid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if os.getpid() != self.owner:
            os._exit(3)
        return self.proj(x)


@pytest.fixture(autouse=True)
def jit(tmp_path: Path) -> Iterator[honed.jit.JitConfig]:
    """JIT in wait mode, dry run (everything up to the tune), workers on, a private cache."""
    honed.jit.reset()
    honed.jit.config.reset()
    with (
        honed.jit.config.patch(
            min_parameters=100,
            max_depth_level=0,
            dry_run=True,
            cache_dir=str(tmp_path / "jit-cache"),
            wait=True,
        ),
        honed.config.patch(isolation="process"),
    ):
        honed.jit.enable_jit_tuning()
        try:
            yield honed.jit.config
        finally:
            honed.jit.reset()


@pytest.fixture
def traced_here(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the modules torch._dynamo.explain traced in this process."""
    import torch._dynamo

    calls: list[str] = []
    real = torch._dynamo.explain

    def recording(module: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(type(module).__name__)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(torch._dynamo, "explain", recording)
    return calls


def run(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [model(x) for x in inputs]


def eager(model: nn.Module, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    honed.jit.disable_jit_tuning()
    try:
        return run(model, inputs)
    finally:
        honed.jit.enable_jit_tuning()


def check_steps(name: str) -> list[str]:
    return [s for s in honed.jit.history() if f"in {name} " in s and "took" in s]


def test_graph_break_check_runs_in_a_worker_and_its_answer_is_cached(
    traced_here: list[str],
) -> None:
    inputs = [x + 0.1 for x in batches(2, 4)] + [-x - 0.1 for x in batches(2, 4)]
    for attempt in range(2):
        honed.jit.reset()
        honed.jit.enable_jit_tuning()
        torch.manual_seed(0)  # the same weights: the same cache key
        model = Branchy().eval()
        got = run(model, inputs)
        for a, b in zip(got, eager(model, inputs), strict=True):
            assert torch.equal(a, b)
        (step,) = check_steps("Branchy")
        how = "Checking in a worker took" if attempt == 0 else "Reusing the cached check took"
        assert step.startswith("1 graph break(s) in Branchy") and how in step, step
        assert honed.jit.roots()[0].state is State.EAGER
    assert traced_here == []


def test_a_module_without_breaks_is_checked_in_a_worker(traced_here: list[str]) -> None:
    torch.manual_seed(0)
    run(TinyMLP().eval(), batches(2, 4))
    (step,) = check_steps("TinyMLP")
    assert step.startswith("No graph breaks in TinyMLP") and "Checking in a worker" in step
    assert honed.jit.roots()[0].reason == "dry run"
    assert traced_here == []


def test_a_worker_dying_during_the_check_is_a_break_and_is_not_cached() -> None:
    inputs = batches(2, 4, 2)
    for _ in range(2):
        honed.jit.reset()
        honed.jit.enable_jit_tuning()
        torch.manual_seed(0)
        model = DiesElsewhere().eval()
        got = run(model, inputs)
        for a, b in zip(got, eager(model, inputs), strict=True):
            assert torch.equal(a, b)
        root = honed.jit.roots()[0]
        assert root.state is State.EAGER and root.reason == "graph breaks"
        (step,) = check_steps("DiesElsewhere")
        assert "the check failed in a worker" in step and "Checking took" in step, step
        assert any("graph-break check of DiesElsewhere" in s for s in honed.jit.history())


def test_the_check_runs_here_without_isolation(traced_here: list[str]) -> None:
    with honed.config.patch(isolation="none"):
        torch.manual_seed(0)
        run(TinyMLP().eval(), batches(2, 4))
    (step,) = check_steps("TinyMLP")
    assert "No graph breaks" in step and "Checking took" in step
    assert traced_here == ["TinyMLP"]


# -- the hand-off to the workers ---------------------------------------------------------------
def test_cpu_tensors_travel_by_value() -> None:
    weight = nn.Parameter(torch.randn(64, 64))
    value = {"weight": weight, "view": weight.data[2:4], "n": 3}
    frames, cuda = sharing.dumps(value)
    assert cuda == 0
    assert len(frames) == 2 and len(frames[1]) == 64 * 64 * 4  # one storage, out of the stream
    assert len(frames[0]) < 1024
    back = sharing.loads(frames)
    assert isinstance(back["weight"], nn.Parameter) and back["n"] == 3
    assert torch.equal(back["weight"], weight) and torch.equal(back["view"], weight[2:4])
    back["weight"].data[2, 0] = 100.0  # one storage, as in the caller
    assert back["view"][0, 0] == 100.0 and weight[2, 0] != 100.0
    context = shared_context(value, "test")
    assert context.fresh is None and context.payload() == context.blob


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(12, dtype=torch.float16).reshape(3, 4).t(),  # strides kept
        torch.arange(10.0)[3:7],  # a view: its storage offset kept
        torch.tensor([True, False]),
        torch.tensor([1 + 2j, -3j]),
        torch.empty(0, 5),
    ],
    ids=["transposed-fp16", "view", "bool", "complex", "empty"],
)
def test_a_cpu_tensor_comes_back_equal_in_its_own_memory(tensor: torch.Tensor) -> None:
    before = tensor.clone()
    back = sharing.loads(sharing.dumps(tensor)[0])
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert back.stride() == tensor.stride() and back.storage_offset() == tensor.storage_offset()
    assert torch.equal(back, tensor)
    back.logical_not_() if back.dtype == torch.bool else back.add_(1)  # writable ...
    assert torch.equal(tensor, before)  # ... and not the caller's memory


def test_a_cpu_module_comes_back_equal() -> None:
    torch.manual_seed(0)
    model = TinyMLP().eval()
    model.fc1.bias.requires_grad_(False)
    back = sharing.loads(sharing.dumps(model)[0])
    for (name, want), (got_name, got) in zip(
        model.named_parameters(), back.named_parameters(), strict=True
    ):
        assert name == got_name and type(got) is nn.Parameter
        assert got.requires_grad == want.requires_grad and torch.equal(got, want)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert torch.equal(back(x), model(x))


def test_what_does_not_pickle_is_not_isolatable() -> None:
    import threading

    with pytest.raises(NotIsolatable, match=r"the module.*lock"):
        GraphJobs({"module": threading.Lock()}, "cpu")


_LOAD_IN_ANOTHER_PROCESS = """
import json, sys, torch
from honed.pipeline.sharing import loads
value = loads([sys.stdin.buffer.read()])
w, v = value["weight"], value["view"]
out = {
    "parameter": isinstance(w, torch.nn.Parameter),
    "sum": float(w.double().sum()),
    "view_sum": float(v.double().sum()),
    "aliased": v.untyped_storage().data_ptr() == w.untyped_storage().data_ptr(),
}
w.data.fill_(7.0)  # the worker's copy: the program's weight must not change
torch.cuda.synchronize()
print(json.dumps(out))
"""


@pytest.mark.gpu
def test_cuda_tensors_travel_as_handles_and_the_worker_owns_its_copy() -> None:
    weight = nn.Parameter(torch.randn(2048, 2048, device="cuda"))  # 16 MiB
    before = weight.detach().clone()
    frames, cuda = sharing.dumps({"weight": weight, "view": weight.data[5:9]})
    assert cuda == 2 and len(frames) == 1 and len(frames[0]) < 64 * 1024  # handles, not 16 MiB
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_ANOTHER_PROCESS],
        input=bytes(frames[0]),
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    out = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert out["parameter"] and out["aliased"]
    assert out["sum"] == pytest.approx(float(before.double().sum()), rel=1e-9, abs=1e-6)
    assert out["view_sum"] == pytest.approx(float(before[5:9].double().sum()), rel=1e-9, abs=1e-6)
    torch.cuda.synchronize()
    assert torch.equal(weight.detach(), before)


@pytest.mark.gpu
def test_a_cuda_graph_context_is_sent_as_handles() -> None:
    module = nn.Linear(2048, 2048).cuda()  # 16 MiB of weights
    jobs = GraphJobs({"module": module, "samples": [torch.randn(4, 2048, device="cuda")]}, "cuda:0")
    (first,), (second,) = jobs.context.payload(), jobs.context.payload()
    assert len(first) < 64 * 1024 and len(second) < 64 * 1024
    assert bytes(first) != bytes(second)  # each worker's load: shares of its own (torch counts)


@pytest.mark.gpu
def test_the_graph_break_check_of_a_cuda_module_runs_in_a_worker(traced_here: list[str]) -> None:
    torch.manual_seed(0)
    model = Branchy().eval().cuda()
    inputs = [x.cuda() for x in batches(2, 4)]
    inputs = [inputs[0] + 0.1, -inputs[1] - 0.1]
    weights = [p.detach().clone() for p in model.parameters()]
    got = run(model, inputs)
    for a, b in zip(got, eager(model, inputs), strict=True):
        assert torch.equal(a, b)
    (step,) = check_steps("Branchy")
    assert "graph break(s)" in step and "Checking in a worker" in step, step
    assert traced_here == []
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights, strict=True))


def test_jit_workers_run_below_the_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool of a first tune, its graph-break check's and then its tune's, is made at
    HONED_JIT_WORKER_NICE (the pool test says what a pool does with it), once, with a worker
    for each of the tune's jobs; the program's own tunes are left as they were."""
    from honed.pipeline import isolation
    from honed.pipeline import tuner as pipeline_tuner

    seen: list[tuple[int, float, int]] = []
    pools: list[Any] = []
    real = isolation.new_pool

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(
            (honed.config.worker_nice, honed.config.worker_spare_cores, honed.config.workers)
        )
        pools.append(real(*args, **kwargs))
        return pools[-1]

    monkeypatch.setattr(isolation, "new_pool", spy)
    monkeypatch.setattr(pipeline_tuner, "new_pool", spy)
    torch.manual_seed(0)
    with (
        honed.jit.config.patch(dry_run=False, backends=[honed.backend.TorchEagerBackend()]),
        honed.config.patch(jit_worker_nice=6),
    ):
        run(TinyMLP().eval(), batches(2, 4))
        assert honed.jit.roots()[0].state is State.TUNED
    # one pool, the graph-break check's and then the tune's, off the cores left to the program;
    # the program waits for JIT here, so of honed.tune's size (test_jits_tunes_have_fewer_...)
    assert seen == [(6, honed.config.jit_spare_cores, 0)]
    assert pools[0].size == isolation.pool_size(2)  # eager and the candidate
    assert pools[0].closed  # when the tune ended
    assert [s for s in check_steps("TinyMLP") if "Checking in a worker" in s]
    assert honed.config.worker_nice == 0 and honed.config.worker_spare_cores == 0


@pytest.mark.parametrize(
    ("workers", "jit_workers", "wait", "expected"),
    [(0, 2, False, 2), (3, 2, False, 3), (0, 0, False, 0), (0, 2, True, 0)],
)
def test_jits_tunes_have_fewer_workers_unless_honed_workers_says(
    workers: int, jit_workers: int, wait: bool, expected: int
) -> None:
    """Each worker's start and build slows the program's calls: JIT's pools have
    HONED_JIT_WORKERS workers, HONED_WORKERS deciding where set (0: honed.tune's count); a
    program that waits for JIT (HONED_JIT_WAIT) gets honed.tune's count."""
    from honed.jit.tuner import _jit_flags

    with (
        honed.config.patch(workers=workers, jit_workers=jit_workers),
        honed.jit.config.patch(wait=wait),
    ):
        with _jit_flags():
            assert honed.config.workers == expected
        assert honed.config.workers == workers  # the program's own tunes: as they were


@pytest.mark.parametrize(
    ("jit_threads", "wait", "expected"), [(1, False, 1), (0, False, 7), (1, True, 7)]
)
def test_jits_workers_compile_with_one_thread_unless_told(
    jit_threads: int, wait: bool, expected: int
) -> None:
    """JIT's workers compile with HONED_JIT_COMPILE_THREADS threads each (1 by default: a
    compile's pool of processes beside the program slowed its calls); 0, or a program waiting
    for JIT, gets what honed.tune's workers get (HONED_WORKER_COMPILE_THREADS)."""
    from honed.jit.tuner import _jit_flags

    assert honed.config.jit_compile_threads == 1  # the default
    with (
        honed.config.patch(worker_compile_threads=7, jit_compile_threads=jit_threads),
        honed.jit.config.patch(wait=wait),
    ):
        with _jit_flags():
            assert honed.config.worker_compile_threads == expected
        assert honed.config.worker_compile_threads == 7


class CountsCalls(nn.Module):
    """Notes the thread of each of its calls."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.threads: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.threads.append(threading.current_thread().name)
        return self.proj(x)


class Direct(honed.backend.Backend):
    """CountsCalls' computation without calling it."""

    def build(self, module: nn.Module, example_inputs: list[Any]) -> Any:
        assert isinstance(module, CountsCalls)
        return lambda x: torch.nn.functional.linear(x, module.proj.weight, module.proj.bias)


@pytest.mark.parametrize("winner", ["Direct", "TorchEagerBackend"])
def test_a_jit_tune_runs_the_model_here_once_per_sample(tmp_path: Path, winner: str) -> None:
    """JIT's samples are the program's own calls: its tune notes their signatures without
    running the model again, the pass over the cache runs it not at all, and eager's outputs
    for the checks are the program's own for its calls, computed in the program's process
    only for the copies at the headroom batch (workers build). Eager winning needs no install
    (no warm run); its check runs it on each sample, against those outputs (a module that
    does not answer as its calls did is caught there)."""
    torch.manual_seed(0)
    model = CountsCalls().eval()
    faster = {winner: [1.0], ({"Direct", "TorchEagerBackend"} - {winner}).pop(): [2.0]}
    with (
        honed.jit.config.patch(dry_run=False, backends=[Direct()]),
        honed.config.patch(cache_enabled=True, jit_worker_nice=0, injected_latencies=faster),
    ):
        run(model, batches(2, 4))
        assert honed.jit.roots()[0].state is State.TUNED, honed.jit.history()
        assert honed.jit.wait(120)  # the live trial's rival installed too
    (record,) = honed.jit.tunes()
    assert record.status == "installed" and record.batch_sizes == [2, 4, 8]
    assert honed.jit.roots()[0].backend == winner, honed.jit.history()
    # the two samples' copies at the headroom batch (8): two references; the samples' own
    # are what the program's calls returned; and eager's check, where it won
    program = threading.main_thread().name
    checks = 4 if winner == "TorchEagerBackend" else 0
    assert len([t for t in model.threads if t != program]) == 2 + checks, (
        model.threads,
        honed.jit.history(),  # where the candidates were built, checked and measured
    )


def test_listing_jits_candidates_imports_none_of_their_libraries(tmp_path: Path) -> None:
    # In a fresh interpreter: importing onnxruntime, onnxscript or torchao in the program's
    # process holds the GIL for hundreds of ms, and TorchDynamo (which Inductor's availability
    # and its package import) seconds of it; the workers that build those candidates do it. So
    # too the workers' environment (Inductor's cache folder) and a tune's start beside a program
    # (Dynamo's recompile limits) leave Dynamo unimported.
    code = """
import sys, torch
from honed.backend import registry
from honed.jit.strategy import JitDefaultStrategy
from honed.pipeline import courtesy, isolation, tuner
names = [b.name for b in JitDefaultStrategy().backends(torch.device("cpu"))]
libs = [c.requires for c in map(type, JitDefaultStrategy().backends(torch.device("cpu")))]
print(sorted({lib for group in libs for lib in group}))
print(names)
cache = isolation.worker_env(2)["TORCHINDUCTOR_CACHE_DIR"]
courtesy.watch(lambda: False)  # beside a program
with tuner._dynamo_limits():
    pass
courtesy.watch(None)
heavy = ("onnx", "onnxruntime", "onnxscript", "torchao", "torch._dynamo", "torch._inductor")
print(sorted(m for m in heavy if m in sys.modules))
from torch._inductor.runtime.cache_dir_utils import cache_dir
print(cache == cache_dir())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HONED_", "TORCHINDUCTOR_"))}
    env["TMPDIR"] = str(tmp_path)  # Inductor's default cache folder is under it
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    required, names, imported, same_cache = done.stdout.strip().splitlines()[-4:]
    assert "onnxruntime" in required  # the ONNX Runtime candidate is listed (it is installed)
    assert "TorchInductorAotBackend" in names  # listed as available, its check left to workers
    assert imported == "[]"
    assert same_cache == "True"  # the folder Inductor itself uses
    assert list(tmp_path.glob("torchinductor_*"))


@pytest.mark.gpu
def test_a_cuda_top_module_prepares_the_hashing_copies_in_its_first_call() -> None:
    """The cache key hashes GPU weights through a side stream and pinned memory; making those
    holds the GIL, so the top module's first call makes them, not a thread beside a later call;
    so too the GPU's details (NVML) and the cores' topology (sysfs) a tune's start reads."""
    from honed.pipeline import cache, isolation, machine

    cache._COPIERS.clear()
    machine._PROBED.clear()
    isolation._cores.cache_clear()
    model = TinyMLP().cuda().eval()
    with honed.jit.config.patch(wait=False, min_samples=1000):  # the first call only
        with torch.no_grad():
            model(torch.randn(4, 16, device="cuda"))
    device = torch.device("cuda", torch.cuda.current_device())
    assert device in cache._COPIERS
    stream, staging = cache._COPIERS[device]
    assert staging.is_pinned() and stream.device == device
    assert list(machine._PROBED) == [machine._gpu_id(device)]
    assert isolation._cores.cache_info().currsize == 1


_FIRST_CALL_IMPORTS = """
import json, sys, torch
import honed.jit
from honed.pipeline import machine, openmp
names = sys.argv[1:]
before = [n for n in names if n in sys.modules]
found = [openmp.runtime.cache_info().currsize]
cpu_found = [machine.cpu.cache_info().currsize]
honed.jit.enable_jit_tuning()
with honed.jit.config.patch(min_samples=1000), torch.no_grad():  # no tune starts
    torch.nn.Linear(4, 4)(torch.randn(2, 4))
found.append(openmp.runtime.cache_info().currsize)
cpu_found.append(machine.cpu.cache_info().currsize)
print(json.dumps({"before": before, "after": [n for n in names if n in sys.modules],
                  "runtime_found": found, "cpu_found": cpu_found}))
"""


def test_the_first_call_imports_the_candidates_modules_so_no_later_call_waits_for_it() -> None:
    """JIT's thread imported a dozen of honed's backend modules, its trials' and progress
    display's, and ONNX Runtime for that candidate's turns on the calls, while the program's
    calls went on, holding them up: the program's first call, JIT's start-up anyway, imports
    them. It also
    finds the OpenMP runtime (the process's memory map read through), which the first call
    JIT worked beside looked for on the program's thread."""
    listed = honed.jit.config.tune_strategy().backends(torch.device("cpu"))
    names = sorted(
        {type(b).__module__ for b in listed}
        | {"honed.jit.strategy", "honed.jit.live", "rich.console"}
        # what an installed candidate runs with: ONNX Runtime's extension, tens of ms of GIL
        | {name for b in listed for name in type(b).runs_with}
    )
    assert "honed.backend.torch_inductor_aot" in names and "onnxruntime" in names
    done = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL_IMPORTS, *names],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("HONED_")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == []
    assert seen["after"] == names
    assert seen["runtime_found"] == [0, 1]
    assert seen["cpu_found"] == [0, 1]  # /proc/cpuinfo read in the first call, not a tune's start
