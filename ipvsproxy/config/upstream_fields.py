"""Every field upstream's KubeProxyConfiguration defines: the ones that are settings here, and the
ones ipvsproxy does not use, which are a warning when set to anything but their zero value or
upstream's default (kubeadm writes every field, mostly zero, so its ConfigMap warns about
nothing). A field upstream does not define is a warning too."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ipvsproxy.config.durations import go_duration_ns
from ipvsproxy.config.proxy_config import ConfigError
from ipvsproxy.config.settings import SETTINGS, Setting


def settings_in_file(data: Mapping[Any, Any], warnings: list[str]) -> Iterator[tuple[Setting, Any]]:
    """The raw values a KubeProxyConfiguration mapping gives settings, nulls left out; a line in
    ``warnings`` for each field set that ipvsproxy does not use or upstream does not define."""
    return _walk(data, _SCHEMA, "", warnings)


@dataclass(frozen=True)
class _Ignored:
    """An upstream field ipvsproxy ignores. It warns when set to something but its zero value or
    ``default``; ``kind`` says how to compare: "ptr" (only null and the default are unset: 0 is a
    value), "duration", "nested" (set if any leaf is), or "" (plain)."""

    default: Any = None
    kind: str = ""


_Node = dict[str, Any]  # field name -> Setting | _Ignored | nested _Node


def _schema() -> _Node:
    tree: _Node = {
        "apiVersion": None,
        "kind": None,
        "featureGates": _Ignored({}),
        "clientConnection": {
            "acceptContentTypes": _Ignored(""),
            "contentType": _Ignored("application/vnd.kubernetes.protobuf"),
            "qps": _Ignored(5),
            "burst": _Ignored(10),
        },
        "logging": {
            "flushFrequency": _Ignored("5s", "duration"),
            "vmodule": _Ignored([]),
            "options": _Ignored(None, "nested"),
        },
        "enableProfiling": _Ignored(False),
        "showHiddenMetricsForVersion": _Ignored(""),
        "iptables": {
            "localhostNodePorts": _Ignored(True, "ptr"),
            "snatNodeInternalIP": _Ignored(False, "ptr"),
            "syncPeriod": _Ignored("30s", "duration"),
            "minSyncPeriod": _Ignored("1s", "duration"),
        },
        "ipvs": {},
        "nftables": {
            "masqueradeBit": _Ignored(14, "ptr"),
            "masqueradeAll": _Ignored(False),
            "syncPeriod": _Ignored("30s", "duration"),
            "minSyncPeriod": _Ignored("1s", "duration"),
        },
        "winkernel": {
            "networkName": _Ignored(""),
            "sourceVip": _Ignored(""),
            "enableDSR": _Ignored(False),
            "rootHnsEndpointName": _Ignored(""),
            "forwardHealthCheckVip": _Ignored(False),
        },
        "detectLocal": {},
        "conntrack": {"max": _Ignored(0)},  # removed upstream
        "configSyncPeriod": _Ignored("15m", "duration"),
        "portRange": _Ignored(""),
        "windowsRunAsService": _Ignored(False),
        # Removed upstream; older kubeadm ConfigMaps still carry them.
        "udpIdleTimeout": _Ignored("250ms", "duration"),
        "resourceContainer": _Ignored("/kube-proxy"),
    }
    for s in SETTINGS:
        if s.path is None:
            continue
        node = tree
        for part in s.path[:-1]:
            node = node.setdefault(part, {})
        node[s.path[-1]] = s
    return tree


_SCHEMA = _schema()


def fields() -> Iterator[tuple[str, Setting | None]]:
    """Every field of upstream's file by its path: its setting, or None for one ipvsproxy
    ignores (a warning when set). apiVersion and kind are left out."""
    return _leaves(_SCHEMA, "")


def _leaves(node: _Node, prefix: str) -> Iterator[tuple[str, Setting | None]]:
    for key, spec in node.items():
        if spec is None:
            continue
        if isinstance(spec, dict):
            yield from _leaves(spec, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", spec if isinstance(spec, Setting) else None


def _zero_duration_or(value: Any, default: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ns = go_duration_ns(value, "")
        return ns == 0 or (isinstance(default, str) and ns == go_duration_ns(default, ""))
    except ConfigError:
        return False


def _is_unset(value: Any, spec: _Ignored) -> bool:
    if value is None:
        return True
    if spec.kind == "ptr":
        return _same(value, spec.default)
    if spec.kind == "nested" and isinstance(value, Mapping):
        return all(_is_unset(v, _Ignored(None, "nested")) for v in value.values())
    if isinstance(value, (Mapping, list)):
        return not value or value == spec.default
    if spec.kind == "duration":
        if isinstance(value, int) and not isinstance(value, bool):  # logging.flushFrequency: ns
            return value == 0 or value == go_duration_ns(str(spec.default), "")
        return _zero_duration_or(value, spec.default)
    return value in ("", "0", 0) or _same(value, spec.default)


def _same(a: Any, b: Any) -> bool:
    """Equal, and a bool only equals a bool (YAML's true is not 1)."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def _walk(
    data: Mapping[Any, Any], node: _Node, prefix: str, warnings: list[str]
) -> Iterator[tuple[Setting, Any]]:
    """The file's values for settings (nulls left out); warnings for fields ipvsproxy ignores."""
    for raw_key, value in data.items():
        key = str(raw_key)
        name = f"{prefix}{key}"
        spec = node.get(key)
        if not isinstance(raw_key, str) or key not in node:
            hint = [k for k in node if k.lower() == key.lower()]
            did_you_mean = f"; did you mean {prefix}{hint[0]}?" if hint else ""
            warnings.append(f"unknown field {name} (ignored{did_you_mean})")
        elif isinstance(spec, dict):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{name}: must be a mapping (got {value!r})")
            yield from _walk(value, spec, f"{name}.", warnings)
        elif isinstance(spec, Setting):
            if value is not None:
                yield spec, value
        elif isinstance(spec, _Ignored) and not _is_unset(value, spec):
            warnings.append(f"{name} is not used by ipvsproxy (ignored)")
