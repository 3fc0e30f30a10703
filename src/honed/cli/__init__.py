"""src/honed/cli/__init__.py: the `honed` command line: parser, exit codes, the artifact commands.

Exit codes: 0 done; 1 an internal error (a bug: one line, the stack with --traceback); 2 bad
input (a bad flag, entry point, artifact or environment variable: one line naming the fix);
130 interrupted (Ctrl-C: nothing saved). `honed doctor` exits 1 when the asked device cannot
run here.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from honed import config
from honed._version import __version__

EXAMPLES = """examples:
  honed demo                   tune the built-in DemoNet on the CPU and print the comparison
  honed demo --device cuda     the same on the GPU
  honed doctor                 what this machine can run (GPUs, driver, torch, packages, backends)
  honed doctor --device cuda --json
                               the same as JSON; exit status 1 when CUDA cannot run here
  honed tune honed.demo:entry --out demo.honed
                               tune the model that a Python function builds (see honed tune -h)
  honed tune honed.demo:entry --dry-run
                               the candidates this machine would try, without tuning
  honed inspect honed.demo:entry
                               where the time goes, module by module
  honed bench demo.honed --entry honed.demo:entry
                               the saved artifact against eager: median, p99, throughput
  honed report demo.honed      the tuning report stored in an artifact, as markdown
  honed export demo.honed --format onnx --out model.onnx
                               the winner's ONNX model, AOTInductor package or TensorRT plan
  honed keygen                 make the key honed.save signs artifacts with (docs/trust.md)
  honed trust alice.pub        load native code from artifacts signed by that key

every command takes --traceback (the full stack instead of one line on an error).
exit codes: 0 done, 1 internal error, 2 bad input, 130 interrupted.
"""

DEMO_EXAMPLES = """examples:
  honed demo
  honed demo --device cuda --out demo.honed
"""

DOCTOR_EXAMPLES = """examples:
  honed doctor
  honed doctor --device cuda --json     exit status 1 when CUDA cannot run here
"""

REPORT_EXAMPLES = """examples:
  honed report demo.honed
  honed report demo.honed --format json
  honed report demo.honed --format html --out report.html
"""

EXPORT_EXAMPLES = """examples:
  honed export demo.honed --format onnx --out model.onnx
        the ONNX model ONNXRuntimeBackend built (run it with onnxruntime)
  honed export demo.honed --format pt2 --out model.pt2
        the AOTInductor package (torch._inductor.aoti_load_package, or honed-run)
  honed export demo.honed --format plan --out model.plan --module encoder --graph 0
        a TensorRT engine plan; --module/--graph pick one when the artifact holds several
"""


def subcommand(sub: Any, name: str, summary: str, examples: str) -> argparse.ArgumentParser:
    """A subcommand with its own examples (not the global ones) and --traceback."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=summary,
        description=summary,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--traceback",
        action="store_true",
        default=argparse.SUPPRESS,
        help="on an error, show the full Python stack instead of one line",
    )
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="honed",
        description="honed: an inference tuner for PyTorch models with a C++ core",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"honed {__version__}")
    parser.add_argument(
        "--traceback",
        action="store_true",
        help="on an error, show the full Python stack instead of one line",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = subcommand(
        sub, "demo", "tune a small built-in model and show every candidate", DEMO_EXAMPLES
    )
    demo.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    demo.add_argument(
        "--out", type=Path, default=None, help="also save the tuned artifact to this file"
    )
    doctor = subcommand(
        sub,
        "doctor",
        "say what this machine can run and, for what it cannot, why and what to change",
        DOCTOR_EXAMPLES,
    )
    doctor.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="what must be able to run for exit status 0 (default: cpu)",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.add_argument(
        "--fresh",
        action="store_true",
        help="probe every optional package again instead of reusing the remembered results",
    )
    from honed.cli import model_commands

    model_commands.add_parsers(sub)
    from honed.cli import trust_commands

    trust_commands.add_parsers(sub)
    report = subcommand(
        sub,
        "report",
        "print the tuning report stored in an artifact (markdown, JSON or HTML)",
        REPORT_EXAMPLES,
    )
    report.add_argument("artifact", type=Path, help="a .honed file written by honed.save")
    report.add_argument(
        "--format",
        default="markdown",
        choices=["markdown", "json", "html"],
        help="markdown (default), json, or html (one self-contained page with plots)",
    )
    report.add_argument(
        "--out", type=Path, default=None, help="write to this file instead of stdout"
    )
    export = subcommand(
        sub,
        "export",
        "write the winner's native payload (ONNX model, AOTInductor .pt2, TensorRT plan) "
        "from an artifact",
        EXPORT_EXAMPLES,
    )
    export.add_argument("artifact", type=Path, help="a .honed file written by honed.save")
    export.add_argument(
        "--format",
        required=True,
        choices=["onnx", "pt2", "plan"],
        help="onnx (ONNXRuntimeBackend), pt2 (TorchInductorAotBackend) or plan (TensorRTBackend)",
    )
    export.add_argument("--out", type=Path, required=True, help="the file to write")
    export.add_argument(
        "--module", default=None, help="the module to export, when the artifact holds several"
    )
    export.add_argument(
        "--graph", type=int, default=None, help="the graph index, when a module has several"
    )
    export.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return parser


def _report(artifact: Path, fmt: str, out: Path | None) -> int:
    from honed.artifact import read_artifact
    from honed.cli.exporting import check_output_path, write_atomically
    from honed.errors import ArtifactError
    from honed.report import load_report

    if out is not None:
        check_output_path(out, force=True, flag="--out")
    manifest, _ = read_artifact(artifact)
    modules = manifest.get("modules", [])
    if modules and not any(m.get("graphs") or m.get("report") for m in modules):
        names = ", ".join(repr(m.get("name")) for m in modules)
        raise ArtifactError(
            f"{artifact}: {names} never tuned (saved before honed.tune ran; the artifact holds "
            "weights only), so there is no report; tune the model and save it again"
        )
    report = load_report(artifact)
    render = {"markdown": report.to_markdown, "json": report.to_json, "html": report.to_html}
    text = render[fmt]()
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        write_atomically(out, text.encode("utf-8"))
        print(f"wrote {out} ({fmt}, {len(text.encode()) / 1e3:.1f} kB)", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    from honed.cli.exporting import export

    out, module, graph = export(
        args.artifact,
        args.format,
        args.out,
        module=args.module,
        graph=args.graph,
        force=args.force,
    )
    size = out.stat().st_size / 1e6
    print(f"wrote {out} ({args.format}, module {module!r} graph {graph}, {size:.2f} MB)")
    return 0


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "run", None) is not None:  # tune, inspect, bench (model_commands.py)
        result: int = args.run(args)
        return result
    if args.command == "demo":
        from honed.cli.model_commands import check_device
        from honed.demo import run

        check_device(args.device)
        return run(args.device, args.out)
    if args.command == "doctor":
        from honed.cli import doctor

        return doctor.run(args.device, as_json=args.json, fresh=args.fresh)
    if args.command == "report":
        return _report(args.artifact, args.format, args.out)
    if args.command == "export":
        return _export(args)
    return 2


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def main(argv: list[str] | None = None) -> int:
    """The `honed` command; returns its exit code (see the module doc)."""
    from honed.errors import HonedError

    args = _parser().parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(levelname)s %(name)s: %(message)s")
    where = f"honed {args.command}"
    try:
        return _run(args)
    except KeyboardInterrupt:
        if args.traceback:
            raise
        saved = getattr(args, "saved", None)
        print(
            f"{where}: interrupted; {f'{saved} saved' if saved else 'nothing saved'}",
            file=sys.stderr,
        )
        return 130
    except HonedError as e:
        if args.traceback:
            raise
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file that cannot be read or written: the user's to fix
        if args.traceback:
            raise
        print(f"{where}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        if args.traceback:
            raise
        print(
            f"{where}: internal error: {type(e).__name__}: {_first_line(e)} (run again with "
            "--traceback for the full stack, and report it)",
            file=sys.stderr,
        )
        return 1
