"""tests/test_isolate.py: the honed._core isolate bindings: results, limits and Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from honed import _core


def sh(script: str, **kw: Any) -> _core.IsolateOptions:
    return _core.IsolateOptions(["sh", "-c", script], **kw)


def gone(pid: int, within_s: float = 2.0) -> bool:
    """Whether pid has exited (absent from /proc, or a zombie) within the time given."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except FileNotFoundError:
            return True
        if stat[stat.rindex(")") + 2] == "Z":
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def wait_for_text(path: Path, within_s: float = 30.0) -> str:
    """The first non-empty content of ``path``, polled until the deadline."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text().strip() if path.exists() else ""
        if text:
            return text
        time.sleep(0.01)
    raise AssertionError(f"{path} stayed empty for {within_s} s")


def wait_for_pid(path: Path, within_s: float = 30.0) -> int:
    return int(wait_for_text(path, within_s))


def signal_once_written(path: Path, signum: int) -> threading.Thread:
    """A thread that sends ``signum`` to this process once ``path`` has content: the child has
    started, so the signal reaches run_isolated while it waits."""

    def send() -> None:
        wait_for_text(path)
        os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def sigint_default() -> Iterator[None]:
    """Python's own SIGINT handler (raises KeyboardInterrupt), restored afterwards."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved)


def test_options_keyword_constructor_and_fields() -> None:
    o = _core.IsolateOptions(
        ["python3", "-c", "pass"],
        env=[("A", "1")],
        cwd="/",
        timeout_s=2.5,
        memory_limit_bytes=1 << 30,
        tail_bytes=100,
        poll_ms=5,
    )
    assert o.argv == ["python3", "-c", "pass"]
    assert o.env == [("A", "1")]
    assert (o.cwd, o.timeout_s, o.memory_limit_bytes, o.tail_bytes, o.poll_ms) == (
        "/",
        2.5,
        1 << 30,
        100,
        5.0,
    )
    assert o.kill_grace_s == 0.5


def test_exit_code_and_output() -> None:
    r = _core.run_isolated(sh("echo out; echo err >&2; exit 3"))
    assert (r.exit_code, r.signal, r.ok) == (3, 0, False)
    assert r.stdout_tail == "out\n"
    assert r.stderr_tail == "err\n"
    assert r.summary() == "exited with status 3"


def test_python_child_and_environment() -> None:
    code = "import os, sys; print(os.environ['HONED_T']); sys.exit(0)"
    r = _core.run_isolated(
        _core.IsolateOptions([sys.executable, "-c", code], env=[("HONED_T", "x")])
    )
    assert r.ok
    assert r.summary() == "ok"
    assert r.stdout_tail == "x\n"
    assert r.peak_rss_bytes > 1 << 20


def test_crash_is_named() -> None:
    r = _core.run_isolated(sh("kill -SEGV $$"))
    assert r.signal == signal.SIGSEGV
    assert r.summary() == "crashed: segmentation fault (SIGSEGV)"


def test_timeout() -> None:
    r = _core.run_isolated(sh("sleep 30", timeout_s=0.3))
    assert r.timed_out
    assert 0.3 <= r.wall_s < 30  # killed at the timeout, not at the child's own end
    assert r.summary() == "killed after the 0.3 s timeout"


def test_memory_ceiling() -> None:
    code = "b = bytearray(500 << 20); import time; time.sleep(5)"
    opts = _core.IsolateOptions([sys.executable, "-c", code], memory_limit_bytes=100 << 20)
    r = _core.run_isolated(opts)
    assert r.memory_exceeded
    assert r.peak_rss_bytes > 100 << 20
    assert r.summary() == "out of memory: resident memory passed the 100 MiB ceiling"


def test_missing_program() -> None:
    r = _core.run_isolated(_core.IsolateOptions(["honed-no-such-program"]))
    assert r.exit_code == 127
    assert "'honed-no-such-program' was not found on PATH" in r.start_error
    assert r.summary().startswith("could not start: ")


def test_empty_argv_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="argv is empty"):
        _core.run_isolated(_core.IsolateOptions([]))


def test_gil_is_released_while_waiting(tmp_path: Path) -> None:
    # The child waits for a file that only a Python thread of this process writes, after the
    # child has started: with the GIL held by run_isolated the file never comes and it times out.
    ready, go = tmp_path / "ready", tmp_path / "go"

    def answer() -> None:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        go.touch()

    t = threading.Thread(target=answer)
    t.start()
    r = _core.run_isolated(
        sh(f"touch {ready}; while [ ! -e {go} ]; do sleep 0.01; done; echo answered", timeout_s=30)
    )
    t.join()
    assert r.ok, r.summary()
    assert r.stdout_tail == "answered\n"


def test_keyboard_interrupt_from_a_signal_kills_the_group(
    tmp_path: Path, sigint_default: None
) -> None:
    pid_file = tmp_path / "pids"
    script = f"sleep 30 & echo $$ $! > {pid_file}; wait"
    signal_once_written(pid_file, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        r = _core.run_isolated(sh(script))
        pytest.fail(f"the child ran to its end: {r.summary()}")
    child, grandchild = (int(p) for p in pid_file.read_text().split())
    assert gone(child)
    assert gone(grandchild)


def test_exception_from_a_signal_handler_propagates(tmp_path: Path) -> None:
    class Stop(Exception):
        pass

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Stop("timer fired")

    pid_file = tmp_path / "pid"
    saved = signal.signal(signal.SIGALRM, handler)
    try:
        signal_once_written(pid_file, signal.SIGALRM)
        with pytest.raises(Stop, match="timer fired"):
            _core.run_isolated(sh(f"echo $$ > {pid_file}; exec sleep 30"))
    finally:
        signal.signal(signal.SIGALRM, saved)
    assert gone(wait_for_pid(pid_file))


def test_without_check_signals_the_child_runs_to_the_end(tmp_path: Path) -> None:
    # The signal is sent while the child waits for "go", which is written only after it.
    ready, go = tmp_path / "ready", tmp_path / "go"
    fired: list[int] = []
    saved = signal.signal(signal.SIGUSR1, lambda signum, frame: fired.append(signum))

    def signal_then_go() -> None:
        wait_for_text(ready)
        os.kill(os.getpid(), signal.SIGUSR1)
        go.touch()

    try:
        threading.Thread(target=signal_then_go, daemon=True).start()
        r = _core.run_isolated(
            sh(f"echo up > {ready}; while [ ! -e {go} ]; do sleep 0.01; done; echo done"),
            check_signals=False,
        )
        deadline = time.monotonic() + 30  # the handler runs once Python code runs again
        while not fired and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGUSR1, saved)
    assert r.ok
    assert r.stdout_tail == "done\n"
    assert fired == [signal.SIGUSR1]
