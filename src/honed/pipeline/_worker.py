"""src/honed/pipeline/_worker.py: a worker process of the pool: builds, checks, measures candidates.

Run as ``python -m honed.pipeline._worker`` by honed.pipeline.pool, which talks to it over fd 3
(a Unix socket; each message is an 8-byte little-endian length and a pickle). The conversation:

    pool -> ("hello", {sys_path, config,      worker -> ("ready",) once torch and the modules
              preload})                       to preload are imported
    pool -> ("context", key, sizes) + frames  the graph's module, samples, references, ...: the
                                              envelope's pickle, then frames of those sizes
                                              (honed.pipeline.sharing), in the same message
    pool -> ("job", kind, sizes) + frames     the request, as frames too (its large bytes
                                              apart); worker -> ("phase", name) as it goes,
                                              then ("result", reply, retire) or ("error", text);
                                              retire: its CUDA context is broken, start another
    worker -> ("phase", "measure")            and waits for pool -> ("go",): one measurement
                                              per device at a time (honed.pipeline.pool's gates),
                                              or ("skip",): no measurement (the job's measure_if)
    pool -> ("exit",) or end of file          the worker leaves

Jobs are "evaluate" (candidate.evaluate, exactly as an in-process tune would, plus what the
caller needs to install the candidate without building it again), "interleave" (the
finalists, loaded from what their workers shipped, measured side by side) and "explain"
(JIT's graph-break check, honed.pipeline.graph_breaks). Limits (time,
memory) and crashes are the pool's business: this process just works.
"""

from __future__ import annotations

import dataclasses
import importlib
import io
import os
import pickle
import struct
import sys
import traceback
from typing import Any

_FD = 3


class _Channel:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def _read(self, n: int) -> bytearray | None:
        data = bytearray(n)
        view, got = memoryview(data), 0
        while got < n:
            read = os.readv(self.fd, [view[got : got + (1 << 20)]])
            if not read:
                return None
            got += read
        return data

    def recv(self) -> Any:
        head = self._read(8)
        if head is None:
            return None
        body = self._read(struct.unpack("<Q", head)[0])
        if body is None:
            return None
        stream = io.BytesIO(body)
        message = pickle.load(stream)
        if message[0] in ("context", "job"):  # its frames follow the envelope: views of this
            at, frames = stream.tell(), []  # (writable) memory, which its tensors then keep alive
            for size in message[2]:
                frames.append(memoryview(body)[at : at + size])
                at += size
            message = (*message[:2], frames)
        return message

    def send(self, message: Any) -> None:
        body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(struct.pack("<Q", len(body)) + body)
        while view:
            view = view[os.write(self.fd, view) :]


def _moved_copy(module: Any, device: Any) -> Any:
    """A copy of ``module`` on ``device``, the original left where it is: ``Module.to`` moves in
    place, and the worker's context must stay on the tune's device for the jobs that run there
    (payload builds, the finalists' re-measure) after one that measured on another GPU. Each
    parameter and buffer is copied straight to ``device`` (no second copy where it was)."""
    import copy

    import torch

    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = torch.nn.Parameter(p.detach().to(device), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b.to(device)
    return copy.deepcopy(module, memo).to(device)


class _Server:
    def __init__(self, channel: _Channel) -> None:
        self.channel = channel
        self.context_key = ""
        self.context: dict[str, Any] = {}
        self.placed: dict[str, dict[str, Any]] = {}  # the context moved to another device
        self.context_error = ""

    def phase(self, name: str) -> None:
        self.channel.send(("phase", name))
        if name != "measure":
            return
        message = self.channel.recv()  # wait for our turn on the device
        if message is None:
            sys.exit(0)
        if message[0] == "skip":
            from honed.pipeline.candidate import MeasureDeferred

            raise MeasureDeferred
        if message[0] != "go":
            raise RuntimeError(f"honed worker: expected go or skip, got {message[0]!r}")

    def context_on(self, device: str) -> dict[str, Any]:
        import torch

        from honed.pipeline.candidate import to_device

        ctx = self.context
        if str(ctx["graph"].device) == device:
            return ctx
        if device not in self.placed:
            target = torch.device(device)
            self.placed = {
                device: dict(
                    ctx,
                    module=_moved_copy(ctx["module"], target),
                    samples=to_device(ctx["samples"], target),
                    references=to_device(ctx["references"], target),
                    graph=dataclasses.replace(ctx["graph"], device=target),
                )
            }
        return self.placed[device]

    def serve(self) -> int:
        while True:
            message = self.channel.recv()  # envelopes hold only str and bytes: they always load
            if message is None or message[0] == "exit":
                return 0
            if message[0] == "context":
                self.context_key, self.context, self.placed = message[1], {}, {}
                try:
                    from honed.pipeline.sharing import loads

                    self.context = loads(message[2])
                    self.context_error = ""
                except Exception as e:  # the next job says so
                    traceback.print_exc()
                    self.context_error = f"the worker could not load the graph: {e}"
            elif message[0] == "job":
                self.job(message[1], message[2])

    def job(self, kind: str, frames: list[Any]) -> None:
        from honed.pipeline.shipping import evaluate_for_caller, interleave_shipped

        try:
            if self.context_error:
                raise RuntimeError(self.context_error)
            request: dict[str, Any] = pickle.loads(frames[0], buffers=frames[1:])
            from honed.pipeline.courtesy import space_runs

            # its model runs, spaced on the GPU and started halfway through the program's calls
            space_runs(bool(request.get("beside_program")), request.get("call_clock") or "")
            if request["device"].startswith("cuda"):
                import torch

                torch.cuda.set_device(request["device"])  # captures and streams follow it
            if kind == "explain":  # its context is a module and one sample, where they were
                from honed.pipeline.graph_breaks import explain_job

                reply = explain_job(self.context)
            elif kind == "evaluate":
                elsewhere = bool(self.context) and request["device"] != str(
                    self.context["graph"].device
                )
                reply = evaluate_for_caller(
                    self.context_on(request["device"]), request, self.phase, elsewhere
                )
            elif kind == "interleave":
                reply = interleave_shipped(self.context_on(request["device"]), request, self.phase)
            else:
                raise ValueError(f"unknown job kind {kind!r}")
        except SystemExit:
            raise
        except BaseException as e:
            text = traceback.format_exc()
            sys.stderr.write(text)
            self.channel.send(("error", f"the worker raised {type(e).__name__}: {e}"))
            return
        # A candidate that failed with a sticky CUDA error (a device-side assert) returns a
        # failed outcome, and every later job in this process would fail with it.
        retire = request["device"].startswith("cuda") and not _cuda_usable()
        self.channel.send(("result", reply, retire))


def _cuda_usable() -> bool:
    import torch

    try:
        torch.cuda.synchronize()
    except Exception:
        return False
    return True


def _hello(channel: _Channel) -> bool:
    message = channel.recv()
    if message is None or message[0] != "hello":
        return False
    spec = message[1]
    sys.path[:0] = [p for p in spec["sys_path"] if p not in sys.path]
    from honed import config

    for name, value in spec["config"].items():
        setattr(config, name, value)
    import torch  # noqa: F401  (every job needs it: imported before the worker says ready)

    # What the pool's jobs will need (JIT: Dynamo and Inductor, imported while the program
    # still records); the rest is imported by the job that needs it (Backend.imports).
    for name in spec.get("preload", ()):
        importlib.import_module(name)

    from honed.backend import _aoti_env

    _aoti_env.IN_WORKER = True  # a loader crash here fails only this worker's job
    return True


def main() -> int:
    channel = _Channel(_FD)
    try:
        if not _hello(channel):
            return 0
    except BaseException as e:
        channel.send(("error", f"{type(e).__name__}: {e}"))
        raise
    channel.send(("ready",))
    return _Server(channel).serve()


if __name__ == "__main__":
    sys.exit(main())
