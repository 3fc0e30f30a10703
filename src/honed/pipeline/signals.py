"""src/honed/pipeline/signals.py: SIGTERM during a tune or a save is handled like Ctrl-C.

By default SIGTERM ends a Python process on the spot: no ``finally`` runs, so a tune would
leave its worker processes' trees, their folders and a half-written ``.NAME.honed.*.tmp``
behind. Inside ``terminate_like_interrupt()`` SIGTERM raises ``Terminated`` (a
KeyboardInterrupt, so every clean-up written for Ctrl-C runs); once the block has unwound, the
process ends the way SIGTERM ends it (the default action, exit status 128 + 15).

Only the main thread can install handlers, and a program that handles SIGTERM itself keeps its
own handler: in both cases the block runs unchanged.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while honed was tuning or saving."""


def _raise(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise Terminated("SIGTERM")


@contextlib.contextmanager
def terminate_like_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM unwinds like Ctrl-C; afterwards the process ends by SIGTERM."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is not signal.SIG_DFL:  # the program's own handler, or ours already (nested)
        yield
        return
    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.kill(os.getpid(), signal.SIGTERM)
        raise  # only if SIGTERM did not end the process (it is blocked)
    finally:
        signal.signal(signal.SIGTERM, previous)
