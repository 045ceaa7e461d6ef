"""Taking a node over from upstream kube-proxy (IPVS mode): its NodePort virtual servers, on
node addresses where nothing else marks them, are recognised by upstream's NodePort ipsets and
adopted (kept if a Service wants them, else deleted); nobody else's virtual server is touched
(``ipsets.recorded_node_ports``, ``observed.adopt_ours``). The kernel-lab counterpart with upstream
kube-proxy itself is tests/kernel/test_handover.py."""

from __future__ import annotations

from pathlib import Path

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey, VirtualServer
from ipvsproxy.dataplane.dataplane import Dataplane
from ipvsproxy.kernel.fakes import fake_backends

TCP, UDP, SCTP = Protocol.TCP, Protocol.UDP, Protocol.SCTP
NODE_IP, BRIDGE, OUTSIDE = "192.168.56.11", "10.244.1.1", "198.51.100.7"
LOCAL = {NODE_IP, BRIDGE}


def test_a_node_port_is_recognised_by_upstreams_set_on_a_node_address() -> None:
    members = {
        ipset_specs.NODE_PORT_TCP: {"30080"},
        ipset_specs.NODE_PORT_UDP: {"30053"},
        ipset_specs.NODE_PORT_SCTP: {f"{NODE_IP},sctp:30132"},
    }
    keys = [
        ServiceKey(NODE_IP, TCP, 30080),  # recorded: kube-proxy's
        ServiceKey(BRIDGE, TCP, 30080),  # on every node address
        ServiceKey(NODE_IP, UDP, 30053),
        ServiceKey(NODE_IP, SCTP, 30132),  # SCTP's entry names the address
        ServiceKey(BRIDGE, SCTP, 30132),  # ... so this one is not recorded
        ServiceKey(NODE_IP, UDP, 30080),  # TCP's port, not UDP's
        ServiceKey(NODE_IP, TCP, 8080),  # a port no NodePort set records
        ServiceKey(OUTSIDE, TCP, 30080),  # not an address of the node
    ]
    assert ipset_specs.recorded_node_ports(keys, members, LOCAL) == keys[:4]
    assert ipset_specs.recorded_node_ports(keys, {}, LOCAL) == []


def virtual_server(address: str, port: int, protocol: Protocol = TCP) -> VirtualServer:
    return VirtualServer(ServiceKey(address, protocol, port), "rr")


def test_kube_proxys_leftovers_are_removed_and_nobody_elses(tmp_path: Path) -> None:
    """No Service wants anything (all deleted while no proxy ran): kube-proxy's ClusterIP
    (on kube-ipvs0) and NodePort virtual servers go, their set members and address too;
    someone else's virtual servers on the node stay."""
    backends = fake_backends()
    ipvs, ipsets, addresses = backends.ipvs, backends.ipsets, backends.addresses
    addresses.add_device("eth0", NODE_IP)
    addresses.add_device("cni0", BRIDGE)
    kube_proxys = [
        virtual_server("10.96.0.50", 80),
        virtual_server(NODE_IP, 30080),
        virtual_server(BRIDGE, 30080),
    ]
    someone_elses = [
        virtual_server(NODE_IP, 8080),  # on a node address, a port no set records
        virtual_server(OUTSIDE, 30080),  # a recorded port, not on a node address
        virtual_server("127.0.0.1", 30080),  # loopback carries no NodePort (upstream's rule)
    ]
    for vs in kube_proxys + someone_elses:
        ipvs.add_virtual_server(vs)
    addresses.add_device("kube-ipvs0", "10.96.0.50")
    for name in ipset_specs.UPSTREAM_NAMES:
        ipsets.add_set(name)
    ipsets.add_set(ipset_specs.NODE_PORT_TCP, members={"30080"})
    ipsets.add_set(ipset_specs.CLUSTER_IP, members={"10.96.0.50,tcp:80"})
    ipsets.add_set(ipset_specs.IPVS_IPS, members={"10.96.0.50"})
    node = NodeFacts(name="node-1", node_ips=(NODE_IP, BRIDGE), primary_ip=NODE_IP)
    dp = Dataplane(node, backends, tmp_path / "state.json")

    result = dp.reconcile()

    assert not result.errors and not result.failed
    assert set(ipvs.virtual_servers) == {vs.key for vs in someone_elses}
    assert addresses.bound() == set()
    assert all(not members for members in ipsets.sets.values())
    # A set kube-proxy does not have is made only when it gets a member.
    assert set(ipsets.sets) == ipset_specs.UPSTREAM_NAMES
    assert ipvs.counters.ok == {"delete_service": 3}
    # And the next full sync, with the sets now empty, leaves the others alone as well.
    dp.reconcile()
    assert set(ipvs.virtual_servers) == {vs.key for vs in someone_elses}
