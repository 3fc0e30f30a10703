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
    return parser


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
    return 2


if __name__ == "__main__":
    sys.exit(main())
