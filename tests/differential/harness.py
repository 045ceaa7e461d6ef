"""The shell of the differential tests (inside the lab guest): one control plane, upstream
kube-proxy on node-2 and ipvsproxy on node-3, the corpus of :mod:`tests.differential.corpus`
applied through the API, and what each node programmed and how its traffic goes.

Both proxies get the same node facts: cluster CIDR 10.244.0.0/16, ``nodePortAddresses`` unset,
scheduler rr, sync period 10 s and minimum sync period 100 ms, the node's InternalIP from its
Node object. kube-proxy is configured as kubeadm does (``lab/cluster/peers.py``), ipvsproxy as
``lab/cluster/kube.py`` runs it.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from lab.cluster import peers
from lab.cluster.kube import LabKube, http_get_from, sync_count
from lab.cluster.kubelet import MERGE_PATCH, LabPod
from lab.net import netns
from lab.net.topology import Cluster, Node
from tests.differential import compare, corpus
from tests.differential.compare import Difference, NodeFacts

UPSTREAM_NODE = "node-2"
OUR_NODE = "node-3"
# Routed from the external client to the node under test while its traffic is probed.
EXTERNAL_ROUTES = ("203.0.113.0/24", "192.0.2.0/24")
REQUEST_TIMEOUT = 1.5
REQUESTS = 8  # more than the most endpoints a shape has (6), so rr shows every one
PROBE_WORKERS = 8
# Both families' ICMP error rate limits, turned off while probing.
ICMP_LIMITS = ("net.ipv4.icmp_ratemask", "net.ipv6.icmp.ratelimit")


def facts(cluster: Cluster, node: Node) -> NodeFacts:
    peer = cluster.node(OUR_NODE if node.name == UPSTREAM_NODE else UPSTREAM_NODE)
    return NodeFacts(
        ip=node.ip,
        bridge_ip=node.gateway,
        pod_prefix=node.pod_cidr.rsplit(".", 1)[0] + ".",
        peer_ip=peer.ip,
        peer_bridge_ip=peer.gateway,
        peer_pod_prefix=peer.pod_cidr.rsplit(".", 1)[0] + ".",
        pod_name_prefix=f"pod-{node.index}-",
        peer_pod_name_prefix=f"pod-{peer.index}-",
        ip6=node.ip6,
        bridge_ip6=node.gateway6,
        pod_prefix6=node.pod_cidr6.split("/")[0],
        peer_ip6=peer.ip6,
        peer_bridge_ip6=peer.gateway6,
        peer_pod_prefix6=peer.pod_cidr6.split("/")[0],
    )


class PodState(NamedTuple):
    ip: str
    ready: bool
    terminating: bool
    selected: bool  # labelled for its Service's selector
    ip6: str = ""


@dataclass
class Snapshot:
    """What one node's proxy programmed, normalised."""

    ipvs: dict[compare.VSKey, compare.VirtualServer]
    ipsets: dict[str, compare.IPSet]


class DiffLab:
    """The cluster of the differential tests."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.kube = LabKube(cluster, workdir)
        self.upstream_node = cluster.node(UPSTREAM_NODE)
        self.our_node = cluster.node(OUR_NODE)
        self.peer: peers.Peer | None = None
        # What the API should say: shape -> Pod name -> its state (what the EndpointSlice
        # controller must have written before the proxies are compared).
        self.model: dict[str, dict[str, PodState]] = {}
        # each compared node's ICMP limits, to restore
        self.icmp_limits: dict[tuple[str, str], str] = {}

    # Set-up -----------------------------------------------------------------------------

    def start(self) -> None:
        # ICMP errors (a pod's packet to an address its node cannot route) are sent at every
        # probe, not as the rate limit lets them: otherwise probes side by side make one
        # node's answer "timeout" and the other's "unreachable" by timing alone.
        for node in (self.upstream_node, self.our_node):
            for key in ICMP_LIMITS:
                self.icmp_limits[(node.name, key)] = netns.read_sysctl(node.netns, key)
                netns.write_sysctl(node.netns, key, "0")
        kube = self.kube
        kube.start_apiserver()
        for node in self.cluster.nodes:
            labels = {"metadata": {"labels": {corpus.ZONE_LABEL: corpus.zone(node.index)}}}
            kube.controlplane.call(
                "PATCH", f"/api/v1/nodes/{node.name}", labels, content_type=MERGE_PATCH
            )
        kube.start_controller([])
        kube.kubelets.ensure_namespace(corpus.NAMESPACE)
        kp_config = peers.grant_kube_proxy(
            kube.controlplane, self.workdir / "kube-proxy.kubeconfig"
        )
        self.peer = peers.kube_proxy(
            UPSTREAM_NODE,
            self.upstream_node.netns,
            kp_config,
            self.workdir,
            sync_period="10s",
            min_sync_period="100ms",
        )
        kube.start_daemons([self.our_node])
        kube.wait_first_sync(self.our_node)

    def stop(self) -> None:
        if self.peer is not None:
            self.peer.stop()
            self.peer = None
        self.kube.stop(cleanup=True)
        peers.kube_proxy_cleanup(self.upstream_node.netns)
        for route in EXTERNAL_ROUTES:
            self.cluster.exec(self.cluster.external.netns, "ip", "route", "del", route, check=False)
        for (name, key), value in self.icmp_limits.items():
            netns.write_sysctl(self.cluster.node(name).netns, key, value)

    def logs(self) -> str:
        upstream = self.peer.logs(tail=200_000) if self.peer else ""
        return f"--- kube-proxy ---\n{upstream}\n{self.kube.logs()}"

    def check_running(self) -> None:
        if self.peer is not None and not self.peer.running():
            raise AssertionError(f"kube-proxy exited:\n{self.peer.logs()}")
        if self.kube.daemons is not None and self.kube.daemons.exited():
            raise AssertionError(f"ipvsproxy exited:\n{self.kube.logs()}")

    # The corpus through the API -----------------------------------------------------------

    @property
    def cp(self) -> Any:
        return self.kube.controlplane

    def apply(self, shapes: Iterable[corpus.Shape]) -> None:
        """Create each shape's Service, its load-balancer status and its Pods."""
        for s in shapes:
            path = f"/api/v1/namespaces/{corpus.NAMESPACE}/services"
            self.cp.call("POST", path, s.manifest())
            if s.ingress:
                body = {"status": {"loadBalancer": {"ingress": list(s.ingress)}}}
                self.cp.call("PATCH", f"{path}/{s.name}/status", body, content_type=MERGE_PATCH)
            self.model[s.name] = {}
            for p in s.pods:
                self.add_pod(s, p)

    def add_pod(self, s: corpus.Shape, p: corpus.PodSpec) -> None:
        lab_pod = self.cluster.pod(p.lab_pod())
        self.model[s.name][s.pod_name(p)] = PodState(lab_pod.ip, p.ready, False, True, lab_pod.ip6)
        self.kube.kubelets.add_pod(
            LabPod(
                s.pod_name(p),
                corpus.NAMESPACE,
                lab_pod.node,
                lab_pod.ip,
                {"shape": s.name},
                {"echo": corpus.ECHO_PORT, "echo-udp": corpus.ECHO_PORT},
                ready=p.ready,
                protocols={"echo-udp": "UDP"},
                ip6=lab_pod.ip6 or None,
            )
        )
        if p.terminating:
            self.terminate(s.name, s.pod_name(p))

    # Live changes, each through the API as a kubelet or an operator makes it.

    def terminate(self, shape: str, pod: str) -> None:
        """Deleted with a grace period no kubelet ends: it stays terminating."""
        self.kube.kubelets.remove_pod(corpus.NAMESPACE, pod, grace_seconds=3600)
        self.model[shape][pod] = self.model[shape][pod]._replace(terminating=True)

    def select(self, shape: str, pod: str, selected: bool) -> None:
        """Scale by label: the pod joins (or leaves) its Service's selector."""
        value = shape if selected else None
        self.kube.kubelets.update_labels({(corpus.NAMESPACE, pod): {"shape": value}})
        self.model[shape][pod] = self.model[shape][pod]._replace(selected=selected)

    def set_ready(self, shape: str, pod: str, ready: bool) -> None:
        self.kube.kubelets.set_ready(corpus.NAMESPACE, pod, ready)
        self.model[shape][pod] = self.model[shape][pod]._replace(ready=ready)

    def delete_pod(self, shape: str, pod: str) -> None:
        self.kube.kubelets.remove_pod(corpus.NAMESPACE, pod, grace_seconds=0)
        del self.model[shape][pod]

    def delete_service(self, shape: str) -> None:
        path = f"/api/v1/namespaces/{corpus.NAMESPACE}/services/{shape}"
        self.cp.call("DELETE", path)
        for pod in list(self.model[shape]):
            self.delete_pod(shape, pod)
        del self.model[shape]

    def expected_endpoints(self) -> dict[str, list[tuple[str, bool, bool]]]:
        """Per Service with a selector: (address, serving, terminating) of its endpoints."""
        out = {}
        for shape, pods in self.model.items():
            s = corpus.shape(shape)
            if s.spec.get("type") == "ExternalName":
                continue
            addresses = [
                (ip, p.ready, p.terminating)
                for p in pods.values()
                if p.selected
                for family, ip in (("IPv4", p.ip), ("IPv6", p.ip6))
                if family in s.families
            ]
            out[shape] = sorted(addresses)
        return out

    def services(self) -> list[dict[str, Any]]:
        out = self.cp.call("GET", f"/api/v1/namespaces/{corpus.NAMESPACE}/services")
        return list(out["items"])

    # Reading the nodes --------------------------------------------------------------------

    def snapshot(self, node: Node) -> Snapshot:
        f = facts(self.cluster, node)
        ipvs = self.cluster.exec(node.netns, "ipvsadm", "-Sn").stdout
        ipsets = self.cluster.exec(node.netns, "ipset", "save").stdout
        return Snapshot(compare.parse_ipvsadm(ipvs, f), compare.parse_ipset_save(ipsets, f))

    def differences(self, services: list[dict[str, Any]]) -> list[Difference]:
        up, ours = self.snapshot(self.upstream_node), self.snapshot(self.our_node)
        owners = owner_index(services)

        def owner(key: compare.VSKey) -> str:
            return owners.get(key[1], "")

        found = compare.diff_ipvs(up.ipvs, ours.ipvs, owner)
        found += [
            Difference(d.kind, d.key, d.upstream, d.ours, member_owner(d.key, owners))
            for d in compare.diff_ipsets(up.ipsets, ours.ipsets)
        ]
        return found

    def wait_slices(self, timeout: float = 60.0) -> None:
        """Until the EndpointSlice controller has written what :attr:`model` says (address,
        serving, terminating of every endpoint) for every Service with a selector."""
        path = f"/apis/discovery.k8s.io/v1/namespaces/{corpus.NAMESPACE}/endpointslices"
        expected = self.expected_endpoints()

        def found() -> dict[str, list[tuple[str, bool, bool]]]:
            out: dict[str, list[tuple[str, bool, bool]]] = {k: [] for k in expected}
            for sl in self.cp.call("GET", path)["items"]:
                svc = sl["metadata"].get("labels", {}).get("kubernetes.io/service-name", "")
                for ep in sl.get("endpoints") or []:
                    cond = ep.get("conditions") or {}
                    serving = cond.get("serving") is not False  # absent: serving (the API's)
                    for addr in ep["addresses"]:
                        out.setdefault(svc, []).append(
                            (addr, serving, bool(cond.get("terminating", False)))
                        )
            return {k: sorted(v) for k, v in out.items()}

        deadline = time.monotonic() + timeout
        while True:
            now = found()
            wrong = {k: (v, now.get(k)) for k, v in expected.items() if now.get(k) != v}
            if not wrong:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"EndpointSlices (wanted, found): {wrong}")
            time.sleep(0.5)

    def wait_settled(
        self,
        services: list[dict[str, Any]],
        ready: Callable[[Snapshot], bool],
        timeout: float = 90.0,
        pause: float = 2.0,
    ) -> list[Difference]:
        """Until each node satisfies ``ready`` and reads the same twice ``pause`` apart (each
        proxy has applied what the API says): then the differences between them."""
        deadline = time.monotonic() + timeout
        # Each proxy syncs twice after the API said what the step did: the second sync began
        # after it (upstream's minimum and periodic syncs bound the wait: 100 ms, 10 s).
        nodes = (self.upstream_node, self.our_node)
        start = {n.name: sync_count(n) for n in nodes}
        while not all(sync_count(n) >= start[n.name] + 2 for n in nodes):
            self.check_running()
            if time.monotonic() > deadline:
                raise AssertionError(f"the proxies did not sync twice: {start}")
            time.sleep(0.5)
        last: tuple[Snapshot, Snapshot] | None = None
        while True:
            self.check_running()
            now = (self.snapshot(self.upstream_node), self.snapshot(self.our_node))
            if now == last and ready(now[0]) and ready(now[1]):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    "the nodes did not settle: "
                    + "; ".join(str(d) for d in self.differences(services)[:40])
                )
            last = now
            time.sleep(pause)
        return self.differences(services)

    # Traffic -------------------------------------------------------------------------------

    def traffic(
        self, services: list[dict[str, Any]]
    ) -> tuple[dict[str, object], dict[str, object]]:
        """Every probe of every Service from each proxied node's pod, the node itself and
        the external client: (upstream's outcomes, ipvsproxy's), by probe name."""
        results: dict[str, dict[str, object]] = {}
        # One node at a time: the external client's routes point at the node under test.
        for node in (self.upstream_node, self.our_node):
            ext = self.cluster.external.netns
            for route in EXTERNAL_ROUTES:
                self.cluster.exec(ext, "ip", "route", "replace", route, "via", node.ip)
            results[node.name] = probe_node(self.cluster, node, services)
        return results[UPSTREAM_NODE], results[OUR_NODE]


def owner_index(services: list[dict[str, Any]]) -> dict[str, str]:
    """Service address:port (NodePorts as NODE:port and NODE-BRIDGE:port, bare ``:port`` for
    bitmap sets) -> the shape (Service name)."""
    owners: dict[str, str] = {}
    for svc in services:
        name, spec = svc["metadata"]["name"], svc["spec"]
        ips = [*(spec.get("clusterIPs") or [spec.get("clusterIP") or ""])]
        ips += spec.get("externalIPs") or []
        ips += [
            i.get("ip", "")
            for i in svc.get("status", {}).get("loadBalancer", {}).get("ingress") or []
        ]
        for p in spec.get("ports") or []:
            for ip in ips:
                if ip and ip != "None":
                    owners[f"{ip}:{p['port']}"] = name
            if p.get("nodePort"):
                for where in ("NODE", "NODE-BRIDGE", "NODE6", "NODE-BRIDGE6", ""):
                    owners[f"{where}:{p['nodePort']}"] = name
        if spec.get("healthCheckNodePort"):
            owners[f":{spec['healthCheckNodePort']}"] = name
    return owners


def member_owner(key: str, owners: Mapping[str, str]) -> str:
    """The shape of an ipset difference ``SET MEMBER`` (``10.96.0.10,tcp:80,...`` or ``30080``)."""
    member = key.partition(" ")[2]
    parts = member.split(",")
    if len(parts) == 1:
        return owners.get(f":{parts[0]}", "")
    return owners.get(f"{parts[0]}:{parts[1].rpartition(':')[2]}", "")


# Probes ------------------------------------------------------------------------------------


def probe_node(cluster: Cluster, node: Node, services: list[dict[str, Any]]) -> dict[str, object]:
    """Every probe of ``services`` through ``node``. Services are probed side by side, each
    one's probes one after another: a virtual server's scheduler and affinity see one probe's
    requests at a time, as in a sequential run, and no two Services share a virtual server."""
    f = facts(cluster, node)
    vantage = {"pod": node.pods[0].netns, "node": node.netns, "external": cluster.external.netns}
    ordered = sorted(services, key=lambda s: str(s["metadata"]["name"]))
    with ThreadPoolExecutor(PROBE_WORKERS) as pool:
        parts = pool.map(lambda svc: probe_service(svc, node, vantage, f), ordered)
        return {key: outcome for part in parts for key, outcome in part.items()}


def probe_service(
    svc: dict[str, Any], node: Node, vantage: Mapping[str, str], f: NodeFacts
) -> dict[str, object]:
    out: dict[str, object] = {}
    name, spec = svc["metadata"]["name"], svc["spec"]
    if spec.get("type") == "ExternalName":
        return out
    sticky = spec.get("sessionAffinity") == "ClientIP"
    ingress = svc.get("status", {}).get("loadBalancer", {}).get("ingress") or []
    for p in spec.get("ports") or []:
        proto, label = p.get("protocol", "TCP"), p.get("name") or str(p["port"])
        targets: list[tuple[str, str, int, tuple[str, ...]]] = []
        cluster_ips = spec.get("clusterIPs") or [spec.get("clusterIP")]
        for ip in cluster_ips if spec.get("clusterIP") not in (None, "None") else ():
            kind = "clusterIP6" if ":" in ip else "clusterIP"
            targets.append((kind, ip, p["port"], ("pod", "node")))
        families = spec.get("ipFamilies") or ["IPv4"]
        if p.get("nodePort") and "IPv4" in families:
            targets.append(("nodePort", node.ip, p["nodePort"], ("pod", "node", "external")))
            targets.append(("nodePort@bridge", node.gateway, p["nodePort"], ("pod",)))
        if p.get("nodePort") and "IPv6" in families:
            targets.append(("nodePort6", node.ip6, p["nodePort"], ("pod", "node", "external")))
            targets.append(("nodePort6@bridge", node.gateway6, p["nodePort"], ("pod",)))
        for ip in spec.get("externalIPs") or []:
            targets.append(("externalIP", ip, p["port"], ("pod", "node", "external")))
        for ing in ingress:
            targets.append(("loadBalancer", ing["ip"], p["port"], ("pod", "node", "external")))
        for kind, ip, number, sources in targets:
            for src in sources:
                key = f"{name}/{label} {proto} {kind} from {src}"
                out[key] = observe(vantage[src], proto, ip, number, f, sticky)
    if spec.get("healthCheckNodePort"):
        url = f"http://{node.ip}:{spec['healthCheckNodePort']}/"
        out[f"{name} healthCheckNodePort from external"] = health(vantage["external"], url)
    return out


def request(ns: str, proto: str, ip: str, port: int) -> dict[str, Any]:
    if proto == "UDP":
        return netns.udp_request(ns, ip, port, timeout=REQUEST_TIMEOUT)
    if proto == "SCTP":
        return netns.sctp_request(ns, ip, port, timeout=REQUEST_TIMEOUT)
    return netns.tcp_request(ns, ip, port, timeout=REQUEST_TIMEOUT)


def observe(ns: str, proto: str, ip: str, port: int, f: NodeFacts, sticky: bool) -> object:
    """Which pods answered (normalised; with ClientIP affinity how many) and which client
    addresses they saw; or why the first request got no answer."""
    pods: set[str] = set()
    clients: set[str] = set()
    for i in range(REQUESTS):
        try:
            answer = request(ns, proto, ip, port)
        except TimeoutError:
            failure = "timeout"
        except ConnectionRefusedError:
            failure = "refused"
        except OSError as exc:
            failure = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
        else:
            pods.add(f.pod(str(answer["pod"])))
            clients.add(f.address(netns.split_hostport(str(answer["client"]))[0]))
            continue
        if i == 0:
            return failure  # a first failure is the outcome: the others would only wait
        pods.add(failure)
    answered: object = f"{len(pods)} pod(s)" if sticky else tuple(sorted(pods))
    return (answered, tuple(sorted(clients)))


def health(ns: str, url: str) -> object:
    try:
        status, body = http_get_from(ns, url, timeout=REQUEST_TIMEOUT)
    except OSError as exc:
        return type(exc).__name__
    try:
        local = json.loads(body).get("localEndpoints")
    except ValueError:
        local = body[:40]
    return (status, local)
