"""The planner with inputs real clusters send: odd but API-valid Services and EndpointSlices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.plan import NodeFacts, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.virtual_servers import DestKey, Protocol, ServiceKey
from ipvsproxy.dataplane.dataplane import Backends, Dataplane
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

NODE = NodeFacts(
    name="node-1",
    node_ips=("192.168.56.11",),
    local_addresses=frozenset({"192.168.56.11", "10.244.1.1"}),
    primary_ip="192.168.56.11",
)


def plan(svc: dict[str, Any] | None, *slices: dict[str, Any]) -> ServicePlan:
    return plan_service(svc, slices, NODE, PlanConfig())


def lb(ranges: list[str]) -> dict[str, Any]:
    return service(
        "fw",
        "10.96.0.50",
        type="LoadBalancer",
        ports=[{"name": "http", "port": 443, "nodePort": 30443, "protocol": "TCP"}],
        loadBalancerSourceRanges=ranges,
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.30"}]}},
    )


def test_a_source_range_of_slash_zero_admits_everyone() -> None:
    open_ = plan(lb([]))
    for ranges in (["0.0.0.0/0"], ["192.0.2.0/24", "0.0.0.0/0"], ["10.1.2.3/0"]):
        p = plan(lb(ranges))
        assert p.error is None
        assert p.members == open_.members, ranges
        assert not p.out_filters
    # An IPv6 /0 is no IPv4 range: with only IPv4 ranges beside it, those filter.
    p = plan(lb(["::/0", "192.0.2.0/24"]))
    assert p.members[ipset_specs.LOAD_BALANCER_SOURCE_CIDR] == {"203.0.113.30,tcp:443,192.0.2.0/24"}


class CountingPort(dict[str, Any]):
    """A slice port that counts how often the planner reads it."""

    reads = 0

    def get(self, key: str, default: Any = None) -> Any:
        CountingPort.reads += 1
        return super().get(key, default)


def test_planning_reads_each_slice_port_a_bounded_number_of_times() -> None:
    """Matching a Service's ports to a slice's was ports x ports (4,000 ports: 0.62 s per
    change); each slice port must be read a bounded number of times, however many ports."""
    for n in (50, 400):
        ports = [{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP"} for i in range(n)]
        slice_ports = [CountingPort(name=f"p{i}", port=2000 + i, protocol="TCP") for i in range(n)]
        sl = endpoint_slice("big", [endpoint("10.244.1.5")], ports=slice_ports)  # type: ignore[arg-type]
        CountingPort.reads = 0
        p = plan(service("big", "10.96.0.70", ports=ports), sl)
        assert len(p.real_servers) == n
        assert CountingPort.reads <= 4 * n, (n, CountingPort.reads)


ODD_ADDRESSES = {
    "224.0.0.5": "multicast",
    "239.255.255.250": "multicast",
    "255.255.255.255": "broadcast",
    "0.0.0.0": "unspecified",
    "0.1.2.3": "unspecified",
    "fd00::1": "IPv6",
    "010.1.1.1": "canonical",
    "10.1.1": "canonical",
}


def test_endpoint_entries_the_kernel_refuses_are_skipped_with_a_warning() -> None:
    good = ["10.244.1.11", "10.244.2.11"]
    eps = [endpoint(ip) for ip in [*good, *ODD_ADDRESSES]]
    slices = [
        endpoint_slice("odd", eps, name="odd-a"),
        endpoint_slice(
            "odd",
            [endpoint("10.244.3.11")],
            ports=[{"name": "http", "port": 70000, "protocol": "TCP"}],
            name="odd-b",
        ),
        endpoint_slice(
            "odd",
            [endpoint("10.244.3.12")],
            ports=[{"name": "http", "port": -1, "protocol": "TCP"}],
            name="odd-c",
        ),
    ]
    p = plan(service("odd", "10.96.0.80"), *slices)
    assert p.error is None
    assert sorted(str(d) for rs in p.real_servers.values() for d in rs) == [
        f"{ip}:8080" for ip in good
    ]
    (warning,) = p.warnings
    assert "default/odd" in warning
    for address, why in ODD_ADDRESSES.items():
        assert f"'{address}' (" in warning and why in warning.split(f"'{address}' (")[1]
    assert "port 70000 (out of range" in warning and "port -1 (out of range" in warning
    # Nothing odd: no warning.
    assert (
        plan(service("odd", "10.96.0.80"), endpoint_slice("odd", [endpoint(good[0])])).warnings
        == ()
    )


def test_the_warning_is_reported_as_for_an_invalid_service_and_goes_away(tmp_path: Path) -> None:
    unused: Any = None  # update_service never touches the kernel
    dp = Dataplane(NODE, Backends(*[unused] * 6), tmp_path / "state.json")
    svc = service("odd", "10.96.0.80")
    odd = endpoint_slice("odd", [endpoint("10.244.1.11"), endpoint("224.0.0.5")])
    report = dp.update_service("default/odd", svc, [odd])
    assert report is not None and "224.0.0.5" in report
    assert dp.errors == {"default/odd": report}
    key = ServiceKey("10.96.0.80", Protocol.TCP, 80)
    assert list(dp.desired.real_servers[key]) == [DestKey("10.244.1.11", 8080)]
    fine = endpoint_slice("odd", [endpoint("10.244.1.11")])
    assert dp.update_service("default/odd", svc, [fine]) is None
    assert dp.errors == {}


def _created(svc: dict[str, Any], when: str) -> dict[str, Any]:
    svc["metadata"]["creationTimestamp"] = when
    return svc


VICTIM = _created(service("victim", "10.96.0.90"), "2020-01-01T00:00:00Z")
THIEF = _created(
    service("thief", "10.96.0.91", externalIPs=["10.96.0.90"]), "2021-01-01T00:00:00+00:00"
)
V_SLICE = endpoint_slice("victim", [endpoint("10.244.1.11")])
T_SLICE = endpoint_slice("thief", [endpoint("10.244.2.22")])
CONTESTED = ServiceKey("10.96.0.90", Protocol.TCP, 80)


def _dataplane(tmp_path: Path) -> Dataplane:
    unused: Any = None  # update_service never touches the kernel
    return Dataplane(NODE, Backends(*[unused] * 6), tmp_path / "state.json")


def test_the_service_that_had_a_virtual_server_first_keeps_it(tmp_path: Path) -> None:
    """Whatever order they arrive in, the older Service owns the contested virtual server
    exactly, the newer one is reported, and whichever is left owns it exactly."""
    for order in ("victim first", "thief first"):
        dp = _dataplane(tmp_path)
        updates = [("default/victim", VICTIM, [V_SLICE]), ("default/thief", THIEF, [T_SLICE])]
        if order == "thief first":
            updates.reverse()
        for name, svc, slices in updates:
            dp.update_service(name, svc, slices)
        assert dp.desired.owner[CONTESTED] == "default/victim", order
        assert list(dp.desired.real_servers[CONTESTED]) == [DestKey("10.244.1.11", 8080)]
        assert "10.96.0.90" in dp.errors["default/thief"] and "default/victim" not in dp.errors
        # The thief's other virtual server and its own entries stay; its entry for the
        # contested one goes (no KUBE-EXTERNAL-IP member masquerading the victim's traffic).
        assert ServiceKey("10.96.0.91", Protocol.TCP, 80) in dp.desired.virtual_servers
        assert not dp.desired.has_member(ipset_specs.EXTERNAL_IP, "10.96.0.90,tcp:80")
        if order == "thief first":
            assert "default/thief" in dp.notices  # reported when the victim took it back
        # Status names the owner only.
        assert CONTESTED in dp.state.identities["default/victim"].virtual_servers
        assert CONTESTED not in dp.state.identities["default/thief"].virtual_servers
        # The thief goes: the victim's virtual server is exactly its own.
        dp.update_service("default/thief", None, [])
        assert list(dp.desired.real_servers[CONTESTED]) == [DestKey("10.244.1.11", 8080)]
        assert dp.errors == {}
        # Back; then the victim goes: the thief owns it now, exactly, and is not reported.
        dp.update_service("default/thief", THIEF, [T_SLICE])
        dp.update_service("default/victim", None, [])
        assert dp.desired.owner[CONTESTED] == "default/thief"
        assert CONTESTED in dp.state.identities["default/thief"].virtual_servers
        assert list(dp.desired.real_servers[CONTESTED]) == [DestKey("10.244.2.22", 8080)]
        assert dp.desired.has_member(ipset_specs.EXTERNAL_IP, "10.96.0.90,tcp:80")
        assert dp.errors == {}
        assert CONTESTED in dp.pending.services


def test_creation_time_then_name_decide_and_no_timestamp_comes_last(tmp_path: Path) -> None:
    dp = _dataplane(tmp_path)
    a = service("a", "10.96.0.92", externalIPs=["198.51.100.1"])  # no creationTimestamp
    b = _created(service("b", "10.96.0.93", externalIPs=["198.51.100.1"]), "2022-05-01T00:00:00Z")
    c = _created(service("c", "10.96.0.94", externalIPs=["198.51.100.1"]), "2022-05-01T00:00:00Z")
    key = ServiceKey("198.51.100.1", Protocol.TCP, 80)
    for name, svc in (("default/a", a), ("default/c", c), ("default/b", b)):
        dp.update_service(name, svc, [])
    assert dp.desired.owner[key] == "default/b"  # same time: by name
    assert set(dp.errors) == {"default/a", "default/c"}
    dp.update_service("default/b", None, [])
    assert dp.desired.owner[key] == "default/c"
    dp.update_service("default/c", None, [])
    assert dp.desired.owner[key] == "default/a" and dp.errors == {}


API_SERVER = "192.168.56.2"
GUARDED = PlanConfig(reserved=frozenset({API_SERVER}))


def _vips(p: ServicePlan) -> set[str]:
    return {key.address for key in p.virtual_servers}


def test_an_unparsable_external_or_load_balancer_ip_or_range_skips_that_entry_only() -> None:
    svc = service(
        "odd",
        "10.96.0.60",
        type="LoadBalancer",
        externalIPs=["010.1.1.1", "198.51.100.7", "nope", ""],
        loadBalancerSourceRanges=["192.0.2.0/24", "10.0.0.0/33", " 198.18.0.0/15 "],
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.300"}, {"ip": "203.0.113.30"}]}},
    )
    p = plan(svc)
    assert p.error is None
    assert _vips(p) == {"10.96.0.60", "198.51.100.7", "203.0.113.30"}
    assert p.members[ipset_specs.LOAD_BALANCER_SOURCE_CIDR] == {
        "203.0.113.30,tcp:80,192.0.2.0/24",
        "203.0.113.30,tcp:80,198.18.0.0/15",
    }
    (warning,) = p.warnings
    assert "default/odd" in warning
    for bad in ("'010.1.1.1'", "'nope'", "'203.0.113.300'", "'10.0.0.0/33'"):
        assert bad in warning, bad
    assert "''" not in warning  # an empty entry is no entry (upstream: not even logged)


def test_source_ranges_none_of_which_parses_admit_no_one() -> None:
    """Upstream drops unparsable ranges and, none left, admits everyone; a firewall whose
    every rule is unreadable is closed instead (and reported), never silently opened."""
    p = plan(lb(["010.0.0.0/8", "nope"]))
    assert p.error is None and "203.0.113.30" in _vips(p)
    assert p.members[ipset_specs.LOAD_BALANCER_FW] == {"203.0.113.30,tcp:443"}
    assert ipset_specs.LOAD_BALANCER_SOURCE_CIDR not in p.members
    assert ipset_specs.LOAD_BALANCER_SOURCE_IP not in p.members
    assert {f.address for f in p.out_filters} == {"203.0.113.30"}
    (warning,) = p.warnings
    assert "'010.0.0.0/8'" in warning and "admit no source" in warning


SPECIAL = {
    "127.0.0.1": "loopback",
    "127.1.2.3": "loopback",
    "169.254.169.254": "link-local",
    "0.0.0.0": "unspecified",
    "224.0.0.1": "multicast",
    "255.255.255.255": "broadcast",
    "::1": "loopback",
    "fe80::1": "link-local",
    "::": "unspecified",
    "ff02::1": "multicast",
    "::ffff:127.0.0.1": "IPv4-mapped",
    "2001:db8::1%eth0": "zone",
    "192.168.56.11": "this node's address",
    "10.244.1.1": "this node's address",
    API_SERVER: "the API server's address",
}


def _special_warning(p: ServicePlan, what: str, refused: dict[str, str]) -> None:
    (warning,) = p.warnings
    for address, why in refused.items():
        named = f"{what} '{address}' ("
        assert named in warning and why in warning.split(named)[1], (address, warning)


# Two halves: a warning names at most 10 entries.
HALVES = [dict(list(SPECIAL.items())[:7]), dict(list(SPECIAL.items())[7:])]


def test_special_and_node_owned_external_ips_are_refused_the_rest_programmed() -> None:
    for refused in HALVES:
        svc = service("ext", "10.96.0.61", externalIPs=[*refused, "198.51.100.8"])
        p = plan_service(svc, [endpoint_slice("ext", [endpoint("10.244.1.11")])], NODE, GUARDED)
        assert p.error is None
        assert _vips(p) == {"10.96.0.61", "198.51.100.8"}
        assert p.bind == {"10.96.0.61", "198.51.100.8"}
        assert p.members[ipset_specs.EXTERNAL_IP] == {"198.51.100.8,tcp:80"}
        _special_warning(p, "externalIP", refused)


def test_special_and_node_owned_load_balancer_ips_are_refused_the_rest_programmed() -> None:
    for refused in HALVES:
        ingress = [{"ip": ip} for ip in [*refused, "203.0.113.31"]]
        svc = service(
            "lbs",
            "10.96.0.62",
            type="LoadBalancer",
            ports=[{"name": "http", "port": 80, "nodePort": 30062, "protocol": "TCP"}],
            status={"loadBalancer": {"ingress": ingress}},
        )
        p = plan_service(svc, [], NODE, GUARDED)
        assert p.error is None
        assert _vips(p) == {"10.96.0.62", "203.0.113.31", "192.168.56.11"}  # (the NodePort)
        assert p.bind == {"10.96.0.62", "203.0.113.31"}
        assert p.members[ipset_specs.LOAD_BALANCER] == {"203.0.113.31,tcp:80"}
        _special_warning(p, "load-balancer ingress IP", refused)


def test_load_balancer_ips_of_a_service_of_another_type_are_programmed() -> None:
    # Upstream's newBaseServiceInfo reads status.loadBalancer.ingress whatever the type.
    status = {"loadBalancer": {"ingress": [{"ip": "203.0.113.32"}]}}
    for stype in ("ClusterIP", "NodePort"):
        p = plan(service("was-lb", "10.96.0.63", type=stype, status=status))
        assert "203.0.113.32" in _vips(p), stype
        assert p.members[ipset_specs.LOAD_BALANCER] == {"203.0.113.32,tcp:80"}
        assert p.warnings == ()


def test_a_refused_external_ip_is_reported_on_its_service(tmp_path: Path) -> None:
    """As every warning: in ``errors`` (a Warning Event, ``status``) while it lasts, with the
    rest of the Service programmed."""
    dp = _dataplane(tmp_path)
    svc = service("ext", "10.96.0.64", externalIPs=["127.0.0.1", "198.51.100.9"])
    report = dp.update_service("default/ext", svc, [])
    assert report is not None and "'127.0.0.1' (loopback" in report
    assert dp.errors == {"default/ext": report}
    assert {k.address for k in dp.desired.virtual_servers} == {"10.96.0.64", "198.51.100.9"}
    fixed = service("ext", "10.96.0.64", externalIPs=["198.51.100.9"])
    assert dp.update_service("default/ext", fixed, []) is None
    assert dp.errors == {}


def test_a_long_skipped_value_is_cut_in_the_warning() -> None:
    # Warnings go into Events, `status` and the log, on every node: a user's value is quoted
    # by its first 64 characters only.
    long = "1" * 256 * 1024
    svc = service(
        "long",
        "10.96.0.65",
        type="LoadBalancer",
        externalIPs=[long],
        loadBalancerSourceRanges=[long, "192.0.2.0/24"],
        status={"loadBalancer": {"ingress": [{"ip": long}]}},
    )
    (warning,) = plan(svc).warnings
    assert len(warning) < 1000
    assert f"externalIP {'1' * 64!r}... (262144 characters)" in warning
