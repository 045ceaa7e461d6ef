"""The kernel lab as an :class:`~tests.e2e.cluster.E2ECluster` (inside the lab guest).

Everything is ``lab.cluster.kube.LabKube``: the real control plane (etcd, kube-apiserver,
kube-controller-manager's EndpointSlice controller) with every lab node a Node and every lab pod
a Pod, and ``ipvsproxy run`` in every node namespace. A "pod on node-N"
is that node's last lab pod, "node-N" its node namespace, "external" the underlay namespace that
is not a node.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lab.cluster import kube
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import Cluster
from tests.e2e.cluster import Answer, Backend, NodeAddr, Proto, Source, parse_proc_ip_vs, selector

NAMESPACE = "ipvsproxy-e2e"


class LabE2E:
    namespace = NAMESPACE
    echo_port = kube.POD_ECHO_PORT
    timeout = 30.0

    def __init__(self, topo: Cluster, lab: kube.LabKube) -> None:
        self.topo = topo
        self.lab = lab
        self.nodes = tuple(NodeAddr(n.name, n.ip) for n in topo.nodes)
        self.backends = tuple(Backend(p.name, p.node, p.ip) for p in topo.pods)

    @classmethod
    @contextmanager
    def started(cls, topo: Cluster, workdir: Path) -> Iterator[LabE2E]:
        lab = kube.LabKube(topo, workdir)
        try:
            lab.start_apiserver()
            from kubernetes import client

            core: Any = client.CoreV1Api(lab.api)
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            lab.start_controller(
                [
                    LabPod(p.name, NAMESPACE, p.node, p.ip, ports={"echo": kube.POD_ECHO_PORT})
                    for p in topo.pods
                ]
            )
            lab.start_daemons()
            for node in topo.nodes:
                lab.wait_first_sync(node)
            yield cls(topo, lab)
        finally:
            lab.stop(cleanup=True)

    @property
    def api(self) -> Any:
        return self.lab.api

    def logs(self) -> str:
        return self.lab.logs()

    def set_backends(self, app: str, backends: Sequence[Backend]) -> None:
        ((key, value),) = selector(app).items()
        chosen = {b.name for b in backends}
        self.lab.kubelets.update_labels(
            {
                (NAMESPACE, p.name): {key: value if p.name in chosen else None}
                for p in self.topo.pods
            }
        )

    def _netns(self, source: Source) -> str:
        if source.kind == "external":
            return self.topo.external.netns
        node = self.topo.node(source.node)
        return node.pods[-1].netns if source.kind == "pod" else node.netns

    def request(
        self, source: Source, host: str, port: int, proto: Proto = "tcp", timeout: float = 2.0
    ) -> Answer:
        fn = netns.tcp_request if proto == "tcp" else netns.udp_request
        return fn(self._netns(source), host, port, timeout=timeout)

    def http_get(self, source: Source, url: str, timeout: float = 3.0) -> tuple[int, str]:
        return kube.http_get_from(self._netns(source), url, timeout)

    def external_address(self, node: NodeAddr) -> str:
        return self.topo.external.ip

    def virtual_servers(self, node: str) -> set[tuple[str, str, int]]:
        ns = self.topo.node(node).netns
        return parse_proc_ip_vs(self.topo.exec(ns, "cat", "/proc/net/ip_vs").stdout)
