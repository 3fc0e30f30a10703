"""src/honed/backend/torch_inductor_aot.py: AOTInductor: torch.export, then a compiled .pt2.

The module is exported with ``torch.export.export`` (dynamic axes from the tuned profile as
``torch.export.Dim``s), compiled ahead of time with ``torch._inductor.aoti_compile_and_package``
and loaded with ``torch._inductor.aoti_load_package``. The package is stored in the artifact as
``model.pt2`` and loads back without compiling.

Calling convention. What is exported is a small wrapper whose ``forward(*tensors)`` takes the
tensor inputs in flatten order of ``(args, kwargs)`` (the order the engine's profile uses);
non-tensor inputs are baked in as constants, as torch.export does anyway. So the package has the
plainest signature there is (what the C++ runtime calls too), and keyword arguments work the
same on every torch version. The returned callable flattens ``(args, kwargs)``, checks the
inputs against what was compiled (AOTInductor itself does not check shapes: a shape outside
the compiled range would read out of bounds) and runs the package.

Autocast: the wrapper enters ``torch.autocast`` inside its forward, which torch.export records
(``wrap_with_autocast``) and Inductor compiles; floating outputs are cast back to the dtype
eager returns, so callers see eager's dtypes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from honed.backend.base import Availability, Backend, BackendConfig, GraphInfo, Sample
from honed.backend.torch_inductor import cpu_available
from honed.errors import ConfigError, InputError, TuneError

log = logging.getLogger("honed")

PAYLOAD_PACKAGE = "model.pt2"
PAYLOAD_CALLING = "calling.json"
_CALLING_FORMAT = 1


@dataclasses.dataclass
class TorchInductorAotBackendConfig(BackendConfig):
    # AOTInductor settings, passed as ``inductor_configs`` to aoti_compile_and_package (e.g.
    # {"max_autotune": True}); None uses Inductor's defaults.
    options: dict[str, Any] | None = None
    # None: dynamic axes where the tuned profile has them, else static; True: the profile's
    # dynamic axes, and an error when it has none; False: static at the example's shapes.
    dynamic: bool | None = None
    # torch.export's strict mode (trace with TorchDynamo) instead of the default non-strict one.
    strict: bool = False
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None
    # Check every call's tensors against the compiled shapes, dtypes and devices (AOTInductor
    # does not; a wrong shape would read out of bounds). Costs a few microseconds per call.
    check_inputs: bool = True

    def __post_init__(self) -> None:
        if self.autocast_dtype is not None and self.autocast_dtype not in (
            torch.float16,
            torch.bfloat16,
        ):
            raise ConfigError(
                f"autocast_dtype={self.autocast_dtype} is not supported; use torch.float16 or "
                "torch.bfloat16"
            )
        if self.options is not None and not isinstance(self.options, dict):
            raise ConfigError(
                "TorchInductorAotBackendConfig: options must be a dict of Inductor settings, "
                f"got {type(self.options).__name__}"
            )


def aot_available() -> Availability:
    """torch.export and AOTInductor present, and a C++ compiler (its wrapper is always C++)."""
    try:
        import torch._inductor
        import torch.export
    except Exception as e:  # an import failure is a reason, not a crash
        return Availability(
            False, f"torch.export/AOTInductor cannot be imported: {e}", "reinstall torch"
        )
    missing = [
        name
        for owner, name in (
            (torch.export, "export"),
            (torch.export, "Dim"),
            (torch._inductor, "aoti_compile_and_package"),
            (torch._inductor, "aoti_load_package"),
        )
        if not hasattr(owner, name)
    ]
    if missing:
        return Availability(
            False,
            f"torch {torch.__version__} lacks {', '.join(missing)}",
            "install torch 2.6 or newer",
        )
    compiler = cpu_available()
    if not compiler:
        return Availability(
            False, "AOTInductor compiles a C++ wrapper and no C++ compiler was found", compiler.fix
        )
    return Availability(True)


# -- the calling convention --------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TensorGuard:
    """What one tensor input must look like: dtype, device type and per-axis [lo, hi].

    ``groups[j]`` names the shared dimension of axis j (axes with the same group must be equal,
    as the compiled code assumes), or is "" for an unshared axis.
    """

    dtype: str
    device: str
    lo: tuple[int, ...]
    hi: tuple[int, ...]
    groups: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Calling:
    """How a call's ``(args, kwargs)`` become the package's flat tensor inputs."""

    num_leaves: int
    tensor_positions: tuple[int, ...]
    guards: tuple[TensorGuard, ...]
    constants: dict[int, Any]  # non-tensor leaf position -> value it was compiled for
    in_spec: str | None  # torch pytree treespec_dumps of (args, kwargs), when serializable

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": _CALLING_FORMAT,
                "num_leaves": self.num_leaves,
                "tensor_positions": list(self.tensor_positions),
                "guards": [dataclasses.asdict(g) for g in self.guards],
                "constants": [[i, v] for i, v in self.constants.items() if _is_json_scalar(v)],
                "in_spec": self.in_spec,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Calling:
        data = json.loads(text)
        if data.get("format") != _CALLING_FORMAT:
            raise InputError(
                f"{PAYLOAD_CALLING} has format {data.get('format')!r}; this honed reads format "
                f"{_CALLING_FORMAT}: re-tune and save with this honed version"
            )
        guards = tuple(
            TensorGuard(g["dtype"], g["device"], tuple(g["lo"]), tuple(g["hi"]), tuple(g["groups"]))
            for g in data["guards"]
        )
        return cls(
            int(data["num_leaves"]),
            tuple(int(i) for i in data["tensor_positions"]),
            guards,
            {int(i): v for i, v in data["constants"]},
            data.get("in_spec"),
        )


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


class AotCompiled:
    """A loaded AOTInductor package, called like the module it was compiled from."""

    def __init__(
        self, runner: Any, package: bytes, calling: Calling, check_inputs: bool = True
    ) -> None:
        from torch.utils._pytree import tree_structure, treespec_loads

        self.runner = runner
        self.package = package
        self.calling = calling
        self.check_inputs = check_inputs
        self._in_spec = treespec_loads(calling.in_spec) if calling.in_spec is not None else None
        n = len(calling.tensor_positions)
        # Plain: the module takes n positional tensors and nothing else (no flattening needed).
        self._plain = calling.num_leaves == n and self._in_spec == tree_structure(((0,) * n, {}))
        self._checks = [_TensorCheck(g) for g in calling.guards]
        # The fast path skips AOTICompiledModel.__call__, which parses its call spec as JSON on
        # every call; its inputs are exactly our flat tensors.
        loader: Any = getattr(runner, "loader", None)
        self._boxed_run: Callable[[list[torch.Tensor]], list[Any]] | None = None
        self._out_spec: Any = None
        self._single_output = False
        if hasattr(loader, "boxed_run") and hasattr(loader, "get_call_spec"):
            self._boxed_run = loader.boxed_run
            self._out_spec = treespec_loads(loader.get_call_spec()[1])
            self._single_output = bool(self._out_spec.is_leaf())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._plain and not kwargs and len(args) == len(self._checks):
            tensors = list(args)
        else:
            tensors = self._flatten(args, kwargs)
        if self.check_inputs:
            _check_tensors(self._checks, tensors)
        if self._boxed_run is None:
            return self.runner(*tensors)
        outs = self._boxed_run(tensors)
        if self._single_output:
            return outs[0]
        from torch.utils._pytree import tree_unflatten

        return tree_unflatten(outs, self._out_spec)

    def _flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        from torch.utils._pytree import tree_flatten

        leaves, spec = tree_flatten((args, kwargs))
        calling = self.calling
        if len(leaves) != calling.num_leaves or (
            self._in_spec is not None and spec != self._in_spec
        ):
            raise InputError(
                "AOTInductor package called with inputs structured differently from the ones it "
                f"was compiled for (expected {self._in_spec or f'{calling.num_leaves} leaves'}, "
                f"got {spec}); call it like the recorded samples or tune with samples like these"
            )
        if self.check_inputs:
            for pos, value in calling.constants.items():
                if leaves[pos] != value:
                    raise InputError(
                        f"AOTInductor package was compiled for non-tensor input {pos} == "
                        f"{value!r}, got {leaves[pos]!r}; tune with samples that use this value"
                    )
        return [leaves[i] for i in calling.tensor_positions]


class _TensorCheck:
    """A TensorGuard prepared for checking calls quickly."""

    def __init__(self, guard: TensorGuard) -> None:
        self.guard = guard
        self.dtype = getattr(torch, guard.dtype.removeprefix("torch."))
        self.device = guard.device
        self.static = guard.lo == guard.hi
        self.shared = tuple((a, g) for a, g in enumerate(guard.groups) if g)


def _check_tensors(checks: list[_TensorCheck], tensors: list[Any]) -> None:
    sizes: dict[str, int] = {}
    for index, (t, c) in enumerate(zip(tensors, checks, strict=True)):
        if not isinstance(t, torch.Tensor):
            raise InputError(
                f"AOTInductor package: input {index} must be a tensor, got {type(t).__name__}"
            )
        g = c.guard
        shape = tuple(t.shape)
        if t.dtype is not c.dtype or t.device.type != c.device or len(shape) != len(g.lo):
            raise InputError(
                f"AOTInductor package: tensor input {index} is {t.dtype} {shape} on {t.device}, "
                f"but was compiled for {g.dtype} of rank {len(g.lo)} on {g.device}"
            )
        if c.static and shape == g.lo:
            continue
        for axis, size in enumerate(shape):
            if not g.lo[axis] <= size <= g.hi[axis]:
                raise InputError(
                    f"AOTInductor package: tensor input {index} has shape {shape}; axis {axis} "
                    f"must be in [{g.lo[axis]}, {g.hi[axis]}] as compiled; tune with samples "
                    "that cover this size"
                )
        for axis, group in c.shared:
            if sizes.setdefault(group, shape[axis]) != shape[axis]:
                raise InputError(
                    f"AOTInductor package: axis {axis} of tensor input {index} is {shape[axis]} "
                    f"but other axes of the shared dimension {group!r} are {sizes[group]}; it "
                    "was compiled for them being equal"
                )


# -- the backend -------------------------------------------------------------------------------
class TorchInductorAotBackend(Backend):
    """Exports the module with torch.export and compiles it ahead of time with AOTInductor."""

    config_class = TorchInductorAotBackendConfig
    portability = 2
    build_cost = 3
    saves_payload = True
    native_payload = True  # model.pt2 holds the compiled .so
    cpp_runnable = True  # cpp/runtime loads model.pt2 + calling.json with libtorch
    config: TorchInductorAotBackendConfig

    @classmethod
    def available(cls) -> Availability:
        try:
            return aot_available()
        except Exception as e:  # never raise from available()
            return Availability(False, f"checking AOTInductor failed: {e}", "reinstall torch")

    def build_graph(
        self, module: torch.nn.Module, example_inputs: list[Sample], graph: GraphInfo
    ) -> Callable[..., Any]:
        if not example_inputs:
            raise InputError("TorchInductorAotBackend needs at least one recorded sample")
        cfg = self.config
        plan = _plan(example_inputs, graph, cfg.dynamic)
        wrapper = _FlatForward(module, plan.calling, plan.spec, plan.template)
        with torch.no_grad():
            eager_out = module(*plan.example.args, **plan.example.kwargs)
        if cfg.autocast_enabled:
            wrapper.set_autocast(graph.device.type, cfg.autocast_dtype or torch.bfloat16, eager_out)
        _check_probe(graph.device.type)  # known not to load here: fail before compiling
        exported = _export(wrapper, plan, cfg.strict, type(module).__name__)
        package = _compile(exported, cfg.options)
        runner = _load(package, graph.device.type)
        return AotCompiled(runner, package, plan.calling, cfg.check_inputs)

    def export_payload(self, fn: Callable[..., Any]) -> dict[str, bytes]:
        if not isinstance(fn, AotCompiled):
            raise TypeError(
                f"TorchInductorAotBackend.export_payload takes what its build returned, got "
                f"{type(fn).__name__}"
            )
        return {PAYLOAD_PACKAGE: fn.package, PAYLOAD_CALLING: fn.calling.to_json().encode()}

    def load_payload(
        self, files: dict[str, bytes], module: torch.nn.Module, graph: GraphInfo
    ) -> Callable[..., Any]:
        del module  # the package holds the weights and the shapes it serves
        missing = [n for n in (PAYLOAD_PACKAGE, PAYLOAD_CALLING) if n not in files]
        if missing:
            raise InputError(
                f"TorchInductorAotBackend payload lacks {missing}; the artifact is incomplete: "
                "save it again"
            )
        package = files[PAYLOAD_PACKAGE]
        calling = Calling.from_json(files[PAYLOAD_CALLING].decode())
        runner = _load(package, graph.device.type)
        return AotCompiled(runner, package, calling, self.config.check_inputs)


# -- export plan: example input, Dims, guards ----------------------------------------------------
@dataclasses.dataclass
class _Plan:
    example: Sample
    spec: Any  # pytree spec of the example's (args, kwargs)
    template: list[Any]  # its leaves, tensors replaced by None
    tensors: list[torch.Tensor]  # the example's tensor inputs (resized where needed)
    dims: list[dict[int, Any] | None]  # dynamic_shapes entry per tensor input
    calling: Calling


def _plan(samples: list[Sample], graph: GraphInfo, dynamic: bool | None) -> _Plan:
    from torch.utils._pytree import tree_flatten

    per_sample = [tree_flatten((s.args, s.kwargs)) for s in samples]
    leaves, spec = per_sample[0]
    positions = tuple(i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor))
    shapes = [[tuple(leaves_i[p].shape) for p in positions] for leaves_i, _ in per_sample]
    lo, hi = _bounds(graph, shapes)
    has_dynamic = lo != hi
    if dynamic is True and not has_dynamic:
        raise ConfigError(
            "TorchInductorAotBackend(dynamic=True): the tuned profile has no dynamic axis; tune "
            "with samples of several sizes (or honed.tune(batch_sizes=...)), or leave dynamic=None"
        )
    index = _example_index(graph, shapes)
    example_leaves = per_sample[index][0]
    tensors = [example_leaves[p] for p in positions]
    if dynamic is False or not has_dynamic:
        lo = hi = [tuple(t.shape) for t in tensors]
    groups = _groups(graph, lo, hi, shapes)
    tensors = _avoid_zero_one(tensors, hi, groups)
    dims = _dims(lo, hi, groups)
    template = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in example_leaves]
    guards = tuple(
        TensorGuard(str(t.dtype), t.device.type, lo[i], hi[i], groups[i])
        for i, t in enumerate(tensors)
    )
    constants = {i: leaf for i, leaf in enumerate(template) if i not in positions}
    calling = Calling(len(template), positions, guards, constants, _dumps(spec))
    return _Plan(samples[index], spec, template, tensors, dims, calling)


def _bounds(
    graph: GraphInfo, shapes: list[list[tuple[int, ...]]]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """Per tensor input, the per-axis min and max: the profile's, else the samples'."""
    n = len(shapes[0])
    if graph.min_shapes and graph.max_shapes:
        if len(graph.min_shapes) != n or len(graph.max_shapes) != n:
            raise InputError(
                f"the tuned profile has {len(graph.min_shapes)} tensor inputs but the samples "
                f"have {n} (in flatten order of (args, kwargs)); this is a honed bug: report it"
            )
        return list(graph.min_shapes), list(graph.max_shapes)
    lo = [tuple(min(s[i][a] for s in shapes) for a in range(len(shapes[0][i]))) for i in range(n)]
    hi = [tuple(max(s[i][a] for s in shapes) for a in range(len(shapes[0][i]))) for i in range(n)]
    return lo, hi


def _example_index(graph: GraphInfo, shapes: list[list[tuple[int, ...]]]) -> int:
    """Trace on the sample at the profile's opt shapes, else the largest one."""
    opt = [tuple(s) for s in graph.opt_shapes]
    for i, s in enumerate(shapes):
        if s == opt:
            return i
    sizes = [sum(_numel(t) for t in s) for s in shapes]
    return sizes.index(max(sizes))


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _groups(
    graph: GraphInfo,
    lo: list[tuple[int, ...]],
    hi: list[tuple[int, ...]],
    shapes: list[list[tuple[int, ...]]],
) -> list[tuple[str, ...]]:
    """A shared-dimension name per dynamic axis ("" for static ones).

    With the profile's axis names, axes named alike share one Dim. Without them, dynamic axes
    with the same range and the same size in every sample share one (torch.export refuses
    separate Dims for axes the model makes equal, e.g. the batch axes of two added inputs).
    """
    seen: dict[tuple[Any, ...], str] = {}
    out: list[tuple[str, ...]] = []
    for i, (lo_t, hi_t) in enumerate(zip(lo, hi, strict=True)):
        row = []
        for a, (low, high) in enumerate(zip(lo_t, hi_t, strict=True)):
            if low == high:
                row.append("")
            elif _axis_name(graph, i, a):
                row.append(_identifier(_axis_name(graph, i, a)))
            else:
                key = (low, high, tuple(s[i][a] for s in shapes))
                row.append(seen.setdefault(key, f"in{i}_axis{a}"))
        out.append(tuple(row))
    return out


def _axis_name(graph: GraphInfo, leaf: int, axis: int) -> str:
    names = graph.axis_names
    return names[leaf][axis] if leaf < len(names) and axis < len(names[leaf]) else ""


def _identifier(name: str) -> str:
    ident = re.sub(r"\W", "_", name)
    return ident if ident and not ident[0].isdigit() else f"d_{ident}"


def _avoid_zero_one(
    tensors: list[torch.Tensor],
    hi: list[tuple[int, ...]],
    groups: list[tuple[str, ...]],
) -> list[torch.Tensor]:
    """torch.export specializes a dynamic axis traced at size 0 or 1: trace such axes at 2.

    The compiled code still serves the profile's min (Dim(min=1) stays a valid range); only the
    example is enlarged, by repeating its rows, so integer inputs such as token ids stay valid.
    """
    target: dict[str, int] = {}
    for i, t in enumerate(tensors):
        for a, size in enumerate(t.shape):
            if groups[i][a] and size < 2 and hi[i][a] >= 2:
                target[groups[i][a]] = 2
    if not target:
        return tensors
    out = []
    for i, t in enumerate(tensors):
        for a in range(t.dim()):
            group = groups[i][a]
            if group in target and t.shape[a] != target[group]:
                if t.shape[a] == 0:
                    raise InputError(
                        f"tensor input {i} has an empty axis {a}; torch.export needs an example "
                        "with at least one element there: record a non-empty sample"
                    )
                index = torch.arange(target[group], device=t.device) % t.shape[a]
                t = t.index_select(a, index)
        out.append(t)
    return out


def _dims(
    lo: list[tuple[int, ...]], hi: list[tuple[int, ...]], groups: list[tuple[str, ...]]
) -> list[dict[int, Any] | None]:
    """torch.export dynamic_shapes per tensor input: one Dim object per shared dimension."""
    from torch.export import Dim

    ranges: dict[str, tuple[int, int]] = {}
    for i, row in enumerate(groups):
        for a, group in enumerate(row):
            if group:
                low, high = ranges.get(group, (lo[i][a], hi[i][a]))
                # Axes of one name with different ranges: the shared Dim takes the common range.
                ranges[group] = (max(low, lo[i][a]), min(high, hi[i][a]))
    made = {group: Dim(group, min=low, max=high) for group, (low, high) in ranges.items()}
    return [{a: made[g] for a, g in enumerate(row) if g} or None for row in groups]


def _dumps(spec: Any) -> str | None:
    from torch.utils._pytree import treespec_dumps

    try:
        return str(treespec_dumps(spec))
    except Exception:  # a custom pytree node without a serializable name: check leaves only
        log.debug("honed: input treespec %s is not serializable", spec, exc_info=True)
        return None


# -- export, compile, load ----------------------------------------------------------------------
class _FlatForward(torch.nn.Module):
    """``forward(*tensors)`` -> ``module(*args, **kwargs)``, optionally under autocast."""

    def __init__(
        self, module: torch.nn.Module, calling: Calling, spec: Any, template: list[Any]
    ) -> None:
        super().__init__()
        self.inner = module
        self._positions = calling.tensor_positions
        self._spec = spec
        self._template = template
        self._autocast: tuple[str, torch.dtype] | None = None
        self._out_dtypes: list[torch.dtype | None] = []

    def set_autocast(self, device_type: str, dtype: torch.dtype, eager_out: Any) -> None:
        from torch.utils._pytree import tree_leaves

        self._autocast = (device_type, dtype)
        self._out_dtypes = [
            t.dtype if isinstance(t, torch.Tensor) else None for t in tree_leaves(eager_out)
        ]

    def forward(self, *tensors: torch.Tensor) -> Any:
        from torch.utils._pytree import tree_flatten, tree_unflatten

        leaves = list(self._template)
        for pos, t in zip(self._positions, tensors, strict=True):
            leaves[pos] = t
        args, kwargs = tree_unflatten(leaves, self._spec)
        if self._autocast is None:
            return self.inner(*args, **kwargs)
        device_type, dtype = self._autocast
        with torch.autocast(device_type=device_type, dtype=dtype):
            out = self.inner(*args, **kwargs)
        flat, out_spec = tree_flatten(out)
        cast = [
            t.to(want)
            if isinstance(t, torch.Tensor) and want is not None and t.dtype != want
            else t
            for t, want in zip(flat, self._out_dtypes, strict=False)
        ]
        return tree_unflatten(cast, out_spec)


def _export(wrapper: _FlatForward, plan: _Plan, strict: bool, model: str) -> Any:
    import torch.export

    try:
        with torch.no_grad():
            return torch.export.export(
                wrapper, tuple(plan.tensors), dynamic_shapes=(tuple(plan.dims),), strict=strict
            )
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TuneError(
            f"torch.export could not capture {model} as one graph ({type(e).__name__}: {first}); "
            "AOTInductor needs a single graph: replace data-dependent Python control flow with "
            "torch.cond or tensor ops, or use TorchInductorBackend, which allows graph breaks"
        ) from e


def _link_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """The user's options plus an explicit dynamic libstdc++ for the generated wrapper.

    On some toolchains (seen: Ubuntu 24.04, GCC 13, torch 2.11.0+cu130) the wrapper.so that
    AOTInductor links picks up the static libstdc++.a, so it carries a private copy of the C++
    runtime next to the process's shared one. Loading a CUDA package then dies with a segfault in
    std::regex (the two copies disagree about locale facets). Naming ``libstdc++.so.6`` as a
    library resolves every C++ runtime symbol from the shared library before the linker's implicit
    ``-lstdc++`` is reached, so no static copy is linked. Only done where the file can be found.
    """
    merged = dict(options or {})
    if sys.platform.startswith("linux") and _shared_libstdcxx_found():
        libs = list(merged.get("aot_inductor.custom_op_libs") or [])
        if _LIBSTDCXX not in libs:
            libs.append(_LIBSTDCXX)
        merged["aot_inductor.custom_op_libs"] = libs
    return merged


_LIBSTDCXX = ":libstdc++.so.6"


@functools.cache
def _shared_libstdcxx_found() -> bool:
    """Whether the C++ compiler Inductor uses resolves libstdc++.so.6 (it is GCC's runtime)."""
    import subprocess

    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        done = subprocess.run(
            [get_cpp_compiler(), "-print-file-name=libstdc++.so.6"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except Exception:
        return False
    found = done.stdout.strip()
    # An unknown file is echoed back as its bare name; a found one comes back as a path.
    return done.returncode == 0 and os.path.isabs(found) and os.path.exists(found)


def _compile(exported: Any, options: dict[str, Any] | None) -> bytes:
    import torch._inductor

    with tempfile.TemporaryDirectory(prefix="honed-aot-") as tmp:
        path = Path(tmp) / PAYLOAD_PACKAGE
        try:
            with _vec_isa_known():
                torch._inductor.aoti_compile_and_package(
                    exported,
                    package_path=str(path),
                    inductor_configs=_link_options(options),
                )
        except Exception as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TuneError(
                f"AOTInductor could not compile the exported graph ({type(e).__name__}: {first}); "
                "check the C++ compiler (CXX) and the options given, or use TorchInductorBackend"
            ) from e
        return path.read_bytes()


# -- torch's CPU vector-ISA check, remembered ------------------------------------------------------
# Every AOTInductor compile asks torch which CPU vector ISAs (AVX2, AVX-512, ...) work here; the
# first time in a process torch compiles a test program per ISA the CPU's flags name and imports
# each in a child interpreter: 17.8 s of an 86 s build on the H100 machine, paid again by every
# worker process (9.1 s with this shortcut: torch tests the AMX ISAs regardless of the setting).
# Once every flagged ISA has passed (same torch, interpreter, compiler and CPU flags), later
# processes tell torch so (``cpp.vec_isa_ok``) and skip the test builds; an ISA that failed is
# never remembered, so torch keeps checking on such machines. A user's own setting of
# ``cpp.vec_isa_ok`` (TORCHINDUCTOR_VEC_ISA_OK) always wins.
def _flagged_vec_isas() -> list[str] | None:
    """The vector ISAs torch would test here (those the CPU's flags name), or None off x86."""
    import platform

    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        return None
    try:
        from torch._inductor import cpu_vec_isa

        flags = cpu_vec_isa.x86_isa_checker()
        return [
            str(isa)
            for isa in cpu_vec_isa.supported_vec_isa_list
            if all(flag in flags for flag in str(isa).split())
        ]
    except Exception:  # another torch layout: no shortcut
        return None


def _verdict_file(name: str, *key: Any) -> Path | None:
    """Where a remembered success lives in the cache folder (None with the cache off), keyed by
    ``key`` and everything that decides how packages are built and loaded here."""
    from honed import __version__, config

    if not config.cache_enabled:
        return None
    parts = [__version__, torch.__version__, sys.executable, os.environ.get("CXX", ""), *key]
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]
    return Path(config.cache_dir) / "aoti-probe" / f"{name}-{digest}.ok"


def _remember(verdict: Path, text: str) -> None:
    with contextlib.suppress(OSError):  # a read-only cache only costs time
        verdict.parent.mkdir(parents=True, exist_ok=True)
        verdict.write_text(text + "\n")


@contextlib.contextmanager
def _vec_isa_known() -> Iterator[None]:
    """Compile with torch's ISA check skipped when an earlier process saw every ISA pass."""
    from torch._inductor import config as inductor_config

    flagged = _flagged_vec_isas()
    verdict = _verdict_file("vec-isa", flagged) if flagged else None
    if verdict is None or inductor_config.cpp.vec_isa_ok is not None:
        yield
        return
    if verdict.exists():
        with inductor_config.patch({"cpp.vec_isa_ok": True}):
            yield
        return
    yield
    try:
        from torch._inductor import cpu_vec_isa

        if cpu_vec_isa.valid_vec_isa_list.cache_info().currsize == 0:
            return  # torch did not check this time: nothing learned, and checking costs
        passed = [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()]  # torch's cached answer
    except Exception:
        return
    if passed == flagged:
        _remember(verdict, f"vector ISAs that build here: {' '.join(passed)}")


def _load(package: bytes, device_type: str) -> Any:
    """Load a .pt2 from bytes; the loader extracts what it needs, so the file can go after."""
    with tempfile.TemporaryDirectory(prefix="honed-aot-") as tmp:
        path = Path(tmp) / PAYLOAD_PACKAGE
        path.write_bytes(package)
        _probe_loading(path, device_type)
        return load_runner(str(path), device_type)


def load_runner(path: str, device_type: str) -> Any:
    """AOTInductor's package loader, without torch's device-information check.

    ``torch._inductor.aoti_load_package`` first compares the package's metadata with this
    machine's (only to log a warning), and finding this CPU's vector ISA compiles and loads
    about ten test programs in child processes: 43 s of a 50 s ``honed.load`` on the H100
    (torch 2.11). honed checks the environment itself (the artifact's fingerprint) and loads
    with libtorch's loader directly, as the C++ runtime does; torch's function is the fallback
    where that loader's Python binding differs.
    """
    import torch._inductor

    try:
        from torch._inductor.package import AOTICompiledModel

        index = torch.cuda.current_device() if device_type == "cuda" else -1
        loader = torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index)
    except (ImportError, AttributeError, TypeError):
        return torch._inductor.aoti_load_package(path)
    return AOTICompiledModel(loader)


# AOTInductor's package loader can kill the whole process with a segfault (seen with torch
# 2.11.0+cu130 on an H100 machine before _link_options existed: a static libstdc++ in the
# wrapper). Any such crash must stay out of the user's process, so the first package of each
# device type is loaded in a child process first; a crash there becomes an error here. Results
# are kept per process (device type -> "" (loads) or the failure), and a success also on disk
# under the cache folder, keyed by everything that decides how packages are built and loaded
# (honed, torch, the interpreter, the C++ compiler), so later processes skip the probe: it costs
# a fresh interpreter importing torch, which dominated honed.load on the H100. A failure is never
# kept on disk: a repaired environment is probed again.
_PROBE_CODE = (
    "import sys; from honed.backend.torch_inductor_aot import load_runner; "
    "load_runner(sys.argv[1], sys.argv[2])"
)
_PROBED: dict[str, str] = {}


def _probe_loading(path: Path, device_type: str) -> None:
    if device_type not in _PROBED:  # once per process and device type
        _PROBED[device_type] = _probe(path, device_type)
    _check_probe(device_type)


def _probe(path: Path, device_type: str) -> str:
    """ "" when packages of ``device_type`` load here (known from disk, or a child loads this
    one), else how the child failed."""
    import subprocess

    verdict = _verdict_file(device_type)
    if verdict is not None and verdict.exists():
        return ""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE, str(path), device_type],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return "timed out after 600 s"
    rc = done.returncode
    last = (done.stderr.strip().splitlines() or [""])[-1]
    if rc < 0:
        return f"crashed with signal {-rc}"
    if rc > 0:
        return f"failed (exit code {rc}: {last})"
    if verdict is not None:
        _remember(verdict, f"loads: torch {torch.__version__}, {sys.executable}")
    return ""


def _check_probe(device_type: str) -> None:
    """Raise when a probe found that packages of this device type cannot be loaded here."""
    failure = _PROBED.get(device_type)
    if failure:
        raise TuneError(
            f"loading an AOTInductor {device_type} package {failure} in a probe process, so "
            f"it is not loaded here: this torch build ({torch.__version__}) cannot run "
            "AOTInductor packages on this machine; use another backend, or another torch build"
        )
