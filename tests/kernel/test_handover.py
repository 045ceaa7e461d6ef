"""Live handover of a node from upstream kube-proxy (IPVS mode) to ipvsproxy, and back, under
continuous load (deploy/README.md, "Replacing kube-proxy node by node").

Node-2 is programmed by upstream kube-proxy; it is stopped with SIGTERM (no ``--cleanup``), a
Service is deleted while no proxy runs there, and ipvsproxy starts on that node alone. New TCP
connections from a pod to a ClusterIP and from outside to a NodePort go on in a loop the whole
time, and two long-lived connections (one each way) are exercised throughout. Then the reverse:
ipvsproxy stopped the same way, a Service deleted in the gap, kube-proxy started again.

What is asserted: no request fails and the long-lived connections answer to the end; the
kernel writes of ipvsproxy's takeover are exactly those encoded here (counted by its
``ipvsproxy_netlink_operations_total`` metric, and shown as the difference of the kernel's
state before and after); nothing either proxy created is leaked by the other.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster import peers
from lab.cluster.kube import METRICS_ADDRESS, LabKube, http_get_from, wait_for
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import Cluster, Node
from tests.e2e.cluster import parse_proc_ip_vs

pytestmark = pytest.mark.kernel

# Upstream kube-proxy's IPVS-mode ipsets (pkg/proxy/ipvs/ipset.go): all of ipvsproxy's but
# KUBE-NO-LOCAL-ENDPOINTS, which ipvsproxy creates only when it has a member.
UPSTREAM_SETS = {
    "KUBE-LOOP-BACK",
    "KUBE-CLUSTER-IP",
    "KUBE-EXTERNAL-IP",
    "KUBE-EXTERNAL-IP-LOCAL",
    "KUBE-LOAD-BALANCER",
    "KUBE-LOAD-BALANCER-LOCAL",
    "KUBE-LOAD-BALANCER-FW",
    "KUBE-LOAD-BALANCER-SOURCE-CIDR",
    "KUBE-LOAD-BALANCER-SOURCE-IP",
    "KUBE-NODE-PORT-TCP",
    "KUBE-NODE-PORT-LOCAL-TCP",
    "KUBE-NODE-PORT-UDP",
    "KUBE-NODE-PORT-LOCAL-UDP",
    "KUBE-NODE-PORT-SCTP-HASH",
    "KUBE-NODE-PORT-LOCAL-SCTP-HASH",
    "KUBE-HEALTH-CHECK-NODE-PORT",
    "KUBE-IPVS-IPS",
}

# Its IPv6 proxier's: the same with KUBE-6- for KUBE-, cut to ipset's 31 characters.
UPSTREAM_IPV6_SETS = {f"KUBE-6-{name[5:]}"[:31] for name in UPSTREAM_SETS}


# -- the load -------------------------------------------------------------------------------------


class Load:
    """New connections in a loop on each path, and one long-lived connection per path asked
    in a loop; every failure is kept with its time and path."""

    def __init__(self, paths: dict[str, tuple[str, str, int]], long_lived: dict[str, Any]) -> None:
        self.paths = paths
        self.sessions: dict[str, netns.TCPSession] = {}
        self.backend: dict[str, str] = {}  # long-lived path -> the pod that answers it
        for name, (ns, ip, port) in long_lived.items():
            session = netns.TCPSession(ns, ip, port, timeout=5)
            self.sessions[name] = session
            self.backend[name] = session.ask()["pod"]
        self.answers: dict[str, int] = dict.fromkeys([*paths, *self.sessions], 0)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._new_connections, args=(name, *path), daemon=True)
            for name, path in paths.items()
        ]
        self._threads.append(threading.Thread(target=self._long_lived, daemon=True))

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def _ok(self, name: str) -> None:
        with self._lock:
            self.answers[name] += 1

    def _fail(self, name: str, exc: BaseException, started: float | None = None) -> None:
        """Kept as "HH:MM:SS.mmm path: error", with when the failed attempt began."""
        now = time.time()
        began = "" if started is None else f" (began {now - started:.2f} s before)"
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1000) % 1000:03d}"
        with self._lock:
            self.failures.append(f"{stamp} {name}: {exc!r}{began}")

    def _new_connections(self, name: str, ns: str, ip: str, port: int) -> None:
        while not self._stop.is_set():
            started, phase = time.time(), "connect"
            try:
                with netns.TCPSession(ns, ip, port, timeout=5) as session:
                    phase = f"answer from {session.local[0]}:{session.local[1]}"
                    session.ask(b"hello\n")
                self._ok(name)
            except Exception as exc:
                self._fail(name, RuntimeError(f"{phase}: {exc!r}"), started)
            self._stop.wait(0.05)

    def _long_lived(self) -> None:
        while not self._stop.is_set():
            for name, session in list(self.sessions.items()):
                try:
                    pod = session.ask()["pod"]
                except Exception as exc:
                    self._fail(name, exc)
                    del self.sessions[name]  # broken: reported once
                    continue
                if pod != self.backend[name]:
                    self._fail(name, AssertionError(f"answered by {pod}"))
                self._ok(name)
            self._stop.wait(0.2)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self.answers)

    def flowing(self, since: dict[str, int], n: int = 5) -> Callable[[], bool]:
        """Every path answered ``n`` more times than at ``since``."""
        return lambda: all(c >= since[k] + n for k, c in self.counts().items())

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        for session in self.sessions.values():
            session.close()


# -- the kernel's state, as the C tools print it --------------------------------------------------


def snapshot(cluster: Cluster, node: Node) -> dict[str, set[str]]:
    """IPVS (``ipvsadm -Sn``), ipsets (``ipset save``, without the random initval), the
    iptables rules (``iptables-save`` without counters) and kube-ipvs0's addresses."""

    def lines(*argv: str) -> list[str]:
        return cluster.exec(node.netns, *argv).stdout.splitlines()

    def rules(save: str) -> set[str]:
        return {re.sub(r" \[\d+:\d+\]$", "", ln) for ln in lines(save) if not ln.startswith("#")}

    return {
        "ipvs": set(lines("ipvsadm", "-Sn")),
        "ipsets": {re.sub(r" initval 0x[0-9a-f]+", "", ln) for ln in lines("ipset", "save")},
        "iptables": rules("iptables-save"),
        "ip6tables": rules("ip6tables-save"),
        "addresses": {
            ln.split()[3].split("/")[0]
            for ln in lines("ip", "-o", "-4", "addr", "show", "dev", "kube-ipvs0")
        },
    }


def changes(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, Any]:
    """What differs, by part: lines gone (``-``) and lines new (``+``)."""
    out: dict[str, Any] = {}
    for part in before:
        gone, new = sorted(before[part] - after[part]), sorted(after[part] - before[part])
        if gone or new:
            out[part] = {"-": gone, "+": new}
    return out


def set_names(snap: dict[str, set[str]]) -> set[str]:
    return {ln.split()[1] for ln in snap["ipsets"] if ln.startswith("create ")}


def writes(node: Node) -> dict[str, int]:
    """ipvsproxy's kernel writes so far, by kind (``ipvsproxy_netlink_operations_total``)."""
    text = http_get_from(node.netns, f"http://{METRICS_ADDRESS}/metrics")[1]
    found = {}
    for m in re.finditer(
        r'^ipvsproxy_netlink_operations_total\{kind="(\w+)",outcome="(\w+)"\} (\S+)$',
        text,
        re.MULTILINE,
    ):
        found[f"{m[1]}:{m[2]}" if m[2] != "ok" else m[1]] = int(float(m[3]))
    return found


def kube_proxy_synced(node: Node, since: float = 0.0) -> bool:
    """Upstream's kubeproxy_sync_proxy_rules_last_timestamp_seconds is past ``since`` for
    both of its proxiers (it runs dual-stack where the kernel has IPv6, as the lab's)."""
    text = http_get_from(node.netns, f"http://{METRICS_ADDRESS}/metrics")[1]
    found = re.findall(
        r'^kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family="(IPv[46])"\} (\S+)$',
        text,
        re.M,
    )
    return {f for f, t in found if float(t) > since} == {"IPv4", "IPv6"}


def virtual_servers(cluster: Cluster, node: Node) -> set[tuple[str, str, int]]:
    return set(parse_proc_ip_vs(cluster.exec(node.netns, "cat", "/proc/net/ip_vs").stdout))


# -- the cluster ----------------------------------------------------------------------------------


@pytest.fixture
def kube(lab_cluster: Cluster, tmp_path: Path) -> Iterator[LabKube]:
    lab = LabKube(lab_cluster, tmp_path)
    lab.start_apiserver()
    lab.start_controller(
        [
            LabPod(p.name, "default", p.node, p.ip, {"app": "web"}, {"echo": 8080})
            for p in lab_cluster.pods
        ]
    )
    try:
        yield lab
    finally:
        print(lab.logs())
        lab.stop(cleanup=False)


def node_port_service(kube: LabKube, name: str, port: int) -> tuple[str, int]:
    """A NodePort Service over every lab pod: (its ClusterIP, its NodePort)."""
    svc: Any = kube.controlplane.call(
        "POST",
        "/api/v1/namespaces/default/services",
        {
            "metadata": {"name": name},
            "spec": {
                "type": "NodePort",
                "selector": {"app": "web"},
                "ports": [{"name": "http", "port": port, "targetPort": "echo"}],
            },
        },
    )
    return svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["nodePort"]


def delete_service(kube: LabKube, name: str) -> None:
    kube.controlplane.call("DELETE", f"/api/v1/namespaces/default/services/{name}")


def service_keys(node: Node, vip: str, port: int, node_port: int) -> set[tuple[str, str, int]]:
    """A NodePort Service's virtual servers on ``node``: its ClusterIP, and its NodePort on
    every node address (upstream's default nodePortAddresses: eth0 and the pod bridge)."""
    return {("TCP", vip, port), ("TCP", node.ip, node_port), ("TCP", node.gateway, node_port)}


def ipvs_lines(key: tuple[str, str, int], backends: list[str]) -> set[str]:
    """``ipvsadm -Sn``'s lines for a TCP virtual server of kube-proxy's shape (rr, masquerade,
    weight 1) with ``backends`` on port 8080."""
    _, address, port = key
    return {f"-A -t {address}:{port} -s rr"} | {
        f"-a -t {address}:{port} -r {ip}:8080 -m -w 1" for ip in backends
    }


def full_syncs(kube: LabKube) -> int:
    return kube.logs().count("full sync: ")


# ipvsproxy's kernel writes when it takes over the node, by kind (its metric's labels). Each
# is a deliberate difference (README.md, "Differences from kube-proxy"); any other write is a
# new difference and fails this test.
EXPECTED_TAKEOVER_WRITES = {
    # The Service deleted while no proxy ran: its ClusterIP and its NodePort on both node
    # addresses (the latter recognised by upstream's KUBE-NODE-PORT-TCP set), ...
    "delete_service": 3,
    # ... its address on kube-ipvs0, ...
    "delete_address": 1,
    # ... its entries in KUBE-CLUSTER-IP, KUBE-NODE-PORT-TCP and KUBE-IPVS-IPS. Upstream would
    # make the same writes at its next sync.
    "delete_member": 3,
    # "Taking over a node": upstream's chains are rewritten once in each family (an identical
    # text here), as ipvsproxy has no record of having written them.
    "restore": 2,
}


def test_handover_from_kube_proxy_to_ipvsproxy_and_back(
    lab_cluster: Cluster, kube: LabKube, tmp_path: Path
) -> None:
    node = lab_cluster.nodes[1]
    pod, other_pod = node.pods[0], node.pods[1]
    external = lab_cluster.external.netns
    backends = sorted(p.ip for p in lab_cluster.pods)
    kp_kubeconfig = peers.grant_kube_proxy(kube.controlplane, tmp_path / "kube-proxy.kubeconfig")
    vip, node_port = node_port_service(kube, "web", 80)
    gone_vip, gone_node_port = node_port_service(kube, "gone", 81)
    web_keys = service_keys(node, vip, 80, node_port)
    gone_keys = service_keys(node, gone_vip, 81, gone_node_port)
    everyone = {p.name for p in lab_cluster.pods}

    kube_proxy = peers.kube_proxy(node.name, node.netns, kp_kubeconfig, tmp_path)
    # ipvsproxy reads the same KubeProxyConfiguration, as a kube-proxy ConfigMap is reused.
    kube.daemon_flags = ("--config", str(tmp_path / f"kube-proxy-{node.name}.yaml"))
    load: Load | None = None
    try:
        # 1. Upstream kube-proxy programs the node; the load starts.
        wait_for(
            lambda: web_keys | gone_keys <= virtual_servers(lab_cluster, node),
            120,
            "kube-proxy programs both Services",
        )

        def balanced() -> bool:
            seen = {netns.tcp_request(pod.netns, vip, 80, timeout=2)["pod"] for _ in range(12)}
            return seen == everyone

        wait_for(balanced, 60, "kube-proxy: every pod answers the ClusterIP")
        wait_for(lambda: kube_proxy_synced(node), 60, "kube-proxy's IPv4 and IPv6 syncs")
        load = Load(
            {
                "pod -> ClusterIP": (pod.netns, vip, 80),
                "external -> NodePort": (external, node.ip, node_port),
            },
            {
                "long-lived pod -> ClusterIP": (other_pod.netns, vip, 80),
                "long-lived external -> NodePort": (external, node.ip, node_port),
            },
        ).start()
        wait_for(load.flowing(load.counts()), 60, "traffic through kube-proxy's node")

        # 2. kube-proxy stopped (SIGTERM, no --cleanup): the dataplane stays as it was.
        before = snapshot(lab_cluster, node)
        kept = virtual_servers(lab_cluster, node) - gone_keys  # web's and the API server's
        # kube-proxy does not catch SIGTERM: it dies of it, as in a DaemonSet's rollout.
        assert kube_proxy.stop() in (0, -15), kube_proxy.logs()
        assert changes(before, snapshot(lab_cluster, node)) == {}
        # A Service deleted while no proxy runs on the node: what kube-proxy made of it is
        # ipvsproxy's to remove (its NodePort virtual servers are on node addresses).
        delete_service(kube, "gone")

        # 3. ipvsproxy takes the node over: its writes are the expected ones, nothing of
        # kube-proxy's is leaked, and a later full sync writes nothing.
        daemons = kube.start_daemons([node])
        kube.wait_first_sync(node)
        taken = writes(node)
        after = snapshot(lab_cluster, node)
        print("takeover writes:", taken)
        print("takeover changes:", changes(before, after))
        wait_for(load.flowing(load.counts()), 60, "traffic through ipvsproxy's node")
        assert taken == EXPECTED_TAKEOVER_WRITES
        gone_ipvs = set().union(*(ipvs_lines(k, backends) for k in gone_keys))
        assert changes(before, after) == {
            "ipvs": {"-": sorted(gone_ipvs), "+": []},
            "ipsets": {
                "-": sorted(
                    {
                        f"add KUBE-CLUSTER-IP {gone_vip},tcp:81",
                        f"add KUBE-IPVS-IPS {gone_vip}",
                        f"add KUBE-NODE-PORT-TCP {gone_node_port}",
                    }
                ),
                "+": [],
            },
            "addresses": {"-": [gone_vip], "+": []},
        }
        assert virtual_servers(lab_cluster, node) == kept
        # kube-proxy's IPv6 proxier's sets and chains are adopted as they are: ipvsproxy
        # serves IPv6 too.
        assert set_names(after) == UPSTREAM_SETS | UPSTREAM_IPV6_SETS
        assert any(":KUBE-" in line for line in after["ip6tables"])
        syncs = full_syncs(kube)
        wait_for(lambda: full_syncs(kube) >= syncs + 1, 60, "a periodic full sync")
        assert writes(node) == taken, changes(after, snapshot(lab_cluster, node))

        # 4. And back: a Service ipvsproxy programmed is deleted once ipvsproxy is stopped
        # (SIGTERM, no cleanup); kube-proxy removes it, and leaves nothing of ipvsproxy's.
        late_vip, late_node_port = node_port_service(kube, "late", 82)
        late_keys = service_keys(node, late_vip, 82, late_node_port)
        wait_for(
            lambda: late_keys <= virtual_servers(lab_cluster, node), 60, "ipvsproxy programs late"
        )
        handed = snapshot(lab_cluster, node)
        daemons.stop()
        assert changes(handed, snapshot(lab_cluster, node)) == {}
        delete_service(kube, "late")
        kube_proxy = peers.kube_proxy(node.name, node.netns, kp_kubeconfig, tmp_path)
        wait_for(lambda: kube_proxy_synced(node), 120, "kube-proxy's first sync")
        wait_for(lambda: virtual_servers(lab_cluster, node) == kept, 60, "kube-proxy removes late")
        back = snapshot(lab_cluster, node)
        print("handback changes:", changes(handed, back))
        # No set of ipvsproxy's left behind; kube-proxy's IPv6 proxier has its own again.
        assert set_names(back) == UPSTREAM_SETS | UPSTREAM_IPV6_SETS
        wait_for(load.flowing(load.counts()), 60, "traffic through kube-proxy's node again")
        # The node is as ipvsproxy took it over: kube-proxy's objects, less "gone"'s, in both
        # families.
        assert changes(after, back) == {}
        assert kube_proxy.running(), kube_proxy.logs()
    finally:
        if load is not None:
            load.stop()
            print("answers:", load.counts())
            print("failures:", load.failures)
        if kube.daemons is not None:
            kube.daemons.stop()
        if kube_proxy.running():
            kube_proxy.stop()
        print(kube_proxy.logs())
        # The session's node namespace is left clean for the next test.
        peers.kube_proxy_cleanup(node.netns)
        lab_cluster.exec(node.netns, "ipset", "destroy", "KUBE-NO-LOCAL-ENDPOINTS", check=False)
    assert load.failures == []
    assert set(load.sessions) == set(load.backend)  # every long-lived connection answered
