"""tests/test_jit_early.py: JIT's workers started as JIT turns on (honed.jit.early).

Where they start and where not, what a first tune does with them (takes them when they suit it,
closes them when not), and what a script's run leaves its next run to decide. The whole program's
way (HONED_JIT=1, a cold run taking them, a warm one starting none) is in
tests/test_jit_program.py; the GPU's, below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import honed
import honed.jit
from honed.backend.base import Backend
from honed.jit import background, decisions, early

from conftest import fast_measurement_env, jit_program


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """This process as a script's, with worker processes on and a cache of its own; nothing
    started early is left open after the test."""
    path = tmp_path / "program.py"
    path.write_text("# the program\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(path)
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setenv(early.MARK, "")  # as unset; what start() sets there is undone after
    monkeypatch.setattr(early, "_EARLY", early._Early())
    honed.jit.reset()
    with (
        honed.config.patch(isolation="process", jit_early_workers=True),
        honed.jit.config.patch(cache_dir=str(tmp_path / "jit-cache")),
    ):
        honed.jit.enable_jit_tuning()
        try:
            yield path.resolve()
        finally:
            background.wait(60)
            early.close()
            honed.jit.reset()


def started() -> list[str]:
    return [s for s in honed.jit.history() if "as JIT turns on" in s]


def test_a_script_starts_them_once_with_a_first_tunes_settings(script: Path) -> None:
    assert early.start()
    assert os.environ[early.MARK] == str(os.getpid())  # what the program's children inherit
    assert background.wait(60)
    pool = early.waiting()
    assert pool is not None and not pool.closed
    assert pool.size == 2  # HONED_JIT_WORKERS
    assert pool.stagger is False  # nothing is called yet: they all start at once
    assert pool.preload[0] == "torch._dynamo"  # the graph-break check's
    assert pool.env["HONED_JIT"] == "0" and pool.env["TORCHINDUCTOR_COMPILE_THREADS"] == "1"
    assert started() == [
        "Starting 2 JIT worker(s) for a cpu model as JIT turns on: they import torch and the "
        "compilers while the program starts"
    ]
    assert not early.start()  # once a process
    # A first tune on the CPU takes them as they are.
    assert early.pool("cpu", 1, []) is pool
    assert early.waiting() is None
    assert any(
        s.startswith("The first tune takes the 2 worker(s) started as JIT turned on (")
        for s in honed.jit.history()
    )
    pool.close(cancel=True)


class NothingToImport(Backend):
    """A candidate whose build imports nothing: the default candidates' preload does not fit."""

    imports = ()


def test_a_tune_they_do_not_suit_closes_them_and_starts_its_own(script: Path) -> None:
    assert early.start() and background.wait(60)
    pool = early.waiting()
    assert pool is not None
    with honed.jit.config.patch(backends=[NothingToImport()]):
        own = early.pool("cpu", 1, [])
    try:
        assert own is not pool and not own.closed
        assert own.preload == ("torch._dynamo",)
        assert pool.closed and early.waiting() is None
        assert (
            "The workers started as JIT turned on do not suit this tune (they differ in the "
            "candidates for a cpu model); starting its own"
        ) in honed.jit.history()
    finally:
        own.close(cancel=True)


def test_turning_jit_off_closes_them(script: Path) -> None:
    assert early.start() and background.wait(60)
    pool = early.waiting()
    assert pool is not None
    honed.jit.disable_jit_tuning()
    assert pool.closed and early.waiting() is None
    early._start(str(script))  # a start that comes after JIT was turned off keeps nothing
    assert early.waiting() is None
    assert started() == [started()[0]]  # and says nothing of it


def test_the_next_run_starts_them_only_where_the_last_left_a_first_tune_to_do(
    script: Path,
) -> None:
    assert decisions.workers_needed(str(script)) is None  # never run: they start
    assert early.start() and background.wait(60)
    assert early.waiting() is not None
    early.close()
    early.remember(next_run_needs=False)  # its first tune ended: every decision is cached
    assert decisions.workers_needed(str(script)) is False
    early._start(str(script))  # what the next run does as JIT turns on
    assert early.waiting() is None
    assert honed.jit.history()[-1] == (
        "JIT's workers start when needed: the last run of this script left its decisions in "
        "the cache"
    )
    early.remember(next_run_needs=True)  # a first tune cancelled at exit, or failed
    assert decisions.workers_needed(str(script)) is True
    early._start(str(script))
    assert early.waiting() is not None


@pytest.mark.parametrize(
    "why",
    [
        "no script",
        "an installed command",
        "a child of the program",
        "no worker processes",
        "turned off",
        "a dry run",
    ],
)
def test_where_none_start(
    script: Path, monkeypatch: pytest.MonkeyPatch, why: str, tmp_path: Path
) -> None:
    if why == "no script":  # python -c, an interactive session
        monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    elif why == "an installed command":  # torchrun's launcher, which imports torch itself
        command = Path(sysconfig.get_path("scripts")) / "pytest"
        assert command.is_file()  # this environment's own
        monkeypatch.setattr(sys.modules["__main__"], "__file__", str(command))
    elif why == "a child of the program":  # a compile worker or data loader it started
        monkeypatch.setenv(early.MARK, "1")
    settings = {
        "no worker processes": {"isolation": "none"},
        "turned off": {"jit_early_workers": False},
    }.get(why, {})
    with (
        honed.config.patch(**settings),
        honed.jit.config.patch(dry_run=why == "a dry run"),
    ):
        assert not early.start()
    assert background.wait(60) and early.waiting() is None and started() == []


GPU_PROGRAM = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import honed.jit
    from honed.jit import background, early, State
    from honed.pipeline.isolation import worker_cpus
    assert background.wait(120)
    pool = early.waiting()
    facts = {"context_before_the_model": torch.cuda.is_initialized(),
             "early_cpus": pool.cpus if pool is not None else None}
    with honed.config.patch(worker_spare_cores=honed.config.jit_spare_cores):
        facts["worker_cpus"] = worker_cpus()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64)).eval().cuda()
    x = torch.randn(8, 64, device="cuda")
    deadline = time.monotonic() + 300
    with torch.no_grad():
        while True:
            model(x)
            roots = honed.jit.roots()
            if roots and not background.busy() and roots[0].state is not State.RECORDING:
                break
            assert time.monotonic() < deadline, honed.jit.history()
    facts["state"] = honed.jit.roots()[0].state.name
    facts["history"] = honed.jit.history()
    json.dump(facts, open(sys.argv[1], "w"))
    """
)


@pytest.mark.gpu
@pytest.mark.integration
def test_on_a_gpu_host_they_start_off_the_programs_cpus_without_a_cuda_context(
    tmp_path: Path,
) -> None:
    program = tmp_path / "gpu_program.py"
    program.write_text(GPU_PROGRAM)
    out = tmp_path / "facts.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HONED_", "_HONED_"))}
    env.update(
        HONED_JIT="1",
        HONED_JIT_BACKENDS="CudaGraphsBackend",
        HONED_JIT_MIN_PARAMETERS="100",
        HONED_CACHE_DIR=str(tmp_path / "cache"),
        **fast_measurement_env(),
    )
    cmd = jit_program(program, str(out))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(out.read_text())
    # Started for the first GPU through NVML's count: no context made in the program for it.
    assert facts["context_before_the_model"] is False
    assert facts["early_cpus"] == facts["worker_cpus"]  # off the program's cores, as a tune's
    history = facts["history"]
    assert any(s.startswith("Starting 2 JIT worker(s) for a cuda:0 model") for s in history)
    assert any(s.startswith("The first tune takes the 2 worker(s)") for s in history), history
    assert facts["state"] in ("TUNED", "EAGER")
    assert torch.cuda.is_available()  # a gpu test: the conftest skips it without CUDA


def test_a_forked_child_leaves_the_programs_workers_alone(script: Path) -> None:
    assert early.start() and background.wait(60)
    pool = early.waiting()
    assert pool is not None
    deadline = time.monotonic() + 60
    while any(slot.worker is None for slot in pool.slots):  # their processes exist
        assert time.monotonic() < deadline, "the early workers never started"
        time.sleep(0.01)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a data loader's worker, say
        try:
            os.close(read)
            early.close()  # would end the program's workers, were they the child's to end
            early.remember(next_run_needs=False)
            os.write(write, b"none" if early.waiting() is None else b"some")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = f.read()
    os.waitpid(pid, 0)
    assert said == b"none"  # the child saw no early pool
    assert early.waiting() is pool and not pool.closed
    assert all(slot.worker.running for slot in pool.slots)
    assert decisions.workers_needed(str(script)) is None  # nor stored what the program would
