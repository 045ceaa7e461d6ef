"""``ipvsproxy status``: its report, drift count and table, from hand-built values (no kernel)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from ipvsproxy.core.identities import (
    ROLE_CLUSTER_IP,
    ROLE_NODE_PORT,
    TOPOLOGY_CLUSTER,
    TOPOLOGY_LOCAL,
    TOPOLOGY_SAME_ZONE,
    EndpointIdentity,
    ServiceIdentity,
    VirtualServerIdentity,
)
from ipvsproxy.core.ruleset import JUMPS, chain_digest
from ipvsproxy.core.virtual_servers import (
    FWD_DROUTE,
    FWD_MASQ,
    SVC_F_HASHED,
    SVC_F_PERSISTENT,
    DestKey,
    DestStats,
    ObservedDest,
    Protocol,
    RealServer,
    ServiceKey,
    Traffic,
    VirtualServer,
)
from ipvsproxy.status import view

NOW = 1_700_000_100.0
SYNCED = 1_700_000_097.5  # 2.5 s before NOW
URL = "http://127.0.0.1:10249/status"
STATE = "/var/lib/ipvsproxy/state.json"

WEB = ServiceKey("10.96.0.10", Protocol.TCP, 80)
WEB_NP = ServiceKey("192.168.56.11", Protocol.TCP, 30080)
STICKY = ServiceKey("10.96.0.20", Protocol.TCP, 443)
DNS = ServiceKey("10.96.0.53", Protocol.UDP, 53)
FOREIGN = ServiceKey("10.0.0.99", Protocol.TCP, 8080)

POD_A = DestKey("10.244.1.11", 8080)
POD_B = DestKey("10.244.2.11", 8080)
POD_C = DestKey("10.244.3.11", 8443)
POD_D = DestKey("10.244.1.12", 5353)
OTHER = DestKey("10.1.1.1", 80)

WEB_IDENT = ServiceIdentity.of(
    {
        WEB: VirtualServerIdentity(
            "default/web", "http", 80, "NodePort", ROLE_CLUSTER_IP, TOPOLOGY_CLUSTER
        ),
        WEB_NP: VirtualServerIdentity(
            "default/web", "http", 80, "NodePort", ROLE_NODE_PORT, TOPOLOGY_LOCAL
        ),
    },
    {
        POD_A.address: EndpointIdentity("default/web-a", "node-1"),
        POD_B.address: EndpointIdentity("default/web-b", "node-2"),
    },
)
STICKY_IDENT = ServiceIdentity.of(
    {
        STICKY: VirtualServerIdentity(
            "shop/sticky", "", 443, "ClusterIP", ROLE_CLUSTER_IP, TOPOLOGY_SAME_ZONE
        )
    },
    {POD_C.address: EndpointIdentity("shop/sticky-0", "node-3")},
)
IDENTITIES = {"default/web": WEB_IDENT, "shop/sticky": STICKY_IDENT}

# The desired state: web's pod B is terminating (no longer wanted), sticky is persistent.
DESIRED_VS = {
    WEB: VirtualServer(WEB),
    WEB_NP: VirtualServer(WEB_NP),
    STICKY: VirtualServer(STICKY, "sh", SVC_F_PERSISTENT, 10800),
}
DESIRED_RS = {
    WEB: {POD_A: RealServer(POD_A)},
    WEB_NP: {POD_A: RealServer(POD_A)},
    STICKY: {POD_C: RealServer(POD_C, 2)},
}

VS_KEYS = {
    "protocol",
    "address",
    "port",
    "scheduler",
    "flags",
    "persistent",
    "persistenceTimeout",
    "netmask",
    "ours",
    "service",
    "portName",
    "servicePort",
    "type",
    "role",
    "topology",
    "stats",
    "rate",
    "realServers",
}
RS_KEYS = {
    "address",
    "port",
    "forward",
    "weight",
    "terminating",
    "activeConnections",
    "inactiveConnections",
    "persistentConnections",
    "pod",
    "node",
    "stats",
    "rate",
}

KernelEntry = tuple[VirtualServer, Traffic, dict[DestKey, tuple[ObservedDest, Traffic]]]


def traffic(n: int) -> Traffic:
    """Counters that differ from each other, so a swapped field shows."""
    return Traffic(*(n * 100 + i for i in range(1, 11)))


def dest(
    key: DestKey, weight: int = 1, active: int = 0, inactive: int = 0, persistent: int = 0
) -> tuple[ObservedDest, Traffic]:
    return (
        ObservedDest(RealServer(key, weight), DestStats(active, inactive, persistent)),
        traffic(key.port % 7 + 10),  # 8080: 1201..1210
    )


def kernel_matching() -> dict[ServiceKey, KernelEntry]:
    """What the kernel holds when it matches DESIRED_*: pod B draining at weight 0, the
    kernel's HASHED flag set, and someone else's virtual server next to ours."""
    return {
        WEB: (
            VirtualServer(WEB, "rr", SVC_F_HASHED),
            traffic(1),
            {POD_A: dest(POD_A, 1, 5, 7), POD_B: dest(POD_B, 0, 3, 1)},
        ),
        WEB_NP: (VirtualServer(WEB_NP, "rr", SVC_F_HASHED), traffic(2), {POD_A: dest(POD_A)}),
        STICKY: (
            VirtualServer(STICKY, "sh", SVC_F_PERSISTENT | SVC_F_HASHED, 10800),
            traffic(3),
            {POD_C: dest(POD_C, 2, 1, 0, 4)},
        ),
        FOREIGN: (VirtualServer(FOREIGN, "wlc", SVC_F_HASHED), traffic(4), {OTHER: dest(OTHER)}),
    }


def daemon_view(
    vss: Mapping[ServiceKey, VirtualServer] = DESIRED_VS,
    rss: Mapping[ServiceKey, Mapping[DestKey, RealServer]] = DESIRED_RS,
    last_sync: float | None = SYNCED,
    pending: int = 0,
    invalid: Mapping[str, str] | None = None,
) -> view.DaemonView:
    """Through the daemon's /status document and back, as ``status`` gets it."""
    doc = view.daemon_document("node-1", vss, rss, IDENTITIES, last_sync, pending, invalid or {})
    return view.parse_daemon_document(doc)


def sources(
    kernel: Mapping[ServiceKey, Any], daemon: view.DaemonView | None = None, **kw: Any
) -> view.Sources:
    ours = frozenset(k for k in kernel if k in DESIRED_VS)
    return view.Sources(daemon_url=URL, daemon=daemon, state_path=STATE, ours=ours, **kw)


def daemon_report(kernel: Mapping[ServiceKey, KernelEntry] | None = None) -> dict[str, Any]:
    k = kernel_matching() if kernel is None else kernel
    return view.build_report(k, sources(k, daemon_view()), NOW)


def state_file_report() -> dict[str, Any]:
    k = kernel_matching()
    src = sources(
        k,
        daemon_error="[Errno 111] Connection refused",
        state_identities=IDENTITIES,
        state_time=1_700_000_000.0,
    )
    return view.build_report(k, src, NOW)


def kernel_report() -> dict[str, Any]:
    k = kernel_matching()
    src = sources(k, daemon_error="[Errno 111] Connection refused")
    return view.build_report(k, src, NOW)


def by_address(report: Mapping[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    return {(v["protocol"], v["address"], v["port"]): v for v in report["virtualServers"]}


def entry(report: Mapping[str, Any], key: ServiceKey) -> dict[str, Any]:
    return by_address(report)[(key.protocol.value, key.address, key.port)]


def real_server(vs: Mapping[str, Any], key: DestKey) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        r for r in vs["realServers"] if (r["address"], r["port"]) == (key.address, key.port)
    ]
    (rs,) = found
    return rs


def drift_of(
    kernel: Mapping[ServiceKey, KernelEntry],
    daemon: view.DaemonView | None = None,
    ours: frozenset[ServiceKey] | None = None,
) -> list[str]:
    d = daemon_view() if daemon is None else daemon
    return view.drift(
        d, kernel, frozenset(k for k in kernel if k in DESIRED_VS) if ours is None else ours
    )


# -- the report ------------------------------------------------------------------------------


def test_report_key_sets_are_the_documented_schema() -> None:
    report = daemon_report()
    assert set(report) == {
        "schemaVersion",
        "node",
        "view",
        "generatedAt",
        "daemon",
        "stateFile",
        "drift",
        "virtualServers",
    }
    assert report["schemaVersion"] == 1
    assert set(report["daemon"]) == {
        "running",
        "url",
        "error",
        "lastSync",
        "secondsSinceSync",
        "pendingChanges",
        "invalidServices",
    }
    assert set(report["stateFile"]) == {"path", "modified", "error", "daemonProblem"}
    assert set(report["drift"]) == {"count", "operations"}
    for vs in report["virtualServers"]:
        assert set(vs) == VS_KEYS
        assert set(vs["stats"]) == {
            "connections",
            "inPackets",
            "outPackets",
            "inBytes",
            "outBytes",
        }
        assert set(vs["rate"]) == {
            "connectionsPerSecond",
            "inPacketsPerSecond",
            "outPacketsPerSecond",
            "inBytesPerSecond",
            "outBytesPerSecond",
        }
        for rs in vs["realServers"]:
            assert set(rs) == RS_KEYS
            assert set(rs["stats"]) == set(vs["stats"])
            assert set(rs["rate"]) == set(vs["rate"])
    for other in (state_file_report(), kernel_report()):
        assert set(other) == set(report)
        assert set(other["daemon"]) == set(report["daemon"])
        assert all(set(vs) == VS_KEYS for vs in other["virtualServers"])


def test_daemon_view_report() -> None:
    report = daemon_report()
    assert report["view"] == view.VIEW_DAEMON == "daemon"
    assert report["node"] == "node-1"
    assert report["generatedAt"] == "2023-11-14T22:15:00Z"
    assert report["daemon"] == {
        "running": True,
        "url": URL,
        "error": None,
        "lastSync": "2023-11-14T22:14:57Z",
        "secondsSinceSync": 2.5,
        "pendingChanges": 0,
        "invalidServices": {},
    }
    assert report["stateFile"] == {
        "path": STATE,
        "modified": None,
        "error": None,
        "daemonProblem": None,
    }
    assert report["drift"] == {"count": 0, "operations": []}
    # Every virtual server in the kernel is listed, ours and someone else's, in key order.
    assert [(v["address"], v["port"]) for v in report["virtualServers"]] == [
        ("10.0.0.99", 8080),
        ("10.96.0.10", 80),
        ("10.96.0.20", 443),
        ("192.168.56.11", 30080),
    ]


def test_daemon_view_virtual_and_real_servers() -> None:
    report = daemon_report()
    web = entry(report, WEB)
    assert web["protocol"] == "TCP"
    assert web["scheduler"] == "rr"
    assert web["flags"] == SVC_F_HASHED
    assert web["persistent"] is False
    assert web["persistenceTimeout"] == 0
    assert web["netmask"] == 32
    assert web["ours"] is True
    assert (web["service"], web["portName"], web["servicePort"]) == ("default/web", "http", 80)
    assert (web["type"], web["role"]) == ("NodePort", "ClusterIP")
    assert web["stats"] == {
        "connections": 101,
        "inPackets": 102,
        "outPackets": 103,
        "inBytes": 104,
        "outBytes": 105,
    }
    assert web["rate"] == {
        "connectionsPerSecond": 106,
        "inPacketsPerSecond": 107,
        "outPacketsPerSecond": 108,
        "inBytesPerSecond": 109,
        "outBytesPerSecond": 110,
    }
    assert [(r["address"], r["port"]) for r in web["realServers"]] == [
        ("10.244.1.11", 8080),
        ("10.244.2.11", 8080),
    ]
    a, b = web["realServers"]
    assert a == {
        "address": "10.244.1.11",
        "port": 8080,
        "forward": "Masq",
        "weight": 1,
        "terminating": False,
        "activeConnections": 5,
        "inactiveConnections": 7,
        "persistentConnections": 0,
        "pod": "default/web-a",
        "node": "node-1",
        "stats": {
            "connections": 1201,
            "inPackets": 1202,
            "outPackets": 1203,
            "inBytes": 1204,
            "outBytes": 1205,
        },
        "rate": {
            "connectionsPerSecond": 1206,
            "inPacketsPerSecond": 1207,
            "outPacketsPerSecond": 1208,
            "inBytesPerSecond": 1209,
            "outBytesPerSecond": 1210,
        },
    }
    assert (b["weight"], b["terminating"]) == (0, True)
    assert (b["activeConnections"], b["inactiveConnections"]) == (3, 1)
    assert (b["pod"], b["node"]) == ("default/web-b", "node-2")

    np = entry(report, WEB_NP)
    assert (np["service"], np["type"], np["role"]) == ("default/web", "NodePort", "NodePort")
    assert np["stats"]["connections"] == 201

    sticky = entry(report, STICKY)
    assert (sticky["scheduler"], sticky["persistent"], sticky["persistenceTimeout"]) == (
        "sh",
        True,
        10800,
    )
    assert (sticky["service"], sticky["portName"], sticky["servicePort"]) == (
        "shop/sticky",
        "",
        443,
    )
    (c,) = sticky["realServers"]
    assert (c["weight"], c["persistentConnections"], c["pod"], c["node"]) == (
        2,
        4,
        "shop/sticky-0",
        "node-3",
    )

    foreign = entry(report, FOREIGN)
    assert foreign["ours"] is False
    assert foreign["service"] is None
    assert foreign["portName"] is None
    assert foreign["type"] is None
    assert foreign["role"] is None
    (other,) = foreign["realServers"]
    assert (other["pod"], other["node"]) == (None, None)


def test_forward_method_names() -> None:
    k = kernel_matching()
    k[FOREIGN] = (
        k[FOREIGN][0],
        Traffic(),
        {
            OTHER: (ObservedDest(RealServer(OTHER, 1, FWD_DROUTE)), Traffic()),
            POD_D: (ObservedDest(RealServer(POD_D, 1, 9)), Traffic()),
        },
    )
    forward = {r["address"]: r["forward"] for r in entry(daemon_report(k), FOREIGN)["realServers"]}
    assert forward == {"10.1.1.1": "Route", "10.244.1.12": "9"}
    assert view.FORWARD_NAMES[FWD_MASQ] == "Masq"


def test_daemon_not_yet_synced() -> None:
    k = kernel_matching()
    report = view.build_report(k, sources(k, daemon_view(last_sync=None, pending=4)), NOW)
    assert report["daemon"]["lastSync"] is None
    assert report["daemon"]["secondsSinceSync"] is None
    assert report["daemon"]["pendingChanges"] == 4
    assert view.header_lines(report)[0] == (
        "ipvsproxy on node-1: daemon running, not synced yet, 4 changes pending;"
        " kernel matches the desired state (drift 0)"
    )


def test_state_file_view_report() -> None:
    report = state_file_report()
    assert report["view"] == view.VIEW_STATE_FILE == "state-file"
    assert report["node"] is None
    assert report["daemon"] == {
        "running": False,
        "url": URL,
        "error": "[Errno 111] Connection refused",
        "lastSync": None,
        "secondsSinceSync": None,
        "pendingChanges": None,
        "invalidServices": {},
    }
    assert report["stateFile"] == {
        "path": STATE,
        "modified": "2023-11-14T22:13:20Z",
        "error": None,
        "daemonProblem": None,
    }
    assert report["drift"] == {"count": None, "operations": []}
    # Names come from the state file.
    web = entry(report, WEB)
    assert (web["service"], web["portName"], web["type"]) == ("default/web", "http", "NodePort")
    assert real_server(web, POD_B)["pod"] == "default/web-b"
    assert real_server(web, POD_B)["terminating"] is True
    assert len(report["virtualServers"]) == 4


def test_kernel_view_report() -> None:
    report = kernel_report()
    assert report["view"] == view.VIEW_KERNEL == "kernel"
    assert report["daemon"]["running"] is False
    assert report["drift"]["count"] is None
    assert len(report["virtualServers"]) == 4
    for vs in report["virtualServers"]:
        assert (vs["service"], vs["portName"], vs["type"], vs["role"]) == (None,) * 4
        for rs in vs["realServers"]:
            assert (rs["pod"], rs["node"]) == (None, None)
    # Counters and settings still come from the kernel.
    web = entry(report, WEB)
    assert web["ours"] is True
    assert web["stats"]["connections"] == 101
    assert real_server(web, POD_A)["activeConnections"] == 5
    assert real_server(web, POD_B)["weight"] == 0


def test_service_filter_keeps_only_that_service() -> None:
    k = kernel_matching()
    report = view.build_report(k, sources(k, daemon_view()), NOW, service="default/web")
    assert [(v["address"], v["port"]) for v in report["virtualServers"]] == [
        ("10.96.0.10", 80),
        ("192.168.56.11", 30080),
    ]
    assert {v["service"] for v in report["virtualServers"]} == {"default/web"}
    sticky = view.build_report(k, sources(k, daemon_view()), NOW, service="shop/sticky")
    assert [v["address"] for v in sticky["virtualServers"]] == ["10.96.0.20"]
    # Without names nothing matches; a Service that is not there matches nothing.
    assert kernel_report()["virtualServers"]
    src = sources(k, daemon_error="refused")
    assert view.build_report(k, src, NOW, service="default/web")["virtualServers"] == []
    nothing = view.build_report(k, sources(k, daemon_view()), NOW, service="default/gone")
    assert nothing["virtualServers"] == []


def test_virtual_service_filter_keeps_only_that_one_and_counts_all_drift() -> None:
    k = kernel_matching()
    del k[WEB_NP]  # drift 1, outside the filter: still counted
    report = view.build_report(k, sources(k, daemon_view()), NOW, only=STICKY)
    assert [(v["address"], v["port"]) for v in report["virtualServers"]] == [("10.96.0.20", 443)]
    assert report["drift"]["count"] == 1
    udp = ServiceKey(STICKY.address, Protocol.UDP, STICKY.port)
    assert view.build_report(k, sources(k, daemon_view()), NOW, only=udp)["virtualServers"] == []


@pytest.mark.parametrize(
    ("text", "proto", "want"),
    [
        ("10.96.0.10:80", Protocol.TCP, ServiceKey("10.96.0.10", Protocol.TCP, 80)),
        ("[fd00:0::a]:53", Protocol.UDP, ServiceKey("fd00::a", Protocol.UDP, 53)),
        ("[fd00::a]:3868", Protocol.SCTP, ServiceKey("fd00::a", Protocol.SCTP, 3868)),
    ],
)
def test_parse_virtual_address(text: str, proto: Protocol, want: ServiceKey) -> None:
    assert view.parse_virtual_address(text, proto) == want


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("10.96.0.10", "illegal virtual server"),
        ("10.96.0.10:0", "illegal virtual server port"),
        ("10.96.0.10:65536", "illegal virtual server port"),
        ("10.96.0.10:http", "illegal virtual server address"),
        ("web:80", "illegal virtual server address"),
        ("fd00::a:53", "[ADDR]:PORT"),
        ("[10.96.0.10:80", "illegal virtual server address"),
    ],
)
def test_parse_virtual_address_rejects(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        view.parse_virtual_address(text, Protocol.TCP)


def test_empty_kernel() -> None:
    report = view.build_report({}, sources({}, daemon_view()), NOW)
    assert report["virtualServers"] == []
    # Everything desired is missing: three virtual servers to add.
    assert report["drift"]["count"] == 3
    assert "(no virtual servers)" in view.render_table(report).splitlines()


# -- drift -----------------------------------------------------------------------------------


def test_no_drift_when_kernel_matches() -> None:
    assert drift_of(kernel_matching()) == []


def test_missing_real_server_is_drift() -> None:
    k = kernel_matching()
    del k[WEB_NP][2][POD_A]
    assert drift_of(k) == ["add real server 10.244.1.11:8080 of TCP 192.168.56.11:30080"]
    report = view.build_report(k, sources(k, daemon_view()), NOW)
    assert report["drift"] == {
        "count": 1,
        "operations": ["add real server 10.244.1.11:8080 of TCP 192.168.56.11:30080"],
    }


def test_missing_virtual_server_is_drift() -> None:
    k = kernel_matching()
    del k[STICKY]
    assert drift_of(k) == ["add virtual server TCP 10.96.0.20:443"]


def test_extra_virtual_server_of_ours_is_drift() -> None:
    k = kernel_matching()
    gone = ServiceKey("10.96.0.99", Protocol.TCP, 80)
    k[gone] = (VirtualServer(gone), Traffic(), {})
    assert drift_of(k, ours=frozenset({*DESIRED_VS, gone})) == [
        "delete virtual server TCP 10.96.0.99:80"
    ]


def test_foreign_virtual_server_is_not_drift() -> None:
    k = kernel_matching()
    assert FOREIGN in k
    assert drift_of(k, ours=frozenset(DESIRED_VS)) == []
    # The same virtual server counts once it is ours.
    assert drift_of(k, ours=frozenset({*DESIRED_VS, FOREIGN})) == [
        "delete virtual server TCP 10.0.0.99:8080"
    ]


def test_changed_weight_is_drift() -> None:
    k = kernel_matching()
    k[STICKY][2][POD_C] = dest(POD_C, weight=5)
    assert drift_of(k) == ["set real server 10.244.3.11:8443 of TCP 10.96.0.20:443"]


def test_changed_scheduler_is_drift() -> None:
    k = kernel_matching()
    _vs, t, dests = k[WEB]
    k[WEB] = (VirtualServer(WEB, "wlc", SVC_F_HASHED), t, dests)
    assert drift_of(k) == ["set virtual server TCP 10.96.0.10:80"]


def test_lost_persistence_is_drift() -> None:
    k = kernel_matching()
    _vs, t, dests = k[STICKY]
    k[STICKY] = (VirtualServer(STICKY, "sh", SVC_F_HASHED), t, dests)
    assert drift_of(k) == ["set virtual server TCP 10.96.0.20:443"]


def test_drift_operations_counted_together() -> None:
    k = kernel_matching()
    _vs, t, dests = k[WEB]
    k[WEB] = (VirtualServer(WEB, "lc", SVC_F_HASHED), t, dests)
    del k[WEB_NP][2][POD_A]
    k[STICKY][2][POD_C] = dest(POD_C, weight=1)
    report = view.build_report(k, sources(k, daemon_view()), NOW)
    assert report["drift"]["count"] == 3
    assert sorted(report["drift"]["operations"]) == [
        "add real server 10.244.1.11:8080 of TCP 192.168.56.11:30080",
        "set real server 10.244.3.11:8443 of TCP 10.96.0.20:443",
        "set virtual server TCP 10.96.0.10:80",
    ]
    assert view.header_lines(report)[0].endswith(
        "; kernel differs from the desired state (drift 3)"
    )


def test_draining_real_server_is_not_drift() -> None:
    # Pod B is at weight 0 with connections (kernel_matching): draining by design.
    k = kernel_matching()
    assert k[WEB][2][POD_B][0].server.weight == 0
    assert drift_of(k) == []
    # Idle and still at weight 0: the next reconcile removes it; still draining, not drift.
    k[WEB][2][POD_B] = dest(POD_B, weight=0)
    assert drift_of(k) == []
    # A UDP real server at weight 0 that is no longer wanted is not drift either.
    vss = {**DESIRED_VS, DNS: VirtualServer(DNS)}
    rss = {**DESIRED_RS, DNS: {}}
    k[DNS] = (VirtualServer(DNS, "rr", SVC_F_HASHED), Traffic(), {POD_D: dest(POD_D, 0)})
    assert drift_of(k, daemon_view(vss, rss), frozenset(vss)) == []


def test_unwanted_real_server_with_weight_is_drift() -> None:
    k = kernel_matching()
    k[WEB][2][POD_B] = dest(POD_B, weight=1, active=3)
    assert drift_of(k) == ["set real server 10.244.2.11:8080 of TCP 10.96.0.10:80"]
    k[WEB][2][POD_B] = dest(POD_B, weight=1)
    assert drift_of(k) == ["delete real server 10.244.2.11:8080 of TCP 10.96.0.10:80"]


def test_real_servers_of_foreign_virtual_server_are_not_drift() -> None:
    k = kernel_matching()
    k[FOREIGN][2][POD_A] = dest(POD_A, weight=7)
    assert drift_of(k) == []


# -- the daemon's document -------------------------------------------------------------------


def test_daemon_document_round_trip() -> None:
    d = daemon_view(pending=2, invalid={"default/bad": "no ports"})
    assert d.node == "node-1"
    assert d.last_sync == SYNCED
    assert d.pending == 2
    assert d.invalid == {"default/bad": "no ports"}
    assert d.virtual_servers == DESIRED_VS
    assert d.real_servers == DESIRED_RS
    assert d.identities == IDENTITIES


def test_parse_rejects_wrong_version() -> None:
    doc = view.daemon_document("n", DESIRED_VS, DESIRED_RS, IDENTITIES, None, 0, {})
    doc["version"] = 2
    with pytest.raises(ValueError, match="unsupported daemon status version 2"):
        view.parse_daemon_document(doc)
    del doc["version"]
    with pytest.raises(ValueError, match="unsupported daemon status version None"):
        view.parse_daemon_document(doc)


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"version": 1}, "desired"),
        ({"version": 1, "desired": [["10.96.0.10", "TCP", 80]]}, "not enough values"),
        ({"version": 1, "desired": [["10.96.0.10", "ICMP", 80, "rr", 0, 0, -1, []]]}, "ICMP"),
        ({"version": 1, "desired": [["10.96.0.10", "TCP", "x", "rr", 0, 0, -1, []]]}, "'x'"),
        ({"version": 1, "desired": [], "lastSync": "yesterday"}, "yesterday"),
        ({"version": 1, "desired": [], "invalidServices": ["a/b"]}, "items"),
        ({"version": 1, "desired": [], "identities": {"a/b": {"endpoints": [[1]]}}}, "unpack"),
        ({"version": 1, "desired": [], "identities": {"a/b": []}}, "get"),
        ([], "not an object"),
        ("status", "not an object"),
    ],
)
def test_parse_rejects_malformed_document(doc: Any, problem: str) -> None:
    with pytest.raises(ValueError, match="malformed daemon status document") as err:
        view.parse_daemon_document(doc)
    assert problem in str(err.value)


# -- the table -------------------------------------------------------------------------------


def test_header_daemon_running() -> None:
    lines = view.header_lines(daemon_report())
    assert lines == [
        "ipvsproxy on node-1: daemon running, last sync 2.5 s ago, 0 changes pending;"
        " kernel matches the desired state (drift 0)",
        "view: daemon (desired state and names from the daemon; kernel read now)",
    ]


def test_header_state_file_and_kernel_views() -> None:
    assert view.header_lines(state_file_report()) == [
        "ipvsproxy on this node: daemon not running ([Errno 111] Connection refused);"
        " drift unknown without the daemon",
        f"view: kernel + state file (names as of 2023-11-14T22:13:20Z from {STATE})",
    ]
    assert view.header_lines(kernel_report())[1] == (
        f"view: kernel only (no state file at {STATE}; names unknown)"
    )
    k = kernel_matching()
    src = sources(k, daemon_error="timed out", state_error="bad JSON in state file")
    assert view.header_lines(view.build_report(k, src, NOW)) == [
        "ipvsproxy on this node: daemon not running (timed out); drift unknown without the daemon",
        "view: kernel only (bad JSON in state file; names unknown)",
    ]


def test_header_lists_invalid_services() -> None:
    k = kernel_matching()
    d = daemon_view(invalid={"shop/z": "port 0 is invalid", "default/bad": "no cluster IP"})
    lines = view.header_lines(view.build_report(k, sources(k, d), NOW))
    assert lines[2:] == [
        "invalid service default/bad: no cluster IP",
        "invalid service shop/z: port 0 is invalid",
    ]


def cell_list(line: str) -> list[str]:
    """A table line's cells: columns are separated by at least two spaces."""
    return [c.strip() for c in line.split("  ") if c.strip()]


def blocks(table: str) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    """The table's rows below the column headers: virtual server address:port -> (its cells,
    its real servers' cells by address:port)."""
    out: dict[str, tuple[list[str], dict[str, list[str]]]] = {}
    current: dict[str, list[str]] = {}
    lines = table.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("Prot  LocalAddress"))
    for ln in lines[first + 2 :]:
        c = cell_list(ln)
        if ln.startswith("  ->  "):
            current[c[1]] = c
        elif ln != "(no virtual servers)":
            current = {}
            out[c[1]] = (c, current)
    return out


def row(table: str, hostport: str) -> list[str]:
    return blocks(table)[hostport][0]


def rs_row(table: str, vs_hostport: str, hostport: str) -> list[str]:
    return blocks(table)[vs_hostport][1][hostport]


def test_table_column_headers() -> None:
    report = daemon_report()
    vs_default = "Prot LocalAddress:Port Scheduler Flags Service Type Endpoints"
    rs_default = "-> RemoteAddress:Port Forward Weight ActiveConn InActConn Pod Node"
    expected = {
        (None, False): (vs_default, rs_default),
        ("stats", False): (
            "Prot LocalAddress:Port Conns InPkts OutPkts InBytes OutBytes Service Type Endpoints",
            "-> RemoteAddress:Port Conns InPkts OutPkts InBytes OutBytes Pod Node",
        ),
        ("rate", False): (
            "Prot LocalAddress:Port CPS InPPS OutPPS InBPS OutBPS Service Type Endpoints",
            "-> RemoteAddress:Port CPS InPPS OutPPS InBPS OutBPS Pod Node",
        ),
        (None, True): (f"{vs_default} Role RawFlags", f"{rs_default} PersistConn"),
        ("stats", True): (
            "Prot LocalAddress:Port Conns InPkts OutPkts InBytes OutBytes Service Type"
            " Endpoints Role RawFlags",
            "-> RemoteAddress:Port Conns InPkts OutPkts InBytes OutBytes Pod Node PersistConn",
        ),
    }
    for (counters, wide), (vs_head, rs_head) in expected.items():
        lines = view.render_table(report, counters, wide).splitlines()
        assert lines[2].startswith("Prot  LocalAddress:Port")
        assert lines[3].startswith("  ->  RemoteAddress:Port")
        assert cell_list(lines[2]) == vs_head.split(), (counters, wide)
        assert cell_list(lines[3]) == rs_head.split(), (counters, wide)


def test_table_rows() -> None:
    table = view.render_table(daemon_report())
    lines = table.splitlines()
    assert lines[:2] == view.header_lines(daemon_report())
    assert row(table, "10.96.0.10:80") == [
        "TCP",
        "10.96.0.10:80",
        "rr",
        "default/web:http",
        "NodePort",
        "Cluster",
    ]
    assert row(table, "10.96.0.20:443") == [
        "TCP",
        "10.96.0.20:443",
        "sh",
        "persistent 10800",
        "shop/sticky:443",
        "ClusterIP",
        "PreferSameZone",
    ]
    assert row(table, "192.168.56.11:30080")[-3:] == ["default/web:http", "NodePort", "Local"]
    assert row(table, "10.0.0.99:8080") == [
        "TCP",
        "10.0.0.99:8080",
        "wlc",
        "(not ipvsproxy's)",
        "?",
        "?",
    ]
    # Real servers follow their virtual server, in order.
    web = next(i for i, ln in enumerate(lines) if cell_list(ln)[1:2] == ["10.96.0.10:80"])
    assert lines[web + 1].startswith("  ->  10.244.1.11:8080")
    assert lines[web + 2].startswith("  ->  10.244.2.11:8080")
    assert cell_list(lines[web + 1]) == [
        "->",
        "10.244.1.11:8080",
        "Masq",
        "1",
        "5",
        "7",
        "default/web-a",
        "node-1",
    ]
    assert cell_list(lines[web + 2]) == [
        "->",
        "10.244.2.11:8080",
        "Masq",
        "0 (terminating)",
        "3",
        "1",
        "default/web-b",
        "node-2",
    ]
    assert rs_row(table, "10.0.0.99:8080", "10.1.1.1:80")[-2:] == ["?", "?"]
    assert "(no virtual servers)" not in table


def test_table_columns_align() -> None:
    lines = view.render_table(daemon_report()).splitlines()
    vs_lines = [ln for ln in lines[2:] if not ln.startswith("  ->")]
    rs_lines = [ln for ln in lines[3:] if ln.startswith("  ->")]
    for group, header in ((vs_lines, "Service"), (rs_lines, "Pod")):
        col = group[0].index(header)
        for ln in group[1:]:
            assert ln[col - 2 : col] == "  ", ln
            assert ln[col] != " ", ln


def test_table_unknown_names_and_ours_without_names() -> None:
    report = kernel_report()
    table = view.render_table(report)
    # Ours (bound here or in the state file) but unnamed: "?"; not ours: labelled so.
    assert row(table, "10.96.0.10:80")[-3:] == ["?", "?", "?"]
    assert row(table, "10.0.0.99:8080")[-3:] == ["(not ipvsproxy's)", "?", "?"]
    assert rs_row(table, "10.96.0.10:80", "10.244.2.11:8080") == [
        "->",
        "10.244.2.11:8080",
        "Masq",
        "0 (terminating)",
        "3",
        "1",
        "?",
        "?",
    ]


def test_table_stats_and_rate_rows() -> None:
    report = daemon_report()
    stats = view.render_table(report, "stats")
    assert row(stats, "10.96.0.10:80") == [
        "TCP",
        "10.96.0.10:80",
        "101",
        "102",
        "103",
        "104",
        "105",
        "default/web:http",
        "NodePort",
        "Cluster",
    ]
    assert rs_row(stats, "10.96.0.10:80", "10.244.1.11:8080")[2:] == [
        "1201",
        "1202",
        "1203",
        "1204",
        "1205",
        "default/web-a",
        "node-1",
    ]
    rate = view.render_table(report, "rate")
    assert row(rate, "10.96.0.10:80")[2:7] == ["106", "107", "108", "109", "110"]
    assert rs_row(rate, "10.96.0.10:80", "10.244.1.11:8080")[2:7] == [
        "1206",
        "1207",
        "1208",
        "1209",
        "1210",
    ]


def test_table_wide_rows() -> None:
    table = view.render_table(daemon_report(), wide=True)
    assert row(table, "10.96.0.10:80")[-4:] == ["NodePort", "Cluster", "ClusterIP", "0x2"]
    assert row(table, "192.168.56.11:30080")[-3:] == ["Local", "NodePort", "0x2"]
    assert row(table, "10.96.0.20:443")[-3:] == ["PreferSameZone", "ClusterIP", "0x3"]
    assert row(table, "10.0.0.99:8080")[-3:] == ["?", "?", "0x2"]
    assert rs_row(table, "10.96.0.20:443", "10.244.3.11:8443")[-3:] == [
        "shop/sticky-0",
        "node-3",
        "4",
    ]


def test_table_persistence_netmask_and_ipv6() -> None:
    v6 = ServiceKey("fd00::10", Protocol.TCP, 80)
    masked = ServiceKey("10.96.0.30", Protocol.TCP, 80)
    k = {
        v6: (
            VirtualServer(v6, "rr", SVC_F_PERSISTENT, 60),
            Traffic(),
            {DestKey("fd00:1::5", 8080): dest(DestKey("fd00:1::5", 8080))},
        ),
        masked: (VirtualServer(masked, "rr", SVC_F_PERSISTENT, 300, 24), Traffic(), {}),
    }
    report = view.build_report(k, view.Sources(URL, daemon_error="down", ours=frozenset(k)), NOW)
    assert entry(report, masked)["netmask"] == 24
    assert entry(report, v6)["netmask"] == 128
    table = view.render_table(report)
    assert row(table, "[fd00::10]:80")[:4] == ["TCP", "[fd00::10]:80", "rr", "persistent 60"]
    assert row(table, "10.96.0.30:80")[3] == "persistent 300 mask /24"
    assert rs_row(table, "[fd00::10]:80", "[fd00:1::5]:8080")[1] == "[fd00:1::5]:8080"


def test_table_port_names() -> None:
    report = daemon_report()
    assert row(view.render_table(report, namer=view.numeric_port), "10.96.0.10:80")[1] == (
        "10.96.0.10:80"
    )
    seen: list[tuple[int, str]] = []

    def namer(port: int, protocol: str) -> str:
        seen.append((port, protocol))
        return {80: "http", 443: "https"}.get(port, str(port))

    table = view.render_table(report, namer=namer)
    assert row(table, "10.96.0.10:http")[1] == "10.96.0.10:http"
    assert row(table, "10.96.0.20:https")[1] == "10.96.0.20:https"
    assert rs_row(table, "10.96.0.10:http", "10.244.1.11:8080")[1] == "10.244.1.11:8080"
    assert (80, "TCP") in seen
    assert (8080, "TCP") in seen
    # The Service column names the Service's port, not the kernel's port.
    assert row(table, "10.96.0.20:https")[-3] == "shop/sticky:443"
    assert view.numeric_port(53, "UDP") == "53"


def test_table_empty_kernel() -> None:
    report = view.build_report({}, view.Sources(URL, daemon_error="down", state_path=STATE), NOW)
    lines = view.render_table(report).splitlines()
    assert lines == [
        "ipvsproxy on this node: daemon not running (down); drift unknown without the daemon",
        f"view: kernel only (no state file at {STATE}; names unknown)",
        "Prot  LocalAddress:Port  Scheduler  Flags  Service  Type  Endpoints",
        "  ->  RemoteAddress:Port  Forward  Weight  ActiveConn  InActConn  Pod  Node",
        "(no virtual servers)",
    ]


def test_table_invalid_services_in_header() -> None:
    k = kernel_matching()
    d = daemon_view(invalid={"default/bad": "no cluster IP"})
    lines = view.render_table(view.build_report(k, sources(k, d), NOW)).splitlines()
    assert lines[2] == "invalid service default/bad: no cluster IP"
    assert lines[3].startswith("Prot")


# -- --all -----------------------------------------------------------------------------------

SAVED_NAT = """\
*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-NODE-PORT - [0:0]
:OTHER - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT
-A KUBE-SERVICES -j KUBE-NODE-PORT
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A OTHER -j ACCEPT
COMMIT
"""


def test_chains_read_counts_our_chains_rules_and_keeps_what_failed() -> None:
    read = view.chains_read({(4, "nat"): SAVED_NAT, (6, "nat"): OSError("no table nat")})
    assert read["chains"] == {
        (4, "nat", "KUBE-SERVICES"): 2,
        (4, "nat", "KUBE-MARK-MASQ"): 1,
        (4, "nat", "KUBE-NODE-PORT"): 0,
    }
    assert set(read["digests"]) == set(read["chains"])
    assert read["chains_error"] == "no table nat"
    assert read["unread_tables"] == frozenset({(6, "nat")})
    # PREROUTING's jump has no comment: it is not ours; every nat jump is missing.
    assert [(j.chain, j.target) for j in read["missing_jumps"]] == [
        (j.chain, j.target) for j in JUMPS if j.table == "nat"
    ]


def test_daemon_document_carries_the_addresses_to_bind() -> None:
    doc = view.daemon_document("n", {}, {}, {}, None, 0, {}, addresses={"10.96.0.2", "fd00::1"})
    assert doc["addresses"] == ["10.96.0.2", "fd00::1"]
    assert view.parse_daemon_document(doc).addresses == frozenset({"10.96.0.2", "fd00::1"})
    del doc["addresses"]  # an older daemon: unknown, not empty
    assert view.parse_daemon_document(doc).addresses is None


def test_address_drift_binds_missing_and_unbinds_extra() -> None:
    assert view.address_drift(None, {"10.96.0.1"}) is None
    assert view.address_drift({"10.96.0.1"}, {"10.96.0.1"}) == []
    assert view.address_drift({"10.96.0.1", "10.96.0.2"}, {"10.96.0.1", "10.96.0.9"}) == [
        "bind 10.96.0.2 to kube-ipvs0",
        "unbind 10.96.0.9 from kube-ipvs0",
    ]


def extras() -> view.Extras:
    return view.Extras(
        frozenset({"10.96.0.10", "10.96.0.99"}),
        {"KUBE-CLUSTER-IP": {"10.96.0.10,tcp:80", "10.96.0.10,udp:53", "10.96.0.99,tcp:80"}}
        | {"KUBE-LOOP-BACK": set()},
        None,
        {(4, "nat", "KUBE-SERVICES"): 2, (6, "filter", "KUBE-FORWARD"): 4},
        "ip6tables-save -t nat: no table",
    )


def test_all_json_counts_address_drift_and_lists_sets_and_chains() -> None:
    doc = view.daemon_document("n", {}, {}, {}, None, 0, {}, addresses={"10.96.0.10", "10.96.0.20"})
    part = view.all_json(extras(), view.parse_daemon_document(doc))
    assert part["kubeIpvs0"] == {
        "addresses": ["10.96.0.10", "10.96.0.99"],
        "drift": {
            "count": 2,
            "operations": ["bind 10.96.0.20 to kube-ipvs0", "unbind 10.96.0.99 from kube-ipvs0"],
        },
    }
    assert part["ipsets"]["sets"] == [
        {"name": "KUBE-CLUSTER-IP", "members": 3},
        {"name": "KUBE-LOOP-BACK", "members": 0},
    ]
    assert part["ipsets"]["drift"]["count"] is None
    assert part["chains"]["chains"][1] == {
        "family": "IPv6",
        "table": "filter",
        "chain": "KUBE-FORWARD",
        "rules": 4,
    }
    assert part["chains"]["error"] == "ip6tables-save -t nat: no table"
    # Without the daemon the address drift is unknown too.
    assert view.all_json(extras(), None)["kubeIpvs0"]["drift"] == {"count": None, "operations": []}


def test_render_all_lines() -> None:
    doc = view.daemon_document("n", {}, {}, {}, None, 0, {}, addresses={"10.96.0.10"})
    lines = view.render_all(view.all_json(extras(), view.parse_daemon_document(doc)))
    assert lines[:5] == [
        "",
        "kube-ipvs0: 2 addresses (drift 1)",
        "  10.96.0.10",
        "  10.96.0.99",
        "  ! unbind 10.96.0.99 from kube-ipvs0",
    ]
    assert "ipsets: 2 (drift unknown)" in lines
    assert [ln.split() for ln in lines if "KUBE-CLUSTER-IP" in ln] == [
        ["KUBE-CLUSTER-IP", "3", "members"]
    ]
    assert "iptables chains: 2 (drift unknown)" in lines
    assert "  error: ip6tables-save -t nat: no table" in lines
    assert ["IPv4", "nat", "KUBE-SERVICES", "2", "rules"] in [ln.split() for ln in lines]


# -- ipset and chain drift (--all) -------------------------------------------------------------

CIP = "KUBE-CLUSTER-IP"
WANT_SETS = {CIP: {"10.96.0.10,tcp:80"}, "KUBE-LOOP-BACK": set()}


def test_ipset_drift_none_when_the_kernel_holds_what_the_daemon_keeps() -> None:
    assert view.ipset_drift(WANT_SETS, WANT_SETS) == []


def test_ipset_drift_adds_missing_and_deletes_extra_members() -> None:
    have = {CIP: {"10.96.0.99,tcp:80"}, "KUBE-LOOP-BACK": set()}
    assert view.ipset_drift(WANT_SETS, have) == [
        f"add 10.96.0.10,tcp:80 in ipset {CIP}",
        f"delete 10.96.0.99,tcp:80 in ipset {CIP}",
    ]


def test_ipset_drift_creates_a_missing_set_with_its_members() -> None:
    assert view.ipset_drift(WANT_SETS, {"KUBE-LOOP-BACK": set()}) == [
        f"create ipset {CIP}",
        f"add 10.96.0.10,tcp:80 in ipset {CIP}",
    ]


def test_ipset_drift_empties_a_set_of_ours_the_daemon_does_not_keep_but_leaves_it() -> None:
    have = {**WANT_SETS, "KUBE-6-CLUSTER-IP": {"fd00::a,tcp:80"}, "KUBE-NODE-PORT-TCP": set()}
    assert view.ipset_drift(WANT_SETS, have) == ["delete fd00::a,tcp:80 in ipset KUBE-6-CLUSTER-IP"]


def test_ipset_drift_ignores_sets_not_ours() -> None:
    have = {**WANT_SETS, "CALICO-ALL-HOSTS": {"10.0.0.1"}, "kube-cluster-ip": {"x"}}
    assert view.ipset_drift({**WANT_SETS, "OTHER": {"y"}}, have) == []


def test_ipset_drift_unknown_without_the_daemons_sets() -> None:
    assert view.ipset_drift(None, WANT_SETS) is None


SERVICES = (4, "nat", "KUBE-SERVICES")
FORWARD = (4, "filter", "KUBE-FORWARD")


def test_chain_drift_none_when_every_digest_is_the_one_left() -> None:
    assert view.chain_drift({SERVICES: "a", FORWARD: "b"}, {SERVICES: "a", FORWARD: "b"}, []) == []


def test_chain_drift_names_each_chain_changed_missing_or_to_rewrite() -> None:
    want: dict[tuple[int, str, str], str | None] = {SERVICES: "a", FORWARD: "b"}
    want[(4, "nat", "KUBE-MARK-MASQ")] = None  # its rendering changed: rewritten anyway
    have = {SERVICES: "changed", (4, "nat", "KUBE-MARK-MASQ"): "c"}
    assert view.chain_drift(want, have, []) == [
        "create chain KUBE-FORWARD in IPv4 filter",
        "rewrite chain KUBE-MARK-MASQ in IPv4 nat",
        "rewrite chain KUBE-SERVICES in IPv4 nat",
    ]


def test_chain_drift_counts_missing_jumps_of_the_daemons_families_only() -> None:
    v6 = replace(JUMPS[0], family=6)
    ops = view.chain_drift({SERVICES: "a"}, {SERVICES: "a"}, [JUMPS[0], v6])
    assert ops == ["insert jump OUTPUT -> KUBE-SERVICES in IPv4 nat"]


def test_chain_drift_ignores_chains_of_a_family_the_daemon_does_not_serve() -> None:
    have = {SERVICES: "a", (6, "nat", "KUBE-SERVICES"): "stale"}
    assert view.chain_drift({SERVICES: "a"}, have, [], unread={(6, "filter")}) == []


def test_chain_drift_unknown_when_a_table_it_would_restore_was_not_read() -> None:
    assert view.chain_drift({SERVICES: "a"}, {}, [], unread={(4, "nat")}) is None
    assert view.chain_drift(None, {SERVICES: "a"}, []) is None


def test_kernel_document_round_trips_through_the_daemon_document() -> None:
    doc = view.daemon_document("n", {}, {}, {}, None, 0, {})
    assert view.parse_daemon_document(doc).sets is None  # /status: not served
    doc |= view.kernel_document({CIP: {"b", "a"}}, {SERVICES: "d", FORWARD: None})
    assert doc["ipsets"] == {CIP: ["a", "b"]}
    parsed = view.parse_daemon_document(doc)
    assert parsed.sets == {CIP: frozenset({"a", "b"})}
    assert parsed.chains == {SERVICES: "d", FORWARD: None}
    doc |= view.kernel_document({}, None)  # chains not known yet
    assert view.parse_daemon_document(doc).chains is None


def daemon_with(sets: Mapping[str, set[str]], chains: Any) -> view.DaemonView:
    doc = view.daemon_document("n", {}, {}, {}, None, 0, {}, addresses={"10.96.0.10"})
    return view.parse_daemon_document(doc | view.kernel_document(sets, chains))


def test_all_json_counts_ipset_and_chain_drift_against_the_daemon() -> None:
    sets = {CIP: {"10.96.0.10,tcp:80", "10.96.0.10,udp:53", "10.96.0.20,tcp:80"}}
    digests = {SERVICES: "d"}
    part = view.all_json(replace(extras(), digests=digests), daemon_with(sets, digests))
    assert part["ipsets"]["drift"] == {
        "count": 2,
        "operations": [
            f"add 10.96.0.20,tcp:80 in ipset {CIP}",
            f"delete 10.96.0.99,tcp:80 in ipset {CIP}",
        ],
    }
    # ip6tables-save failed, but the daemon restores IPv4's chains only.
    assert part["chains"]["drift"] == {"count": 0, "operations": []}
    assert view.all_json(extras(), None)["ipsets"]["drift"]["count"] is None
    failed = replace(extras(), ipsets_error="no netlink")
    assert view.all_json(failed, daemon_with(sets, digests))["ipsets"]["drift"]["count"] is None


def test_render_all_lists_the_first_operations_and_counts_the_rest() -> None:
    many = {CIP: {f"10.96.1.{i},tcp:80" for i in range(12)}}
    lines = view.render_all(view.all_json(replace(extras(), ipsets={}), daemon_with(many, None)))
    assert "ipsets: 0 (drift 13)" in lines
    shown = [ln for ln in lines if ln.startswith("  ! ") and "ipset" in ln]
    assert shown[0] == f"  ! create ipset {CIP}" and len(shown) == view.SHOWN_OPERATIONS
    assert shown[1] == f"  ! add 10.96.1.0,tcp:80 in ipset {CIP}"
    assert "  ! ... and 3 more" in lines
    assert "iptables chains: 2 (drift unknown)" in lines  # the daemon knows no chains yet


def test_chain_digest_is_of_the_lines_in_any_order() -> None:
    assert chain_digest(["-A X -j A", "-A X -j B"]) == chain_digest(["-A X -j B", "-A X -j A"])
    assert chain_digest(["-A X -j A"]) != chain_digest(["-A X -j B"])
