"""src/honed/pipeline/sharing.py: what a worker gets of the caller's tensors: CUDA ones by handle.

Pickling a CUDA module for a worker by value copies every weight to host bytes in the caller,
holding the GIL: the program's calls stop for that long. Here a CUDA tensor travels as a CUDA IPC
handle instead (torch.multiprocessing's own reduction), and the worker copies it into memory of
its own while it loads the blob (``loads``), then lets the handle go. So what a worker holds after
loading is its own: it cannot change the program's weights, samples or references, and the
program's memory is mapped in the worker only while it loads. Tensors sharing a storage share its
copy, as they did in the caller. CPU tensors, and CUDA tensors the reduction refuses, travel by
value: a CPU storage's bytes are copied once by torch (no GIL held) and left out of the pickle's
stream (``_cpu_storage_bytes``): a blob is a list of frames, the stream and then those buffers,
which the pool's ``Worker.send`` joins into one message without the GIL and the worker splits
again. Pickled in band, a CPU model's weights were copied three times holding the GIL (into the
pickle, out of it, into the pool's message), stopping the program's calls for that long.

Each IPC share is counted by torch (the caller keeps the memory while a worker holds it), so a
blob with handles is loaded once: ``Shared.blob()`` pickles afresh for each worker.
"""

from __future__ import annotations

import io
import logging
import pickle
from typing import Any, cast

import cloudpickle
import torch

from honed.pipeline.courtesy import give_way

log = logging.getLogger("honed")

# While a blob loads: the shared storage's address -> (that storage, the worker's copy). Holding
# the shared storage keeps its address unique until the load ends.
_COPIES: dict[int, tuple[Any, Any]] = {}


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, CUDA tensors as IPC handles (``share``) or as placeholders (a dry run)."""

    def __init__(self, file: io.BytesIO, share: bool) -> None:
        self.frames: list[Any] = []
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=self._aside)
        self.share = share
        self.cuda_tensors = 0
        self._cpu_buffers: dict[tuple[int, int], tuple[pickle.PickleBuffer]] = {}

    def _aside(self, buffer: pickle.PickleBuffer) -> None:
        self.frames.append(buffer.raw())

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is torch.storage.TypedStorage and obj._untyped_storage.device.type == "cpu":
            give_way()
            # Tensors viewing one storage get one buffer, aliased again on load: the same tuple
            # each time, which the pickler memoizes (a buffer itself it would send again).
            key = (obj._untyped_storage.data_ptr(), obj._untyped_storage.nbytes())
            if key not in self._cpu_buffers or not key[0]:
                self._cpu_buffers[key] = (_cpu_storage_bytes(obj),)
            return _cpu_storage, (self._cpu_buffers[key], obj.dtype)
        if not _shareable(obj):
            return super().reducer_override(obj)
        self.cuda_tensors += 1
        give_way()
        if not self.share:
            return _placeholder, ()
        from torch.multiprocessing.reductions import reduce_tensor

        try:
            rebuild, args = reduce_tensor(obj)
        except Exception as e:  # e.g. memory the driver cannot share: send its bytes
            log.debug("honed: a CUDA tensor travels by value (%s: %s)", type(e).__name__, e)
            return super().reducer_override(obj)
        return _received, (rebuild, args)


def _shareable(obj: Any) -> bool:
    return (
        type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.is_cuda
        and obj.layout == torch.strided
        and obj.grad_fn is None
    )


def _placeholder() -> None:
    return None


def _cpu_storage_bytes(storage: Any) -> pickle.PickleBuffer:
    """A CPU storage as its bytes: a copy (torch's, without the GIL), so later changes to the
    caller's tensors do not reach a worker, handed to the pickler as an out-of-band buffer.

    torch's own reduction saves each storage with ``torch.save`` into bytes of its own, which the
    pickler then copies again: Python per storage and two copies of every weight, all holding the
    GIL in the program's process while its calls wait."""
    flat = torch.empty((0,), dtype=torch.uint8).set_(storage._untyped_storage).clone()
    return pickle.PickleBuffer(cast(Any, flat.numpy()))  # numpy's stubs lack __buffer__


def _cpu_storage(held: tuple[Any], dtype: torch.dtype) -> Any:
    """In the worker: the storage over the received bytes (its own memory, no further copy)."""
    (data,) = held
    if len(data):
        flat = torch.frombuffer(data, dtype=torch.uint8)
    else:  # frombuffer refuses an empty buffer
        flat = torch.empty((0,), dtype=torch.uint8)
    return torch.storage.TypedStorage(
        wrap_storage=flat.untyped_storage(), dtype=dtype, _internal=True
    )


def _received(rebuild: Any, args: tuple[Any, ...]) -> Any:
    """In the worker: the tensor the handle names, copied into the worker's own memory."""
    shared = rebuild(*args)
    storage = shared.untyped_storage()
    if storage.data_ptr() not in _COPIES:
        _COPIES[storage.data_ptr()] = (storage, storage.clone())
    copy = _COPIES[storage.data_ptr()][1]
    with torch.no_grad():
        own = torch.empty((0,), dtype=shared.dtype, device=shared.device)
        own.set_(copy, shared.storage_offset(), shared.size(), shared.stride())
    if isinstance(shared, torch.nn.Parameter):
        return torch.nn.Parameter(own, requires_grad=shared.requires_grad)
    return own.requires_grad_(shared.requires_grad)


def dumps(value: Any, share: bool = True) -> tuple[list[Any], int]:
    """``value`` pickled for a worker as frames (the pickle's stream, then the buffers it left
    out of band), and how many CUDA tensors it holds.

    share: CUDA tensors as IPC handles; False: as placeholders (checks that the rest pickles,
    and counts them, without sharing anything).
    """
    buffer = io.BytesIO()
    pickler = _Pickler(buffer, share)
    pickler.dump(value)
    return [buffer.getbuffer(), *pickler.frames], pickler.cuda_tensors


def loads(frames: list[Any]) -> Any:
    """In the worker: ``frames`` loaded; every shared CUDA tensor already copied and let go."""
    try:
        return pickle.loads(frames[0], buffers=frames[1:])
    finally:
        # Letting the shared storages go closes their handles; torch first waits for the copies
        # queued on the stream, then tells the caller the memory is no longer used here.
        _COPIES.clear()


class NotShapesOnly(ValueError):
    """A tensor that ``dumps_shapes`` cannot stand in for with an empty one of its shape."""


class _ShapesPickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle, each plain tensor as its size, strides, dtype and device (``_empty``)."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            if not _plain(obj):
                raise NotShapesOnly(
                    f"a {type(obj).__name__} ({obj.layout}, {obj.dtype}, {obj.device.type}) "
                    "has no empty stand-in"
                )
            give_way()
            spec = (tuple(obj.size()), tuple(obj.stride()), obj.dtype, str(obj.device))
            return _empty, (*spec, obj.requires_grad, type(obj) is torch.nn.Parameter)
        if isinstance(obj, torch.storage.TypedStorage | torch.UntypedStorage):
            raise NotShapesOnly("a storage has no empty stand-in")
        return super().reducer_override(obj)


def _plain(obj: torch.Tensor) -> bool:
    return (
        type(obj) in (torch.Tensor, torch.nn.Parameter)
        and obj.layout == torch.strided
        and not obj.is_quantized
        and not obj.is_nested
        and obj.device.type in ("cpu", "cuda")
    )


def _empty(
    size: tuple[int, ...],
    stride: tuple[int, ...],
    dtype: torch.dtype,
    device: str,
    requires_grad: bool,
    parameter: bool,
) -> torch.Tensor:
    """In the worker: an uninitialised tensor in the place of one of the caller's."""
    empty = torch.empty_strided(size, stride, dtype=dtype, device=device)
    if parameter:
        return torch.nn.Parameter(empty, requires_grad=requires_grad)
    return empty.requires_grad_(requires_grad)


def dumps_shapes(value: Any) -> bytes:
    """``value`` pickled with every tensor as an uninitialised one of its size, strides, dtype and
    device: what tracing needs of a module, without sending its weights. Nothing of the
    caller's memory is copied or shared (no CUDA IPC export, no copy of a CPU weight), and a
    loaded value's tensors hold garbage. Raises NotShapesOnly for a tensor it cannot stand in
    for (a subclass, a quantized, nested, sparse or meta one) and what pickling raises."""
    buffer = io.BytesIO()
    _ShapesPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


class Shared:
    """A value for workers, checked once here; ``blob()`` pickles it for one worker's load."""

    def __init__(self, value: Any) -> None:
        probe, self.cuda_tensors = dumps(value, share=False)  # raises when it does not pickle
        self.value = value if self.cuda_tensors else None  # kept alive while handles may go out
        self._by_value = probe if not self.cuda_tensors else []

    def blob(self) -> list[Any]:
        if not self.cuda_tensors:
            return self._by_value
        return dumps(self.value)[0]


__all__ = ["NotShapesOnly", "Shared", "dumps", "dumps_shapes", "loads"]
