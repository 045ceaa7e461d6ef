"""/configz and /proxyMode on the metrics address, as upstream's serveMetrics serves them
(cmd/kube-proxy/app/server.go; component-base/configz): the configuration in force as a
KubeProxyConfiguration under its group's name, and the mode."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from ipvsproxy.config import build
from ipvsproxy.config.durations import go_duration
from ipvsproxy.config.render import configz
from ipvsproxy.servers.metrics import upstream_routes


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (30, "30s"),
        (1.5, "1.5s"),
        (90, "1m30s"),
        (900, "15m0s"),
        (3600, "1h0m0s"),
        (86400, "24h0m0s"),
        (0.25, "250ms"),
        (0.0015, "1.5ms"),
        (2e-6, "2µs"),
    ],
)
def test_durations_are_written_as_go_writes_them(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


FILE: dict[str, Any] = {
    "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
    "kind": "KubeProxyConfiguration",
    "mode": "ipvs",
    "clusterCIDR": "10.244.0.0/16,fd00:10:244::/48",
    "hostnameOverride": "node-1",
    "clientConnection": {"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"},
    "ipvs": {"scheduler": "wrr", "syncPeriod": "1m0s", "excludeCIDRs": ["10.0.0.0/8"]},
    "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s"},
    "nodePortAddresses": ["primary"],
    "detectLocalMode": "ClusterCIDR",
}


def test_the_configuration_in_force_reads_back_as_the_same_configuration() -> None:
    cfg = build(FILE, ["--ipvs-min-sync-period", "250ms"])
    doc = configz(cfg)
    assert doc["apiVersion"] == "kubeproxy.config.k8s.io/v1alpha1"
    assert doc["kind"] == "KubeProxyConfiguration"
    assert doc["mode"] == "ipvs"
    assert doc["ipvs"]["syncPeriod"] == "1m0s"
    assert doc["ipvs"]["minSyncPeriod"] == "250ms"
    assert doc["conntrack"]["tcpCloseWaitTimeout"] == "1h0m0s"
    assert doc["clusterCIDR"] == "10.244.0.0/16,fd00:10:244::/48"
    assert doc["clientConnection"] == {"kubeconfig": "/var/lib/kube-proxy/kubeconfig.conf"}
    assert doc["logging"] == {"format": "text", "verbosity": 0}
    again = build(json.loads(json.dumps(doc)), [])
    assert dataclasses.replace(again, warnings=()) == dataclasses.replace(cfg, warnings=())


def test_unset_values_are_written_as_go_writes_their_zero_values() -> None:
    doc = configz(build(None, []))
    assert doc["hostnameOverride"] == ""
    assert doc["nodePortAddresses"] is None and doc["ipvs"]["excludeCIDRs"] is None
    assert doc["clusterCIDR"] == ""
    assert doc["ipvs"]["tcpTimeout"] == "0s"


def test_the_metrics_address_serves_proxy_mode_configz_and_healthz_as_upstream() -> None:
    routes = upstream_routes("ipvs", {"kind": "KubeProxyConfiguration"})
    assert routes["/proxyMode"]() == (200, "text/plain; charset=utf-8", b"ipvs")
    code, ctype, body = routes["/configz"]()
    assert (code, ctype) == (200, "application/json")
    assert json.loads(body) == {"kubeproxy.config.k8s.io": {"kind": "KubeProxyConfiguration"}}
    assert routes["/healthz"]() == (200, "text/plain; charset=utf-8", b"ok")
