"""tests/conftest.py: shared fixtures (tiny models, fast measurement, one shared Inductor tune) and
the test tiers.

Tiers: a test is a fast unit test unless it says otherwise. ``@pytest.mark.integration`` (or a
module's ``pytestmark``) puts it in the CPU integration tier: real compiles, worker processes,
subprocess builds; a test using one of the shared compiled fixtures lands there on its own.
``@pytest.mark.gpu`` tests skip without CUDA. `make test-fast` runs the unit tier, `make test` all:
side by side in pytest-xdist workers, then ``@pytest.mark.serial`` tests (which need the machine to
themselves) alone. Everything a test writes is private to it (tmp_path, the tuning cache and the
config folder below, also for the processes it starts), so tests may run side by side; Inductor's
own cache is shared, as honed's workers share it (it is safe for concurrent processes).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

import honed


class FakeClock:
    """A clock that moves only when the test moves it (``now``)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class TinyMLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class KwModel(nn.Module):
    """Keyword tensor input, a non-tensor constant and a nested dict/tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor, *, bias: torch.Tensor, scale: float = 1.0) -> Any:
        y = self.fc(x) * scale + bias
        return {"y": y, "parts": (y.relu(), y.sum(dim=1))}


def interruptible() -> None:
    """A child's ``preexec_fn``: SIGINT at its default, so Python installs its handler there. A
    test run started in the background of a non-interactive shell inherits SIGINT ignored, and so
    would every process it starts, where a Ctrl-C test's signal would then do nothing."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def batches(*sizes: int, dim: int = 16, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, dim, generator=g) for b in sizes]


_LOADER = """
import sys, torch
sys.path.insert(0, {tests!r})
import honed
{prelude}
model = honed.Module({model}, {name!r})
honed.load(model, {artifact!r})
assert model.is_tuned, "no variant was installed"
x = torch.load({inputs!r})
with torch.no_grad():
    torch.save([model(t) for t in x], {outputs!r})
backend = model.variants[0].backend
print("BACKEND", type(backend).__name__)
print("NAME", backend.name)
"""


class Loaded(NamedTuple):
    backend_class: str  # the installed variant's backend class
    backend_name: str  # and its name with the config
    outputs: list[torch.Tensor]


def ended_pid() -> int:
    """The pid of a process that has ended (a stale file's owner)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def load_in_new_process(
    artifact: Path,
    inputs: list[torch.Tensor],
    tmp_path: Path,
    model: str = "TinyMLP().eval()",
    name: str = "tiny",
    prelude: str = "from conftest import TinyMLP",
) -> Loaded:
    """honed.load ``artifact`` into a fresh ``model`` (Python source) in a new interpreter and run
    it on ``inputs``; ``prelude`` runs first (imports, patches)."""
    torch.save(inputs, tmp_path / "x.pt")
    script = textwrap.dedent(_LOADER).format(
        tests=str(Path(__file__).parent),
        prelude=prelude,
        model=model,
        name=name,
        artifact=str(artifact),
        inputs=str(tmp_path / "x.pt"),
        outputs=str(tmp_path / "y.pt"),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    return Loaded(lines["BACKEND"], lines["NAME"], torch.load(tmp_path / "y.pt"))


# Using one of these fixtures makes a test an integration test (they compile on first use).
COMPILED_FIXTURES = {"inductor_tuned"}


@pytest.hookimpl(tryfirst=True)  # before -m selects on the markers added here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_cuda = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("slow") or COMPILED_FIXTURES & set(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.integration)
        if no_cuda is not None and item.get_closest_marker("gpu"):
            item.add_marker(no_cuda)


# Short warm-up and windows: tests check behaviour, never timings.
FAST_MEASUREMENT: dict[str, float] = dict(
    warmup_ms=2.0, warmup_calls=2, window_ms=2.0, window_calls=3, max_windows=4
)


def jit_program(script: Path, *args: str) -> list[str]:
    """The command that runs ``script`` as a program under HONED_JIT=1: by its .pth hook, or
    where none is installed (``HONED_TEST_JIT_LAUNCHER`` other than "pth") through the hook's
    call made by hand, with the script's path where the hook finds it (honed.jit.early looks the
    script's last run up)."""
    if os.environ.get("HONED_TEST_JIT_LAUNCHER", "pth") == "pth":
        return [sys.executable, str(script), *args]
    return [
        sys.executable,
        "-c",
        "import runpy, sys; sys.argv = sys.argv[1:]; "
        "sys.modules['__main__'].__file__ = sys.argv[0]; "
        "import honed.jit; honed.jit._autoload(); "
        "runpy.run_path(sys.argv[0], run_name='__main__')",
        str(script),
        *args,
    ]


def fast_measurement_env() -> dict[str, str]:
    """FAST_MEASUREMENT as HONED_* variables, for the processes a test starts."""
    return {f"HONED_{name.upper()}": f"{value:g}" for name, value in FAST_MEASUREMENT.items()}


@pytest.fixture(autouse=True)
def fast_measurement(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Short measurements, here and in the processes a test starts (a test's own env= wins):
    a tune in a child otherwise measures with the defaults, seconds a candidate."""
    for name, value in fast_measurement_env().items():
        monkeypatch.setenv(name, value)
    with honed.config.patch(**FAST_MEASUREMENT):
        yield


@pytest.fixture(scope="session")
def inductor_tuned() -> honed.Module:
    """A TinyMLP tuned once with Inductor on batches 2, 4 and 8 (shared: compiling is slow).
    In-process, like every test of the tuner's logic: a session fixture is set up before the
    autouse fixtures below, so it says so itself (a worker pool would cost two interpreters)."""
    torch.manual_seed(0)
    model = honed.Module(TinyMLP().eval(), "tiny")
    strategy = honed.OneBackendStrategy(honed.backend.TorchInductorBackend())
    with honed.config.patch(
        warmup_ms=2.0,
        warmup_calls=2,
        window_ms=2.0,
        window_calls=3,
        max_windows=4,
        cache_enabled=False,
        isolation="none",
    ):
        honed.tune(model, batches(2, 4, 8), strategy=strategy)
    return model


@pytest.fixture(autouse=True)
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests of the tuner's logic evaluate candidates in-process (fast); the isolation tests
    (tests/test_isolation.py) opt back in to worker processes. JIT's live trial, which routes
    calls by real time, is off here and in the programs tests start, so that which variant
    answers a call follows from the test alone; tests/test_jit_live.py turns it on. JIT's workers
    keep the tests' priority: lowered, they would wait for the other tests running beside."""
    import honed.jit

    monkeypatch.setenv("HONED_JIT_LIVE_CHOICE", "0")
    monkeypatch.setenv("HONED_JIT_WORKER_NICE", "0")
    with (
        honed.config.patch(isolation="none", jit_live_choice=False, jit_worker_nice=0),
        honed.jit.config.patch(live_choice=False),
    ):
        yield


@pytest.fixture(autouse=True)
def private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Each test gets its own tuning cache, so no test sees another's outcomes; the processes it
    starts too (HONED_CACHE_DIR), so none reads ~/.cache/honed or another test's entries, also
    when tests run side by side (pytest-xdist). A test's own env= still wins."""
    root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("HONED_CACHE_DIR", str(root))
    with honed.config.patch(cache_dir=root):
        yield


@pytest.fixture(autouse=True)
def private_config(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Path]:
    """Each test gets its own honed config folder (keys, trusted keys), also for the processes
    it starts; the user's ~/.config/honed and HONED_SIGNING_KEY are never used."""
    root = tmp_path_factory.mktemp("config")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(root))
    monkeypatch.delenv("HONED_SIGNING_KEY", raising=False)
    with honed.config.patch(config_dir=root / "honed", signing_key=""):
        yield root / "honed"
