"""Nothing upstream kube-proxy accepts is silently dropped: every KubeProxyConfiguration field
and every flag (tests/unit/upstream_kube_proxy.py) set to a non-default value is either used
(it changes the configuration the daemon reads, or is refused with its name) or named in a
warning; and every setting of the configuration is read by the daemon."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.config import API_VERSION, KIND, ConfigError, ProxyConfig, build
from tests.unit.upstream_kube_proxy import FIELDS, FLAGS

PACKAGE = Path(__file__).resolve().parents[2] / "ipvsproxy"
CONFIG = PACKAGE / "config"


def nested(path: str, value: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND}
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return data


def settings(cfg: ProxyConfig) -> ProxyConfig:
    return dataclasses.replace(cfg, warnings=())


def outcome(name: str, make: Any) -> str:
    """ "used", "warned" or "dropped" for one field or flag."""
    try:
        cfg = make()
    except ConfigError as exc:
        return "used" if any(name in p for p in exc.problems) else f"refused: {exc}"
    if any(name in w for w in cfg.warnings):
        return "warned"
    return "used" if settings(cfg) != settings(make.baseline()) else "dropped"


class FromFile:
    def __init__(self, path: str, value: Any) -> None:
        self.path, self.value = path, value

    def __call__(self) -> ProxyConfig:
        data = nested(self.path, self.value)
        if self.path == "detectLocal.bridgeInterface":
            data["detectLocalMode"] = "BridgeInterface"
        elif self.path == "detectLocal.interfaceNamePrefix":
            data["detectLocalMode"] = "InterfaceNamePrefix"
        return build(data, [])

    def baseline(self) -> ProxyConfig:
        return build({"apiVersion": API_VERSION, "kind": KIND}, [])


class FromFlag:
    def __init__(self, flag: str, value: str | None) -> None:
        self.argv = [flag] if value is None else [flag, value]

    def __call__(self) -> ProxyConfig:
        return build(None, self.argv)

    def baseline(self) -> ProxyConfig:
        return build(None, [])


@pytest.mark.parametrize("path", sorted(FIELDS))
def test_every_upstream_field_is_used_or_warned(path: str) -> None:
    assert outcome(path, FromFile(path, FIELDS[path])) in ("used", "warned")


@pytest.mark.parametrize("flag", sorted(set(FLAGS) - {"--config"}))
def test_every_upstream_flag_is_used_or_warned(flag: str) -> None:
    assert outcome(flag, FromFlag(flag, FLAGS[flag])) in ("used", "warned")


def test_what_ipvsproxy_implements_is_not_merely_warned() -> None:
    """These fields change the configuration: ipvsproxy implements them, it does not only warn."""
    for path in ("bindAddress", "conntrack.tcpBeLiberal", "oomScoreAdj", "bindAddressHardFail"):
        assert outcome(path, FromFile(path, FIELDS[path])) == "used", path


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(ProxyConfig)])
def test_every_setting_is_read_by_the_daemon(field: str) -> None:
    """A setting nothing reads outside ipvsproxy/config/ is accepted and dropped."""
    assert (CONFIG / "__init__.py").is_file()  # so that the configuration's own reads are left out
    sources = [p.read_text() for p in PACKAGE.rglob("*.py") if not p.is_relative_to(CONFIG)]
    assert any(re.search(rf"\.{field}\b", text) for text in sources), field
