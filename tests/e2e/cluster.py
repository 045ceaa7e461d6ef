"""What the portable end-to-end tests need from a cluster, and helpers built only on that.

Two implementations: ``tests/e2e/lab.py`` (the kernel lab: namespaces, the real control plane,
Nodes and Pods registered as a kubelet would, ``ipvsproxy run`` per node) and
``tests/e2e/real.py`` (a real cluster reached through ``--e2e-kubeconfig``, ipvsproxy already
deployed on it). A test written against :class:`E2ECluster` runs unchanged on both; see
tests/e2e/README.md.

Backends are echo servers (``lab/net/echo.py``): every request gets one JSON line back naming the
pod that answered (``pod``), the protocol, the client address the pod saw (``client``) and the
address it was reached on (``server``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Answer = dict[str, Any]
Proto = Literal["tcp", "udp"]

SELECTOR_PREFIX = "e2e.ipvsproxy.io/"


@dataclass(frozen=True)
class NodeAddr:
    name: str
    ip: str  # the node's InternalIP: NodePorts and health-check node ports answer here


@dataclass(frozen=True)
class Backend:
    """An echo pod. ``name`` is what it answers as (its pod name)."""

    name: str
    node: str
    ip: str


@dataclass(frozen=True)
class Source:
    """Where a request starts: a pod on a node, a node itself (host network), or outside."""

    kind: Literal["pod", "node", "external"]
    node: str = ""

    @classmethod
    def pod(cls, node: str) -> Source:
        return cls("pod", node)

    @classmethod
    def on_node(cls, node: str) -> Source:
        return cls("node", node)

    @classmethod
    def external(cls) -> Source:
        return cls("external")

    def __str__(self) -> str:
        return {"pod": f"pod on {self.node}", "node": self.node, "external": "external"}[self.kind]


class E2ECluster(Protocol):
    """A cluster that runs ipvsproxy on every node and has echo backends to point Services at."""

    @property
    def api(self) -> Any:
        """An official ``kubernetes`` ApiClient."""
        ...

    @property
    def namespace(self) -> str:
        """Where the tests create their Services (and the echo pods live)."""
        ...

    @property
    def nodes(self) -> Sequence[NodeAddr]: ...

    @property
    def backends(self) -> Sequence[Backend]:
        """The echo pods, each serving TCP and UDP on ``echo_port``."""
        ...

    @property
    def echo_port(self) -> int: ...

    @property
    def timeout(self) -> float:
        """How long a change may take to show on every node (seconds)."""
        ...

    def set_backends(self, app: str, backends: Sequence[Backend]) -> None:
        """Make exactly ``backends`` match ``selector(app)`` (by their labels, so the cluster's
        EndpointSlice controller follows)."""
        ...

    def request(
        self, source: Source, host: str, port: int, proto: Proto = "tcp", timeout: float = 2.0
    ) -> Answer:
        """One echo request from ``source``; its parsed answer. OSError if none came."""
        ...

    def http_get(self, source: Source, url: str, timeout: float = 3.0) -> tuple[int, str]:
        """(status, body) of a GET from ``source``, HTTP error statuses included."""
        ...

    def external_address(self, node: NodeAddr) -> str:
        """The address a request from ``Source.external()`` to ``node`` leaves from: what a
        backend sees when the client address is preserved."""
        ...

    def virtual_servers(self, node: str) -> set[tuple[str, str, int]]:
        """The node's IPVS virtual servers as (protocol, address, port), from /proc/net/ip_vs."""
        ...


def selector(app: str) -> dict[str, str]:
    """The Service selector that ``E2ECluster.set_backends(app, ...)`` makes backends match."""
    return {SELECTOR_PREFIX + app: "backend"}


def parse_proc_ip_vs(text: str) -> set[tuple[str, str, int]]:
    """``/proc/net/ip_vs`` (addresses in hex) to (protocol, dotted address, port)."""
    out: set[tuple[str, str, int]] = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[0] not in ("TCP", "UDP", "SCTP") or ":" not in parts[1]:
            continue
        addr, port = parts[1].split(":")
        if len(addr) != 8:
            continue  # IPv6 or a firewall mark
        dotted = ".".join(str(int(addr[i : i + 2], 16)) for i in range(0, 8, 2))
        out.add((parts[0], dotted, int(port, 16)))
    return out


def eventually(check: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``check`` until truthy (OSError and AssertionError count as not yet)."""
    deadline = time.monotonic() + timeout
    last = ""
    while True:
        try:
            if check():
                return
        except (OSError, AssertionError) as exc:
            last = f" (last: {type(exc).__name__}: {exc})"
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what} did not hold within {timeout:g} s{last}")
        time.sleep(0.3)


def answered_by(
    cluster: E2ECluster,
    source: Source,
    host: str,
    port: int,
    n: int = 4,
    proto: Proto = "tcp",
) -> set[str]:
    """The set of pods that answered ``n`` requests (raises OSError if any went unanswered)."""
    return {cluster.request(source, host, port, proto)["pod"] for _ in range(n)}


def wait_answered_by(
    cluster: E2ECluster,
    source: Source,
    host: str,
    port: int,
    want: set[str],
    n: int = 4,
    proto: Proto = "tcp",
) -> None:
    """Wait until ``n`` requests from ``source`` are answered by exactly the pods ``want``."""
    eventually(
        lambda: answered_by(cluster, source, host, port, n, proto) == want,
        cluster.timeout,
        f"{host}:{port}/{proto} from {source} answered by {sorted(want)}",
    )


def sources(cluster: E2ECluster) -> list[Source]:
    """A pod on every node, every node, and outside."""
    return [
        *(Source.pod(n.name) for n in cluster.nodes),
        *(Source.on_node(n.name) for n in cluster.nodes),
        Source.external(),
    ]


def backends_on_distinct_nodes(cluster: E2ECluster, count: int) -> list[Backend]:
    """``count`` backends, spread over the nodes first."""
    by_node: dict[str, list[Backend]] = {}
    for b in cluster.backends:
        by_node.setdefault(b.node, []).append(b)
    picked: list[Backend] = []
    while len(picked) < count and any(by_node.values()):
        for node in list(by_node):
            if by_node[node] and len(picked) < count:
                picked.append(by_node[node].pop(0))
    if len(picked) < count:
        raise AssertionError(f"need {count} echo backends, the cluster has {len(picked)}")
    return picked


class Services:
    """Create Services in the cluster's namespace and delete them (and selections) at the end."""

    def __init__(self, cluster: E2ECluster) -> None:
        from kubernetes import client

        self.cluster = cluster
        self.core: Any = client.CoreV1Api(cluster.api)
        self.names: list[str] = []
        self.apps: list[str] = []

    def create(
        self,
        name: str,
        app: str,
        spec: Mapping[str, Any],
        backends: Sequence[Backend] = (),
    ) -> Any:
        """A Service selecting ``app``'s backends; returns it as read back (allocations)."""
        body = {"metadata": {"name": name}, "spec": {**spec, "selector": selector(app)}}
        self.core.create_namespaced_service(self.cluster.namespace, body)
        self.names.append(name)
        self.apps.append(app)
        if backends:
            self.cluster.set_backends(app, backends)
        return self.core.read_namespaced_service(name, self.cluster.namespace)

    def delete(self, name: str) -> None:
        self.core.delete_namespaced_service(name, self.cluster.namespace)
        self.names.remove(name)

    def close(self) -> None:
        for name in list(self.names):
            try:
                self.delete(name)
            except Exception:  # best effort: the test's own failure matters more
                self.names.remove(name)
        for app in self.apps:
            self.cluster.set_backends(app, [])


@contextmanager
def services(cluster: E2ECluster) -> Iterator[Services]:
    svc = Services(cluster)
    try:
        yield svc
    finally:
        svc.close()
