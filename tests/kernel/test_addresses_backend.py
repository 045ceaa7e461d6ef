"""Service addresses on kube-ipvs0, in batches, against the real kernel."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from ipvsproxy.core.diff import AddressOp, OpKind
from ipvsproxy.kernel.addresses import Addresses
from ipvsproxy.kernel.errors import ApplyError
from lab.net import netns
from lab.net.topology import Cluster

pytestmark = pytest.mark.kernel


@pytest.fixture
def addresses() -> Iterator[Addresses]:
    backend = Addresses()
    try:
        yield backend
    finally:
        backend.close()
        subprocess.run(["ip", "link", "del", "kube-ipvs0"], capture_output=True)


def test_device_is_created_and_addresses_bound_in_a_batch(addresses: Addresses) -> None:
    assert addresses.device_index() is None
    wanted = [f"10.96.{i // 200}.{i % 200 + 1}" for i in range(400)]
    addresses.apply([AddressOp(OpKind.ADD, a) for a in wanted])
    assert addresses.sock.sends <= 4
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", "kube-ipvs0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert len(out.splitlines()) == 400
    assert "inet 10.96.1.200/32" in out
    assert addresses.bound() == set(wanted)
    link = subprocess.run(
        ["ip", "-d", "link", "show", "kube-ipvs0"], capture_output=True, text=True
    )
    assert "dummy" in link.stdout
    flags = link.stdout.split("<", 1)[1].split(">", 1)[0].split(",")
    assert "UP" not in flags  # left down, as upstream keeps it
    addresses.apply([AddressOp(OpKind.DELETE, a) for a in wanted[:100]])
    assert addresses.bound() == set(wanted[100:])


def test_rejected_address_operations_are_named(addresses: Addresses) -> None:
    addresses.apply([AddressOp(OpKind.ADD, "10.96.5.5")])
    with pytest.raises(ApplyError) as exc:
        addresses.apply(
            [
                AddressOp(OpKind.ADD, "10.96.5.5"),  # exists
                AddressOp(OpKind.ADD, "10.96.5.6"),
                AddressOp(OpKind.DELETE, "10.96.5.7"),  # not there
            ]
        )
    assert exc.value.applied == 1
    text = str(exc.value)
    assert "add address 10.96.5.5 on kube-ipvs0" in text
    assert "delete address 10.96.5.7 on kube-ipvs0" in text
    assert addresses.bound() == {"10.96.5.5", "10.96.5.6"}


def test_node_port_addresses_from_a_lab_node(lab_cluster: Cluster) -> None:
    from ipvsproxy.core.node_addresses import node_port_addresses

    node = lab_cluster.node("node-1")
    with netns.entered(node.netns):
        backend = Addresses()
        try:
            backend.apply([AddressOp(OpKind.ADD, "10.96.9.1")])
            found = node_port_addresses(backend.indexed(), backend.device_index())
        finally:
            backend.remove_device()
            backend.close()
    # eth0 and cni0, not loopback and not the service address on kube-ipvs0.
    assert found == (node.gateway, node.ip)


def test_ipv6_service_addresses_are_bound_usable_at_once(addresses: Addresses) -> None:
    wanted = ["fd00:10:96::a", "fd00:10:96::1:0", "2001:db8::5"]
    addresses.apply([AddressOp(OpKind.ADD, a) for a in [*wanted, "10.96.0.10"]])
    out = subprocess.run(
        ["ip", "-o", "-6", "addr", "show", "dev", "kube-ipvs0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    lines = [ln for ln in out.splitlines() if "scope global" in ln]
    assert len(lines) == 3, out
    assert all("nodad" in ln and "tentative" not in ln for ln in lines), out
    assert "inet6 fd00:10:96::a/128" in out
    assert addresses.bound() == {*wanted, "10.96.0.10"}
    addresses.apply([AddressOp(OpKind.DELETE, "fd00:10:96::a")])
    assert addresses.bound() == {"fd00:10:96::1:0", "2001:db8::5", "10.96.0.10"}
