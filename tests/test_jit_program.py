"""tests/test_jit_program.py: JIT on a whole program (HONED_JIT=1, fresh processes, worker pool).

Each test runs a small script in a new interpreter the way a user would, with JIT's default
background tuning and process isolation, and reads what it printed. The script imports honed
only to know when to stop calling its model (it polls JIT's state, with a deadline): the model
code itself knows nothing of honed.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conftest import fast_measurement_env, jit_program

pytestmark = pytest.mark.integration  # new interpreters, worker processes, real compiles

SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys, threading, time
    import torch
    from torch import nn
    import honed.jit
    from honed.backend.base import Backend
    from honed.jit import State, background

    mode, out = sys.argv[1], sys.argv[2]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8))

        def forward(self, x):
            return self.body(x).softmax(-1)

    class Blocking(Backend):
        # its build never ends: the program ends while the tune is in flight
        build_cost = 1

        def build(self, module, example_inputs):
            threading.Event().wait()

    if mode == "exit":
        honed.jit.config.backends = [Blocking()]
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))
    deadline = time.monotonic() + 400

    def call_until(done):
        with torch.no_grad():
            while not done():
                assert time.monotonic() < deadline, "JIT never got there"
                out = model(x)
                time.sleep(0.001)  # a program that also waits, leaving the tune a core
        return out

    def building():
        roots = honed.jit.roots()
        tuner = roots[0].tuner if roots else None
        events = list(tuner.tracker.events) if tuner is not None else []
        return any(e.candidate == "Blocking" and e.phase == "build" for e in events)

    def decided():
        roots = honed.jit.roots()
        return bool(roots) and not background.busy() and roots[0].state is not State.RECORDING

    if mode == "exit":
        call_until(building)
        print("the program ends while its tune builds", flush=True)
    else:
        got = call_until(decided)
        with honed.jit.paused():
            torch.testing.assert_close(got, model(x))
        root = honed.jit.roots()[0]
        dynamo_imported = "torch._dynamo" in sys.modules  # before the line below imports it
        counters = torch._dynamo.utils.counters["inductor"]
        facts = dict(
            state=root.state.name,
            backend=root.backend,
            from_cache=root.from_cache,
            tunes=[dataclasses.asdict(r) for r in honed.jit.tunes()],
            fx_hits=counters["fxgraph_cache_hit"],
            fx_misses=counters["fxgraph_cache_miss"],
            dynamo_imported=dynamo_imported,
        )
        json.dump(facts, open(out, "w"), default=str)
    """
)


def run(tmp_path: Path, mode: str, tag: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / "program.py"
    script.write_text(SCRIPT)
    workers_tmp = tmp_path / f"tmp-{tag}"
    workers_tmp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HONED_", "_HONED_"))}
    env.update(
        HONED_JIT="1",
        HONED_JIT_REPORT="1",
        HONED_JIT_MIN_PARAMETERS="100",
        HONED_JIT_DETECT_GRAPH_BREAKS="0",
        HONED_JIT_BACKENDS="TorchInductorBackend",
        # The workers measure, whatever the program is doing at their turn (tests/conftest.py:
        # measuring on the program's calls follows real time; tests/test_jit_live.py has it).
        HONED_JIT_LIVE_CHOICE="0",
        HONED_CACHE_DIR=str(tmp_path / "honed-cache"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"),
        TMPDIR=str(workers_tmp),  # the workers' folders: none may be left behind
        **fast_measurement_env(),
        # Every measurement is unstable, as beside a busy program: eager stays (no evidence),
        # and a restart must replay that decision rather than measure beside the program again.
        # (JIT's tunes use the larger of the two tolerances.)
        HONED_STABILITY_TOLERANCE="1e-9",
        HONED_JIT_STABILITY_TOLERANCE="1e-9",
    )
    out = tmp_path / f"{tag}.json"
    cmd = jit_program(script, mode, str(out))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=580)
    return proc, out


def facts(proc: subprocess.CompletedProcess[str], out: Path) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded: dict[str, Any] = json.loads(out.read_text())
    return loaded


def leftover_workers(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("tmp-*/honed-worker-*"))


def test_cold_tune_finishes_beside_the_program_and_a_restart_replays_it(tmp_path: Path) -> None:
    cold_proc, cold_out = run(tmp_path, "tune", "cold")
    cold = facts(cold_proc, cold_out)
    assert cold["state"] == "TUNED" and not cold["from_cache"]
    (record,) = cold["tunes"]
    assert record["status"] == "installed" and record["evidence"] == "worker measurement"
    assert record["tried"] == {"TorchEagerBackend": "ok", "TorchInductorBackend": "ok"}
    assert "Tuned Net 📊2.6K (first tune) beside the program in" in cold_proc.stderr
    assert "state=tuned🎯 (TorchEagerBackend)" in cold_proc.stderr  # the report at exit
    # Its workers started as JIT turned on (the program's own start), and the tune took them.
    assert (
        "Starting 2 JIT worker(s) for a cpu model as JIT turns on: they import torch and the "
        "compilers while the program starts" in cold_proc.stderr
    )
    assert "The first tune takes the 2 worker(s) started as JIT turned on (" in cold_proc.stderr
    # The candidates compiled in workers: the program's process never imported TorchDynamo
    # (seconds of imports holding the GIL beside its calls).
    assert cold["dynamo_imported"] is False
    # the restart: every outcome from the cache, unstable figures included; nothing built
    warm_proc, warm_out = run(tmp_path, "tune", "warm")
    warm = facts(warm_proc, warm_out)
    assert warm["state"] == "TUNED" and warm["from_cache"], warm_proc.stderr[-3000:]
    (record,) = warm["tunes"]
    assert record["status"] == "installed" and record["evidence"] == "cache"
    assert record["tried"] == {
        "TorchEagerBackend": "ok (cached)",
        "TorchInductorBackend": "ok (cached)",
    }
    assert "selected TorchEagerBackend on cache" in warm_proc.stderr
    # the first run left every decision in the cache: no worker starts early for the restart
    assert (
        "JIT's workers start when needed: the last run of this script left its decisions in "
        "the cache" in warm_proc.stderr
    )
    assert "as JIT turns on" not in warm_proc.stderr
    assert warm["dynamo_imported"] is False
    assert "KeyError" not in cold_proc.stderr + warm_proc.stderr
    assert leftover_workers(tmp_path) == []


def test_program_ending_during_a_tune_exits_cleanly_with_the_report(tmp_path: Path) -> None:
    proc, _ = run(tmp_path, "exit", "exit")
    assert "the program ends while its tune builds" in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stderr[-3000:]  # the program's own status
    report = proc.stderr[proc.stderr.index("JIT Tuning Hierarchy:") :]
    assert "├─ Net 📊2.6K level=0🪜 state=eager⚠️" in report
    assert (
        "Tuning Net 📊2.6K (first tune) beside the program cancelled (the program ended) after"
        in report
    )
    assert "Blocking not tried" in report  # ended in flight: no figure of it counts
    assert "trying its children" not in proc.stderr  # nothing new starts at exit
    assert leftover_workers(tmp_path) == []  # every worker ended, its folder removed
