"""src/honed/jit/early.py: JIT's workers started as JIT turns on, before the program calls.

A worker's start is an interpreter importing torch, Dynamo and the candidates' compilers: seconds
of a core. Started where a first tune first needs them (its graph-break check), those imports ran
beside the program's first calls, and calls near their end ran past twice eager's time on the
program's own CPU (docs/jit.md). Started when JIT turns on (HONED_JIT=1 or ``import
honed.jit.enable``), they run while the program itself starts: its own imports, its model's build
and load. They all start at once, as nothing is called yet.

The pool is made for the model's likeliest device (the first GPU where there is one, else the
CPU), with the settings a first tune's pool would have then. The first tune takes it where its
own pool's settings are the same (the model's device, the flags, the candidates' modules), and
otherwise closes it and starts its own, as before. An early pool nothing took is closed when a
first tune ends without needing workers, when JIT is turned off or reset, and at exit. A process
forked from the program (a data loader's worker) forgets it: those workers are the program's.

It is not started:
- in a process whose ancestor started one: HONED_JIT=1 is inherited by every Python process the
  program starts (Inductor's compile workers, data loaders), which are not the program;
- with no script (``python -c``, an interactive session), whose last run cannot be looked up, or
  from an installed command (torchrun, pytest: launchers, not the program);
- where the script's last run ended its first tunes (their decisions are in the cache): a warm
  restart needs no worker, and their imports would run beside its first calls;
- with isolation other than "process", in a dry run, or with ``HONED_JIT_EARLY_WORKERS=0``.
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import torch

from honed import config as _flags
from honed.jit import background
from honed.jit.config import config
from honed.jit.history import add as add_step

# Set in the environment of the process that started early workers: its children inherit it.
MARK = "_HONED_JIT_EARLY_PID"


class _Early:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: Any = None  # the early pool no tune has taken yet
        self.settings: dict[str, Any] = {}
        self.started = 0.0
        self.program = ""  # the script whose runs' needs are stored ("" none)
        self.stored: bool | None = None  # what this process stored last


_EARLY = _Early()


def _forget_in_child() -> None:
    """A process forked from the program (a data loader's worker) inherits the early pool's
    object but none of its threads, and its workers are the program's: it neither takes nor
    closes them, nor stores anything about the script's runs."""
    _EARLY.lock = threading.Lock()
    _EARLY.pool, _EARLY.program = None, ""


os.register_at_fork(after_in_child=_forget_in_child)


def start() -> bool:
    """Start JIT's workers now, on JIT's thread, where the rules above allow; whether queued."""
    if not _flags.jit_early_workers or _flags.isolation != "process" or config.dry_run:
        return False
    if os.environ.get(MARK):
        return False
    program = _script()
    if program is None:
        return False
    os.environ[MARK] = str(os.getpid())
    _EARLY.program = program
    return background.submit(_start, program)


def _script() -> str | None:
    """The running script's path (``python script.py``, ``python -m package.module``); None for
    an installed command (the environment's scripts: torchrun, pytest), which launches programs
    rather than being one: torchrun imports torch, and its ranks inherit the mark."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path or not os.path.isfile(path):
        return None
    script = Path(path).resolve()
    commands = sysconfig.get_path("scripts")
    if commands and script.parent == Path(commands).resolve():
        return None
    return str(script)


def _start(program: str) -> None:
    from honed.jit.decisions import workers_needed

    if workers_needed(program) is False:
        add_step(
            "JIT's workers start when needed: the last run of this script left its decisions "
            "in the cache",
            logging.DEBUG,
        )
        return
    device = _likely_device()
    settings = _settings(device, 1)
    from honed.pipeline.isolation import memory_ceiling_bytes
    from honed.pipeline.pool import WorkerPool

    pool = WorkerPool(
        settings["size"],
        memory_limit_bytes=memory_ceiling_bytes(),
        **{k: v for k, v in settings.items() if k != "size"},
    )
    from honed.jit.patcher import STATE

    with _EARLY.lock:
        if STATE.enabled:  # else JIT was turned off meanwhile, and close() has run
            _EARLY.pool, _EARLY.settings, _EARLY.started = pool, settings, time.perf_counter()
    if _EARLY.pool is not pool:
        pool.close(cancel=True)
        return
    cpus = f" on CPUs {_span(settings['cpus'])}" if settings["cpus"] else ""
    add_step(
        f"Starting {pool.size} JIT worker(s) for a {device} model{cpus} as JIT turns on: they "
        "import torch and the compilers while the program starts"
    )


def _likely_device() -> str:
    # NVML's count (torch's device_count reads it first): no CUDA context is made here
    return "cuda:0" if torch.cuda.device_count() > 0 else "cpu"


def _span(cpus: list[int]) -> str:
    return f"{cpus[0]}-{cpus[-1]}" if cpus == list(range(cpus[0], cpus[-1] + 1)) else str(cpus)


def _settings(device: str, jobs: int) -> dict[str, Any]:
    """What a first tune's pool on ``device`` gets now (tuner._Workers): as many workers as its
    candidates and eager want, under JIT's flags, preloading Dynamo (for the graph-break check)
    and what the candidates' builds import."""
    from honed.jit.tuner import _jit_flags
    from honed.pipeline.isolation import pool_settings

    backends = config.tune_strategy().backends(torch.device(device))
    preload = tuple(dict.fromkeys(["torch._dynamo", *(m for b in backends for m in b.imports)]))
    with _jit_flags():
        return pool_settings(max(jobs, len(backends) + 1), device, preload)


def pool(device: str, jobs: int, gpus: list[str]) -> Any:
    """The pool for a first tune on ``device``: the early one where its settings are the same as
    a new one's would be, else a new one (the early one closed)."""
    from honed.pipeline.isolation import new_pool

    settings = _settings(device, jobs)
    with _EARLY.lock:
        early, _EARLY.pool = _EARLY.pool, None
    if early is not None and not early.closed:
        if _EARLY.settings == settings:
            early.spread_over(gpus)
            add_step(
                f"The first tune takes the {early.size} worker(s) started as JIT turned on "
                f"({time.perf_counter() - _EARLY.started:.2f}s ago)"
            )
            return early
        early.close(cancel=True)
        add_step(
            "The workers started as JIT turned on do not suit this tune "
            f"({_difference(_EARLY.settings, settings, device)}); starting its own"
        )
    from honed.jit.tuner import _jit_flags

    with _jit_flags():
        return new_pool(settings["size"], gpus, device, stagger=True, preload=settings["preload"])


def _difference(was: dict[str, Any], now: dict[str, Any], device: str) -> str:
    names = [k for k in now if was.get(k) != now[k]]
    what = {
        "size": "the number of workers",
        "env": "the environment",
        "worker_config": "honed's flags",
        "nice": "the niceness",
        "cpus": "the CPUs",
        "preload": "the candidates",
    }
    return "they differ in " + ", ".join(what.get(k, k) for k in names) + f" for a {device} model"


def remember(next_run_needs: bool) -> None:
    """A first tune ended: complete (its decisions are in the cache, so the script's next run
    needs no worker for it: False), or cancelled or failed (True). The last to end decides."""
    if not _EARLY.program or _EARLY.stored is next_run_needs:
        return
    _EARLY.stored = next_run_needs
    from honed.jit.decisions import store_workers_needed

    store_workers_needed(_EARLY.program, next_run_needs)


def close() -> None:
    """Close the early pool if no tune took it (JIT turned off or reset; nothing needs it)."""
    with _EARLY.lock:
        early, _EARLY.pool = _EARLY.pool, None
    if early is not None:
        early.close(cancel=True)


def waiting() -> Any:
    """The early pool no tune has taken yet (None: none), for tests and the bench."""
    return _EARLY.pool


__all__ = ["MARK", "close", "pool", "remember", "start", "waiting"]
