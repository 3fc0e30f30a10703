"""src/honed/backend/cuda_graphs.py: the eager module captured into CUDA graphs, one per shape.

Each input signature (tensor shapes, dtypes, devices; non-tensor values; structure) gets its own
``torch.cuda.CUDAGraph``, captured on first sight after a few warm-up calls on a side stream,
with static input buffers and static outputs. A call copies its inputs into the buffers,
replays, and returns clones of the outputs: callers own them, as in eager (the next replay
overwrites the static ones).

Memory: with ``pool_sharing`` all captures draw from one pool. That is safe here because every
replay runs on the caller's stream, one at a time, and its outputs are cloned before any other
graph replays; a graph only reads its own static inputs, the weights, and what it wrote itself
in the same replay.

Inference only: captures and replays run under ``torch.no_grad()``; outputs do not require grad.
One process thread at a time (CUDA graph capture is not thread safe).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

from honed import config as honed_config
from honed.backend._precision import (
    check_config,
    converted,
    memory_format_field,
    precision_field,
    tf32_enabled,
    tolerance,
    with_precision,
)
from honed.backend.base import (
    Availability,
    Backend,
    BackendConfig,
    GraphInfo,
    Sample,
    known_output,
)
from honed.errors import ConfigError, InputError, TuneError
from honed.pipeline import courtesy
from honed.pipeline.correctness import Tolerance

log = logging.getLogger("honed")

# Held through each capture. A device-wide synchronize (cudaDeviceSynchronize) from another thread
# while a stream captures invalidates the capture and fails itself ("operation not permitted when
# stream is capturing"), whatever the capture mode: a JIT program calling torch.cuda.synchronize()
# while JIT captures a winner on its own thread did (the H100 test, with either AOTInductor loader).
# So beside a program (JIT), torch.cuda.synchronize takes this lock first (``guard_synchronize``):
# it waits for a capture under way, and a capture waits for a synchronize under way. Re-entrant:
# torch.cuda.graph synchronizes as it begins.
CAPTURING = threading.RLock()
# torch's synchronize, kept after the guard is off: code that bound torch.cuda.synchronize while
# the guard was on keeps calling the guard afterwards (torch._dynamo's CUDA device interface binds
# it when first imported, and Inductor's autotuning syncs through it).
_PLAIN_SYNCHRONIZE: list[Any] = []
_GUARDING = [False]


def _guarded_synchronize(device: Any = None) -> None:
    if not _GUARDING[0]:
        _PLAIN_SYNCHRONIZE[0](device)
        return
    with courtesy.program_waits(), CAPTURING:
        _PLAIN_SYNCHRONIZE[0](device)


def guard_synchronize(on: bool) -> None:
    """Make ``torch.cuda.synchronize`` wait for honed's captures (on), or put torch's back."""
    if on and not _GUARDING[0]:
        if torch.cuda.synchronize is not _guarded_synchronize:
            _PLAIN_SYNCHRONIZE[:] = [torch.cuda.synchronize]
        torch.cuda.synchronize = _guarded_synchronize
        _GUARDING[0] = True
    elif not on and _GUARDING[0]:
        _GUARDING[0] = False
        if torch.cuda.synchronize is _guarded_synchronize:
            torch.cuda.synchronize = _PLAIN_SYNCHRONIZE[0]


@dataclasses.dataclass
class CudaGraphsBackendConfig(BackendConfig):
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None
    # Eager calls on a side stream before each capture (lazy initialisation, cuBLAS workspaces,
    # autotuning libraries: none of it may happen during capture).
    warmup_iters: int = 3
    # One memory pool shared by the graphs of all shapes (see the file's docstring).
    pool_sharing: bool = True
    # At most this many captured graphs; signatures beyond it run the plain eager module (one
    # log line says so).
    max_graphs: int = 64

    # fp32, tf32, bf16 or fp16 (bf16/fp16 cast the weights); see backend/_precision.py.
    precision: str = precision_field()
    # None (the module's own) or "channels_last" (image models).
    memory_format: str | None = memory_format_field()

    def __post_init__(self) -> None:
        check_config(
            "CudaGraphsBackendConfig",
            self.precision,
            self.memory_format,
            self.autocast_enabled,
            self.autocast_dtype,
        )
        if self.warmup_iters < 1:
            raise ConfigError(
                f"CudaGraphsBackendConfig: warmup_iters must be at least 1 (got "
                f"{self.warmup_iters}): capturing without a warm-up call fails on lazy "
                "initialisation"
            )
        if self.max_graphs < 1:
            raise ConfigError(
                f"CudaGraphsBackendConfig: max_graphs must be at least 1, got {self.max_graphs}"
            )


class CudaGraphsBackend(Backend):
    """Replays the eager module's kernels from CUDA graphs (no compiler involved)."""

    config_class = CudaGraphsBackendConfig
    portability = 1
    build_cost = 1
    jit = True  # a new signature is captured on its first call
    stands_in = True  # a capture of eager's own kernels: no compile
    config: CudaGraphsBackendConfig

    def tolerance(self) -> Tolerance | None:
        return tolerance(self.config.precision)

    @property
    def expected_cost(self) -> float:
        return 0.3

    @property
    def expected_gain(self) -> float:
        reduced = self.config.precision in ("bf16", "fp16") or self.config.autocast_enabled
        return 1.3 * (1.5 if reduced else 1.0)

    @classmethod
    def available(cls) -> Availability:
        if torch.cuda.is_available():
            return Availability(True)
        return Availability(
            False,
            "needs a CUDA device (torch.cuda.is_available() is False)",
            "run on a machine with an NVIDIA GPU and a CUDA build of torch; `honed doctor` says "
            "why CUDA cannot start here",
        )

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        if graph.device.type != "cuda":
            raise InputError(
                f"CudaGraphsBackend captures CUDA work, but this graph runs on {graph.device}; "
                "move the model and its inputs to CUDA (.to('cuda')) or use another backend"
            )
        if not torch.cuda.is_available():
            raise InputError(
                "CudaGraphsBackend needs a CUDA device (torch.cuda.is_available() is False); "
                "run `honed doctor` for the reason"
            )
        cfg = self.config
        module = converted(module, example_inputs, cfg.precision, cfg.memory_format, self.name)
        fn = CudaGraphed(module, graph.device, cfg)
        with contextlib.ExitStack() as stack:
            if cfg.precision == "tf32":  # kernels are chosen while capturing
                stack.enter_context(tf32_enabled())
            for sample in example_inputs:  # capture the recorded signatures now: build time
                # under autocast, the dtypes eager returns from the tune's own output for the
                # sample where it holds one, not from an eager run beside the program's calls
                found, reference = known_output(sample) if cfg.autocast_enabled else (False, None)
                fn.capture_for(sample.args, sample.kwargs, reference if found else _UNKNOWN)
        return with_precision(fn, cfg.precision, graph.device)


_UNKNOWN = object()  # eager's output for a capture's call: not known, run eager to learn it


@dataclasses.dataclass
class _Captured:
    spec: Any  # pytree spec of the call's (args, kwargs)
    graph: Any  # torch.cuda.CUDAGraph
    static_inputs: list[torch.Tensor]
    static_output: Any


class CudaGraphed:
    """A module called through CUDA graphs captured per input signature."""

    def __init__(
        self,
        module: Callable[..., Any],
        device: torch.device,
        config: CudaGraphsBackendConfig,
        what: str | None = None,
    ) -> None:
        self.module = module
        self.what = what or type(module).__name__  # how a failed capture names what it ran
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.config = config
        self.graphs: dict[tuple[Any, ...], list[_Captured]] = {}
        self.captures = 0
        self._stream: Any = None
        self._pool: Any = None
        self._failed: list[Any] = []  # graphs whose capture did not end well
        self._warned_full = False

    @property
    def num_graphs(self) -> int:
        return sum(len(v) for v in self.graphs.values())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils._pytree import tree_flatten, tree_map_only

        leaves, spec = tree_flatten((args, kwargs))
        key = self._key(len(args), kwargs, leaves)
        captured = self._find(key, spec)
        if captured is None:
            captured = self._capture(key, spec, leaves)
            if captured is None:  # over max_graphs: the plain eager module
                with torch.no_grad():
                    return self.module(*args, **kwargs)
        with torch.no_grad():
            tensors = (x for x in leaves if isinstance(x, torch.Tensor))
            for static, t in zip(captured.static_inputs, tensors, strict=True):
                static.copy_(t)
            captured.graph.replay()
            return tree_map_only(torch.Tensor, torch.Tensor.clone, captured.static_output)

    def capture_for(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], eager_out: Any = _UNKNOWN
    ) -> None:
        """Capture the graph for this call's signature now (if not captured yet);
        ``eager_out``: eager's output for this call where the caller knows it (under autocast
        the capture then runs no eager call to learn the dtypes to cast back to)."""
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        key = self._key(len(args), kwargs, leaves)
        if self._find(key, spec) is None:
            self._capture(key, spec, leaves, eager_out)

    # -- signature ---------------------------------------------------------------------------------
    def _key(self, nargs: int, kwargs: dict[str, Any], leaves: list[Any]) -> tuple[Any, ...]:
        parts: list[Any] = [nargs, tuple(kwargs)]
        for x in leaves:
            if isinstance(x, torch.Tensor):
                if x.device != self.device:
                    raise InputError(
                        f"CudaGraphsBackend was built for {self.device} but got a tensor on "
                        f"{x.device}; move every input to {self.device}"
                    )
                parts.append((tuple(x.shape), x.dtype))
            else:
                parts.append(_hashable(x))
        return tuple(parts)

    def _find(self, key: tuple[Any, ...], spec: Any) -> _Captured | None:
        for captured in self.graphs.get(key, ()):
            if captured.spec == spec:
                return captured
        return None

    # -- capture -----------------------------------------------------------------------------------
    def _run(self, *args: Any, **kwargs: Any) -> Any:
        cfg = self.config
        if not cfg.autocast_enabled:
            return self.module(*args, **kwargs)
        dtype = cfg.autocast_dtype or torch.bfloat16
        # cache_enabled=False: the autocast weight cache must not outlive a capture.
        with torch.autocast(device_type="cuda", dtype=dtype, cache_enabled=False):
            return self.module(*args, **kwargs)

    def _capture(
        self, key: tuple[Any, ...], spec: Any, leaves: list[Any], eager_out: Any = _UNKNOWN
    ) -> _Captured | None:
        from torch.utils._pytree import tree_unflatten

        cfg = self.config
        if self.num_graphs >= cfg.max_graphs:
            if not self._warned_full:
                self._warned_full = True
                log.warning(
                    "honed: CudaGraphsBackend holds max_graphs=%d graphs; new input signatures "
                    "run eager (raise CudaGraphsBackendConfig.max_graphs to capture them)",
                    cfg.max_graphs,
                )
            return None
        with torch.no_grad(), torch.cuda.device(self.device):
            if self._stream is None:
                self._stream = torch.cuda.Stream(self.device)
                self._pool = torch.cuda.graph_pool_handle() if cfg.pool_sharing else None
            static_leaves = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
            static_inputs = [x for x in static_leaves if isinstance(x, torch.Tensor)]
            args, kwargs = tree_unflatten(static_leaves, spec)
            eager_dtypes = self._warm_up(args, kwargs, eager_out)
            graph = torch.cuda.CUDAGraph()
            try:
                with (
                    courtesy.spaced_run(self.device),  # after the last warm-up call's gap
                    CAPTURING,
                    _workspaces_in_graph_pool(),
                    _graph_capture(graph, self._pool, self._stream),
                    courtesy.giving_way_at_module_calls(honed_config.jit_capture_gives_way),
                    courtesy.taking_turns(honed_config.jit_takes_turns),
                ):
                    out = self._run(*args, **kwargs)
                    if eager_dtypes is not None:
                        out = _cast_back(out, eager_dtypes)
            except Exception as e:
                _release_generator(self.device)
                # The allocator may still route the failed capture's pool, by a rule that
                # refers to the graph object: the object stays alive, later captures get a pool
                # of their own.
                self._failed.append(graph)
                self._pool = torch.cuda.graph_pool_handle() if cfg.pool_sharing else None
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                raise TuneError(
                    f"CUDA graph capture of {self.what} failed "
                    f"({type(e).__name__}: {first}); the module must not synchronize with the "
                    "host while running (.item(), .cpu(), printing tensors, data-dependent "
                    "Python control flow, dynamic output shapes): remove those or use another "
                    "backend"
                ) from e
        captured = _Captured(spec, graph, static_inputs, out)
        self.graphs.setdefault(key, []).append(captured)
        self.captures += 1
        return captured

    @contextlib.contextmanager
    def _beside(self) -> Iterator[None]:
        """One warm-up run: spaced beside a program (``courtesy.spaced_run``), its module calls
        in turns with the program's calls (``honed.config.jit_takes_turns``), or else, with
        ``honed.config.jit_capture_gives_way``, giving way to its calls at each module call.
        A turn ends with the run, before the spacing's wait."""
        with (
            courtesy.spaced_run(self.device),
            courtesy.giving_way_at_module_calls(honed_config.jit_capture_gives_way),
            courtesy.taking_turns(honed_config.jit_takes_turns),
        ):
            yield

    def _warm_up(
        self, args: Any, kwargs: Any, eager_out: Any = _UNKNOWN
    ) -> list[torch.dtype | None] | None:
        """Eager calls on the side stream; under autocast, also the dtypes eager returns (from
        ``eager_out`` where known, else from one more call, without autocast).

        The last call runs the path the capture will record (``_as_if_capturing``), where
        ``_warms_up_on_the_capture_path`` says so: code that asks whether it is being captured
        takes another path there, and what that path does once (a library's plans and kernels
        for the shapes it meets) then happens here, outside ``CAPTURING``, instead of inside the
        capture, where a program's synchronize waits for it.

        Beside a program (a JIT install, or a worker's build for one) each call is spaced
        (``courtesy.spaced_run``): queued back to back, the warm-up calls of a model slower than
        the program's own held its next call up for all of them at once."""
        from torch.utils._pytree import tree_leaves

        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        eager_dtypes = None
        with torch.cuda.stream(stream):
            if self.config.autocast_enabled:
                if eager_out is _UNKNOWN:
                    with self._beside():
                        eager_out = self.module(*args, **kwargs)
                eager_dtypes = [
                    t.dtype if isinstance(t, torch.Tensor) else None for t in tree_leaves(eager_out)
                ]
            for _ in range(self.config.warmup_iters):
                with self._beside():
                    self._run(*args, **kwargs)
            if _warms_up_on_the_capture_path():
                try:
                    with self._beside(), _as_if_capturing():
                        self._run(*args, **kwargs)
                except Exception as e:  # the capture itself says what breaks, if anything does
                    log.debug("honed: the warm-up call on the capture's path failed: %s", e)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        return eager_dtypes


def _warms_up_on_the_capture_path() -> bool:
    """Whether a capture's warm-up ends with a call on the capture's path (``_warm_up``).

    Always, but beside a program (JIT) only in a first build (``courtesy.first_build``: the
    early stand-in, before any worker built the model). There the capture met the masked path
    it records for the first time (cuDNN's plans, CUDA loading the path's kernels), and the
    program's synchronize waited the whole of it. A capture installed after a worker's build
    records quickly, and the extra call, run beside the program's calls, held them up instead:
    while CUDA loads a kernel's module the program's thread cannot launch (docs/jit.md).
    """
    return not courtesy.beside_program() or courtesy.in_first_build()


_AS_IF_CAPTURING = threading.RLock()


@contextlib.contextmanager
def _as_if_capturing() -> Iterator[None]:
    """Inside, ``torch.cuda.is_current_stream_capturing()`` answers True on this thread.

    Libraries branch on it to stay capturable: Hugging Face's masks, for one, skip an all-ones
    attention mask only when not capturing (the test syncs with the host), so a BERT's capture
    meets an attention with a mask its warm-up never ran, and builds cuDNN's plans for it while
    capturing. Other threads get torch's answer throughout; torch's own function is put back on
    the way out (kept no longer than one call: torch.compile traces the attribute), and code that
    took the stand-in meanwhile gets torch's answer from it afterwards.
    """
    real = torch.cuda.is_current_stream_capturing
    here = threading.get_ident()
    inside = [True]

    def answer() -> bool:
        # code that took the function meanwhile keeps it: afterwards it gets torch's answer
        return (inside[0] and threading.get_ident() == here) or real()

    with _AS_IF_CAPTURING:
        torch.cuda.is_current_stream_capturing = answer
        try:
            yield
        finally:
            inside[0] = False
            torch.cuda.is_current_stream_capturing = real


@contextlib.contextmanager
def _graph_capture(graph: Any, pool: Any, stream: Any) -> Iterator[None]:
    """``torch.cuda.graph(graph, pool, stream, capture_error_mode="thread_local")``, except that
    beside a program (JIT's install) it leaves the program's memory alone.

    thread_local: a capture on one thread leaves other threads' CUDA work alone, and theirs does
    not break it. torch.cuda.graph begins with a device-wide synchronize and empties the caching
    allocators, device and pinned host, to free memory for the graph: beside a program that
    waits for its queued kernels and hands its cached blocks back to the driver, so its next
    calls allocate them again with cudaMalloc, on the program's thread. A capture needs neither
    (it runs nothing; the inputs it reads are ordered by stream waits), so beside a program only
    the capture itself is done; elsewhere memory is freed first, as torch does.
    """
    if not courtesy.beside_program():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    with torch.cuda.stream(stream):
        graph.capture_begin(pool, capture_error_mode="thread_local")
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):  # broken: the body's error is the one to raise
                graph.capture_end()
            raise
        graph.capture_end()


@contextlib.contextmanager
def _workspaces_in_graph_pool() -> Iterator[None]:
    """cuBLAS workspaces dropped before and after a capture (as Inductor's CUDA graph trees do).

    A GEMM captured into a graph keeps the address of the cuBLAS workspace of its stream. If that
    workspace was allocated before the capture, it belongs to the ordinary allocator, and anyone
    who clears the workspaces later (torch.compile's reduce-overhead mode does, each time it
    warms up or records) frees memory our graph still writes to on every replay, which shows as
    "an illegal memory access" once a reduce-overhead function records after our capture.
    Dropped first, the workspace is allocated during the capture, inside the graph's private pool,
    which lives as long as the graph; dropped after, eager work never shares it.
    """
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    conv_flag = getattr(torch._C, "_cuda_get_conv_benchmark_empty_cache", None)
    set_conv = getattr(torch._C, "_cudnn_set_conv_benchmark_empty_cache", None)
    previous = conv_flag() if conv_flag is not None and set_conv is not None else None
    if clear is not None:
        clear()
    if previous is not None and set_conv is not None:
        set_conv(False)  # cuDNN benchmarking must not empty the cache mid-capture either
    try:
        yield
    finally:
        if previous is not None and set_conv is not None:
            set_conv(previous)
        if clear is not None:
            clear()


def _cast_back(out: Any, dtypes: list[torch.dtype | None]) -> Any:
    """Autocast outputs back to the dtypes eager returns (position by position)."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    flat, spec = tree_flatten(out)
    cast = [
        t.to(want) if isinstance(t, torch.Tensor) and want is not None and t.dtype != want else t
        for t, want in zip(flat, dtypes, strict=False)
    ]
    return tree_unflatten(cast, spec)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return ("unhashable", type(value).__name__, repr(value))
    return (type(value).__name__, value)


def _release_generator(device: torch.device) -> None:
    """After a failed capture: the device's default generator as it was, no longer capturing.

    The capture marked the generator as capturing, and only a capture that ends well unmarks it;
    left marked, every later random op on the device fails ("Offset increment outside graph
    capture"). A clone of its state has the same seed and offset and is not capturing.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    gen = torch.cuda.default_generators[index]
    gen.graphsafe_set_state(gen.clone_state())
