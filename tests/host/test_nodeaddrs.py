"""nodePortAddresses: which node addresses carry NodePorts."""

from __future__ import annotations

import pytest

from ipvsproxy.nodeaddrs import InvalidNodePortAddresses, local_addresses, node_port_addresses

ADDRS = [
    (1, "127.0.0.1"),
    (2, "192.168.56.11"),
    (3, "10.244.1.1"),
    (4, "10.96.0.10"),  # on kube-ipvs0
    (4, "192.168.56.11"),  # also on kube-ipvs0, but eth0 has it too
    (2, "169.254.3.3"),
]


def test_default_is_every_local_address_but_loopback_link_local_and_the_dummy() -> None:
    assert node_port_addresses(ADDRS, dummy_index=4) == ("10.244.1.1", "192.168.56.11")
    assert local_addresses(ADDRS, 4) == {"10.244.1.1", "192.168.56.11"}


def test_cidrs_and_primary_narrow_it() -> None:
    assert node_port_addresses(ADDRS, 4, ["192.168.56.0/24"]) == ("192.168.56.11",)
    assert node_port_addresses(ADDRS, 4, ["primary"], primary_ip="192.168.56.11") == (
        "192.168.56.11",
    )
    assert node_port_addresses(ADDRS, 4, ["10.96.0.0/12"]) == ()


def test_a_bad_entry_is_a_clear_error() -> None:
    with pytest.raises(InvalidNodePortAddresses, match="'nope'"):
        node_port_addresses(ADDRS, 4, ["nope"])
