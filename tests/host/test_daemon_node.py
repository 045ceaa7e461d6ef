"""The daemon's node facts: the node IP from bindAddress or the Node object (upstream's
detectNodeIPs), and the Services re-planned when it changes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from ipvsproxy import daemon
from ipvsproxy.config import build
from ipvsproxy.metrics import Metrics
from ipvsproxy.nodeaddrs import FALLBACK_NODE_IP
from ipvsproxy.plan import NodeFacts

NODE = {
    "metadata": {"name": "node-1"},
    "status": {
        "addresses": [
            {"type": "ExternalIP", "address": "203.0.113.5"},
            {"type": "InternalIP", "address": "192.168.56.11"},
        ]
    },
}
NODE_PORT = {"spec": {"type": "NodePort", "ports": [{"port": 80, "nodePort": 30080}]}}
CLUSTER_IP = {"spec": {"type": "ClusterIP", "ports": [{"port": 80}]}}


class FakeAddresses:
    def __init__(self, addresses: list[tuple[int, str]]) -> None:
        self.addresses = addresses

    def indexed(self) -> list[tuple[int, str]]:
        return list(self.addresses)

    def device_index(self) -> int:
        return 9  # kube-ipvs0


class FakeDataplane:
    def __init__(self, addresses: FakeAddresses, cfg: Any) -> None:
        self.b = SimpleNamespace(addresses=addresses)
        self.node: NodeFacts = daemon.node_facts("node-1", cast(Any, self.b), cfg, FALLBACK_NODE_IP)
        self.updated: list[str] = []

    def update_service(self, service: str, _svc: Any, _slices: Any) -> None:
        self.updated.append(service)


def proxy_with(argv: list[str]) -> tuple[daemon.Proxy, FakeDataplane]:
    cfg = build(None, argv)
    # lo, eth0, the pod bridge: the string-smallest local address is the bridge's.
    addrs = FakeAddresses([(1, "127.0.0.1"), (2, "192.168.56.11"), (3, "10.244.1.1")])
    dp = FakeDataplane(addrs, cfg)
    proxy = daemon.Proxy(cfg, cast(Any, dp), Metrics())
    proxy.on_service("default/np", None, cast(Any, NODE_PORT))
    proxy.on_service("default/cip", None, cast(Any, CLUSTER_IP))
    proxy._take()
    return proxy, dp


def test_primary_node_port_address_is_the_nodes_internal_ip() -> None:
    proxy, dp = proxy_with(["--nodeport-addresses", "primary"])
    assert "10.244.1.1" not in dp.node.node_ips  # not the string-smallest local address
    proxy.on_node("node-1", None, cast(Any, NODE))
    assert set(proxy.dirty) == {"default/np"}  # only the Service that reads node addresses
    proxy._replan()
    assert dp.node.primary_ip == "192.168.56.11"  # the source-range node check's IP too
    assert dp.node.node_ips == ("192.168.56.11",)
    assert dp.updated == ["default/np"]
    # The same Node again: nothing to re-plan.
    proxy.on_node("node-1", cast(Any, NODE), cast(Any, NODE))
    assert not proxy.dirty


def test_a_bind_address_is_the_node_ip_whatever_the_node_says() -> None:
    proxy, dp = proxy_with(["--bind-address", "10.0.0.7"])
    proxy.on_node("node-1", None, cast(Any, NODE))
    proxy._replan()
    assert proxy.node_ip() == "10.0.0.7" and dp.node.primary_ip == "10.0.0.7"


def test_no_node_ip_anywhere_is_upstreams_loopback() -> None:
    proxy, dp = proxy_with([])
    proxy.on_node("node-1", None, cast(Any, {"metadata": {"name": "node-1"}}))
    proxy._replan()
    assert proxy.node_ip() == "127.0.0.1" and dp.node.primary_ip == "127.0.0.1"
