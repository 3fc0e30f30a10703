"""src/honed/cli/model_commands.py: `honed tune | inspect | bench` on an entry point's model."""

from __future__ import annotations

import argparse
import ast
import dataclasses
from pathlib import Path
from typing import Any

from honed.errors import ConfigError, EntryPointError

ENTRY_HELP = (
    "a function that returns (model, dataset) or (model, dataset, kwargs_for_tune), as "
    "pkg.module:function or path/to/file.py:function"
)

TUNE_EXAMPLES = """examples:
  honed tune honed.demo:entry
        tune the model honed.demo.entry() returns on its dataset; saves entry.honed
  honed tune my_models.py:build --out resnet.honed --device cuda
  honed tune honed.demo:entry --dry-run
        the candidates this machine would try (and why the others are left out), no tuning
  honed tune honed.demo:entry --backend TorchInductorBackend:mode=max-autotune \
        --strategy min-latency
        only Inductor (with that config) against eager, picked by median latency
  honed tune honed.demo:entry --batch-sizes 1,8,32
        also tune for batches of 1, 8 and 32 (each sample resized along axis 0)
  honed tune my_models.py:build --shapes x:1x3x224x224/8x3x224x224/32x3x224x224
        min/opt/max shapes of input x, as trtexec's --minShapes/--optShapes/--maxShapes
  honed tune honed.demo:entry --strategy latency-budget=5 --isolation none --no-cache

the entry point, e.g. in my_models.py:
  def build():
      model = torchvision.models.resnet18().eval()
      return model, [torch.randn(b, 3, 224, 224) for b in (1, 8)], {"batch_sizes": [16]}
"""

INSPECT_EXAMPLES = """examples:
  honed inspect honed.demo:entry
        the module tree, time per module and which modules are worth wrapping
  honed inspect my_models.py:build --max-depth 2 --json
"""

BENCH_EXAMPLES = """examples:
  honed tune honed.demo:entry --out demo.honed
  honed bench demo.honed --entry honed.demo:entry
        loads demo.honed into the model honed.demo.entry() builds and measures it against eager
  honed bench demo.honed --entry honed.demo:entry --sample 0
        on the first sample of the dataset instead of the last
"""

STRATEGIES = "max-throughput | min-latency | first-wins | latency-budget=MS"


def add_parsers(sub: Any) -> None:
    """Add the tune, inspect and bench subcommands to the `honed` parser."""
    from honed.cli import subcommand

    tune = subcommand(
        sub,
        "tune",
        "tune the model a Python function builds, print the report, save an artifact",
        TUNE_EXAMPLES,
    )
    add_tune_arguments(tune)
    tune.set_defaults(run=run_tune)

    inspect = subcommand(
        sub,
        "inspect",
        "show the module tree, time per module and what is worth tuning",
        INSPECT_EXAMPLES,
    )
    inspect.add_argument("entry", metavar="ENTRY", help=ENTRY_HELP)
    inspect.add_argument(
        "--max-depth",
        type=int,
        default=None,
        metavar="N",
        help="show modules down to this depth below the model (0: the model only; default: all)",
    )
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.set_defaults(run=run_inspect)

    bench = subcommand(
        sub,
        "bench",
        "measure a saved artifact against eager (median, p99, throughput)",
        BENCH_EXAMPLES,
    )
    bench.add_argument("artifact", metavar="ARTIFACT", type=Path, help="a .honed file")
    bench.add_argument("--entry", required=True, help=ENTRY_HELP)
    bench.add_argument("--sample", type=int, default=-1, help="dataset index (default: last)")
    bench.add_argument(
        "--trust-native-code",
        action="store_true",
        help="load native code (AOTInductor, TensorRT) from an unsigned or untrusted artifact "
        "(docs/trust.md)",
    )
    bench.set_defaults(run=run_bench)


def add_tune_arguments(tune: argparse.ArgumentParser) -> None:
    tune.add_argument("entry", metavar="ENTRY", help=ENTRY_HELP)
    tune.add_argument(
        "--out", type=Path, default=None, help="artifact path (default: NAME.honed here)"
    )
    tune.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    tune.add_argument("--name", default=None, help="module name (default: the function's name)")
    tune.add_argument(
        "--device", default=None, help="move the model and data there first (cpu, cuda, cuda:N)"
    )
    tune.add_argument(
        "--backend",
        action="append",
        default=[],
        metavar="NAME[:key=value,...]",
        help="a builtin backend (repeatable), e.g. TorchInductorBackend:mode=max-autotune",
    )
    tune.add_argument("--strategy", default=None, help=f"{STRATEGIES} (default max-throughput)")
    tune.add_argument(
        "--batch-sizes",
        default=None,
        metavar="B,B,...",
        help="also tune for these batch sizes (each sample resized along axis 0), e.g. 1,8,32",
    )
    tune.add_argument(
        "--shapes",
        action="append",
        default=[],
        metavar="NAME:MIN/OPT/MAX",
        help="an input's min/opt/max shapes as in trtexec, e.g. x:1x64/8x64/32x64 (repeatable "
        "or comma-separated; NAME is a forward() argument or a tensor index)",
    )
    tune.add_argument(
        "--isolation",
        choices=["process", "none"],
        default=None,
        help="process: each candidate in a worker process, so a crash or hang fails only it "
        "(default, HONED_ISOLATION); none: in this process (faster to start)",
    )
    tune.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    tune.add_argument(
        "--dry-run",
        action="store_true",
        help="list the candidates this machine would try and why the others are left out; "
        "tune nothing, save nothing",
    )
    tune.add_argument(
        "--time-budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop trying candidates after this long; the best so far wins (docs/tuning.md)",
    )


def check_device(device: str | None) -> None:
    """``--device``: a device torch knows, and one that can run here (one line otherwise)."""
    if device is None:
        return
    import torch

    try:
        wanted = torch.device(device)
    except RuntimeError:
        raise ConfigError(
            f"--device {device!r} is not a device; give cpu, cuda or cuda:N"
        ) from None
    if wanted.type == "cuda":
        if not torch.cuda.is_available():
            from honed.cli.doctor import cuda_problems

            problems = cuda_problems()
            why = (
                problems[0].split(". Fix:")[0] if problems else "torch.cuda.is_available() is False"
            )
            raise ConfigError(
                f"--device {device}: CUDA cannot run here ({why}); run `honed doctor --device "
                "cuda` for the fix, or use --device cpu"
            )
        if wanted.index is not None and wanted.index >= torch.cuda.device_count():
            raise ConfigError(
                f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    elif wanted.type != "cpu":
        raise ConfigError(f"--device {device!r}: honed tunes on cpu or cuda; give one of those")


def _console() -> Any:
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


# -- parsing ---------------------------------------------------------------------------------------
def parse_backend(spec: str) -> Any:
    """``Name`` or ``Name:key=value,key=value`` -> a builtin backend instance."""
    from honed.backend import builtin_backends

    name, _, params = spec.partition(":")
    classes = {cls.__name__.lower(): cls for cls in builtin_backends()}
    cls = classes.get(name.lower()) or classes.get(name.lower() + "backend")
    if cls is None:
        known = ", ".join(c.__name__ for c in builtin_backends())
        raise ConfigError(f"--backend {spec}: no builtin backend {name!r}; known: {known}")
    values: dict[str, Any] = {}
    for item in (p for p in params.split(",") if p.strip()):
        key, eq, raw = item.partition("=")
        if not eq:
            raise ConfigError(f"--backend {spec}: {item!r} is not key=value")
        values[key.strip()] = _value(raw.strip())
    if not values:
        return cls()
    fields = {f.name for f in dataclasses.fields(cls.config_class)} if cls.config_class else set()
    unknown = sorted(set(values) - fields)
    if unknown or cls.config_class is None:
        raise ConfigError(
            f"--backend {spec}: {cls.__name__} has no config field(s) {unknown or sorted(values)}"
            f"; its fields: {sorted(fields)}"
        )
    try:
        return cls(cls.config_class(**values))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"--backend {spec}: {e}") from e


def _value(raw: str) -> Any:
    import torch

    dtype = getattr(torch, raw.removeprefix("torch."), None)
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        return raw  # a plain word such as max-autotune


def parse_strategy(text: str, backends: list[Any] | None) -> Any:
    import honed

    name, _, arg = text.partition("=")
    if name == "latency-budget":
        try:
            return honed.LatencyBudgetStrategy(float(arg), backends)
        except ValueError as e:
            raise ConfigError(f"--strategy {text}: give the budget in ms, e.g. =5") from e
    classes = {
        "max-throughput": honed.MaxThroughputStrategy,
        "min-latency": honed.MinLatencyStrategy,
        "first-wins": honed.FirstWinsStrategy,
    }
    if name not in classes or arg:
        raise ConfigError(f"--strategy {text}: give one of {STRATEGIES}")
    return classes[name](backends)


def _to_device(model: Any, dataset: Any, device: str | None) -> tuple[Any, Any]:
    import torch

    if device is None:
        return model, dataset
    if isinstance(model, torch.nn.Module):
        model = model.to(device)

    def move(x: Any) -> Any:
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return model, torch.utils._pytree.tree_map(move, dataset)


# -- the commands ----------------------------------------------------------------------------------
def run_tune(args: argparse.Namespace) -> int:
    import torch

    import honed
    from honed import config
    from honed.cli import entry_point
    from honed.cli.exporting import check_output_path
    from honed.cli.shape_flags import parse_batch_sizes, parse_shapes

    # Every flag is checked before the entry point runs: a typo costs nothing.
    check_device(args.device)
    sizes = parse_batch_sizes(args.batch_sizes) if args.batch_sizes else None
    ranges = parse_shapes(args.shapes)
    backends = [parse_backend(b) for b in args.backend] or None
    strategy = None
    if args.strategy or backends:
        strategy = parse_strategy(args.strategy or "max-throughput", backends)
    name = args.name or args.entry.rpartition(":")[2]
    out = args.out or Path(f"{name}.honed")
    if not args.dry_run:
        check_output_path(out, args.force, "--out")

    found = entry_point.load(args.entry)
    model, dataset = _to_device(found.model, found.dataset, args.device)
    if isinstance(model, torch.nn.Module) and not isinstance(model, honed.Module):
        model = honed.Module(model, name)
    kwargs = dict(found.tune_kwargs)
    if strategy is not None:
        kwargs.pop("backends", None)
        kwargs["strategy"] = strategy
    if args.device:
        kwargs["device"] = args.device
    if args.isolation:
        kwargs["isolation"] = args.isolation
    if sizes:
        kwargs["batch_sizes"] = sizes
    if ranges:
        _apply_shapes(model, ranges, kwargs)
    if args.dry_run:
        from honed.cli.dryrun import dry_run

        print(dry_run(model, kwargs, args.device))
        return 0
    if args.time_budget is not None:
        kwargs["time_budget_s"] = args.time_budget
    console = _console()
    with config.patch(cache_enabled=config.cache_enabled and not args.no_cache):
        report = honed.tune(model, dataset, **kwargs)
    console.print(report.table())
    honed.save(model, out)
    args.saved = out  # a Ctrl-C from here on says so (cli.main)
    console.print(f"saved {out} ({out.stat().st_size / 1e6:.2f} MB)")
    return 0


def _apply_shapes(model: Any, ranges: list[Any], kwargs: dict[str, Any]) -> None:
    """--shapes onto the module's dynamic_shapes, and its batch sizes onto the tune's."""
    import honed
    from honed.cli.shape_flags import to_dynamic_shapes

    if not isinstance(model, honed.Module):
        raise ConfigError(
            "--shapes needs the entry point to return one model (a torch.nn.Module or "
            "honed.Module); for a pipeline, set dynamic_shapes= on each honed.Module"
        )
    if model.dynamic_shapes is not None:
        raise ConfigError(
            f"--shapes: module {model.name!r} already has dynamic_shapes from the entry point; "
            "give one or the other"
        )
    model.dynamic_shapes, batch = to_dynamic_shapes(ranges)
    if batch:
        kwargs["batch_sizes"] = sorted(set(kwargs.get("batch_sizes") or []) | set(batch))


def run_inspect(args: argparse.Namespace) -> int:
    import honed
    from honed.cli import entry_point

    found = entry_point.load(args.entry)
    report = honed.inspect(found.model, found.dataset, max_depth=args.max_depth)
    if args.json:
        print(report.to_json())
    else:
        _console().print(report.table())
    return 0


def run_bench(args: argparse.Namespace) -> int:
    import torch

    import honed
    from honed import _core
    from honed.artifact import read_artifact
    from honed.cli import entry_point
    from honed.pipeline.tuner import _call, _normalize_dataset

    found = entry_point.load(args.entry)
    manifest, _ = read_artifact(args.artifact)
    names = [m["name"] for m in manifest["modules"]]
    model = found.model
    if not isinstance(model, torch.nn.Module):
        raise EntryPointError(f"honed bench: {args.entry} must return a torch.nn.Module as model")
    if not isinstance(model, honed.Module):
        if len(names) != 1:
            raise EntryPointError(
                f"honed bench: {args.artifact} holds modules {names}; return a model that wraps "
                "them in honed.Module(..., name) from the entry point"
            )
        model = honed.Module(model, names[0])
    honed.load(model, args.artifact, trust_native_code=args.trust_native_code)
    samples = _normalize_dataset(found.dataset)
    try:
        sample = samples[args.sample]
    except IndexError as e:
        raise EntryPointError(f"--sample {args.sample}: the dataset has {len(samples)}") from e
    device = _device(model)
    batch = _batch(sample)
    eager = model.module
    with torch.no_grad():
        diff = _max_diff(_call(eager, sample), _call(model, sample))
        rows = [
            ("eager", _measure(_core, eager, sample, device, batch)),
            ("tuned", _measure(_core, model, sample, device, batch)),
        ]
    _console().print(_bench_table(args.artifact, device, batch, rows, diff))
    return 0


def _measure(core: Any, fn: Any, sample: Any, device: Any, batch: int) -> Any:
    from honed.pipeline.candidate import _measure_config, make_timer
    from honed.pipeline.tuner import _call

    return core.measure(lambda: _call(fn, sample), make_timer(device), _measure_config(batch))


def _device(model: Any) -> Any:
    import torch

    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _batch(sample: Any) -> int:
    import torch

    for t in torch.utils._pytree.tree_leaves(sample):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    return 1


def _max_diff(a: Any, b: Any) -> float:
    import torch

    pairs = zip(torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b), strict=True)
    diffs = [
        float((x.float() - y.float()).abs().max())
        for x, y in pairs
        if isinstance(x, torch.Tensor) and x.numel()
    ]
    return max(diffs, default=0.0)


def _bench_table(path: Path, device: Any, batch: int, rows: list[Any], diff: float) -> Any:
    from rich.table import Table

    from honed.report import cv_text

    table = Table(title=f"honed bench {path} on {device} (batch {batch})")
    for col in ("variant", "median ms", "p99 ms", "samples/s", "CV", "speedup"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    eager_median = rows[0][1].median_ms
    for label, m in rows:
        table.add_row(
            label,
            f"{m.median_ms:.3f}",
            f"{m.p99_ms:.3f}",
            f"{m.throughput:,.0f}",
            cv_text(m.cv, m.stable),
            f"{eager_median / m.median_ms:.2f}x" if m.median_ms > 0 else "-",
        )
    table.caption = f"max abs difference tuned vs eager: {diff:.2e}"
    table.caption_justify = "left"
    return table
