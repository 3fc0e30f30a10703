"""tests/test_aoti_direct.py: AOTInductor packages loaded through their C interface, no GIL held.

One AOT compile (about 10 s on the CPU) shared by the module's tests: a net of two large matrix
products, slow enough per call (a few hundred ms) that a thread holding the GIL through it shows.
"""

from __future__ import annotations

import itertools
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import honed
from honed.backend import _aoti_constants, _aoti_direct, _aoti_env

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*LeafSpec:FutureWarning")]

WIDTH = 1536


class Heavy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.relu(self.a(x))
        for _ in range(3):
            h = torch.relu(self.a(h))
        return {"out": self.b(h), "twice": y * 2}


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path, Any]:
    torch.manual_seed(0)
    model = Heavy().eval()
    example = (torch.randn(WIDTH, WIDTH), torch.randn(5))
    exported = torch.export.export(model, example)
    path = tmp_path_factory.mktemp("aoti") / "model.pt2"
    torch._inductor.aoti_compile_and_package(
        exported, package_path=str(path), inductor_configs=_aoti_constants.NO_CONSTANTS_IN_SO
    )
    return model, path, exported


def _load(path: Path, monkeypatch: pytest.MonkeyPatch, how: str, exported: Any, model: Any) -> Any:
    monkeypatch.setattr(honed.config, "aoti_loader", how)
    runner = _aoti_env.load_runner(str(path), "cpu")
    constants = _aoti_constants.plan(runner.loader, exported, model)
    _aoti_constants.give(runner.loader, constants.live)
    return runner


def test_a_package_runs_through_its_c_interface_as_through_torchs_loader(
    package: tuple[nn.Module, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, path, exported = package
    direct = _load(path, monkeypatch, "direct", exported, model)
    assert isinstance(direct, _aoti_direct.DirectRunner)
    torchs = _load(path, monkeypatch, "torch", exported, model)
    assert not isinstance(torchs, _aoti_direct.DirectRunner)
    assert sorted(direct.loader.get_constant_fqns()) == sorted(torchs.loader.get_constant_fqns())
    assert direct.loader.get_call_spec() == list(torchs.loader.get_call_spec())

    x, y = torch.randn(WIDTH, WIDTH), torch.randn(5)
    with torch.no_grad():
        want = model(x, y)
    got = direct(x, y)  # the pytree of the outputs, as torch's AOTICompiledModel gives it
    assert set(got) == {"out", "twice"}
    torch.testing.assert_close(got["out"], want["out"], rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(got["twice"], y * 2)
    flat = direct.loader.boxed_run([x, y])
    theirs = torchs.loader.boxed_run([x, y])
    for a, b in zip(flat, theirs, strict=True):
        torch.testing.assert_close(a, b)


def test_constants_it_does_not_know_are_refused(
    package: tuple[nn.Module, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, path, exported = package
    direct = _load(path, monkeypatch, "direct", exported, model)
    with pytest.raises(RuntimeError, match="no constant 'nope'"):
        direct.loader.load_constants({"nope": torch.zeros(1)}, False, True, False)
    with pytest.raises(TypeError, match="no keywords"):
        direct(torch.zeros(1), y=torch.zeros(5))


class _Recording:
    """A container that notes each handful of constants it is handed, then hands it on."""

    def __init__(self, container: Any) -> None:
        self.container = container
        self.updates: list[tuple[list[str], bool]] = []

    def update_constants(self, pairs: list[tuple[str, Any]], validate: bool) -> None:
        self.updates.append(([name for name, _ in pairs], validate))
        self.container.update_constants(pairs, validate)

    def __getattr__(self, name: str) -> Any:  # running it: the container's own
        return getattr(self.container, name)


def _unloaded(path: Path, monkeypatch: pytest.MonkeyPatch, exported: Any, model: Any) -> Any:
    """A package opened by honed's loader, its constants planned but not handed over yet, its
    container recording each update."""
    monkeypatch.setattr(honed.config, "aoti_loader", "direct")
    runner = _aoti_env.load_runner(str(path), "cpu")
    live = _aoti_constants.plan(runner.loader, exported, model).live
    runner.loader._container = _Recording(runner.loader._container)
    return runner, live


def test_beside_a_program_constants_go_over_a_handful_at_a_time_between_its_calls(
    package: tuple[nn.Module, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from honed.pipeline import courtesy

    model, path, exported = package
    waits: list[int] = []
    monkeypatch.setattr(_aoti_direct, "give_way", lambda: waits.append(1) or 0.0)
    monkeypatch.setattr(_aoti_direct, "HANDOVER_CHUNK", 1)

    alone, live = _unloaded(path, monkeypatch, exported, model)
    alone.loader.load_constants(live, False, True, False)
    assert [(len(names), check) for names, check in alone.loader._container.updates] == [
        (len(live), True)
    ]

    courtesy.watch(lambda: False)  # JIT's probe: a program runs beside
    try:
        beside, live = _unloaded(path, monkeypatch, exported, model)
        waits.clear()
        beside.loader.load_constants(live, False, True, False)
        updates = beside.loader._container.updates
        assert len(live) > 1
        assert [len(names) for names, _ in updates] == [1] * len(live)
        assert sorted(n for names, _ in updates for n in names) == sorted(
            beside.loader._fqn_to_name[f] for f in live
        )
        assert not any(check for _, check in updates)  # each handful alone is not all of them
        assert len(waits) == len(updates)  # the program's call ends between two handfuls

        x, y = torch.randn(WIDTH, WIDTH), torch.randn(5)
        with torch.no_grad():
            want = model(x, y)
        torch.testing.assert_close(beside(x, y)["out"], want["out"], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(beside(x, y)["out"], alone(x, y)["out"])

        # Some constant missing: one update, and the package's own check refuses it.
        partial, live = _unloaded(path, monkeypatch, exported, model)
        some = dict(list(live.items())[:-1])
        with pytest.raises(RuntimeError):
            partial.loader.load_constants(some, False, True, False)
        assert [len(names) for names, _ in partial.loader._container.updates] == [len(some)]
    finally:
        courtesy.watch(None)


def _longest_stop_of_another_thread(runner: Any) -> tuple[float, float]:
    """(the call's duration, the longest time the main thread ran no Python in its middle half)
    while another thread makes one call of the package."""
    x, y = torch.randn(WIDTH, WIDTH), torch.randn(5)
    runner.loader.boxed_run([x, y])  # first call apart: kernels and buffers set up
    span: dict[str, float] = {}

    def call() -> None:
        span["start"] = time.perf_counter()
        runner.loader.boxed_run([x, y])
        span["end"] = time.perf_counter()

    thread = threading.Thread(target=call)
    ticks: list[float] = []
    thread.start()
    while thread.is_alive():
        ticks.append(time.perf_counter())
    thread.join()
    start, end = span["start"], span["end"]
    quarter = (end - start) / 4
    inside = [start + quarter] + [t for t in ticks if start + quarter < t < end - quarter]
    inside.append(end - quarter)
    return end - start, max(b - a for a, b in itertools.pairwise(inside))


def test_other_threads_run_python_while_a_call_runs(
    package: tuple[nn.Module, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of the direct loader: torch's binding holds the GIL through a call, so the
    program's other threads stop for all of it; through the C interface they keep running."""
    model, path, exported = package
    held, held_stop = _longest_stop_of_another_thread(
        _load(path, monkeypatch, "torch", exported, model)
    )
    assert held_stop == pytest.approx(held / 2, rel=0.2), (held, held_stop)  # stopped throughout
    free, free_stop = _longest_stop_of_another_thread(
        _load(path, monkeypatch, "direct", exported, model)
    )
    assert free_stop < free / 4, (free, free_stop)


def test_jit_jobs_load_directly_and_the_variable_decides_for_every_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(honed.config, "aoti_loader", "auto")
    assert not _aoti_direct.wanted()  # a tune or honed.load: torch's loader
    with _aoti_direct.unlocked_loads():
        with _aoti_direct.unlocked_loads():
            assert _aoti_direct.wanted()
        assert _aoti_direct.wanted()  # an inner block's end keeps the outer one
        seen: list[bool] = []
        other = threading.Thread(target=lambda: seen.append(_aoti_direct.wanted()))
        other.start()
        other.join()
        assert seen == [False]  # per thread: the program's own loads are not JIT's
        monkeypatch.setattr(honed.config, "aoti_loader", "torch")
        assert not _aoti_direct.wanted()
    assert not _aoti_direct.wanted()
    monkeypatch.setattr(honed.config, "aoti_loader", "direct")
    assert _aoti_direct.wanted() and _aoti_direct.wanted("cuda")  # asked for: every device

    from honed.jit import background

    monkeypatch.setattr(honed.config, "aoti_loader", "auto")
    in_job: list[bool] = []
    assert background.submit(lambda: in_job.append(_aoti_direct.wanted()))
    assert background.wait(30)
    assert in_job == [True]


def test_a_jit_process_loads_directly_on_every_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """JIT's tune runs on a thread of its own (the tuner's), not the JIT job's: while JIT is on,
    every thread's loads are direct."""
    monkeypatch.setattr(honed.config, "aoti_loader", "auto")
    seen: list[bool] = []

    def look() -> None:
        seen.append(_aoti_direct.wanted())

    honed.jit.enable_jit_tuning()
    try:
        other = threading.Thread(target=look)
        other.start()
        other.join()
    finally:
        honed.jit.disable_jit_tuning()
        honed.jit.reset()
    look()
    assert seen == [True, False]


def test_jit_loads_cpu_and_cuda_packages_directly_and_other_devices_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(honed.config, "aoti_loader", "auto")
    with _aoti_direct.unlocked_loads():
        assert _aoti_direct.wanted("cpu") and _aoti_direct.wanted("cuda")
        assert not _aoti_direct.wanted("xpu")
        monkeypatch.setattr(honed.config, "aoti_loader", "direct")
        assert _aoti_direct.wanted("xpu")
        monkeypatch.setattr(honed.config, "aoti_loader", "torch")
        assert not _aoti_direct.wanted("cuda")


def test_packages_needing_more_of_torchs_loader_go_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Extern kernels (a proxy executor) or several libraries: torch's loader, not this one."""
    monkeypatch.setattr(honed.config, "aoti_loader", "direct")
    for extra in (["abc.json"], ["other.so"]):
        path = tmp_path / f"{extra[0]}.pt2"
        with zipfile.ZipFile(path, "w") as z:
            for name in ["abc.so", "abc_metadata.json", *extra]:
                z.writestr(f"model/data/aotinductor/model/{name}", b"")
        before = _aoti_direct.LOADS.copy()
        assert _aoti_direct.open_package(str(path), "cpu", False) is None
        why = "extern kernels (a proxy executor)" if extra == ["abc.json"] else "2 libraries"
        assert _aoti_direct.LOADS - before == {f"torch: {why}": 1}


def test_nothing_outside_the_model_folder_is_taken(tmp_path: Path) -> None:
    assert _aoti_direct._in_model_dir("m/data/aotinductor/model/k/a.cubin") == "k/a.cubin"
    assert _aoti_direct._in_model_dir("m/data/aotinductor/model/abc.so") == "abc.so"
    for name in (
        "m/data/aotinductor/model/../../../evil.so",
        "m/data/aotinductor/model/k/",
        "m/data/aotinductor/other/abc.so",
        "a/b/data/aotinductor/model/abc.so",
    ):
        assert _aoti_direct._in_model_dir(name) == "", name


def test_a_library_it_cannot_open_goes_to_torchs_loader_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(honed.config, "aoti_loader", "direct")
    path = tmp_path / "broken.pt2"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/data/aotinductor/model/abc.so", b"not a library")
    before = _aoti_direct.LOADS.copy()
    assert _aoti_direct.open_package(str(path), "cpu", False) is None
    (why,) = (_aoti_direct.LOADS - before).keys()
    assert why.startswith("torch: cannot open the AOTInductor library"), why


def test_opening_a_package_gives_way_before_its_listing_and_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a JIT program, the archive's listing and each file copied out of it wait for the
    program's call to end (courtesy.give_way): a CUDA package holds a kernel binary per kernel,
    and their copies held the GIL through one of the program's calls on the GPU machine."""
    monkeypatch.setattr(honed.config, "aoti_loader", "direct")
    path = tmp_path / "kernels.pt2"
    kernels = [f"k{i}/kernel.cubin" for i in range(12)]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model/data/aotinductor/model/abc.so", b"not a library")
        z.writestr("model/data/aotinductor/model/abc.cpp", b"// a source: not copied")
        for name in kernels:
            z.writestr(f"model/data/aotinductor/model/{name}", bytes(64))
    asked: list[int] = []

    def give_way() -> float:
        asked.append(1)
        return 0.0

    monkeypatch.setattr(_aoti_direct, "give_way", give_way, raising=False)
    assert _aoti_direct.open_package(str(path), "cpu", False) is None  # not a library
    assert len(asked) == 1 + 1 + len(kernels)  # the listing, the library, each kernel


def test_constants_through_the_cxx_map_older_libraries_take(
    package: tuple[nn.Module, Path, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.11's libraries lack the pairs entry point: the constants go as the C++ map they
    take, which honed builds itself; the package computes the same as through torch's loader."""
    model, path, exported = package
    monkeypatch.setattr(honed.config, "aoti_loader", "direct")
    runner = _aoti_direct.open_package(str(path), "cpu", False, pairs=False)
    assert runner is not None and not runner.loader._container.uses_pairs
    constants = _aoti_constants.plan(runner.loader, exported, model)
    _aoti_constants.give(runner.loader, constants.live)
    x, y = torch.randn(WIDTH, WIDTH), torch.randn(5)
    with torch.no_grad():
        want = model(x, y)
    got = runner(x, y)
    torch.testing.assert_close(got["out"], want["out"], rtol=1e-3, atol=1e-3)
    paired = _load(path, monkeypatch, "direct", exported, model)
    assert paired.loader._container.uses_pairs
    torch.testing.assert_close(paired(x, y)["out"], got["out"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_package_runs_directly_on_the_callers_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CUDA path, on a package built as a tune builds it: the library's kernels load from
    the package's folder, the constants come from the model (through whichever entry point the
    library has), calls go on the caller's current stream; the outputs equal torch's loader's."""
    from honed.backend import GraphInfo, Sample
    from honed.backend.torch_inductor_aot import (
        PAYLOAD_PACKAGE,
        TorchInductorAotBackend,
        TorchInductorAotBackendConfig,
    )

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 8)
    )
    model = model.cuda().eval()
    x = torch.randn(256, WIDTH, device="cuda")
    shapes = (tuple(x.shape),)
    graph = GraphInfo(torch.device("cuda"), False, shapes, shapes, shapes)
    backend = TorchInductorAotBackend(TorchInductorAotBackendConfig(cuda_graphs=False))
    files = backend.export_payload(backend.build_graph(model, [Sample((x,), {})], graph))

    def load(how: str) -> Any:
        monkeypatch.setattr(honed.config, "aoti_loader", how)
        return backend.load_payload(files, model, graph)

    torchs, direct = load("torch"), load("direct")
    assert not isinstance(torchs.runner, _aoti_direct.DirectRunner)
    assert isinstance(direct.runner, _aoti_direct.DirectRunner)
    with torch.no_grad():
        want = model(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = direct(x)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, torchs(x))

    # the constants through the C++ map (torch 2.11's libraries have no pairs entry point)
    path = tmp_path / "model.pt2"
    path.write_bytes(files[PAYLOAD_PACKAGE])
    runner = _aoti_direct.open_package(str(path), "cuda", False, pairs=False)
    assert runner is not None and not runner.loader._container.uses_pairs
    constants = _aoti_constants.tensors(files, model, graph.device)
    assert constants is not None
    _aoti_constants.give(runner.loader, constants)
    for a, b in zip(runner.loader.boxed_run([x]), torchs.runner.loader.boxed_run([x]), strict=True):
        torch.testing.assert_close(a, b)
