"""src/honed/pipeline/buildlog.py: each candidate's third-party compiler output, kept in build.log.

A tune writes ``<config.cache_dir>/runs/<timestamp>/<module>/<graph>/<candidate>.build.log`` for
each candidate that produced output, and the report names the file instead of the console
showing that output. In a worker process the output is what the engine kept of the worker's
stdout and stderr (their tails, ``IsolateResult.stdout_tail``/``stderr_tail``: the engine does not
keep more); in this process it is the warnings and the ``torch`` log records raised while the
candidate was built, checked and measured (output that C++ code writes straight to the file
descriptors is not captured there).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

from honed import config


def new_run_dir() -> Path:
    """A fresh directory for this tune's logs (created when the first log is written)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(config.cache_dir) / "runs"
    path, n = base / stamp, 1
    while path.exists():
        n += 1
        path = base / f"{stamp}-{n}"
    return path


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name).strip("_") or "_"


def write(run_dir: Path, module: str, graph: int, candidate: str, text: str) -> str | None:
    """Write ``text`` to the candidate's build.log; returns its path (None when nothing to keep)."""
    if not text.strip():
        return None
    path = run_dir / _safe(module) / str(graph) / f"{_safe(candidate)}.build.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return str(path)


def worker_text(stdout_tail: str, stderr_tail: str) -> str:
    """A worker's output as the engine kept it (tails only)."""
    parts = []
    for name, tail in (("stdout", stdout_tail), ("stderr", stderr_tail)):
        if tail.strip():
            parts.append(f"== worker {name} (the last part, as kept by the engine) ==\n{tail}")
    return "\n".join(parts)


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.DEBUG)
        self.lines = lines
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextlib.contextmanager
def capture() -> Iterator[list[str]]:
    """Collect warnings and ``torch`` log records in a ``with`` block instead of printing them."""
    lines: list[str] = []
    collect = _Collect(lines)
    # torch gives some of its loggers (torch._dynamo, torch._inductor, ...) their own handlers
    # and no propagation: each of those, and "torch" itself, hands its records to us instead.
    loggers = [logging.getLogger("torch")] + [
        logger
        for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and logger.handlers
    ]
    saved = [(logger, logger.handlers[:], logger.propagate) for logger in loggers]
    for logger in loggers:
        logger.handlers, logger.propagate = [collect], False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield lines
        for w in caught:
            lines.append(f"{w.category.__name__} {w.filename}:{w.lineno}: {w.message}")
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers, logger.propagate = handlers, propagate
