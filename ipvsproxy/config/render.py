"""The configuration in force as upstream's ``/configz`` shows it: a KubeProxyConfiguration
(v1alpha1) with the file's field names, from the settings that have a field there. Fields
ipvsproxy does not use are left out; values are written as Go's JSON writes them (durations
as Go durations, an empty list as null, an unset string as "")."""

from __future__ import annotations

import dataclasses
from typing import Any

from ipvsproxy.config.durations import go_duration
from ipvsproxy.config.file import API_VERSION, KIND
from ipvsproxy.config.proxy_config import ProxyConfig
from ipvsproxy.config.settings import SETTINGS

# Every float field of ProxyConfig is a duration in seconds.
_DURATIONS = {f.name for f in dataclasses.fields(ProxyConfig) if f.type == "float"}


def configz(cfg: ProxyConfig) -> dict[str, Any]:
    """``cfg`` as a KubeProxyConfiguration mapping (JSON-ready)."""
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    for s in SETTINGS:
        if s.path is None or s.key == "config":
            continue
        node = doc
        for part in s.path[:-1]:
            node = node.setdefault(part, {})
        node[s.path[-1]] = _value(cfg, s.key)
    return doc


def _value(cfg: ProxyConfig, key: str) -> Any:
    if key == "mode":
        return "ipvs"
    if key == "cluster_cidr":  # clusterCIDR: both families' CIDRs, comma-separated
        return ",".join(c for c in (cfg.cluster_cidr, cfg.cluster_cidr6) if c)
    value = getattr(cfg, key)
    if key in _DURATIONS:
        return go_duration(value)
    if isinstance(value, tuple):
        return list(value) or None
    return "" if value is None else value
