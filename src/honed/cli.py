"""src/honed/cli.py: the `honed` command line."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from honed import config

EXAMPLES = """examples:
  honed demo                   tune the built-in DemoNet on the CPU and print the comparison
  honed demo --device cuda     the same on the GPU
  honed doctor                 what this machine can run (GPUs, driver, torch, packages, backends)
  honed doctor --device cuda --json
                               the same as JSON; exit status 1 when CUDA cannot run here
  honed tune honed.demo:entry --out demo.honed
                               tune the model that a Python function builds (see honed tune -h)
  honed inspect honed.demo:entry
                               where the time goes, module by module
  honed bench demo.honed --entry honed.demo:entry
                               the saved artifact against eager: median, p99, throughput
  honed report demo.honed      the tuning report stored in an artifact, as markdown
  honed report demo.honed --format html --out report.html
                               the same as one self-contained HTML page with plots
  honed keygen                 make the key honed.save signs artifacts with (docs/trust.md)
  honed trust alice.pub        load native code from artifacts signed by that key
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="honed",
        description="honed: an inference tuner for PyTorch models with a C++ core",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="tune a small built-in model and show every candidate",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    demo.add_argument("--out", type=Path, default=None, help="where to save the artifact")
    doctor = sub.add_parser(
        "doctor",
        help="say what this machine can run and, for what it cannot, why and what to change",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    doctor.add_argument(
        "--device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="what must be able to run for exit status 0 (default: cpu)",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    from honed import cli_entry

    cli_entry.add_parsers(sub)
    from honed import cli_trust

    cli_trust.add_parsers(sub)
    report = sub.add_parser(
        "report",
        help="print the tuning report stored in an artifact (markdown, JSON or HTML)",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument("artifact", type=Path, help="a .honed file written by honed.save")
    report.add_argument(
        "--format",
        default="markdown",
        choices=["markdown", "json", "html"],
        help="markdown (default), json, or html (one self-contained page with plots)",
    )
    report.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    return parser


def _report(artifact: Path, fmt: str, out: Path | None) -> int:
    from honed.errors import HonedError
    from honed.report import load_report

    try:
        report = load_report(artifact)
    except HonedError as e:
        print(f"honed report: {e}", file=sys.stderr)
        return 1
    render = {"markdown": report.to_markdown, "json": report.to_json, "html": report.to_html}
    text = render[fmt]()
    if out is None:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out} ({fmt}, {len(text.encode()) / 1e3:.1f} kB)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=config.log_level, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "run", None) is not None:  # tune, inspect, bench (cli_entry.py)
        from honed.cli_entry import run_command

        return run_command(args)
    if args.command == "demo":
        from honed.demo import run

        return run(args.device, args.out)
    if args.command == "doctor":
        from honed import doctor

        return doctor.run(args.device, as_json=args.json)
    if args.command == "report":
        return _report(args.artifact, args.format, args.out)
    return 2


if __name__ == "__main__":
    sys.exit(main())
