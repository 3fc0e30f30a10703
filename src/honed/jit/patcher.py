"""src/honed/jit/patcher.py: the patched torch.nn.Module.__call__ that discovers and routes modules.

Why patch ``__call__`` rather than a global forward pre-hook: a pre-hook cannot skip the forward
(a tuned module must not run its eager body), and any global hook sends every module call in
the process through ``_call_impl``'s slow path. The patched ``__call__`` is one Python frame and
one dict look-up per module call, and the original is put back exactly by ``disable()``.
The program's calls may run on one inference thread, as the seed assumes; JIT's own work runs
on its background thread (background.py), whose module calls bypass the patch (``bypass`` is
per thread).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from honed import config as _flags
from honed.jit import background, pacing
from honed.jit.config import config
from honed.jit.cores import at_outermost_call as _outermost
from honed.jit.cores import restore as _restore_cores
from honed.jit.hierarchy import Node, State, render
from honed.jit.history import add as add_step
from honed.jit.history import clear as clear_history
from honed.jit.history import history as steps
from honed.module import MISS
from honed.pipeline import courtesy

log = logging.getLogger("honed.jit")

_ORIGINAL_CALL: Callable[..., Any] = torch.nn.Module.__call__


class _PerThread(threading.local):
    """A thread's JIT state. honed's own threads (named "honed-...": a tune's, a pool's, one a
    user's backend builds on) start bypassing the patch: a module they call is never one of the
    program's."""

    def __init__(self) -> None:
        self.bypass = 1 if threading.current_thread().name.startswith("honed-") else 0


class _Jit:
    """Process-wide JIT state: which modules were seen, and what is running now."""

    def __init__(self) -> None:
        self.enabled = False  # every module is discovered (import honed.jit.enable)
        self.installed = False  # torch.nn.Module.__call__ is ours
        self.nodes: weakref.WeakKeyDictionary[torch.nn.Module, Node] = weakref.WeakKeyDictionary()
        self.roots: list[Node] = []
        self.stack: list[Node] = []  # the discovered modules whose forward is running
        self.in_call = 0  # the thread inside an outermost module call now (0: none)
        self.call_ended = 0.0  # time.monotonic() at the end of the latest outermost call
        self._local = _PerThread()
        self.opted_in: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # decorator's models
        self.grad_warned: set[int] = set()
        self.report_registered = False

    @property
    def bypass(self) -> int:
        """> 0: JIT's own calls in this thread (tuning, checking, routing): run originals."""
        return getattr(self._local, "bypass", 0)

    @bypass.setter
    def bypass(self, value: int) -> None:
        self._local.bypass = value


STATE = _Jit()


# Looked up once: an enum member read through its class costs a lookup on every module call.
_TUNED, _INIT, _RECORDING = State.TUNED, State.INIT, State.RECORDING
_EAGER, _SKIPPED = State.EAGER, State.SKIPPED
_is_compiling = torch.compiler.is_compiling
_get_ident = threading.get_ident
_monotonic = time.monotonic
_call_ended = courtesy.call_ended
_call_starting = courtesy.call_starting
_TURN = courtesy.TURN  # non-zero while JIT's work in this process takes or wants a turn
_at_module_call = courtesy.at_module_call
_CALL_CLOCK = courtesy.CALL_CLOCK  # None in it until a tune beside the program opens one
_observe = pacing.observe


def _patched_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    st = STATE
    if _is_compiling():
        return _ORIGINAL_CALL(self, *args, **kwargs)
    if getattr(st._local, "bypass", 0):  # JIT's own thread
        _at_module_call()  # a capture's recorded forward may give way to the program's call
        return _ORIGINAL_CALL(self, *args, **kwargs)
    node = st.nodes.get(self)
    if node is None:
        if not (st.enabled or st.stack or self in st.opted_in):
            return _ORIGINAL_CALL(self, *args, **kwargs)
        node = _discover(self)
    else:
        node.call_count += 1
    stack = st.stack
    outermost = timed = not stack
    if outermost:
        # while JIT works beside the program, a core for it, unless this call measures a
        # candidate (honed.jit.cores)
        _outermost(node.trial is not None)
        st.in_call = _get_ident()  # JIT's work gives way meanwhile (honed.pipeline.courtesy)
        if _TURN[0]:  # JIT's work in this process takes turns: this call waits for the one held
            st.in_call = 0
            _call_starting()
            st.in_call = _get_ident()
        started = _monotonic()
        clock = _CALL_CLOCK[0]  # the call clock: workers start their GPU runs mid-call
        if clock is not None:
            clock[0] = started
    try:
        state = node.state
        if state is _TUNED:
            timed = False  # a variant's call, not the program's pace (honed.jit.pacing)
            return _route(node, args, kwargs)
        if state is not _INIT and state is not _RECORDING:
            # decided (SKIPPED, DETACHED, EAGER): only kept on the stack, so that modules it
            # calls for the first time are found as its children
            stack.append(node)
            try:
                return _ORIGINAL_CALL(self, *args, **kwargs)
            finally:
                stack.pop()
        sample = None
        if not node.tried and _records(node):
            sample = _sample(node, args, kwargs)
        elif node.trial is not None:  # its tune measures candidates on the program's calls
            timed = False
            return _route(node, args, kwargs)
        stack.append(node)
        try:
            out = _ORIGINAL_CALL(self, *args, **kwargs)
        finally:
            stack.pop()
        if sample is not None:
            _keep(node, sample, out)
        if node.state is _INIT:
            node.state = _RECORDING
        if node.state is _RECORDING and not node.tried:
            parent = node.parent
            # a module is tried once it is a top module or its parent ended eager or skipped
            # (maybe_try): the children of a module being tuned skip the call, which each of
            # the program's calls would otherwise make for every one of them
            if parent is None or parent.state is _EAGER or parent.state is _SKIPPED:
                _maybe_try(node)
        return out
    finally:
        if outermost:
            st.in_call = 0
            st.call_ended = ended = _monotonic()
            if clock is not None:
                clock[2] = ended - started
                clock[1] = ended
            _call_ended(ended - started)  # wakes JIT's work waiting for this call's end
            if timed:
                _observe(id(node), ended - started)  # eager's pace paces the workers


def _maybe_try(node: Node) -> None:
    """``honed.jit.tuner.maybe_try`` (which imports this module), imported once."""
    if not _TRY:
        from honed.jit.tuner import maybe_try

        _TRY.append(maybe_try)
    _TRY[0](node)


_TRY: list[Callable[[Node], None]] = []


def _discover(module: torch.nn.Module) -> Node:
    st = STATE
    parent = st.stack[-1] if st.stack else None
    node = Node(module, parent)
    node.call_count = 1
    st.nodes[module] = node
    if parent is None:
        st.roots.append(node)
        add_step(f"New top module: {node.describe()}")
        _prepare_start(module)
    else:
        if parent.state in (State.TUNED, State.DETACHED):
            node.state = State.DETACHED
        add_step(f"New child module: {node.describe()}", logging.DEBUG)
    return node


def _records(node: Node) -> bool:
    """Whether this call of ``node`` (not tried yet) is recorded as one of its samples.

    Beside the program, a module's calls are recorded once it can be tried
    (``honed.jit.tuner.maybe_try``): it is a top module, or its parent ended eager or skipped.
    Recording every module down to ``max_depth_level`` from the first call cloned every such
    module's inputs in each of the program's first ``max_samples`` calls, which made those calls
    several times slower (docs/jit.md), and kept the clones in GPU memory through the top
    module's tune, which mostly ends with the children detached. In wait mode the program
    waits for JIT anyway: there a child records its first ``min_samples`` calls from the start,
    so a module that ends eager has its children tried within the same wait."""
    parent = node.parent
    if parent is None or parent.state is _EAGER or parent.state is _SKIPPED:
        return True
    return config.wait and len(node.samples) < config.min_samples


def _prepare_start(module: torch.nn.Module) -> None:
    """In a top module's first call (whose time is JIT's start-up anyway), what JIT's thread
    would otherwise derive beside a later call, holding the GIL or the CPU the program runs on:
    the key ids a cached payload's signature is checked against (OpenSSL's key decoding); the
    CPU's description a tune's machine check reads (/proc/cpuinfo); for a
    GPU model, the side stream and pinned staging that hash its weights for the cache key, the
    GPU's details through NVML (a tune's machine check), and the CPUs its workers may use (the
    cores' topology from sysfs); the modules of the candidates its tune will list (a dozen of
    honed's backend modules, whose import on JIT's thread beside a call held it up), the
    tune's own and the libraries its candidates run with (ONNX Runtime's); and the
    OpenMP runtime the program's calls lend a core from while JIT works (honed.jit.cores),
    found through torch's parallel settings and this process's memory map, which a CUDA
    process's libraries make thousands of lines long: found in the first call JIT works
    beside, on the program's thread, it doubled that call. Each is also derived where it is
    needed, should this fail."""
    from honed import trust
    from honed.pipeline import isolation, machine, openmp
    from honed.pipeline.cache import prepare_copies

    first = next(module.parameters(), None)
    on_gpu = first is not None and first.is_cuda
    device = first.device if first is not None else torch.device("cpu")
    steps: list[tuple[str, Callable[[], Any]]] = [
        ("the trusted keys", trust.known_key_ids),
        ("its candidates' modules", lambda: _import_candidates(device)),
        ("the OpenMP runtime", openmp.runtime),
        # /proc/cpuinfo, which a tune's start describes the machine with: the kernel makes it
        # as it is read, each CPU's clock among it
        ("the CPU's description", machine.cpu),
    ]
    if on_gpu:
        assert first is not None
        steps += [
            ("its copies", lambda: prepare_copies(first.device)),
            ("the GPU's details", lambda: machine.prepare(first.device)),
            ("the cores' topology", isolation.physical_cores),
            ("the pace of its calls", pacing.pacer),  # timed from the first (honed.jit.pacing)
        ]
    for what, step in steps:
        try:
            step()
        except Exception as e:
            log.debug("honed: JIT could not prepare %s at its start: %s", what, e)


def _import_candidates(device: torch.device) -> None:
    """The modules of honed's default candidates and JIT's strategy, the tune's own and the
    installed libraries the candidates run with (``Backend.runs_with``), imported (honed's own
    list: a strategy of the user's is not called before its tune)."""
    from honed.backend._defaults import default_candidates
    from honed.jit import strategy  # noqa: F401  (imported for its import's sake)

    listed = default_candidates(device, None)
    # What the tune itself imports here: its trials on the program's calls and its progress
    # display; and the libraries an installed candidate runs with (ONNX Runtime's extension,
    # one C call of tens of ms holding the GIL), where they are installed.
    wanted = ["honed.jit.live", "rich.console"]
    wanted += [name for b in listed for name in type(b).runs_with]
    for name in dict.fromkeys(wanted):
        if name not in sys.modules and importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def _sample(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """This call's inputs, copied before the call (it may change them), when it is one of the
    samples ``node`` keeps; else None."""
    if node.level > config.max_depth_level:
        return None
    shapes = tuple(
        tuple(t.shape)
        for t in torch.utils._pytree.tree_leaves((args, kwargs))
        if isinstance(t, torch.Tensor)
    )
    cap = max(config.max_samples, config.min_samples)
    new_shape = shapes not in node.shapes_seen
    if len(node.samples) < cap or (new_shape and len(node.samples) < 2 * cap):
        return shapes, _detach((args, kwargs))
    return None


def _keep(node: Node, sample: Any, out: Any) -> None:
    """Keep a sample the call returned from, with a copy of its output: eager's answer to it,
    which the tune's check compares candidates with instead of running eager on it again
    beside the program (a call's length of the program's GPU and GIL each)."""
    shapes, inputs = sample
    node.samples.append(inputs)
    node.outputs.append(_detach(out))
    node.shapes_seen.add(shapes)


def _detach(value: Any) -> Any:
    return torch.utils._pytree.tree_map(
        lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, value
    )


def _route(node: Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A TUNED module's call: through its honed.Module (eager for shapes it was not tuned for);
    the calls a live trial or a tune's promoted variant takes (honed.jit.live), of a tuned
    module or of one being tuned, through them."""
    module = node.module
    if torch.is_grad_enabled():
        if id(node) not in STATE.grad_warned:
            STATE.grad_warned.add(id(node))
            add_step(
                f"{node.short()} runs eager while autograd is on; call it under "
                "torch.no_grad() or torch.inference_mode() to use its tuned variant",
                logging.WARNING,
            )
        return _ORIGINAL_CALL(module, *args, **kwargs)
    STATE.bypass += 1
    try:
        trial = node.trial  # a tune's trial or promoted variant: the calls it takes
        tuned = node.tuned  # None in a first tune (then a trial is set): nothing tuned yet
        if trial is None:
            out = tuned.dispatch(args, kwargs)
        else:
            out = trial.call(module, _ORIGINAL_CALL, args, kwargs)
            if out is MISS and tuned is not None:
                out = tuned.dispatch(args, kwargs)
        if out is not MISS:
            return out
        if tuned is not None:
            from honed.jit.tuner import outside_profile

            outside_profile(node, args, kwargs, tuned.miss_reason(args, kwargs))
        return _ORIGINAL_CALL(module, *args, **kwargs)  # eager: never a crash or a wrong answer
    finally:
        STATE.bypass -= 1


def program_idle(for_s: float) -> bool:
    """No thread but this one is inside an outermost module call, none ended during the last
    ``for_s`` seconds, and the program does not wait for JIT."""
    if config.wait:
        return True
    return not _program_busy() and _monotonic() - STATE.call_ended >= for_s


def _program_busy() -> bool:
    """Another thread than this one is inside an outermost module call, and not waiting for
    JIT (``honed.jit.config.wait``)."""
    busy = STATE.in_call
    return busy != 0 and busy != _get_ident() and not config.wait


def install() -> None:
    """Put the patched __call__ in place (idempotent)."""
    if not STATE.installed:
        torch.nn.Module.__call__ = _patched_call  # type: ignore[method-assign]
        STATE.installed = True
        courtesy.watch(_program_busy)
        from honed.backend.cuda_graphs import guard_synchronize

        guard_synchronize(True)  # the program's device-wide syncs wait for JIT's captures


def uninstall() -> None:
    """Put torch's own __call__ back (idempotent)."""
    if STATE.installed:
        torch.nn.Module.__call__ = _ORIGINAL_CALL  # type: ignore[method-assign]
        STATE.installed = False
        courtesy.watch(None)
        from honed.backend.cuda_graphs import guard_synchronize

        guard_synchronize(False)


def enable() -> None:
    """Discover and tune every module that runs from now on."""
    STATE.enabled = True
    install()
    # JIT's tunes install winners beside the program's calls, on threads of their own.
    from honed.backend import _aoti_direct

    _aoti_direct.beside_a_program(True)
    if _flags.jit_report and not STATE.report_registered:
        STATE.report_registered = True
        background.on_exit(_report)  # after the running tune was cancelled, so it is in it
    log.info("honed.jit: JIT tuning enabled")


def disable() -> None:
    """Stop JIT: every module runs its original forward again (what was learned stays readable)."""
    STATE.enabled = False
    STATE.opted_in = weakref.WeakSet()
    uninstall()
    from honed.backend import _aoti_direct
    from honed.jit import early

    early.close()

    _aoti_direct.beside_a_program(False)
    _restore_cores()
    log.info("honed.jit: JIT tuning disabled")


def reset() -> None:
    """Forget every discovered module and the history (for tests and long-lived processes).

    A tune running in the background is cancelled and waited for first, and a live trial's
    verdict being worked out; the objects JIT froze out of the garbage collector are given back
    to it.
    """
    from honed.jit import live

    disable()
    live.wait_for_verdicts()
    background.cancel_and_wait()
    background.thaw()
    STATE.nodes = weakref.WeakKeyDictionary()
    STATE.roots = []
    STATE.stack = []
    STATE.grad_warned = set()
    clear_history()
    background.clear_records()


def opt_in(value: Any) -> None:
    """Tune the modules in ``value`` (a module, or an object holding modules) when they run."""
    seen: set[int] = set()

    def visit(v: Any, depth: int) -> None:
        if id(v) in seen or depth > 3:
            return
        seen.add(id(v))
        if isinstance(v, torch.nn.Module):
            STATE.opted_in.add(v)
            return
        items = v if isinstance(v, list | tuple) else getattr(v, "__dict__", {}).values()
        for item in items:
            visit(item, depth + 1)

    visit(value, 0)
    if len(STATE.opted_in):
        install()


def _report() -> None:
    """HONED_JIT_REPORT=1: the hierarchy and the history, on stderr, when the program ends."""
    lines = [render(STATE.roots), "JIT Tuning History:", *(f"  {s}" for s in steps())]
    lines += [
        f"  Still running at exit: {r.line()}"
        for r in background.records()
        if r.status == "running"
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Run a block with JIT out of the way: modules run their originals, nothing is counted."""
    STATE.bypass += 1
    try:
        yield
    finally:
        STATE.bypass -= 1


def roots() -> list[Node]:
    return list(STATE.roots)


__all__ = [
    "STATE",
    "disable",
    "enable",
    "install",
    "opt_in",
    "paused",
    "reset",
    "roots",
    "uninstall",
]
