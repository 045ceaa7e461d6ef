"""The ``ipvsproxy`` command line.

``run`` and ``cleanup`` take upstream kube-proxy's flags (parsed by ipvsproxy/config/);
``status`` has its own (ipvsproxy/status/command.py).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ipvsproxy import __version__

if TYPE_CHECKING:
    from ipvsproxy.config import ProxyConfig as ProxyConfigT
    from ipvsproxy.kernel.backends import Backends

USAGE_ERROR = 2


def _cmd_version(_args: argparse.Namespace | None = None) -> int:
    """As `kube-proxy --version` prints `Kubernetes v1.37.2`."""
    print(f"ipvsproxy v{__version__}")
    return 0


def _wants_version(argv: Sequence[str]) -> bool:
    """kube-proxy's `--version` (verflag): print and exit, whatever else is given."""
    return any(a in ("--version", "--version=true") for a in argv)


def _load(command: str, argv: Sequence[str]) -> ProxyConfigT | None:
    from ipvsproxy import config
    from ipvsproxy.process import logs

    if "-h" in argv or "--help" in argv:
        parser = argparse.ArgumentParser(
            prog=f"ipvsproxy {command}",
            description="Flags as upstream kube-proxy's; they override --config's file.",
        )
        config.add_flags(parser)
        parser.print_help()
        raise SystemExit(0)
    try:
        cfg = config.load(argv)
    except config.ConfigError as exc:
        print(f"ipvsproxy {command}: invalid configuration: {exc}", file=sys.stderr)
        return None
    logs.setup(cfg.log_format, cfg.verbosity)
    return cfg


def cmd_run(argv: Sequence[str], open_backends: Callable[[], Backends] | None = None) -> int:
    """``ipvsproxy run``; ``open_backends`` replaces ``Backends.open`` (lab/faults.py)."""
    cfg = _load("run", argv)
    if cfg is None:
        return 1
    from ipvsproxy.process import limits, malloc_tuning

    limits.raise_open_files_limit()
    # Before the daemon's imports and lists: what malloc hands out from here on follows it.
    applied = malloc_tuning.configure()
    logging.getLogger("ipvsproxy").debug("malloc settings: %s", applied or "unchanged")
    from ipvsproxy.daemon.wiring import run

    if open_backends is None:
        return run(cfg)
    return run(cfg, open_backends)


def cmd_cleanup(argv: Sequence[str]) -> int:
    """Remove what ipvsproxy created on this node; nothing to remove is success."""
    cfg = _load("cleanup", argv)
    if cfg is None:
        return 1
    from ipvsproxy.core.plan import NodeFacts
    from ipvsproxy.dataplane.dataplane import Backends, Dataplane
    from ipvsproxy.dataplane.statefile import StateLock, StateLocked

    try:
        lock = StateLock.acquire(Path(cfg.state_path), wait=False)
    except StateLocked as exc:
        print(f"ipvsproxy cleanup: {exc}; stop it first", file=sys.stderr)
        return 1
    except OSError as exc:  # a read-only state directory must not stop the cleanup
        print(f"ipvsproxy cleanup: cannot lock the state file: {exc}", file=sys.stderr)
        lock = None
    from ipvsproxy.kernel.families import ipv6_unavailable

    backends = Backends.open()
    if ipv6_unavailable() is None:  # both families' chains, where ip6tables works
        backends.serve_families((4, 6))
    try:
        dp = Dataplane(
            NodeFacts(cfg.hostname_override or ""),
            backends,
            Path(cfg.state_path),
            exclude_cidrs=cfg.exclude_cidrs,
        )
        result = dp.cleanup()
    finally:
        backends.close()
        if lock is not None:
            lock.release()
    for err in result.errors:
        print(f"ipvsproxy cleanup: {err}", file=sys.stderr)
    if dp.state_problem:  # the kernel is clean all the same
        print(f"ipvsproxy cleanup: {dp.state_problem}", file=sys.stderr)
    print(f"ipvsproxy cleanup: {result.writes} writes")
    return 1 if result.errors else 0


def _cmd_status(args: argparse.Namespace) -> int:
    from ipvsproxy.status import command as status_command

    return status_command.run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ipvsproxy",
        description="An incremental IPVS-mode kube-proxy.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = {
        "run": (_not_parsed, "watch the API server and program this node's IPVS dataplane"),
        "status": (_cmd_status, "show this node's virtual servers with their Kubernetes identity"),
        "cleanup": (_not_parsed, "remove everything ipvsproxy created on this node"),
        "version": (_cmd_version, "print the version"),
    }
    for name, (func, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if name == "status":
            from ipvsproxy.status import command as status_command

            status_command.add_arguments(p)
    return parser


def _not_parsed(_args: argparse.Namespace) -> int:
    raise AssertionError("run and cleanup parse their own flags")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["run"], ["cleanup"], ["--version"]) and _wants_version(argv):
        return _cmd_version()
    # run and cleanup take kube-proxy's flags (ipvsproxy/config/ parses them).
    if argv[:1] == ["run"]:
        return cmd_run(argv[1:])
    if argv[:1] == ["cleanup"]:
        return cmd_cleanup(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return USAGE_ERROR
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
