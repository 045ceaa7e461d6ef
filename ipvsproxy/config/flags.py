"""kube-proxy's flags: the settings' flags, and upstream's flags ipvsproxy ignores (a warning) or
refuses (an error). Every flag's default is None, so a flag that is given is told from one that is
not."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NoReturn

from ipvsproxy.config.proxy_config import ConfigError
from ipvsproxy.config.settings import SETTINGS

# Upstream kube-proxy flags ipvsproxy accepts and ignores (with a warning), and those it refuses.
_IGNORED_FLAGS = (
    "--feature-gates", "--kube-api-content-type", "--kube-api-burst", "--kube-api-qps",
    "--show-hidden-metrics-for-version", "--iptables-sync-period", "--iptables-min-sync-period",
    "--config-sync-period", "--healthz-port", "--metrics-port", "--vmodule",
    "--log-flush-frequency", "--log-json-info-buffer-size", "--log-text-info-buffer-size",
)  # fmt: skip
_IGNORED_BOOL_FLAGS = (
    "--profiling", "--iptables-localhost-nodeports", "--log-json-split-stream",
    "--log-text-split-stream",
)  # fmt: skip
_REFUSED_FLAGS = {
    "--cleanup": "run `ipvsproxy cleanup` instead",
    "--init-only": "not supported by ipvsproxy",
    "--write-config-to": "not supported by ipvsproxy",
}


def ignored_flags() -> tuple[str, ...]:
    """Upstream's flags ipvsproxy accepts and ignores, with a warning."""
    return (*_IGNORED_FLAGS, *_IGNORED_BOOL_FLAGS)


def refused_flags() -> dict[str, str]:
    """Upstream's flags that stop start-up, each with the reason given."""
    return dict(_REFUSED_FLAGS)


def _dest(flag: str) -> str:
    return "_upstream_" + flag.lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """kube-proxy's flags (and ipvsproxy's own). Every default is None: only a flag that is given
    overrides the file."""
    group = parser.add_argument_group("kube-proxy flags (given ones override --config)")
    for s in SETTINGS:
        if s.kind == "bool":
            group.add_argument(
                *s.flags, dest=s.key, nargs="?", const="true", default=None, metavar=s.metavar,
                help=s.help,
            )  # fmt: skip
        else:
            group.add_argument(
                *s.flags, dest=s.key, default=None, metavar=s.metavar, help=s.help,
                action="append" if s.kind == "list" else "store",
            )  # fmt: skip
    for flag in _IGNORED_FLAGS:
        parser.add_argument(flag, dest=_dest(flag), default=None, help=argparse.SUPPRESS)
    for flag in (*_IGNORED_BOOL_FLAGS, *_REFUSED_FLAGS):
        parser.add_argument(
            flag, dest=_dest(flag), nargs="?", const="true", default=None, help=argparse.SUPPRESS
        )


class _FlagParser(argparse.ArgumentParser):
    """Reports a bad command line as a ConfigError instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"command line: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ConfigError(f"command line: {message or f'exit {status}'}")


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    """The flags in ``argv``: each setting's under its key, None where it is not given."""
    parser = _FlagParser(prog="ipvsproxy", add_help=False, allow_abbrev=False)
    add_flags(parser)
    return parser.parse_args(list(argv))


def report_unused_flags(ns: argparse.Namespace, problems: list[str], warnings: list[str]) -> None:
    """A line in ``problems`` for each refused upstream flag given, and in ``warnings`` for each
    ignored one."""
    for flag, why in _REFUSED_FLAGS.items():
        if getattr(ns, _dest(flag)) is not None:
            problems.append(f"{flag}: {why}")
    for flag in (*_IGNORED_FLAGS, *_IGNORED_BOOL_FLAGS):
        if getattr(ns, _dest(flag)) is not None:
            warnings.append(f"{flag} is not used by ipvsproxy (ignored)")
