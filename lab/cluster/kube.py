"""The lab as a small Kubernetes cluster running ipvsproxy: what tests and the demo drive.

On top of a :class:`lab.net.topology.Cluster` (node and pod namespaces, echo servers) this starts

- the real control plane (``lab/cluster/controlplane.py``: etcd, kube-apiserver with RBAC,
  kube-controller-manager's EndpointSlice controllers) on the underlay (192.168.56.1:6443), an
  admin kubeconfig, and deploy/'s ServiceAccount, ClusterRole and binding,
- a Node object for every lab node and a Pod object for every lab pod
  (``lab/cluster/kubelet.py``), dual-stack (an InternalIP and a pod IP of each family, IPv4
  first), so the real EndpointSlice controller writes the slices of Services with a selector,
  IPv6 ones for IPv6 and dual-stack Services,
- ``ipvsproxy run`` in every node namespace, as an operator runs it: a kubeconfig acting as
  deploy/'s ServiceAccount (the real authorizer holds it to deploy/'s ClusterRole) and
  kube-proxy's flags, one state file per node. ``fault=`` starts the daemons through
  ``lab/faults.py`` instead, with a deliberately broken dataplane.

On an IPv6-only topology (``Cluster.build(ipv4=False)``) the cluster is IPv6-only too: the API
server on [fc00:f853:ccd:e793::1]:6443 with only the IPv6 Service range (a Service is IPv6 unless
it asks otherwise), Nodes and Pods with IPv6 addresses only, and ``--cluster-cidr``
fd00:10:244::/48 alone.

Inside the lab guest only (it needs IPVS and the topology).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from lab.cluster.controlplane import SERVICE_CIDR6, SERVICE_CIDRS, ControlPlane
from lab.cluster.kubelet import MERGE_PATCH, LabKubelets, LabPod
from lab.net import netns
from lab.net.topology import Cluster, Node, Pod

APISERVER_PORT = 6443
HEALTHZ_PORT = 10256
METRICS_ADDRESS = "127.0.0.1:10249"
CLUSTER_CIDR = "10.244.0.0/16,fd00:10:244::/48"  # dual-stack: the pods of both families
CLUSTER_CIDR6 = "fd00:10:244::/48"  # an IPv6-only cluster's
POD_ECHO_PORT = 8080
REPO = Path(__file__).resolve().parents[2]
SERVICE_ACCOUNT = ("kube-system", "ipvsproxy")  # deploy/serviceaccount.yaml


ECHO_PORT_NAMES = {"TCP": "echo", "UDP": "echo-udp", "SCTP": "echo-sctp"}  # by protocol


def echo_pods(cluster: Cluster, labels: Callable[[Pod], dict[str, str]]) -> list[LabPod]:
    """Every lab pod as a Pod in namespace default, labelled ``labels(pod)``, with its
    addresses and a named container port per protocol its echo servers answer on
    (``ECHO_PORT_NAMES``, all POD_ECHO_PORT)."""
    return [
        LabPod(
            p.name,
            "default",
            p.node,
            p.ip,
            labels(p),
            {name: POD_ECHO_PORT for name in ECHO_PORT_NAMES.values()},
            protocols={"echo-udp": "UDP", "echo-sctp": "SCTP"},
            ip6=p.ip6 or None,
        )
        for p in cluster.pods
    ]


def http_get_from(ns: str | None, url: str, timeout: float = 3.0) -> tuple[int, str]:
    """GET ``url`` from namespace ``ns``: (status, body), HTTP errors included."""
    with netns.entered(ns):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


def healthz(node: Node, path: str = "/healthz") -> tuple[int, str]:
    return http_get_from(node.netns, f"http://127.0.0.1:{HEALTHZ_PORT}{path}")


def metrics(node: Node) -> str:
    return http_get_from(node.netns, f"http://{METRICS_ADDRESS}/metrics")[1]


def ipv4_sample(text: str, name: str) -> float | None:
    """The value of ``name``'s IPv4 series (``name{ip_family="IPv4"}``, as upstream labels
    its per-family series; ipvsproxy's one proxier sets every family's) in a /metrics text,
    or of its unlabelled one; None when it has neither."""
    for line in text.splitlines():
        if line.startswith((f'{name}{{ip_family="IPv4"}} ', f"{name} ")):
            return float(line.split()[-1])
    return None


def last_sync_time(node: Node) -> float:
    """kubeproxy_sync_proxy_rules_last_timestamp_seconds: 0 until a sync ran to its end (no
    series before it, as upstream's; /healthz is 200 while the daemon starts)."""
    name = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
    return ipv4_sample(metrics(node), name) or 0.0


def sync_count(node: Node) -> float:
    """How many syncs (of the IPv4 proxier, for kube-proxy) ran so far."""
    name = "kubeproxy_sync_proxy_rules_duration_seconds_count"
    return ipv4_sample(metrics(node), name) or 0.0


def wait_for(check: Callable[[], object], timeout: float = 30.0, what: str = "condition") -> None:
    """Poll ``check`` until it is truthy; OSError counts as not yet. AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last: str = ""
    while True:
        try:
            if check():
                return
        except OSError as exc:
            last = f" (last error: {exc})"
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout:g} s{last}")
        time.sleep(0.2)


class Daemons:
    """One ``ipvsproxy run`` per node namespace (every node, or those of ``nodes``), logs and
    state files in ``workdir``."""

    def __init__(
        self,
        cluster: Cluster,
        kubeconfig: Path,
        workdir: Path,
        extra: Sequence[str] = (),
        fault: str | None = None,
        nodes: Sequence[Node] | None = None,
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.nodes = tuple(cluster.nodes if nodes is None else nodes)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []
        entry = ["lab.faults", fault] if fault else ["ipvsproxy"]
        for node in self.nodes:
            log = (workdir / f"{node.name}.log").open("wb")
            self._logs.append(log)
            self.procs[node.name] = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    sys.executable,
                    "-m",
                    *entry,
                    "run",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--hostname-override",
                    node.name,
                    "--cluster-cidr",
                    CLUSTER_CIDR if cluster.ipv4 else CLUSTER_CIDR6,
                    "--state-file",
                    str(self.state_file(node)),
                    "--ipvs-sync-period",
                    "10s",
                    "--ipvs-min-sync-period",
                    "100ms",
                    "--healthz-bind-address",
                    f"0.0.0.0:{HEALTHZ_PORT}",
                    "--metrics-bind-address",
                    METRICS_ADDRESS,
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def state_file(self, node: Node) -> Path:
        return self.workdir / f"{node.name}.json"

    def logs(self, tail: int = 3000) -> str:
        return "\n".join(
            f"--- {n} ---\n" + (self.workdir / f"{n}.log").read_text(errors="replace")[-tail:]
            for n in self.procs
        )

    def exited(self) -> dict[str, int]:
        """Daemons that are no longer running, with their exit status."""
        return {n: rc for n, p in self.procs.items() if (rc := p.poll()) is not None}

    def stop(self) -> None:
        """SIGTERM: the daemons leave the dataplane in place."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def cleanup(self) -> list[subprocess.CompletedProcess[str]]:
        """``ipvsproxy cleanup`` on every node a daemon ran on (after stop())."""
        return [
            self.cluster.exec(
                node.netns,
                sys.executable,
                "-m",
                "ipvsproxy",
                "cleanup",
                "--state-file",
                str(self.state_file(node)),
                check=False,
            )
            for node in self.nodes
        ]


class LabKube:
    """Control plane, lab kubelets and ipvsproxy daemons on a lab topology.

    ``start()`` does it all; the demo calls the steps one by one to report each.
    """

    def __init__(
        self,
        cluster: Cluster,
        workdir: Path,
        *,
        daemon_flags: Sequence[str] = (),
        fault: str | None = None,
        pod_cidrs: bool = False,
        register_nodes: bool = True,
    ) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.daemon_flags = tuple(daemon_flags)
        self.fault = fault
        self.pod_cidrs = pod_cidrs
        self.register_nodes = register_nodes
        self.controlplane = ControlPlane(
            workdir / "controlplane",
            host=cluster.apiserver_ip,
            port=APISERVER_PORT,
            service_cidrs=SERVICE_CIDRS if cluster.ipv4 else SERVICE_CIDR6,
        )
        self.kubeconfig = self.controlplane.kubeconfig  # the admin's
        self.daemon_kubeconfig = workdir / "ipvsproxy.kubeconfig"
        self.kubelets = LabKubelets(self.controlplane)
        self.daemons: Daemons | None = None
        self._api: Any = None

    # Steps ------------------------------------------------------------------------------

    def start_apiserver(self) -> None:
        """The control plane, deploy/'s identity for ipvsproxy, and a Node per lab node."""
        cp = self.controlplane
        cp.start()
        for manifest in ("serviceaccount.yaml", "rbac.yaml"):
            cp.create_from_manifest(REPO / "deploy" / manifest)
        cp.service_account_kubeconfig(*SERVICE_ACCOUNT, self.daemon_kubeconfig)
        for node in self.cluster.nodes if self.register_nodes else ():
            cidr = node.pod_cidr if self.pod_cidrs else None
            cidr6 = node.pod_cidr6 if self.pod_cidrs and node.pod_cidr6 else None
            self.kubelets.register_node(node.name, node.ip, cidr, node.ip6 or None, cidr6)

    def start_controller(self, pods: Sequence[LabPod] | None = None) -> None:
        """Register ``pods`` (default: every lab pod with both its addresses, in namespace
        default, unlabelled)."""
        if pods is None:
            pods = [
                LabPod(
                    p.name,
                    "default",
                    p.node,
                    p.ip,
                    ports={"echo": POD_ECHO_PORT},
                    ip6=p.ip6 or None,
                )
                for p in self.cluster.pods
            ]
        self.kubelets.add_pods(pods)

    def start_daemons(self, nodes: Sequence[Node] | None = None) -> Daemons:
        """``ipvsproxy run`` on every lab node, or only on ``nodes`` (the others are left to
        another proxy, or to none)."""
        self.daemons = Daemons(
            self.cluster,
            self.daemon_kubeconfig,
            self.workdir,
            self.daemon_flags,
            self.fault,
            nodes,
        )
        return self.daemons

    def wait_first_sync(self, node: Node, timeout: float = 60.0) -> None:
        """The node's first sync ran to its end (its timestamp metric is set)."""

        def synced() -> bool:
            if self.daemons is not None and node.name in self.daemons.exited():
                raise AssertionError(
                    f"ipvsproxy on {node.name} exited with status "
                    f"{self.daemons.exited()[node.name]}:\n{self.daemons.logs()}"
                )
            return last_sync_time(node) > 0

        wait_for(synced, timeout, f"first sync on {node.name}")

    def start(
        self,
        pods: Sequence[LabPod] | None = None,
        node_labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> LabKube:
        """Every step: ``pods`` as ``start_controller`` takes them, each Node labelled with
        ``node_labels[name]`` before any pod is registered; then the first sync everywhere."""
        self.start_apiserver()
        for name, labels in (node_labels or {}).items():
            body = {"metadata": {"labels": dict(labels)}}
            self.controlplane.call("PATCH", f"/api/v1/nodes/{name}", body, content_type=MERGE_PATCH)
        self.start_controller(pods)
        self.start_daemons()
        for node in self.cluster.nodes:
            self.wait_first_sync(node)
        return self

    @property
    def api(self) -> Any:
        """An official ``kubernetes`` ApiClient for kube-apiserver, as the admin (imported on
        first use: ``import kubernetes`` costs seconds in the guest)."""
        if self._api is None:
            from kubernetes import config

            new_client: Any = config.new_client_from_config
            self._api = new_client(str(self.kubeconfig))
        return self._api

    def logs(self) -> str:
        return self.daemons.logs() if self.daemons is not None else ""

    def stop(self, cleanup: bool = True) -> None:
        """Stop the daemons (and, with ``cleanup``, remove what they programmed) and the
        control plane. Safe to call twice."""
        if self.daemons is not None:
            self.daemons.stop()
            if cleanup:
                self.daemons.cleanup()
            self.daemons = None
        if self._api is not None:
            with contextlib.suppress(Exception):
                self._api.close()
            self._api = None
        self.controlplane.stop()
