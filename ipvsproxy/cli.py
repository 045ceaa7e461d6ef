"""The ``ipvsproxy`` command line.

Subcommands that later work fills in exit with status 2 and say so, so that a DaemonSet
pointed at an unfinished build fails loudly instead of pretending to proxy.
"""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence

from ipvsproxy import __version__

NOT_IMPLEMENTED = 2


def _not_implemented(name: str) -> int:
    print(f"ipvsproxy {name}: not implemented yet", file=sys.stderr)
    return NOT_IMPLEMENTED


def _cmd_version(_args: argparse.Namespace) -> int:
    print(f"ipvsproxy {__version__} (Python {platform.python_version()})")
    return 0


def _cmd_run(_args: argparse.Namespace) -> int:
    return _not_implemented("run")


def _cmd_status(_args: argparse.Namespace) -> int:
    return _not_implemented("status")


def _cmd_cleanup(_args: argparse.Namespace) -> int:
    return _not_implemented("cleanup")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipvsproxy",
        description="An incremental IPVS-mode kube-proxy.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = {
        "run": (_cmd_run, "watch the API server and program this node's IPVS dataplane"),
        "status": (_cmd_status, "show this node's virtual servers with their Kubernetes identity"),
        "cleanup": (_cmd_cleanup, "remove everything ipvsproxy created on this node"),
        "version": (_cmd_version, "print the version"),
    }
    for name, (func, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return NOT_IMPLEMENTED
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
