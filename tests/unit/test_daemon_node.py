"""The daemon's node facts: the node IP from bindAddress or the Node object (upstream's
detectNodeIPs), and the Services re-planned when it changes."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ipvsproxy.config import build
from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.node_addresses import FALLBACK_NODE_IP
from ipvsproxy.core.plan import NodeFacts, PlanConfig
from ipvsproxy.core.topology import ZONE_LABEL
from ipvsproxy.daemon.node import node_facts, rules_config
from ipvsproxy.daemon.proxy import Proxy
from ipvsproxy.servers.metrics import Metrics

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
        self.backends = SimpleNamespace(addresses=addresses)
        self.node: NodeFacts = node_facts("node-1", cast(Any, self.backends), cfg, FALLBACK_NODE_IP)
        self.updated: list[str] = []
        self.notices: dict[str, str] = {}  # reports about other Services (none here)
        self.rules_config = rules_config(cfg)
        self.plan_config = PlanConfig()

    def update_service(self, service: str, _svc: Any, _slices: Any) -> None:
        self.updated.append(service)


def proxy_with(argv: list[str]) -> tuple[Proxy, FakeDataplane]:
    cfg = build(None, argv)
    # lo, eth0, the pod bridge: the string-smallest local address is the bridge's.
    addrs = FakeAddresses([(1, "127.0.0.1"), (2, "192.168.56.11"), (3, "10.244.1.1")])
    dp = FakeDataplane(addrs, cfg)
    proxy = Proxy(cfg, cast(Any, dp), Metrics())
    proxy.on_service("default/np", None, cast(Any, NODE_PORT))
    proxy.on_service("default/cip", None, cast(Any, CLUSTER_IP))
    proxy.changes.take()
    return proxy, dp


def test_primary_node_port_address_is_the_nodes_internal_ip() -> None:
    proxy, dp = proxy_with(["--nodeport-addresses", "primary"])
    # No Node seen yet: the node IP is upstream's loopback, which ``primary`` skips, so every
    # IPv4 address matches (expandNodePortAddressKeywords, NewNodePortAddresses).
    assert set(dp.node.node_ips) == {"10.244.1.1", "192.168.56.11"}
    proxy.on_node("node-1", None, cast(Any, NODE))
    assert set(proxy.changes.dirty) == {"default/np"}  # only the Service that reads node addresses
    proxy._replan()
    assert dp.node.primary_ip == "192.168.56.11"  # the source-range node check's IP too
    assert dp.node.node_ips == ("192.168.56.11",)
    assert dp.updated == ["default/np"]
    # The same Node again: nothing to re-plan.
    proxy.on_node("node-1", cast(Any, NODE), cast(Any, NODE))
    assert not proxy.changes.dirty


def test_a_bind_address_is_the_node_ip_whatever_the_node_says() -> None:
    proxy, dp = proxy_with(["--bind-address", "10.0.0.7"])
    proxy.on_node("node-1", None, cast(Any, NODE))
    proxy._replan()
    assert proxy.node.ip() == "10.0.0.7" and dp.node.primary_ip == "10.0.0.7"


def test_no_node_ip_anywhere_is_upstreams_loopback() -> None:
    proxy, dp = proxy_with([])
    proxy.on_node("node-1", None, cast(Any, {"metadata": {"name": "node-1"}}))
    proxy._replan()
    assert proxy.node.ip() == "127.0.0.1" and dp.node.primary_ip == "127.0.0.1"


def node_with(*internal: str) -> dict[str, Any]:
    addresses = [{"type": "InternalIP", "address": a} for a in internal]
    return {"metadata": {"name": "node-1"}, "status": {"addresses": addresses}}


def test_an_ipv6_only_node_is_logged_with_its_ipv6_node_ip(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The IPv4 node IP of an IPv6-only node is upstream's 127.0.0.1 (its IPv4 rules use it),
    but the node IP is its IPv6 one (upstream's primary family is the Node's first address's):
    the logs name that one, and no 127.0.0.1, nor a warning."""
    proxy, dp = proxy_with([])
    dp.plan_config = PlanConfig(families=(4, 6))
    dp.backends.addresses.addresses[1:] = [(2, "fc00::11"), (3, "fd00:10:244:1::1")]
    backends = cast(Any, dp.backends)
    dp.node = node_facts("node-1", backends, proxy.cfg, FALLBACK_NODE_IP, families=(4, 6))
    with caplog.at_level(logging.INFO, logger="ipvsproxy"):
        proxy.on_node("node-1", None, cast(Any, node_with("fc00::11")))
        assert proxy.wait_for_node()
        proxy._replan()
    assert (proxy.node.ip(), proxy.node.ip6()) == (FALLBACK_NODE_IP, "fc00::11")
    assert proxy.node.ips_text() == "fc00::11"
    said = [r.getMessage() for r in caplog.records]
    assert "node IP is now fc00::11" in said
    assert "node addresses: node IP fc00::11, NodePorts on fc00::11, fd00:10:244:1::1" in said
    assert not [m for m in said if "127.0.0.1" in m], said
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], said
    # Dual-stack: both, IPv4 first; neither known: upstream's loopback.
    proxy.on_node("node-1", None, cast(Any, node_with("fc00::11", "192.168.56.11")))
    assert proxy.node.ips_text() == "192.168.56.11 and fc00::11"
    proxy, _ = proxy_with([])
    assert proxy.node.ips_text() == FALLBACK_NODE_IP


class Notices:
    """AddressEvents' stand-in: hands out the given notices, then stops the proxy."""

    def __init__(self, proxy: Proxy, notices: list[set[int] | None]) -> None:
        self.proxy = proxy
        self.notices = notices

    def wait(self, _timeout: float) -> set[int] | None:
        if not self.notices:
            self.proxy.stop.set()
            return set()
        return self.notices.pop(0)


def test_an_address_notice_replans_the_services_that_read_node_addresses() -> None:
    proxy, dp = proxy_with([])
    assert list(dp.node.node_ips) == ["10.244.1.1", "192.168.56.11"]
    dp.backends.addresses.addresses.append((2, "192.168.56.211"))  # keepalived adds a VIP to eth0
    # kube-ipvs0's own notices (ipvsproxy's binds) are no change of the node's addresses.
    proxy.node.watch_addresses(cast(Any, Notices(proxy, [{9}, set()])))
    assert not proxy.changes.has_work() and not proxy.node.addresses_stale.is_set()
    proxy.stop.clear()
    proxy.node.watch_addresses(cast(Any, Notices(proxy, [{9, 2}])))
    assert proxy.changes.has_work() and proxy.node.addresses_stale.is_set()
    proxy._replan()
    assert list(dp.node.node_ips) == ["10.244.1.1", "192.168.56.11", "192.168.56.211"]
    assert "192.168.56.211" in dp.node.local_addresses  # an externalIP there is not bound
    assert dp.updated == ["default/np"]
    # Removed again; notices lost (the socket overflowed): everything is re-read.
    dp.backends.addresses.addresses.remove((2, "192.168.56.211"))
    proxy.stop.clear()
    proxy.node.watch_addresses(cast(Any, Notices(proxy, [None])))
    proxy._replan()
    assert dp.node.node_ips == ("10.244.1.1", "192.168.56.11")


def test_a_notice_that_changed_no_node_address_replans_nothing() -> None:
    """A pod's veth coming and going, a DHCP renewal of the same address: the node's addresses
    are read again at the next sync, and no Service is re-planned since none changed."""
    proxy, dp = proxy_with([])
    facts = dp.node
    dp.backends.addresses.addresses.append((14, "fe80::1"))  # a pod veth's link-local address
    proxy.node.watch_addresses(cast(Any, Notices(proxy, [{14}, {2}, {2, 14}])))
    assert proxy.changes.has_work()  # the next sync runs, to read them again
    proxy._replan()
    assert not proxy.node.addresses_stale.is_set() and dp.node == facts
    assert dp.updated == []
    assert not proxy.changes.has_work()


def test_addresses_are_read_again_every_sync_period_without_notices() -> None:
    proxy, dp = proxy_with(["--ipvs-sync-period", "1h"])
    dp.backends.addresses.addresses.append((2, "192.168.56.211"))
    proxy._replan()
    assert "192.168.56.211" not in dp.node.node_ips  # no notice, within the period: not read
    proxy.node._addresses_read -= 3600
    proxy._replan()
    assert "192.168.56.211" in dp.node.node_ips


def test_node_cidr_detects_local_traffic_by_the_nodes_pod_cidr() -> None:
    proxy, dp = proxy_with(["--detect-local-mode", "NodeCIDR"])
    assert dp.rules_config.if_not_local() is None  # before the Node: nothing to go by
    node = {
        **NODE,
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["fd00:1::/64", "10.244.1.0/24"]},
    }
    proxy.on_node("node-1", None, cast(Any, node))
    proxy._replan()
    assert dp.rules_config.if_not_local() == "! -s 10.244.1.0/24"
    text = ruleset.render(dp.rules_config, frozenset({ipset_specs.CLUSTER_IP}), [])
    assert "dst,dst ! -s 10.244.1.0/24 -j KUBE-MARK-MASQ" in text  # traffic from elsewhere
    assert proxy.wait_for_node(pod_cidr_timeout=0.1)


def test_node_cidr_without_a_pod_cidr_stops_the_start() -> None:
    proxy, _dp = proxy_with(["--detect-local-mode", "NodeCIDR"])
    proxy.on_node("node-1", None, cast(Any, NODE))
    assert not proxy.wait_for_node(pod_cidr_timeout=0.2)
    proxy, _dp = proxy_with([])  # other modes need no pod CIDR
    proxy.on_node("node-1", None, cast(Any, NODE))
    assert proxy.wait_for_node(pod_cidr_timeout=0.2)


def test_a_failing_read_of_the_node_addresses_does_not_stop_the_sync() -> None:
    """The node's addresses are dumped again every sync period: when that dump fails (as the
    dataplane's own read of kube-ipvs0 may), the Services are still handed to the
    dataplane with the addresses last read, and the read is tried again at the next sync."""
    proxy, dp = proxy_with(["--ipvs-sync-period", "1h"])
    proxy.on_service("default/cip", None, cast(Any, CLUSTER_IP))
    before = dp.node

    def failing() -> list[tuple[int, str]]:
        raise OSError(105, "No buffer space available")

    dp.backends.addresses.indexed = failing
    proxy.node._addresses_read -= 3600  # a sync period since the last read
    proxy._replan()
    assert dp.updated == ["default/cip"]
    assert dp.node == before
    del dp.backends.addresses.indexed  # the dump works again
    dp.backends.addresses.addresses.append((2, "192.168.56.211"))
    proxy._replan()
    assert "192.168.56.211" in dp.node.node_ips


def _hinted_slice(service: str, hints: dict[str, Any] | None) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": ["10.244.2.5"], "nodeName": "node-2"}
    if hints is not None:
        ep["hints"] = hints
    return {
        "metadata": {
            "name": f"{service}-x",
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": [ep],
    }


def test_a_zone_label_change_replans_only_the_services_with_zone_hints() -> None:
    proxy, dp = proxy_with([])
    for name, hints in [
        ("zoned", {"forZones": [{"name": "zone-a"}]}),
        ("noded", {"forNodes": [{"name": "node-1"}]}),
        ("plain", None),
    ]:
        proxy.on_service(f"default/{name}", None, cast(Any, CLUSTER_IP))
        proxy.on_slice(f"default/{name}-x", None, cast(Any, _hinted_slice(name, hints)))
    proxy.on_node("node-1", None, cast(Any, NODE))
    proxy._replan()
    dp.updated.clear()
    assert dp.node.zone == ""
    zoned = {**NODE, "metadata": {"name": "node-1", "labels": {ZONE_LABEL: "zone-a"}}}
    proxy.on_node("node-1", cast(Any, NODE), cast(Any, zoned))
    assert set(proxy.changes.dirty) == {"default/zoned"}
    proxy._replan()
    assert dp.node.zone == "zone-a" and dp.updated == ["default/zoned"]
    # Another label changed: nothing to re-plan.
    other = {**NODE, "metadata": {"name": "node-1", "labels": {ZONE_LABEL: "zone-a", "x": "y"}}}
    proxy.on_node("node-1", cast(Any, zoned), cast(Any, other))
    assert not proxy.changes.dirty


def test_a_family_without_a_node_port_address_is_named_by_healthz(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Serving IPv6 on a node with IPv4 addresses only (an IPv4 cluster on a kernel with
    IPv6): IPv6 NodePorts have no address. That is logged once when it begins and once when it
    ends, and /healthz names it meanwhile (still 200: the rest is served)."""
    proxy, dp = proxy_with([])
    dp.plan_config = PlanConfig(families=(4, 6))
    with caplog.at_level(logging.INFO, logger="ipvsproxy"):
        proxy._replan()
        proxy._replan()
        code, body = proxy.health.status(node_check=True)
        assert code == 200
        assert list(body["noNodePortAddressIPFamilies"]) == ["IPv6"]
        assert body["noNodePortAddressIPFamilies"]["IPv6"].startswith(
            "no IPv6 address of this node carries NodePorts"
        )
        dp.backends.addresses.addresses.append((2, "fc00::11"))
        proxy.node.addresses_stale.set()
        proxy._replan()
        assert "noNodePortAddressIPFamilies" not in proxy.health.status(node_check=True)[1]
    said = [r.getMessage() for r in caplog.records if "NodePorts" in r.getMessage()]
    assert [m.split(" ", 2)[:2] for m in said if "carries" in m] == [["no", "IPv6"]]
    assert "IPv6 NodePorts are on this node's addresses again" in said
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_family_node_port_addresses_leave_out_has_node_ports_and_health_checks() -> None:
    """nodePortAddresses of IPv4 only: IPv6 NodePorts and health-check ports are on every
    IPv6 address of the node (upstream's IPv6 proxier matches ::/0), not on none."""
    cfg = build(None, ["--nodeport-addresses", "192.168.56.0/24"])
    addrs = FakeAddresses(
        [(1, "127.0.0.1"), (1, "::1"), (2, "192.168.56.11"), (2, "fc00::11"), (2, "fe80::1")]
    )
    dp = FakeDataplane(addrs, cfg)
    dp.node = node_facts("node-1", cast(Any, dp.backends), cfg, "192.168.56.11", "", (4, 6))
    assert dp.node.node_ips == ("192.168.56.11", "fc00::11")
    proxy = Proxy(cfg, cast(Any, dp), Metrics())
    listened: list[Any] = []

    def sync(_wanted: Any, addresses: Any = None) -> None:
        listened.append(addresses)

    proxy.health_checks = cast(Any, SimpleNamespace(sync=sync))
    proxy._health_checks()
    assert listened == [("192.168.56.11", "fc00::11")]
