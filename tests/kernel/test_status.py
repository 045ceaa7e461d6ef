"""``ipvsproxy status`` against ``ipvsadm`` on the same node, with the daemon running, stopped
(state file) and with nothing but the kernel.

Every virtual and real server ``ipvsadm -Ln`` lists must be in ``status --output json`` with the
same scheduler, persistence, forwarding, weight, connection counts and ``--stats --exact``
counters; the human table must carry the Kubernetes names in its columns.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster.kube import POD_ECHO_PORT, LabKube, wait_for
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import Cluster, Node

pytestmark = pytest.mark.kernel

WEB_BACKENDS = ("pod-1-1", "pod-2-1", "pod-3-1")
# on another node than the client (pod-1-2): hairpin has its own tests
STICKY_BACKEND = "pod-2-2"


@pytest.fixture
def kube(lab_cluster: Cluster, tmp_path: Path) -> Iterator[LabKube]:
    # No periodic reconcile during the test: drift made by hand stays until status sees it.
    lab = LabKube(lab_cluster, tmp_path, daemon_flags=("--ipvs-sync-period", "1h"))
    try:
        yield lab.start()
    finally:
        print(lab.logs())
        lab.stop(cleanup=True)


# -- ipvsadm's view ---------------------------------------------------------------------------

Table = dict[tuple[str, str], dict[str, Any]]


def body(listing: str) -> list[str]:
    """The lines after ipvsadm's headers (three, or two for one virtual service)."""
    lines = listing.splitlines()
    heads = next(i for i, ln in enumerate(lines) if "RemoteAddress:Port" in ln)
    return lines[heads + 1 :]


def parse_ipvsadm(listing: str, stats: str) -> Table:
    """``ipvsadm -Ln`` and ``ipvsadm -Ln --stats --exact`` as one table:
    (protocol, address:port) -> settings, counters and real servers."""
    table: Table = {}
    vs: dict[str, Any] | None = None
    for line in body(listing):
        f = line.split()
        if f[0] == "->":
            assert vs is not None
            vs["dests"][f[1]] = {"forward": f[2], "weight": int(f[3]), "conns": (f[4], f[5])}
        else:
            persistent = int(f[f.index("persistent") + 1]) if "persistent" in f else 0
            vs = {"scheduler": f[2], "persistent": persistent, "dests": {}, "stats": None}
            table[(f[0], f[1])] = vs
    key: tuple[str, str] | None = None
    for line in body(stats):
        f = line.split()
        counters = tuple(int(x) for x in f[2:7])
        if f[0] == "->":
            assert key is not None
            table[key]["dests"][f[1]]["stats"] = counters
        else:
            key = (f[0], f[1])
            table[key]["stats"] = counters
    return table


def ipvsadm(cluster: Cluster, node: Node, *only: str) -> Table:
    """``only``: a virtual service as ipvsadm takes it, e.g. ``-t ADDR:PORT``."""
    listing = cluster.exec(node.netns, "ipvsadm", "-Ln", *only).stdout
    stats = cluster.exec(node.netns, "ipvsadm", "-Ln", "--stats", "--exact", *only).stdout
    return parse_ipvsadm(listing, stats)


def hostport(address: str, port: int) -> str:
    """As ipvsadm -n writes them: an IPv6 address in brackets."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def from_status(report: dict[str, Any]) -> Table:
    """The same table from ``status --output json``."""

    def counters(doc: dict[str, Any]) -> tuple[int, ...]:
        s = doc["stats"]
        return (s["connections"], s["inPackets"], s["outPackets"], s["inBytes"], s["outBytes"])

    table: Table = {}
    for vs in report["virtualServers"]:
        table[(vs["protocol"], hostport(vs["address"], vs["port"]))] = {
            "scheduler": vs["scheduler"],
            "persistent": vs["persistenceTimeout"] if vs["persistent"] else 0,
            "stats": counters(vs),
            "dests": {
                hostport(rs["address"], rs["port"]): {
                    "forward": rs["forward"],
                    "weight": rs["weight"],
                    "conns": (str(rs["activeConnections"]), str(rs["inactiveConnections"])),
                    "stats": counters(rs),
                }
                for rs in vs["realServers"]
            },
        }
    return table


def status(cluster: Cluster, node: Node, state: Path, *args: str) -> str:
    proc = cluster.exec(
        node.netns,
        sys.executable,
        "-m",
        "ipvsproxy",
        "status",
        "--state-file",
        str(state),
        *args,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def status_matching_ipvsadm(
    cluster: Cluster, node: Node, state: Path, *only: str
) -> dict[str, Any]:
    """``status --output json`` read between two identical ``ipvsadm`` readings (a connection
    may leave the inactive count meanwhile), checked against them; ``only`` is given to both."""
    for _attempt in range(5):
        before = ipvsadm(cluster, node, *only)
        report: dict[str, Any] = json.loads(status(cluster, node, state, "-o", "json", *only))
        if ipvsadm(cluster, node, *only) == before:
            assert before, "ipvsadm lists no virtual server"
            assert from_status(report) == before
            return report
    raise AssertionError("the kernel's IPVS counters never held still for a reading")


# -- the test -----------------------------------------------------------------------------------


def create_services(kube: LabKube) -> tuple[str, str]:
    from kubernetes import client

    core: Any = client.CoreV1Api(kube.api)
    kube.kubelets.update_labels(
        {("default", p): {"app": "web"} for p in WEB_BACKENDS}
        | {("default", STICKY_BACKEND): {"app": "sticky"}}
    )
    web = {
        "metadata": {"name": "web"},
        "spec": {
            "type": "NodePort",
            "selector": {"app": "web"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30600},
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 8080},
            ],
        },
    }
    sticky = {
        "metadata": {"name": "sticky"},
        "spec": {
            "selector": {"app": "sticky"},
            "sessionAffinity": "ClientIP",
            "ports": [{"port": 81, "targetPort": 8080}],
        },
    }
    core.create_namespaced_service("default", web)
    core.create_namespaced_service("default", sticky)
    read = core.read_namespaced_service
    return read("web", "default").spec.cluster_ip, read("sticky", "default").spec.cluster_ip


def test_status_matches_ipvsadm_and_names_every_server(lab_cluster: Cluster, kube: LabKube) -> None:
    assert kube.daemons is not None
    n1 = lab_cluster.nodes[0]
    state = kube.daemons.state_file(n1)
    web_ip, sticky_ip = create_services(kube)
    client_ns = n1.pods[-1].netns

    def web_answers() -> set[str]:
        return {netns.tcp_request(client_ns, web_ip, 80, timeout=2)["pod"] for _ in range(9)}

    wait_for(lambda: web_answers() == set(WEB_BACKENDS), 30, "web answered by its 3 pods")
    wait_for(
        lambda: netns.tcp_request(client_ns, sticky_ip, 81)["pod"] == STICKY_BACKEND,
        30,
        "sticky answered",
    )
    for _ in range(3):
        netns.udp_request(client_ns, web_ip, 53)
    # A connection that stays open to one web pod; that pod then leaves the Service, so its
    # real server drains at weight 0 (graceful termination) while the connection lives.
    session = netns.TCPSession(client_ns, web_ip, 80)
    try:
        held = session.ask()["pod"]
        held_ip = pod_ip(lab_cluster, held)
        kube.kubelets.update_labels({("default", held): {"app": None}})

        def draining() -> bool:
            dests = ipvsadm(lab_cluster, n1)[("TCP", f"{web_ip}:80")]["dests"]
            return bool(dests.get(f"{held_ip}:8080", {}).get("weight", 1) == 0)

        wait_for(draining, 30, "held pod draining at weight 0")

        # Daemon running: its view, every server named, no drift.
        report = status_matching_ipvsadm(lab_cluster, n1, state)
        assert report["schemaVersion"] == 1 and report["view"] == "daemon"
        assert report["node"] == "node-1" and report["daemon"]["running"] is True
        assert report["daemon"]["pendingChanges"] == 0
        assert report["drift"] == {"count": 0, "operations": []}
        by_key = {(v["protocol"], v["address"], v["port"]): v for v in report["virtualServers"]}
        web = by_key[("TCP", web_ip, 80)]
        assert (web["service"], web["portName"], web["type"]) == ("default/web", "http", "NodePort")
        by_ip = {
            rs["address"]: (rs["pod"], rs["node"], rs["weight"], rs["terminating"])
            for rs in web["realServers"]
        }
        for pod in WEB_BACKENDS:
            node = f"node-{pod[4]}"
            # The held pod left the Service's slices: the kernel still drains it, nameless.
            want = (None, None, 0, True) if pod == held else (f"default/{pod}", node, 1, False)
            assert by_ip[pod_ip(lab_cluster, pod)] == want, by_ip
        assert web["stats"]["connections"] >= 10
        node_port = by_key[("TCP", n1.ip, 30600)]
        assert (node_port["service"], node_port["role"]) == ("default/web", "NodePort")
        dns = by_key[("UDP", web_ip, 53)]
        assert dns["portName"] == "dns" and dns["stats"]["inPackets"] >= 3
        sticky = by_key[("TCP", sticky_ip, 81)]
        assert (sticky["persistent"], sticky["persistenceTimeout"]) == (True, 10800)
        assert [rs["pod"] for rs in sticky["realServers"]] == [f"default/{STICKY_BACKEND}"]

        table = status(lab_cluster, n1, state, "-n")
        # Without -n, ports are named from /etc/services, as ipvsadm does.
        named = status(lab_cluster, n1, state)
        assert re.search(rf"^TCP\s+{re.escape(web_ip)}:http\s", named, re.M)
        assert re.search(rf"^UDP\s+{re.escape(web_ip)}:domain\s", named, re.M)
        check_table(table, web_ip, sticky_ip, held, held_ip)
        check_counter_tables(lab_cluster, n1, state, web_ip)
        check_virtual_service_filters(lab_cluster, n1, state, web_ip)
        check_connections(lab_cluster, n1, state, web_ip, session.local, held_ip)
        check_all(lab_cluster, n1, state, web_ip)
        drift_by_hand(lab_cluster, n1, web_ip)
        check_drift_by_hand(lab_cluster, n1, state, web_ip)
    finally:
        session.close()

    # A real server deleted behind the daemon's back is drift (no reconcile runs in this test).
    lab_cluster.exec(
        n1.netns,
        "ipvsadm",
        "-d",
        "-t",
        f"{sticky_ip}:81",
        "-r",
        f"{pod_ip(lab_cluster, STICKY_BACKEND)}:8080",
    )
    drifted = json.loads(status(lab_cluster, n1, state, "--output", "json"))
    assert drifted["drift"]["count"] == 1, drifted["drift"]
    assert sticky_ip in drifted["drift"]["operations"][0]
    assert re.search(
        r"kernel differs from the desired state \(drift 1\)", status(lab_cluster, n1, state)
    )

    # Daemon stopped: the kernel and the names the state file kept.
    kube.daemons.stop()
    report = status_matching_ipvsadm(lab_cluster, n1, state)
    assert report["view"] == "state-file" and report["daemon"]["running"] is False
    assert report["drift"]["count"] is None
    services = {v["service"] for v in report["virtualServers"]}
    assert {"default/web", "default/sticky"} <= services
    table = status(lab_cluster, n1, state, "-n")
    assert "daemon not running" in table and "view: kernel + state file" in table
    assert re.search(
        rf"^TCP\s+{re.escape(web_ip)}:80\s+rr\s+default/web:http\s+NodePort\s+Cluster$", table, re.M
    )

    # Nothing but the kernel: every server still listed, names unknown, and said so.
    report = status_matching_ipvsadm(lab_cluster, n1, Path("/nonexistent/state.json"))
    assert report["view"] == "kernel"
    assert {v["service"] for v in report["virtualServers"]} == {None}
    # Addresses bound on kube-ipvs0 are ipvsproxy's; a node port's address alone does not say.
    ours = {v["address"] for v in report["virtualServers"] if v["ours"]}
    assert {web_ip, sticky_ip} <= ours and n1.ip not in ours
    table = status(lab_cluster, n1, Path("/nonexistent/state.json"))
    assert "view: kernel only (no state file at /nonexistent/state.json; names unknown)" in table

    # The daemons again (every node's: the fixture's cleanup is theirs): the first sync, a
    # full reconcile, repairs what was changed by hand.
    kube.start_daemons()
    for each in lab_cluster.nodes:
        kube.wait_first_sync(each)

    def repaired() -> bool:
        report = json.loads(status(lab_cluster, n1, state, "--all", "-o", "json"))
        drifts = [report["all"][k]["drift"]["count"] for k in ("kubeIpvs0", "ipsets", "chains")]
        return report["drift"]["count"] == 0 and drifts == [0, 0, 0]

    wait_for(repaired, 30, "status --all: drift 0 everywhere after the daemon's reconcile")


def pod_ip(cluster: Cluster, name: str) -> str:
    return next(p.ip for p in cluster.pods if p.name == name)


def check_table(table: str, web_ip: str, sticky_ip: str, held: str, held_ip: str) -> None:
    lines = table.splitlines()
    assert re.match(
        r"ipvsproxy on node-1: daemon running, last sync \d+\.\d s ago, 0 changes pending; "
        r"kernel matches the desired state \(drift 0\)$",
        lines[0],
    ), lines[0]
    assert lines[1].startswith("view: daemon")
    assert lines[2].split() == [
        "Prot",
        "LocalAddress:Port",
        "Scheduler",
        "Flags",
        "Service",
        "Type",
        "Endpoints",
    ]
    assert lines[3].split() == [
        "->",
        "RemoteAddress:Port",
        "Forward",
        "Weight",
        "ActiveConn",
        "InActConn",
        "Pod",
        "Node",
    ]
    assert re.search(
        rf"^TCP\s+{re.escape(web_ip)}:80\s+rr\s+default/web:http\s+NodePort\s+Cluster$", table, re.M
    )
    assert re.search(
        rf"^TCP\s+{re.escape(sticky_ip)}:81\s+rr\s+persistent 10800\s+"
        r"default/sticky:81\s+ClusterIP\s+Cluster$",
        table,
        re.M,
    )
    assert re.search(
        rf"^  ->\s+{re.escape(held_ip)}:8080\s+Masq\s+0 \(terminating\)\s+1\s+\d+\s+\?\s+\?$",
        table,
        re.M,
    )
    for pod in WEB_BACKENDS:
        if pod != held:
            assert re.search(
                rf"^  ->\s+\S+:8080\s+Masq\s+1\s+\d+\s+\d+\s+default/{pod}\s+node-{pod[4]}$",
                table,
                re.M,
            )


def check_counter_tables(cluster: Cluster, node: Node, state: Path, web_ip: str) -> None:
    stats = status(cluster, node, state, "-n", "--stats", "--service", "default/web")
    heads = [ln.split() for ln in stats.splitlines()[2:4]]
    assert heads[0] == [
        "Prot",
        "LocalAddress:Port",
        "Conns",
        "InPkts",
        "OutPkts",
        "InBytes",
        "OutBytes",
        "Service",
        "Type",
        "Endpoints",
    ]
    assert heads[1][:2] == ["->", "RemoteAddress:Port"] and heads[1][-2:] == ["Pod", "Node"]
    assert "default/sticky" not in stats and "default/web:http" in stats
    assert re.search(rf"^TCP\s+{re.escape(web_ip)}:80\s+[1-9]\d*\s+[1-9]\d*\s", stats, re.M)
    rate = status(cluster, node, state, "--rate")
    assert rate.splitlines()[2].split()[2:7] == ["CPS", "InPPS", "OutPPS", "InBPS", "OutBPS"]
    wide = status(cluster, node, state, "-o", "wide")
    assert wide.splitlines()[2].split()[-2:] == ["Role", "RawFlags"]
    assert wide.splitlines()[3].split()[-1] == "PersistConn"


def check_virtual_service_filters(cluster: Cluster, node: Node, state: Path, web_ip: str) -> None:
    """-t and -u list the one virtual service ipvsadm lists; one that is not there fails as
    ipvsadm fails (exit 1)."""
    for only in (("-t", f"{web_ip}:80"), ("-u", f"{web_ip}:53"), ("--tcp-service", f"{web_ip}:80")):
        report = status_matching_ipvsadm(cluster, node, state, *only)
        assert len(report["virtualServers"]) == 1, report["virtualServers"]
        assert report["drift"]["count"] == 0
    table = status(cluster, node, state, "-n", "-u", f"{web_ip}:53")
    assert re.search(rf"^UDP\s+{re.escape(web_ip)}:53\s+rr\s+default/web:dns\s", table, re.M)
    assert "TCP" not in table.split("\n", 4)[-1]
    for only in (("-u", f"{web_ip}:80"), ("--sctp-service", f"{web_ip}:80")):
        theirs = cluster.exec(node.netns, "ipvsadm", "-Ln", *only, check=False)
        ours = cluster.exec(
            node.netns, sys.executable, "-m", "ipvsproxy", "status", *only, check=False
        )
        assert (ours.returncode, theirs.returncode) == (1, 1), ours.stderr + theirs.stderr
        assert "No such service" in theirs.stderr and "No such service" in ours.stderr


def test_status_timeout_is_ipvsadm_timeout(lab_cluster: Cluster) -> None:
    """``status --timeout`` prints what ``ipvsadm -L --timeout`` prints, as set by ipvsadm, and
    needs neither the daemon nor a state file."""
    n1 = lab_cluster.nodes[0]
    nothing = Path("/nonexistent/state.json")

    def both() -> tuple[str, str]:
        theirs = lab_cluster.exec(n1.netns, "ipvsadm", "-L", "--timeout").stdout
        return status(lab_cluster, n1, nothing, "--timeout"), theirs

    before = both()
    assert before[0] == before[1] and before[0].startswith("Timeout (tcp tcpfin udp): ")
    tcp, fin, udp = before[0].split(":")[1].split()
    try:
        lab_cluster.exec(n1.netns, "ipvsadm", "--set", "7201", "31", "61")
        ours, theirs = both()
        assert ours == theirs == "Timeout (tcp tcpfin udp): 7201 31 61\n"
        doc = json.loads(status(lab_cluster, n1, nothing, "--timeout", "-o", "json"))
        assert doc["timeouts"] == {"tcp": 7201, "tcpFin": 31, "udp": 61}
    finally:
        lab_cluster.exec(n1.netns, "ipvsadm", "--set", tcp, fin, udp)
    assert both() == before


Conn = tuple[str, str, str, str, str]  # protocol, state, source, virtual, destination


def ipvsadm_connections(cluster: Cluster, node: Node, *only: str) -> set[Conn]:
    """``ipvsadm -Lnc``'s entries, without their expiry (it ticks between two readings)."""
    lines = cluster.exec(node.netns, "ipvsadm", "-Lnc").stdout.splitlines()
    assert lines[:2] and lines[0] == "IPVS connection entries", lines
    return {(f[0], f[2], f[3], f[4], f[5]) for f in (ln.split() for ln in lines[2:])}


def status_connections(cluster: Cluster, node: Node, state: Path, *args: str) -> list[Any]:
    entries: list[Any] = json.loads(status(cluster, node, state, "-c", "-o", "json", *args))[
        "connections"
    ]
    return entries


def as_conn(e: dict[str, Any]) -> Conn:
    return (
        e["protocol"],
        e["state"],
        hostport(e["client"], e["clientPort"]),
        hostport(e["virtual"], e["virtualPort"]),
        hostport(e["destination"], e["destinationPort"]),
    )


def check_connections(
    cluster: Cluster,
    node: Node,
    state: Path,
    web_ip: str,
    held: tuple[str, int],
    held_ip: str,
) -> None:
    """-c lists the entries ``ipvsadm -Lnc`` lists (read between two identical ipvsadm
    readings), the held connection among them, with Service and Pod names."""
    for _attempt in range(5):
        before = ipvsadm_connections(cluster, node)
        entries = status_connections(cluster, node, state)
        if ipvsadm_connections(cluster, node) == before:
            break
    else:
        raise AssertionError("the connection table never held still for a reading")
    assert {as_conn(e) for e in entries} == before and len(entries) == len(before)
    held_conn = ("TCP", "ESTABLISHED", f"{held[0]}:{held[1]}", f"{web_ip}:80", f"{held_ip}:8080")
    assert held_conn in before
    web = [e for e in entries if (e["virtual"], e["virtualPort"]) == (web_ip, 80)]
    assert len(web) >= 2 and {e["service"] for e in web} == {"default/web:http"}
    # The held pod left the Service: nameless; the others are named.
    assert {e["pod"] for e in web if e["destination"] == held_ip} == {None}
    assert {e["pod"] for e in web if e["destination"] != held_ip} <= {
        f"default/{p}" for p in WEB_BACKENDS
    }
    table = status(cluster, node, state, "-c")
    assert re.search(
        rf"^TCP\s+\d\d:\d\d\s+ESTABLISHED\s+{re.escape(held[0])}:{held[1]}\s+"
        rf"{re.escape(web_ip)}:80\s+{re.escape(held_ip)}:8080\s+default/web:http\s+\?$",
        table,
        re.M,
    ), table
    udp = status_connections(cluster, node, state, "-u", f"{web_ip}:53")
    assert udp and {(e["protocol"], e["virtualPort"]) for e in udp} == {("UDP", 53)}


def check_all(cluster: Cluster, node: Node, state: Path, web_ip: str) -> None:
    """--all: kube-ipvs0's addresses as ``ip addr`` shows them (no drift), ipset member
    counts as ``ipset list -t``, chain rule counts as ``iptables -S``."""
    part = json.loads(status(cluster, node, state, "--all", "-o", "json"))["all"]
    shown = cluster.exec(node.netns, "ip", "-o", "addr", "show", "dev", "kube-ipvs0").stdout
    bound = {ln.split()[3].split("/")[0] for ln in shown.splitlines()}
    assert web_ip in bound and set(part["kubeIpvs0"]["addresses"]) == bound
    assert part["kubeIpvs0"]["drift"] == {"count": 0, "operations": []}
    sets = {e["name"]: e["members"] for e in part["ipsets"]["sets"]}
    for name in ("KUBE-CLUSTER-IP", "KUBE-NODE-PORT-TCP"):
        listing = cluster.exec(node.netns, "ipset", "list", "-t", name).stdout
        (entries,) = re.findall(r"^Number of entries: (\d+)$", listing, re.M)
        assert sets[name] == int(entries), (name, listing)
    chains = {(e["family"], e["table"], e["chain"]): e["rules"] for e in part["chains"]["chains"]}
    rules = cluster.exec(node.netns, "iptables", "-t", "nat", "-S", "KUBE-SERVICES").stdout
    assert chains[("IPv4", "nat", "KUBE-SERVICES")] == rules.count("\n-A ") > 0
    # The daemon's sets and chains as a reconcile would leave them.
    assert part["ipsets"]["drift"] == NO_DRIFT, part["ipsets"]["drift"]
    assert part["chains"]["drift"] == NO_DRIFT, part["chains"]["drift"]
    table = status(cluster, node, state, "--all", "-n")
    assert re.search(r"^kube-ipvs0: \d+ addresses \(drift 0\)$", table, re.M), table
    assert re.search(r"^ipsets: \d+ \(drift 0\)$", table, re.M), table
    assert re.search(r"^iptables chains: \d+ \(drift 0\)$", table, re.M), table


NO_DRIFT = {"count": 0, "operations": []}
STRAY = "192.0.2.99,tcp:80"  # a member no Service wants


def forward_rule(cluster: Cluster, node: Node) -> str:
    """KUBE-FORWARD's first rule, as ``iptables -S`` gives it."""
    rules = cluster.exec(node.netns, "iptables", "-t", "filter", "-S", "KUBE-FORWARD").stdout
    return next(ln for ln in rules.splitlines() if ln.startswith("-A "))


def drift_by_hand(cluster: Cluster, node: Node, web_ip: str) -> None:
    """A member of ipvsproxy's set deleted, one added; a rule added to one of its chains and
    one deleted from another."""
    run = cluster.exec
    run(node.netns, "ipset", "del", "KUBE-CLUSTER-IP", f"{web_ip},tcp:80")
    run(node.netns, "ipset", "add", "KUBE-CLUSTER-IP", STRAY)
    extra = ["-A", "KUBE-SERVICES", "-m", "comment", "--comment", "by hand", "-j", "RETURN"]
    run(node.netns, "iptables", "-t", "nat", *extra)
    gone = shlex.split(forward_rule(cluster, node))
    run(node.netns, "iptables", "-t", "filter", "-D", *gone[1:])


def check_drift_by_hand(cluster: Cluster, node: Node, state: Path, web_ip: str) -> None:
    """status --all counts and names exactly what ``drift_by_hand`` changed."""
    report = json.loads(status(cluster, node, state, "--all", "-o", "json"))
    part = report["all"]
    assert part["ipsets"]["drift"] == {
        "count": 2,
        "operations": [
            f"add {web_ip},tcp:80 in ipset KUBE-CLUSTER-IP",
            f"delete {STRAY} in ipset KUBE-CLUSTER-IP",
        ],
    }
    assert part["chains"]["drift"] == {
        "count": 2,
        "operations": [
            "rewrite chain KUBE-FORWARD in IPv4 filter",
            "rewrite chain KUBE-SERVICES in IPv4 nat",
        ],
    }
    assert part["kubeIpvs0"]["drift"] == NO_DRIFT and report["drift"] == NO_DRIFT
    table = status(cluster, node, state, "--all", "-n")
    assert re.search(r"^ipsets: \d+ \(drift 2\)$", table, re.M), table
    assert f"  ! delete {STRAY} in ipset KUBE-CLUSTER-IP" in table.splitlines()
    assert re.search(r"^iptables chains: \d+ \(drift 2\)$", table, re.M), table
    assert "  ! rewrite chain KUBE-SERVICES in IPv4 nat" in table.splitlines()


def test_status_filter_and_connections_over_ipv6(lab_cluster: Cluster, tmp_path: Path) -> None:
    """An IPv6 Service: -t [ADDR]:PORT lists what ``ipvsadm -Ln -t`` lists, and -c shows the
    IPv6 entries of /proc/net/ip_vs_conn as ``ipvsadm -Lnc`` does, named."""
    from kubernetes import client

    lab = LabKube(lab_cluster, tmp_path)
    pods = [
        LabPod(p.name, "default", p.node, p.ip, {"app": "six"}, {"http": POD_ECHO_PORT}, ip6=p.ip6)
        for p in lab_cluster.pods
    ]
    try:
        kube = lab.start(pods)
        assert kube.daemons is not None
        core: Any = client.CoreV1Api(kube.api)
        spec: dict[str, Any] = {"selector": {"app": "six"}, "ipFamilies": ["IPv6"]}
        spec["ports"] = [{"name": "http", "port": 80, "targetPort": POD_ECHO_PORT}]
        core.create_namespaced_service("default", {"metadata": {"name": "six"}, "spec": spec})
        six = core.read_namespaced_service("six", "default").spec.cluster_ip
        n1 = lab_cluster.nodes[0]
        state = kube.daemons.state_file(n1)
        client_ns = n1.pods[-1].netns
        wait_for(lambda: netns.tcp_request(client_ns, six, 80, timeout=2)["pod"], 30, "six")
        session = netns.TCPSession(client_ns, six, 80)
        try:
            pod = session.ask()["pod"]
            only = ("-t", f"[{six}]:80")
            report = status_matching_ipvsadm(lab_cluster, n1, state, *only)
            (vs,) = report["virtualServers"]
            assert (vs["address"], vs["service"]) == (six, "default/six")
            entries = status_connections(lab_cluster, n1, state, *only)
            held = ("TCP", "ESTABLISHED", f"[{session.local[0]}]:{session.local[1]}")
            mine = [e for e in entries if as_conn(e)[:3] == held]
            assert len(mine) == 1 and mine[0]["pod"] == f"default/{pod}", entries
            assert mine[0]["service"] == "default/six:http"
            assert {as_conn(e) for e in entries} <= ipvsadm_connections(lab_cluster, n1)
        finally:
            session.close()
    finally:
        print(lab.logs())
        lab.stop(cleanup=True)
