"""src/honed/pipeline/planning.py: the candidates a graph's tune tries, their order, the skips.

Cheap first (docs/tuning.md): candidates run in the order of their expected build cost
(``Backend.expected_build_cost()``: eager and CUDA-graph captures first, they set the bar in
seconds; long compiles last), the strategy's order among equals. Five rules leave a candidate
out, and the report lists it as "not tried" with the rule's reason:

- same build: a candidate whose ``build_identity`` for this graph equals an earlier one's (for
  example Inductor with ``dynamic=None`` and with ``dynamic=False`` on a graph without dynamic
  axes) would build the very same thing;
- precision: a reduced-precision candidate that costs a compile is not tried when a cheap
  candidate (build cost 0 or 1) in the same precision was rejected for its outputs: the compiled
  one computes in that precision too. It waits for those cheap candidates to finish;
- AOT covers JIT on CPU (default candidates only): Inductor's JIT variants in its default mode
  are not tried when AOTInductor, in the same precision, built and passed for the graph. Both
  compile the graph with Inductor's C++ code generator; what differs is the call path, and
  AOTInductor's has no guards and no Python wrapper. On the 2-core CPU machine AOTInductor was
  the faster of them (bench/results/tune_cost/, the exhaustive runs), and the JIT variants cost
  two of the three compiles of a default CPU tune. The JIT variants wait for AOTInductor and run
  when it failed or was rejected;
- a package covers a capture beside a program (JIT on a GPU, ``captures_wait``): a capture of
  eager's own kernels (``Backend.stands_in``, CUDA graphs over eager) is not built where a
  candidate that installs from a package (``Backend.saves_payload``) with at least its expected
  gain passed. Beside a calling program such a capture is left out of the program's process
  once a package is in (honed.pipeline.graph_tuner), so its build, whose warm-ups, recording and
  check run eager's forward on the program's GPU, would share that GPU with the program's calls
  for nothing. It waits for those packages and is built when none passed;
- a package covers a package of a lower expected gain beside a program (``captures_wait``
  again): of the candidates that install from a package, one is not built where another with a
  higher expected gain passed. A package's build compiles on the program's host while its
  load, check, warm-ups and capture run on the program's GPU, and one whose check ran much
  slower than an installed one's stays out of the program's process (honed.pipeline.graph_tuner);
  the lower one (AOTInductor in fp32 beside the one with bf16 weights) is built where the higher
  one failed or was rejected. An AOT tune still builds both.

The time budget is the sixth way a candidate ends up "not tried" (honed.pipeline.graph_tuner).
"""

from __future__ import annotations

import dataclasses
import json

from honed.backend.base import Backend, GraphInfo

CHEAP = 1  # build costs up to this one are "cheap" (the precision rule's probes)


@dataclasses.dataclass
class Planned:
    """One candidate of the plan: its place, its expected cost, and why it is skipped if so."""

    backend: Backend
    cost: int
    precision: str
    skip: str = ""  # the reason it is not tried ("" while it is)
    # Candidates whose passing leaves this one out (the AOT-covers-JIT rule, a package covers a
    # capture); it waits for them.
    covered_by: list[Planned] = dataclasses.field(default_factory=list)


def _identity(backend: Backend, graph: GraphInfo) -> str:
    try:
        return json.dumps(backend.build_identity(graph), sort_keys=True, default=str)
    except Exception:  # an identity that cannot be computed is unique: never a duplicate
        return f"unique:{id(backend)}"


def plan(
    backends: list[Backend],
    graph: GraphInfo,
    baseline: Backend | None = None,
    defaults: bool = False,
    captures_wait: bool = False,
) -> list[Planned]:
    """The candidates in the order they run, duplicates marked; the baseline is left out.
    ``defaults``: the list is honed's defaults (not the user's), so the AOT-covers-JIT rule
    applies; ``captures_wait``: beside a calling program on a GPU that takes no stand-ins, so
    packages cover captures."""
    seen: dict[str, str] = {}
    if baseline is not None:
        seen[_identity(baseline, graph)] = ""
    out: list[Planned] = []
    for backend in backends:
        identity = _identity(backend, graph)
        item = Planned(backend, _cost(backend), _precision(backend))
        if identity in seen:
            if not seen[identity]:
                continue  # the baseline itself (eager with its default config)
            item.skip = f"same build as {seen[identity]} for this graph"
        else:
            seen[identity] = backend.name
        out.append(item)
    if defaults and graph.device.type == "cpu":
        _cover_jit_with_aot(out)
    if captures_wait:
        _cover_captures_with_packages(out)
        _cover_packages_with_packages(out)
    # Stable: the strategy's order among equal costs; a covered candidate after its covers.
    out.sort(key=lambda p: (max([p.cost, *(c.cost for c in p.covered_by)]), bool(p.covered_by)))
    return out


def _cover_jit_with_aot(items: list[Planned]) -> None:
    from honed.backend.torch_inductor import TorchInductorBackend
    from honed.backend.torch_inductor_aot import TorchInductorAotBackend

    for item in items:
        b = item.backend
        if item.skip or type(b) is not TorchInductorBackend:
            continue
        if b.config.mode not in (None, "default") or b.config.autocast_enabled:
            continue
        item.covered_by = [
            p
            for p in items
            if type(p.backend) is TorchInductorAotBackend
            and not p.skip
            and p.precision == item.precision
            and not p.backend.config.autocast_enabled
        ]


def _cover_captures_with_packages(items: list[Planned]) -> None:
    for item in items:
        if item.skip or not item.backend.stands_in:
            continue
        gain = _gain(item.backend)
        item.covered_by += [
            p
            for p in items
            if p.backend.saves_payload
            and not p.backend.stands_in
            and not p.skip
            and _gain(p.backend) >= gain - 1e-9  # gains are products of rough factors
        ]


def _cover_packages_with_packages(items: list[Planned]) -> None:
    packages = [p for p in items if p.backend.saves_payload and not p.backend.stands_in]
    for item in packages:
        if item.skip:
            continue
        gain = _gain(item.backend)
        # strictly higher: equal gains cover neither way, so no two packages wait for each other
        item.covered_by += [p for p in packages if not p.skip and _gain(p.backend) > gain + 1e-9]


def _gain(backend: Backend) -> float:
    try:
        return float(backend.expected_gain)
    except Exception:
        return 1.0


def waits_for(item: Planned, items: list[Planned]) -> list[Planned]:
    """The candidates whose outcome decides whether ``item`` runs (the precision rule's cheap
    probes, the AOT-covers-JIT rule's AOTInductor, a capture's or a package's packages)."""
    covers = list(item.covered_by)
    if item.precision == "fp32" or item.cost <= CHEAP:
        return covers
    return [
        p for p in items if p.precision == item.precision and p.cost <= CHEAP and not p.skip
    ] + covers


def skip_reason(item: Planned, probes: list[tuple[Planned, str, str]]) -> str:
    """The reason to skip ``item`` given its probes' (planned, status, reason): the precision
    rule's, or a covering rule's."""
    covers = [id(c) for c in item.covered_by]
    for probe, status, _ in probes:
        if id(probe) in covers and status == "ok":
            if item.backend.stands_in:
                return (
                    f"not built beside the calling program: {probe.backend.name} passed, and a "
                    "capture of eager's kernels is not installed in the program's process once "
                    "a package is (its build would share the program's GPU for nothing)"
                )
            if item.backend.saves_payload:
                return (
                    f"not built beside the calling program: {probe.backend.name} passed, with a "
                    "higher expected gain; a package of a lower one is built only where none "
                    "of those passes (its build and check would share the program's host and GPU "
                    "for a variant unlikely to be installed)"
                )
            return (
                f"on CPU {probe.backend.name} built and passed: it compiles this graph with the "
                "same code generator and calls it without guards or a Python wrapper "
                "(docs/tuning.md)"
            )
    for probe, status, reason in probes:
        if id(probe) in covers:
            continue
        if status == "rejected":
            why = reason.split(";")[0]
            return (
                f"{item.precision}: {probe.backend.name} in the same precision was rejected ({why})"
            )
    return ""


def _cost(backend: Backend) -> int:
    try:
        return int(backend.expected_build_cost())
    except Exception:
        return int(getattr(type(backend), "build_cost", 2))


def _precision(backend: Backend) -> str:
    try:
        return str(backend.precision())
    except Exception:
        return "fp32"
