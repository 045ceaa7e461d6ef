"""Command line of the kernel lab."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lab import guest


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("lab run: no command given (python -m lab run -- CMD ARGS...)", file=sys.stderr)
        return 2
    try:
        result = guest.boot(command, timeout=args.timeout, mem=args.mem)
    except guest.LabUnavailable as exc:
        print(f"lab run: {exc}", file=sys.stderr)
        return 3
    if result.rc is None:
        print(f"lab run: FAILED: {result.describe()}", file=sys.stderr)
        return 3
    return result.rc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="what", metavar="COMMAND", required=True)
    run = sub.add_parser(
        "run",
        help="boot the lab kernel, run a command inside it, exit with its status",
        description="Boot the UML kernel with this filesystem as root, load ipvsproxy's "
        "modules, run CMD in the repository with the venv's environment and exit with its "
        "status. A guest that panics, dies or times out exits with status 3.",
    )
    run.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    run.add_argument("--mem", default="1G", help="guest memory (default 1G)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(func=_cmd_run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc
