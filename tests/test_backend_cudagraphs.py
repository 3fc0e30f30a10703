"""tests/test_backend_cudagraphs.py: CudaGraphsBackend: availability on CPU, captures on CUDA."""

from __future__ import annotations

import contextlib
import gc
from typing import Any

import pytest
import torch
from torch import nn

import honed
from honed.backend import GraphInfo, Sample, backend_from_recipe
from honed.backend.cuda_graphs import CudaGraphed, CudaGraphsBackend, CudaGraphsBackendConfig
from honed.pipeline import courtesy

from conftest import TinyMLP

HAS_CUDA = torch.cuda.is_available()


class Scaled(nn.Module):
    """A non-tensor argument and a nested output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> dict[str, Any]:
        y = self.fc(x) * scale
        return {"y": y, "stats": (y.mean(dim=1), y.amax(dim=1))}


class Syncs(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.sum().item() > 0 else x


# -- anywhere ------------------------------------------------------------------------------------
def test_config_defaults_and_validation() -> None:
    cfg = CudaGraphsBackendConfig()
    assert (cfg.autocast_enabled, cfg.autocast_dtype) == (False, None)
    assert (cfg.warmup_iters, cfg.pool_sharing, cfg.max_graphs) == (3, True, 64)
    with pytest.raises(honed.ConfigError, match="warmup_iters must be at least 1"):
        CudaGraphsBackendConfig(warmup_iters=0)
    with pytest.raises(honed.ConfigError, match="max_graphs must be at least 1"):
        CudaGraphsBackendConfig(max_graphs=0)
    with pytest.raises(honed.ConfigError, match=r"float16 or torch\.bfloat16"):
        CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=torch.float32)


def test_recipe_round_trip() -> None:
    backend = CudaGraphsBackend(
        CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=torch.float16)
    )
    rebuilt = backend_from_recipe(backend.recipe())
    assert isinstance(rebuilt, CudaGraphsBackend)
    assert rebuilt.config == backend.config
    assert rebuilt.name == "CudaGraphsBackend(autocast_enabled=True, autocast_dtype=float16)"
    assert (CudaGraphsBackend.portability, CudaGraphsBackend.saves_payload) == (1, False)


def test_unavailable_without_cuda_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    avail = CudaGraphsBackend.available()
    assert not avail.ok
    assert avail.reason == "needs a CUDA device (torch.cuda.is_available() is False)"
    assert "NVIDIA GPU" in avail.fix


def test_available_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom() -> bool:
        raise RuntimeError("driver exploded")

    monkeypatch.setattr(torch.cuda, "is_available", boom)
    avail = honed.backend.availability(CudaGraphsBackend)
    assert not avail.ok
    assert "driver exploded" in avail.reason


def test_building_for_a_cpu_graph_is_a_clear_error() -> None:
    model = TinyMLP().eval()
    x = torch.randn(4, 16)
    with pytest.raises(honed.InputError, match=r"runs on cpu; move the model .* to CUDA"):
        CudaGraphsBackend().build_graph(model, [Sample((x,), {})], GraphInfo(torch.device("cpu")))
    with pytest.raises(honed.InputError, match="captures CUDA work"):
        CudaGraphsBackend().build(model, [Sample((x,), {})])


class _FakeGraph:
    """What _graph_capture asks of a torch.cuda.CUDAGraph, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self.calls.append(("begin", capture_error_mode))

    def capture_end(self) -> None:
        self.calls.append(("end", None))


@pytest.mark.parametrize("beside", [True, False])
def test_a_capture_beside_a_program_leaves_its_memory_and_queue_alone(
    monkeypatch: pytest.MonkeyPatch, beside: bool
) -> None:
    """Beside a JIT program a capture neither synchronizes the device nor empties the caching
    allocator (the program's next calls would cudaMalloc its blocks again); a tune's capture
    with nothing beside it frees memory first, as torch.cuda.graph does."""
    from honed.backend import cuda_graphs
    from honed.pipeline import courtesy

    done: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: done.append("sync"))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: done.append("empty_cache"))
    graph = _FakeGraph()
    courtesy.watch((lambda: False) if beside else None)
    try:
        with cuda_graphs._graph_capture(graph, None, None):
            graph.calls.append(("body", None))
    finally:
        courtesy.watch(None)
    assert done == ([] if beside else ["sync", "empty_cache"])
    assert graph.calls == [("begin", "thread_local"), ("body", None), ("end", None)]


def test_a_failing_capture_is_ended_and_its_error_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    from honed.backend import cuda_graphs

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    class Broken(_FakeGraph):
        def capture_end(self) -> None:
            super().capture_end()
            raise RuntimeError("capture invalidated")

    graph = Broken()
    with pytest.raises(ValueError, match="the module's own"):
        with cuda_graphs._graph_capture(graph, None, None):
            raise ValueError("the module's own")
    assert graph.calls == [("begin", "thread_local"), ("end", None)]


def test_as_if_capturing_answers_true_on_its_own_thread_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inside, this thread is told a capture is under way and another thread gets torch's own
    answer; torch's function is put back after, also when the body raises."""
    import threading

    from honed.backend import cuda_graphs

    def torch_answer() -> bool:
        return False

    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", torch_answer)
    elsewhere: list[bool] = []
    with cuda_graphs._as_if_capturing():
        here = torch.cuda.is_current_stream_capturing()
        bound = torch.cuda.is_current_stream_capturing  # as `from torch.cuda import ...` would
        other = threading.Thread(
            target=lambda: elsewhere.append(torch.cuda.is_current_stream_capturing())
        )
        other.start()
        other.join()
    assert (here, elsewhere) == (True, [False])
    assert torch.cuda.is_current_stream_capturing is torch_answer
    assert bound is not torch_answer and bound() is False  # taken inside, asked after: torch's
    with pytest.raises(ValueError, match="the body's"), cuda_graphs._as_if_capturing():
        raise ValueError("the body's")
    assert torch.cuda.is_current_stream_capturing is torch_answer


def test_beside_a_program_only_a_first_build_warms_up_on_the_capture_path() -> None:
    """Without a program beside, every capture's warm-up ends on the capture's path; beside one,
    only a capture inside ``courtesy.first_build`` on its own thread."""
    import threading

    from honed.backend import cuda_graphs

    asked = cuda_graphs._warms_up_on_the_capture_path
    assert asked()
    courtesy.watch(lambda: False)
    try:
        assert not asked()
        with courtesy.first_build():
            elsewhere: list[bool] = []
            other = threading.Thread(target=lambda: elsewhere.append(asked()))
            other.start()
            other.join()
            assert (asked(), elsewhere) == (True, [False])
        assert not asked()
    finally:
        courtesy.watch(None)
    assert asked()


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here")
def test_tune_on_cpu_reports_it_unavailable() -> None:
    model = honed.Module(TinyMLP().eval(), "tiny-cg")
    report = honed.tune(
        model, [torch.randn(4, 16)], strategy=honed.OneBackendStrategy(CudaGraphsBackend())
    )
    row = next(c for g in report.graphs for c in g.candidates if not c.is_baseline)
    assert row.status == "failed"
    assert "needs a CUDA device" in row.reason


# -- CUDA ----------------------------------------------------------------------------------------
def _cuda_mlp() -> nn.Module:
    torch.manual_seed(0)
    return TinyMLP().cuda().eval()


def _x(batch: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(batch, 16, device="cuda", generator=g)


def _build(model: nn.Module, *xs: torch.Tensor, **config: Any) -> CudaGraphed:
    fn = CudaGraphsBackend(CudaGraphsBackendConfig(**config)).build_graph(
        model, [Sample((x,), {}) for x in xs], GraphInfo(torch.device("cuda"))
    )
    assert isinstance(fn, CudaGraphed)
    return fn


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
class TestOnCuda:
    @pytest.mark.parametrize("pool_sharing", [True, False])
    def test_outputs_equal_eager(self, pool_sharing: bool) -> None:
        model = _cuda_mlp()
        fn = _build(model, _x(4), pool_sharing=pool_sharing)
        with torch.no_grad():
            for seed in range(3):
                x = _x(4, seed)
                torch.testing.assert_close(fn(x), model(x))

    @pytest.mark.parametrize("beside, first", [(False, False), (True, False), (True, True)])
    def test_the_last_warm_up_call_runs_the_path_the_capture_records(
        self, beside: bool, first: bool
    ) -> None:
        """A module that asks whether it is captured (as Hugging Face's masks do) is warmed up
        on the capture's path once, outside any capture, before the capture records that path;
        beside a program, only in a first build (JIT's early stand-in). Its answers are eager's
        either way."""
        seen: list[tuple[bool, bool]] = []

        class Asks(nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                told = torch.cuda.is_current_stream_capturing()
                seen.append((told, torch._C._cuda_isCurrentStreamCapturing()))
                return x * 3 if told else (x * 3 if bool((x > -1e9).all()) else x)

        courtesy.watch((lambda: False) if beside else None)
        try:
            with courtesy.first_build() if first else contextlib.nullcontext():
                fn = _build(Asks(), _x(4), warmup_iters=2)
        finally:
            courtesy.watch(None)
        on_the_path = [(True, False)] if first or not beside else []
        assert seen == [(False, False), (False, False), *on_the_path, (True, True)]
        assert torch.cuda.is_current_stream_capturing() is False
        x = _x(4, seed=3)
        torch.testing.assert_close(fn(x), x * 3)

    def test_a_capture_on_another_thread_leaves_this_threads_calls_alone(self) -> None:
        """JIT captures on its own thread while the program keeps calling the model eagerly
        on its thread, syncing the device after each call: neither breaks the other. While JIT
        is on, the program's torch.cuda.synchronize waits for honed's captures (a device-wide
        sync during another thread's capture breaks both), as here."""
        import threading

        from honed.backend.cuda_graphs import guard_synchronize

        model = _cuda_mlp()
        big = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(8)]).cuda().eval()
        stop = threading.Event()
        errors: list[BaseException] = []

        def program() -> None:
            x = torch.randn(256, 1024, device="cuda")
            try:
                with torch.no_grad():
                    while not stop.is_set():
                        big(x)
                        torch.cuda.synchronize()
            except BaseException as e:  # what a capture in global mode does to this thread
                errors.append(e)

        guard_synchronize(True)
        caller = threading.Thread(target=program)
        caller.start()
        try:
            fns = [_build(model, _x(4, seed)) for seed in range(5)]
        finally:
            stop.set()
            caller.join()
            guard_synchronize(False)
        assert errors == []
        with torch.no_grad():
            for fn in fns:
                torch.testing.assert_close(fn(_x(4, 9)), model(_x(4, 9)))

    @pytest.mark.parametrize("beside", [True, False])
    def test_a_capture_beside_a_program_keeps_its_cached_blocks(self, beside: bool) -> None:
        """The program's cached, free memory stays cached through a capture beside it (JIT's
        install), so its next calls need no cudaMalloc; without a program it is freed first."""
        from honed.pipeline import courtesy

        model = _cuda_mlp()
        block = 64 << 20
        # Earlier tests' graphs and packages, collected now rather than during the build (their
        # pools' memory would come back cached whether or not the capture freed the cache).
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        del_me = torch.empty(block, dtype=torch.uint8, device="cuda")
        del del_me  # a free block the caching allocator keeps
        assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= block
        courtesy.watch((lambda: False) if beside else None)
        gc.disable()
        try:
            fn = _build(model, _x(4))
        finally:
            gc.enable()
            courtesy.watch(None)
        cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
        assert (cached >= block) is beside
        with torch.no_grad():
            torch.testing.assert_close(fn(_x(4, 3)), model(_x(4, 3)))

    def test_two_shapes_make_two_captures_and_alternate_correctly(self) -> None:
        model = _cuda_mlp()
        fn = _build(model, _x(4))
        assert fn.num_graphs == 1  # the sample's signature was captured at build
        with torch.no_grad():
            for seed in range(3):  # A B A B ...: the shared pool must not mix them up
                for batch in (8, 4):
                    x = _x(batch, seed)
                    torch.testing.assert_close(fn(x), model(x))
        assert fn.num_graphs == 2
        assert fn.captures == 2

    def test_outputs_kept_across_calls_stay_valid(self) -> None:
        model = _cuda_mlp()
        fn = _build(model, _x(4))
        x1, x2 = _x(4, 1), _x(4, 2)
        out1 = fn(x1)
        out2 = fn(x2)
        static = fn.graphs[next(iter(fn.graphs))][0].static_output
        assert out1.data_ptr() != static.data_ptr() and out2.data_ptr() != static.data_ptr()
        with torch.no_grad():
            torch.testing.assert_close(out1, model(x1))
            torch.testing.assert_close(out2, model(x2))
        assert not torch.equal(out1, out2)

    def test_autocast_bf16_returns_float32(self) -> None:
        model = _cuda_mlp()
        fn = _build(model, _x(4), autocast_enabled=True, autocast_dtype=torch.bfloat16)
        x = _x(4, 5)
        out = fn(x)
        assert out.dtype == torch.float32
        with torch.no_grad():
            ref = model(x)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                ref_bf16 = model(x)
        torch.testing.assert_close(out, ref, atol=5e-2, rtol=5e-2)
        torch.testing.assert_close(out, ref_bf16.float())

    @pytest.mark.parametrize("known", [True, False])
    def test_autocast_learns_eagers_dtypes_from_the_tunes_output_where_it_holds_one(
        self, known: bool
    ) -> None:
        """Under autocast the capture casts back to the dtypes eager returns: taken from the
        tune's output for the sample where it holds one (backend.base.known_outputs: a JIT
        program's own outputs), without one more eager call beside the program; else from
        that call. The answer is the same either way."""
        from honed.backend.base import known_outputs

        model = _cuda_mlp()
        calls: list[torch.dtype] = []  # the dtype each forward call computed in
        model.fc1.register_forward_hook(lambda m, i, o: calls.append(o.dtype))
        sample = Sample((_x(4),), {})
        with torch.no_grad():
            reference = model(*sample.args)
        calls.clear()
        config = CudaGraphsBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
        backend = CudaGraphsBackend(config)
        info = GraphInfo(torch.device("cuda"))
        if known:
            with known_outputs([sample], [reference]):
                fn = backend.build_graph(model, [sample], info)
        else:
            fn = backend.build_graph(model, [sample], info)
        # the warm-up calls, one more on the capture's path and the capture, under autocast;
        # the fp32 call only where unknown
        want = [torch.bfloat16] * (config.warmup_iters + 2)
        assert calls == (want if known else [torch.float32, *want])
        x = _x(4, 5)
        out = fn(x)
        assert out.dtype == torch.float32
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            torch.testing.assert_close(out, model(x).float())

    def test_non_tensor_arguments_and_nested_outputs(self) -> None:
        torch.manual_seed(0)
        model = Scaled().cuda().eval()
        x = _x(4)
        fn = CudaGraphsBackend().build_graph(
            model, [Sample((x,), {"scale": 0.5})], GraphInfo(torch.device("cuda"))
        )
        assert isinstance(fn, CudaGraphed)
        with torch.no_grad():
            for scale in (0.5, 2.0, 0.5):
                out, ref = fn(x, scale=scale), model(x, scale=scale)
                torch.testing.assert_close(out["y"], ref["y"])
                torch.testing.assert_close(out["stats"][1], ref["stats"][1])
        assert fn.num_graphs == 2  # scale=2.0 was captured separately

    def test_beyond_max_graphs_runs_eager(self) -> None:
        model = _cuda_mlp()
        fn = _build(model, _x(4), max_graphs=1)
        x = _x(6)
        with torch.no_grad():
            torch.testing.assert_close(fn(x), model(x))
        assert fn.num_graphs == 1

    def test_inputs_on_another_device_are_refused(self) -> None:
        fn = _build(_cuda_mlp(), _x(4))
        with pytest.raises(honed.InputError, match="move every input"):
            fn(torch.randn(4, 16))

    def test_host_sync_fails_capture_clearly(self) -> None:
        with pytest.raises(honed.TuneError, match="must not synchronize with the host"):
            _build(Syncs().cuda(), _x(4))
        # The failed capture leaves the device's random generator usable, on its sequence.
        torch.cuda.manual_seed(7)
        expected = torch.randn(3, device="cuda")
        torch.cuda.manual_seed(7)
        with pytest.raises(honed.TuneError):
            _build(Syncs().cuda(), _x(4))
        assert torch.equal(torch.randn(3, device="cuda"), expected)
        # Capturing and replaying still work in this process after the failed captures.
        model = _cuda_mlp()
        fn = _build(model, _x(4))
        with torch.no_grad():
            torch.testing.assert_close(fn(_x(4, seed=3)), model(_x(4, seed=3)))
        assert fn.captures == 1

    def test_tune_selects_cuda_graphs_and_matches_eager(self) -> None:
        model = honed.Module(_cuda_mlp(), "tiny-cg")
        strategy = honed.OneBackendStrategy(CudaGraphsBackend())
        report = honed.tune(model, [_x(2), _x(4), _x(8)], strategy=strategy)
        assert report.selected() == ["CudaGraphsBackend"]
        with torch.no_grad():
            for batch in (2, 5, 8):
                x = _x(batch, 7)
                torch.testing.assert_close(model(x), model.module(x))

    def test_replays_survive_reduce_overhead_recording_after_the_capture(self) -> None:
        """torch.compile(mode="reduce-overhead") clears cuBLAS workspaces when it warms up and
        records; our graph must not have captured a workspace it does not own (a replay would read
        freed memory: an illegal memory access)."""
        torch.manual_seed(0)

        def mlp() -> nn.Module:  # GEMMs big enough for cuBLAS to use its workspace
            return nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 512))

        model, other = mlp().cuda().eval(), mlp().cuda().eval()
        compiled = torch.compile(other, mode="reduce-overhead")
        x = torch.randn(1, 512, device="cuda")
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()
            compiled(x)  # its warm-up run: before our capture
            fn = CudaGraphsBackend().build_graph(model, [Sample((x,), {})], GraphInfo(x.device))
            for _ in range(3):  # its recording and replays: after our capture
                torch.compiler.cudagraph_mark_step_begin()
                compiled(x)
            for seed in range(3):
                y = torch.randn(
                    1, 512, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
                )
                torch.testing.assert_close(fn(y), model(y))
            torch.cuda.synchronize()
