"""Per-Service traffic metrics (opt-in, ``--service-traffic-metrics N``): IPVS's counters of a
Service port's virtual servers, summed into counters that only grow, for at most N ports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ipvsproxy.config import build
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey, Traffic
from ipvsproxy.servers.metrics import Metrics
from ipvsproxy.servers.traffic_metrics import PortName, ServiceTraffic

CLUSTER = ServiceKey("10.96.0.10", Protocol.TCP, 80)
NODE_PORT = ServiceKey("192.168.56.11", Protocol.TCP, 30080)
DNS = ServiceKey("10.96.0.53", Protocol.UDP, 53)
WEB = PortName("default", "web", "http", "TCP")
KUBE_DNS = PortName("kube-system", "kube-dns", "dns", "UDP")


class Kernel:
    """What IPVS counts now, and which Service port each virtual server is."""

    def __init__(self) -> None:
        self.counters: dict[ServiceKey, Traffic] = {}
        self.names: dict[ServiceKey, PortName] = {CLUSTER: WEB, NODE_PORT: WEB, DNS: KUBE_DNS}

    def read(self) -> Mapping[ServiceKey, Traffic]:
        return dict(self.counters)


def traffic(conns: int, packets: int = 0, octets: int = 0) -> Traffic:
    return Traffic(conns, packets, packets, octets, octets * 2)


def values(collector: ServiceTraffic) -> dict[tuple[str, tuple[str, ...]], float]:
    return {
        (s.name, tuple(s.labels.values())): s.value
        for family in collector.collect()
        for s in family.samples
    }


def test_a_service_ports_virtual_servers_are_summed_into_counters() -> None:
    k = Kernel()
    k.counters = {CLUSTER: traffic(3, 10, 1000), NODE_PORT: traffic(1, 2, 100)}
    collector = ServiceTraffic(10, k.read, lambda: k.names)
    web = ("default", "web", "http", "TCP")
    got = values(collector)
    assert got["ipvsproxy_service_connections_total", web] == 4.0
    assert got["ipvsproxy_service_packets_total", (*web, "in")] == 12.0
    assert got["ipvsproxy_service_bytes_total", (*web, "in")] == 1100.0
    assert got["ipvsproxy_service_bytes_total", (*web, "out")] == 2200.0
    assert got["ipvsproxy_service_traffic_ports_left_out", ()] == 0.0


def test_the_counters_only_grow_when_a_virtual_server_goes_or_is_made_again() -> None:
    k = Kernel()
    k.counters = {CLUSTER: traffic(3), NODE_PORT: traffic(5)}
    collector = ServiceTraffic(10, k.read, lambda: k.names)
    conns = ("ipvsproxy_service_connections_total", ("default", "web", "http", "TCP"))
    assert values(collector)[conns] == 8.0
    k.counters = {CLUSTER: traffic(4)}  # the node port's virtual server is gone
    assert values(collector)[conns] == 9.0
    k.counters = {CLUSTER: traffic(4), NODE_PORT: traffic(2)}  # made again: from 0
    assert values(collector)[conns] == 11.0
    k.counters = {CLUSTER: traffic(1), NODE_PORT: traffic(2)}  # the cluster IP's made again
    assert values(collector)[conns] == 12.0


def test_at_most_the_limit_of_ports_have_series_the_others_are_counted() -> None:
    k = Kernel()
    k.counters = {CLUSTER: traffic(1), DNS: traffic(2)}
    collector = ServiceTraffic(1, k.read, lambda: k.names)
    got = values(collector)
    # In name order: default/web first.
    assert ("ipvsproxy_service_connections_total", ("default", "web", "http", "TCP")) in got
    assert not any(labels[:2] == ("kube-system", "kube-dns") for _, labels in got)
    assert got["ipvsproxy_service_traffic_ports_left_out", ()] == 1.0
    # A port whose Service went frees its place.
    del k.names[CLUSTER], k.names[NODE_PORT]
    k.counters = {DNS: traffic(3)}
    got = values(collector)
    assert got["ipvsproxy_service_connections_total", ("kube-system", "kube-dns", "dns", "UDP")]
    assert not any(labels[:2] == ("default", "web") for _, labels in got)
    assert got["ipvsproxy_service_traffic_ports_left_out", ()] == 0.0


def test_off_by_default() -> None:
    assert build(None, []).service_traffic_metrics == 0
    assert build(None, ["--service-traffic-metrics", "200"]).service_traffic_metrics == 200
    text = Metrics().exposition().decode()
    assert "ipvsproxy_service_" not in text


def test_the_daemons_desired_state_names_each_virtual_server_by_its_service_port(
    tmp_path: Path,
) -> None:
    from ipvsproxy.daemon.proxy import Proxy
    from tests.unit.fake_node import node
    from tests.unit.k8s_objects import endpoint, endpoint_slice, service

    dp = node(tmp_path).dp
    ports = [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]
    dp.update_service(
        "default/web",
        service("web", "10.96.0.10", type="NodePort", ports=ports),
        [endpoint_slice("web", [endpoint("10.244.1.5")], ports=[{"port": 8080}])],
    )
    proxy = Proxy(build(None, []), dp, Metrics())
    assert proxy.port_names() == {}  # as of the last sync: none yet
    proxy.apply_changes()
    unnamed = PortName("default", "web", "80", "TCP")
    assert proxy.port_names() == {CLUSTER: unnamed, NODE_PORT: unnamed}
    with proxy.sync_lock:  # a sync that runs long: the scrape reads the last sync's names
        assert proxy.port_names() == {CLUSTER: unnamed, NODE_PORT: unnamed}
