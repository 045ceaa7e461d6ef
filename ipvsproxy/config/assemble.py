"""Putting it together: ``build`` makes a ``ProxyConfig`` from a file's mapping and the flags, a
flag that is given overriding the file, and checks what takes several settings; ``load`` reads the
``--config`` file first."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ipvsproxy.config.file import API_VERSION, KIND, parse_config_text
from ipvsproxy.config.flags import parse_flags, report_unused_flags
from ipvsproxy.config.proxy_config import HEALTHZ_PORT, METRICS_PORT, ConfigError, ProxyConfig
from ipvsproxy.config.settings import DEFAULT, SETTINGS, Setting, parse_cidr, parse_ip
from ipvsproxy.config.upstream_fields import settings_in_file

_BY_KEY = {s.key: s for s in SETTINGS}


def build(file_data: Mapping[str, Any] | None, argv: Sequence[str]) -> ProxyConfig:
    """The configuration from a parsed KubeProxyConfiguration (None: no file) and the flags in
    ``argv`` (``--config`` there is not read: that is ``load``'s job). Pure."""
    warnings: list[str] = []
    problems: list[str] = []
    from_file: dict[str, Any] = {}
    if file_data is not None:
        if not isinstance(file_data, Mapping):
            raise ConfigError(f"the configuration file must contain a {KIND} mapping")
        api_version, kind = file_data.get("apiVersion"), file_data.get("kind")
        if api_version != API_VERSION:
            problems.append(f"apiVersion: must be {API_VERSION} (got {api_version!r})")
        if kind != KIND:
            problems.append(f"kind: must be {KIND} (got {kind!r})")
        if problems:
            raise ConfigError(*problems)
        from_file = {s.key: value for s, value in settings_in_file(file_data, warnings)}
        # Upstream defaults ipvs.syncPeriod but not ipvs.minSyncPeriod: a file without it means 0.
        from_file.setdefault("min_sync_period", 0)

    ns = parse_flags(argv)
    report_unused_flags(ns, problems, warnings)
    from_flags = {s.key: getattr(ns, s.key) for s in SETTINGS if getattr(ns, s.key) is not None}
    # An empty --bind-address or --hostname-override is no override (upstream's flag types).
    for key in ("bind_address", "hostname_override"):
        if from_flags.get(key) == "":
            del from_flags[key]

    values: dict[str, Any] = {}
    names: dict[str, str] = {}  # key -> the field or flag its value came from
    failed: set[str] = set()  # keys whose value is already a problem
    for s in SETTINGS:
        if s.key in from_flags:
            raw, name, file = from_flags[s.key], s.flags[0], False
        elif s.key in from_file:
            raw, name, file = from_file[s.key], s.file_name, True
        else:
            continue
        names[s.key] = name
        try:
            value = s.convert(raw, name, file)
        except ConfigError as exc:
            problems.extend(exc.problems)
            failed.add(s.key)
            continue
        if not file and file_data is not None and s.path and not s.flag_wins_upstream:
            warnings.extend(_override_warning(s, from_file.get(s.key), value))
        if value is not DEFAULT:
            values[s.key] = value
    values.pop("config", None)
    values.pop("mode", None)

    _check_together(values, names, failed, problems, warnings)
    if problems:
        raise ConfigError(*problems)
    return ProxyConfig(**values, warnings=tuple(warnings))


def _override_warning(s: Setting, file_raw: Any, flag_value: Any) -> list[str]:
    """Upstream ignores this flag when --config is given: say so where the value differs from
    what the file (or, where the file is silent, upstream's default) gives."""
    default = getattr(ProxyConfig(), s.key, "")
    try:
        file_value = default if file_raw is None else s.convert(file_raw, s.file_name, True)
    except ConfigError:
        file_value = None
    if (default if file_value is DEFAULT else file_value) == (
        default if flag_value is DEFAULT else flag_value
    ):
        return []
    return [
        f"{s.flags[0]} overrides {s.file_name} from the config file "
        f"(upstream kube-proxy ignores {s.flags[0]} when --config is given)"
    ]


def _check_together(
    values: dict[str, Any],
    names: dict[str, str],
    failed: set[str],
    problems: list[str],
    warnings: list[str],
) -> None:
    """The checks that take more than one field; fills in defaults that depend on others."""
    default = ProxyConfig()

    def name(key: str, like: str = "") -> str:
        """Where the value came from; for one not given, named as ``like``'s source spells it."""
        if key in names:
            return names[key]
        setting = _BY_KEY[key]
        if names.get(like, "").startswith("-") or not setting.file_name:
            return setting.flags[0]
        return setting.file_name

    sync = values.get("sync_period", default.sync_period)
    min_sync = values.get("min_sync_period", default.min_sync_period)
    periods_parsed = not failed & {"sync_period", "min_sync_period"}
    if periods_parsed and "sync_period" in values and sync <= 0:
        problems.append(f"{name('sync_period')}: must be greater than 0")
    elif periods_parsed and min_sync > sync:
        problems.append(
            f"{name('sync_period', 'min_sync_period')}: must be greater than or equal to "
            f"{name('min_sync_period', 'sync_period')} "
            f"({sync:g}s < {min_sync:g}s)"
        )

    mode = values.get("detect_local_mode", default.detect_local_mode)
    for needed_mode, key in (
        ("BridgeInterface", "bridge_interface"),
        ("InterfaceNamePrefix", "interface_name_prefix"),
    ):
        if mode == needed_mode and not values.get(key):
            problems.append(
                f"{name(key, 'detect_local_mode')}: must not be empty when "
                f"{name('detect_local_mode')} is {mode}"
            )

    cidrs: tuple[str, ...] = values.pop("cluster_cidr", ())
    if cidrs:
        values["cluster_cidr"], values["cluster_cidr6"] = _cluster_cidr(
            cidrs, name("cluster_cidr"), mode == "ClusterCIDR", problems
        )

    bind = parse_ip(values.get("bind_address", default.bind_address))
    if bind is not None and bind.version == 6 and bind.ipv4_mapped is None:
        values.setdefault("healthz_bind_address", f"[::]:{HEALTHZ_PORT}")
        values.setdefault("metrics_bind_address", f"[::1]:{METRICS_PORT}")


def _cluster_cidr(
    cidrs: tuple[str, ...], name: str, validate: bool, problems: list[str]
) -> tuple[str | None, str | None]:
    """The first IPv4 CIDR and the first IPv6 one. Upstream validates clusterCIDR only in
    detectLocalMode ClusterCIDR: one CIDR, or a dual-stack pair."""
    nets = [parse_cidr(c) for c in cidrs]
    if validate:
        if len(cidrs) > 2:
            problems.append(
                f"{name}: must be either a single CIDR or a dual-stack pair of CIDRs "
                f"(e.g. 10.100.0.0/16,fde4:8dba:82e1::/48; got {len(cidrs)})"
            )
            return None, None
        bad = [c for c, n in zip(cidrs, nets, strict=True) if n is None]
        if bad:
            problems.append(
                f"{name}: {bad[0]!r} must be a valid CIDR block "
                "(e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"
            )
            return None, None
        if len(nets) == 2 and {n.version for n in nets if n is not None} != {4, 6}:
            problems.append(
                f"{name}: a pair of CIDRs must be dual-stack, one IPv4 and one IPv6 (got "
                f"{','.join(cidrs)})"
            )
            return None, None
    first: dict[int, str | None] = {4: None, 6: None}
    for n in reversed(nets):
        if n is not None:
            first[n.version] = str(n)
    return first[4], first[6]


def load(argv: Sequence[str]) -> ProxyConfig:
    """The configuration from the command line: reads the ``--config`` file, if any, then
    ``build``. The only function here that does I/O."""
    path = parse_flags(argv).config
    if not path:
        return build(None, argv)
    try:
        content = Path(path).read_bytes()
        text = content.decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config: {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc}") from None
    cfg = build(parse_config_text(text, path), argv)
    return dataclasses.replace(cfg, config_file=path, config_content=content)
