"""``ipvsproxy status -c``: /proc/net/ip_vs_conn parsed, named and laid out as ipvsadm -Lnc;
and the command's ``--all`` on the same faked sources."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy import cli
from ipvsproxy.core.identities import (
    ROLE_CLUSTER_IP,
    TOPOLOGY_CLUSTER,
    EndpointIdentity,
    Identities,
    ServiceIdentity,
    VirtualServerIdentity,
)
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey, Traffic, VirtualServer
from ipvsproxy.status import command, connections, view
from ipvsproxy.status.connections import Connection

# As the kernel writes it (ip_vs_conn_seq_show): IPv4 as %08X, IPv6 as %pI6, ports as %04X.
V6_CLIENT = "fd00:0010:0244:0001:0000:0000:0000:000c"
V6_VIRTUAL = "fd00:0010:0096:0000:0000:0000:0000:000a"
V6_POD = "fd00:0010:0244:0002:0000:0000:0000:000b"
PROC = f"""\
Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0AF4010C A1B2 0A60000A 0050 0AF4020B 1F90 ESTABLISHED     897
UDP FD000010024400010000000000000012 0035 0A600035 0035 0AF4010C 14E9 UDP             299
TCP {V6_CLIENT} 9C40 {V6_VIRTUAL} 0050 {V6_POD} 1F90 TIME_WAIT         61
TCP 0AF4010C 0000 0A600014 01BB 0AF4030B 20FB NONE          10790 sip callid
"""

WEB = ServiceKey("10.96.0.10", Protocol.TCP, 80)
WEB6 = ServiceKey("fd00:10:96::a", Protocol.TCP, 80)
DNS = ServiceKey("10.96.0.53", Protocol.UDP, 53)
WEB_IDENT = ServiceIdentity.of(
    {
        k: VirtualServerIdentity(
            "default/web", "http", 80, "ClusterIP", ROLE_CLUSTER_IP, TOPOLOGY_CLUSTER
        )
        for k in (WEB, WEB6)
    },
    {
        "10.244.2.11": EndpointIdentity("default/web-b", "node-2"),
        "fd00:10:244:2::b": EndpointIdentity("default/web-b", "node-2"),
    },
)
NAMES = Identities([WEB_IDENT])


def test_parse_reads_ipv4_ipv6_and_persistence_entries() -> None:
    conns = connections.parse(PROC)
    assert conns[0] == Connection(
        "TCP", "10.244.1.12", 41394, "10.96.0.10", 80, "10.244.2.11", 8080, "ESTABLISHED", 897
    )
    assert conns[1] == Connection(
        "TCP",
        "fd00:10:244:1::c",
        40000,
        "fd00:10:96::a",
        80,
        "fd00:10:244:2::b",
        8080,
        "TIME_WAIT",
        61,
    )
    assert conns[2][1:3] == ("10.244.1.12", 0) and conns[2].state == "NONE"
    # The second line's client field is not an address the kernel writes: skipped.
    assert len(conns) == 3


def test_parse_skips_the_header_and_an_empty_table() -> None:
    assert connections.parse(PROC.splitlines()[0] + "\n") == []
    assert connections.parse("") == []


def test_entries_carry_service_and_pod_names() -> None:
    entries = connections.to_json(connections.parse(PROC), NAMES)
    by_client = {(e["client"], e["clientPort"]): e for e in entries}
    v4 = by_client[("10.244.1.12", 41394)]
    assert (v4["service"], v4["pod"]) == ("default/web:http", "default/web-b")
    v6 = by_client[("fd00:10:244:1::c", 40000)]
    assert (v6["service"], v6["pod"]) == ("default/web:http", "default/web-b")
    template = by_client[("10.244.1.12", 0)]
    assert (template["service"], template["pod"]) == (None, None)
    assert set(v4) == {
        "protocol",
        "client",
        "clientPort",
        "virtual",
        "virtualPort",
        "destination",
        "destinationPort",
        "state",
        "expires",
        "service",
        "pod",
    }


def test_render_is_ipvsadm_lnc_with_names() -> None:
    lines = connections.render(connections.to_json(connections.parse(PROC), NAMES))
    assert lines[0] == "IPVS connection entries"
    assert lines[1].split() == [
        "pro",
        "expire",
        "state",
        "source",
        "virtual",
        "destination",
        "Service",
        "Pod",
    ]
    rows = [ln.split() for ln in lines[2:]]
    assert [
        "TCP",
        "14:57",
        "ESTABLISHED",
        "10.244.1.12:41394",
        "10.96.0.10:80",
        "10.244.2.11:8080",
        "default/web:http",
        "default/web-b",
    ] in rows
    assert [
        "TCP",
        "01:01",
        "TIME_WAIT",
        "[fd00:10:244:1::c]:40000",
        "[fd00:10:96::a]:80",
        "[fd00:10:244:2::b]:8080",
        "default/web:http",
        "default/web-b",
    ] in rows
    template = ["TCP", "179:50", "NONE", "10.244.1.12:0", "10.96.0.20:443", "10.244.3.11:8443"]
    assert [*template, "?", "?"] in rows


def _fake_gather(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The command with a kernel of two virtual servers (web, and a UDP one), the daemon's
    names, and PROC as /proc/net/ip_vs_conn."""
    vss = {k: VirtualServer(k) for k in (WEB, WEB6, DNS)}
    kernel: view.KernelView = {k: (vs, Traffic(*([0] * 10)), {}) for k, vs in vss.items()}
    doc = view.daemon_document("node-1", vss, {}, {"default/web": WEB_IDENT}, 1.0, 0, {})
    src = view.Sources(daemon_url="u", daemon=view.parse_daemon_document(doc), ours=frozenset(vss))

    def gather(args: Any) -> tuple[view.KernelView, view.Sources]:
        return kernel, replace(src, extras=command.read_extras(src.bound) if args.all else None)

    monkeypatch.setattr(command, "gather", gather)
    proc = tmp_path / "ip_vs_conn"
    proc.write_text(PROC + "UDP 0AF4010C 8000 0A600035 0035 0AF4010C 0035 UDP 299\n")
    monkeypatch.setattr(connections, "PROC_PATH", str(proc))


def test_command_c_prints_the_table_under_the_header(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_gather(monkeypatch, tmp_path)
    assert cli.main(["status", "-c"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ipvsproxy on node-1: daemon running")
    assert lines[2] == "IPVS connection entries"
    assert len(lines) == 2 + 2 + 4


def test_command_c_json_and_the_virtual_service_filter(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_gather(monkeypatch, tmp_path)
    assert cli.main(["status", "-c", "-o", "json", "-t", "[fd00:10:96::a]:80"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(e["client"], e["service"]) for e in report["connections"]] == [
        ("fd00:10:244:1::c", "default/web:http")
    ]
    assert cli.main(["status", "-c", "-o", "json", "-u", "10.96.0.53:53"]) == 0
    (udp,) = json.loads(capsys.readouterr().out)["connections"]
    assert (udp["clientPort"], udp["service"], udp["pod"]) == (32768, None, None)


def test_command_c_without_the_proc_file_says_so(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_gather(monkeypatch, tmp_path)
    monkeypatch.setattr(connections, "PROC_PATH", str(tmp_path / "missing"))
    assert cli.main(["status", "-c"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_command_all_adds_addresses_ipsets_and_chains(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_gather(monkeypatch, tmp_path)
    seen: list[frozenset[str]] = []

    def extras(bound: frozenset[str]) -> view.Extras:
        seen.append(bound)
        return view.Extras(frozenset({"10.96.0.10"}), {"KUBE-CLUSTER-IP": {"10.96.0.10,tcp:80"}})

    monkeypatch.setattr(command, "read_extras", extras)
    assert cli.main(["status", "--all", "-o", "json"]) == 0
    part = json.loads(capsys.readouterr().out)["all"]
    # The daemon of _fake_gather wants no address bound.
    assert part["kubeIpvs0"] == {
        "addresses": ["10.96.0.10"],
        "drift": {"count": 1, "operations": ["unbind 10.96.0.10 from kube-ipvs0"]},
    }
    assert part["ipsets"]["sets"] == [{"name": "KUBE-CLUSTER-IP", "members": 1}]
    assert cli.main(["status", "--all", "-n"]) == 0
    out = capsys.readouterr().out
    assert "kube-ipvs0: 1 addresses (drift 1)" in out and "ipsets: 1 (drift unknown)" in out
    assert cli.main(["status", "-n"]) == 0
    assert "kube-ipvs0" not in capsys.readouterr().out and len(seen) == 2
