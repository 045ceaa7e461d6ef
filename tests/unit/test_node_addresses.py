"""nodePortAddresses: which node addresses carry NodePorts."""

from __future__ import annotations

import pytest

from ipvsproxy.core.node_addresses import (
    InvalidNodePortAddresses,
    local_addresses,
    node_ip,
    node_port_addresses,
)

ADDRS = [
    (1, "127.0.0.1"),
    (2, "192.168.56.11"),
    (3, "10.244.1.1"),
    (4, "10.96.0.10"),  # on kube-ipvs0
    (4, "192.168.56.11"),  # also on kube-ipvs0, but eth0 has it too
    (2, "169.254.3.3"),
]


def test_default_is_every_local_address_but_loopback_and_the_dummy() -> None:
    # IPv4 link-local included (upstream's isValidForSet drops IPv6 link-local only).
    everything = ("10.244.1.1", "169.254.3.3", "192.168.56.11")
    assert node_port_addresses(ADDRS, dummy_index=4) == everything
    assert local_addresses(ADDRS, 4) == set(everything)
    assert node_port_addresses(ADDRS, 4, ["169.254.0.0/16"]) == ("169.254.3.3",)


def test_cidrs_and_primary_narrow_it() -> None:
    assert node_port_addresses(ADDRS, 4, ["192.168.56.0/24"]) == ("192.168.56.11",)
    assert node_port_addresses(ADDRS, 4, ["primary"], primary_ip="192.168.56.11") == (
        "192.168.56.11",
    )
    assert node_port_addresses(ADDRS, 4, ["10.96.0.0/12"]) == ()


def test_a_bad_entry_is_a_clear_error() -> None:
    with pytest.raises(InvalidNodePortAddresses, match="'nope'"):
        node_port_addresses(ADDRS, 4, ["nope"])


NODE = {
    "metadata": {"name": "node-1"},
    "status": {
        "addresses": [
            {"type": "Hostname", "address": "node-1"},
            {"type": "ExternalIP", "address": "203.0.113.5"},
            {"type": "InternalIP", "address": "fd00::11"},
            {"type": "InternalIP", "address": "192.168.56.11"},
        ]
    },
}


def test_node_ip_follows_upstreams_detect_node_ips() -> None:
    # InternalIP before ExternalIP whatever the order listed; this proxier's family only.
    assert node_ip("0.0.0.0", NODE) == "192.168.56.11"
    # A bindAddress that is not unspecified wins; one of the other family does not count.
    assert node_ip("10.0.0.7", NODE) == "10.0.0.7"
    assert node_ip("fd00::7", NODE) == "192.168.56.11"
    external_only = {"status": {"addresses": [{"type": "ExternalIP", "address": "203.0.113.5"}]}}
    assert node_ip("0.0.0.0", external_only) == "203.0.113.5"
    # Nothing to go by: None (the daemon falls back to 127.0.0.1 and warns).
    assert node_ip("0.0.0.0", None) is None
    assert node_ip("0.0.0.0", {"status": {"addresses": [{"type": "Hostname"}]}}) is None


def test_primary_is_the_node_ip_when_it_is_a_local_address() -> None:
    # The string-smallest local address (the pod bridge, 10.244.1.1) is not the node IP.
    ip = node_ip("0.0.0.0", NODE)
    assert node_port_addresses(ADDRS, 4, ["primary"], primary_ip=ip) == ("192.168.56.11",)
    # A node IP the node does not have (yet) carries no NodePort.
    assert node_port_addresses(ADDRS, 4, ["primary"], primary_ip="192.168.56.99") == ()


ADDRS6 = [
    *ADDRS,
    (1, "::1"),
    (2, "fc00::11"),
    (2, "fe80::1"),  # link-local: never a NodePort address
    (3, "fd00:10:244:1::1"),
    (4, "fd00:10:96::a"),  # on kube-ipvs0
]


def test_ipv6_node_addresses_when_the_proxy_serves_ipv6() -> None:
    assert node_port_addresses(ADDRS6, 4) == ("10.244.1.1", "169.254.3.3", "192.168.56.11")
    assert node_port_addresses(ADDRS6, 4, families=(4, 6)) == (
        "10.244.1.1",
        "169.254.3.3",
        "192.168.56.11",
        "fc00::11",
        "fd00:10:244:1::1",
    )
    assert local_addresses(ADDRS6, 4, (6,)) == {"fc00::11", "fd00:10:244:1::1"}
    primary = node_port_addresses(
        ADDRS6, 4, ["primary"], "192.168.56.11", (4, 6), primary_ip6="fc00::11"
    )
    assert primary == ("192.168.56.11", "fc00::11")
    assert node_port_addresses(ADDRS6, 4, ["fc00::/64", "fd00::/8"], None, (6,)) == (
        "fc00::11",
        "fd00:10:244:1::1",
    )


def test_a_family_nodePortAddresses_names_nothing_of_has_every_address_of_it() -> None:
    """Upstream's NewNodePortAddresses: a family with no CIDR of its own in the list matches
    all of that family's addresses (0.0.0.0/0 or ::/0), as does ``primary`` for a family
    without a node IP, or with a loopback one (expandNodePortAddressKeywords)."""
    v4 = ("10.244.1.1", "169.254.3.3", "192.168.56.11")
    v6 = ("fc00::11", "fd00:10:244:1::1")
    both = (4, 6)
    assert node_port_addresses(ADDRS6, 4, ["fc00::/64"], families=both) == (*v4, "fc00::11")
    assert node_port_addresses(ADDRS6, 4, ["192.168.56.0/24"], families=both) == (
        "192.168.56.11",
        *v6,
    )
    primary_v4 = node_port_addresses(ADDRS6, 4, ["primary"], "192.168.56.11", both, None)
    assert primary_v4 == ("192.168.56.11", *v6)
    fallback = node_port_addresses(ADDRS6, 4, ["primary"], "127.0.0.1", both, "fc00::11")
    assert fallback == (*v4, "fc00::11")
    assert node_port_addresses(ADDRS, 4, ["primary"], primary_ip="127.0.0.1") == v4


def test_the_ipv6_node_ip_is_the_nodes_first_ipv6_internal_ip() -> None:
    assert node_ip("0.0.0.0", NODE, 6) == "fd00::11"
    assert node_ip("fd00::7", NODE, 6) == "fd00::7"
    assert node_ip("::", NODE, 6) == "fd00::11"
    assert node_ip("0.0.0.0", {"status": {"addresses": []}}, 6) is None
