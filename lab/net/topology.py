"""A multi-node cluster built from network namespaces inside the lab guest.

    guest root namespace: bridge lab0 (the underlay, 192.168.56.1/24; the API server lives here)
      |-- node-1 (netns): eth0 192.168.56.11, bridge cni0 10.244.1.1/24, pods 10.244.1.10, .11 ...
      |-- node-2 (netns): eth0 192.168.56.12, bridge cni0 10.244.2.1/24, ...
      |-- external (netns): eth0 192.168.56.100, a client that is not a node

Nodes route each other's pod CIDRs through the underlay (host-gw, as flannel's host-gw backend
does), have ip_forward and bridge-nf-call-iptables on, and pods default-route through their
node's cni0. As on real nodes (Docker and many distributions set it), a node's filter FORWARD
policy is DROP: the lab's "CNI" admits the connections that pods open or that are addressed to
pods (``FORWARD_RULES``); everything else a node forwards, such as the replies to a client
outside the pod network whose connection a Service's virtual server took to a pod unmasqueraded,
passes only by kube-proxy's own KUBE-FORWARD rules. Each namespace gets its commands in one
``ip -batch`` process: forks are the expensive thing in this kernel.
"""

from __future__ import annotations

import ipaddress
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from lab.net import netns

UNDERLAY = ipaddress.IPv4Network("192.168.56.0/24")
UNDERLAY_BRIDGE = "lab0"
ROOT_IP = ipaddress.IPv4Address("192.168.56.1")
EXTERNAL_IP = ipaddress.IPv4Address("192.168.56.100")
POD_SUPERNET = ipaddress.IPv4Network("10.244.0.0/16")
MAX_NODES = 80
# The filter table of every node: policy DROP, and what a CNI admits (by the connection's
# original direction, so both directions of it: replies too).
FORWARD_RULES = "\n".join(
    [
        "*filter",
        ":FORWARD DROP [0:0]",
        '-A FORWARD -m comment --comment "lab CNI: connections to pods" '
        f"-m conntrack --ctorigdst {POD_SUPERNET} -j ACCEPT",
        '-A FORWARD -m comment --comment "lab CNI: connections from pods" '
        f"-m conntrack --ctorigsrc {POD_SUPERNET} -j ACCEPT",
        "COMMIT",
        "",
    ]
)
MAX_PODS = 200


class TopologyError(RuntimeError):
    """A command that builds or tears down the topology failed."""


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    netns: str
    ip: str
    host_veth: str  # the pod's port on its node's cni0


@dataclass(frozen=True)
class Node:
    name: str
    index: int
    netns: str
    ip: str
    pod_cidr: str
    gateway: str
    pods: tuple[Pod, ...]


@dataclass(frozen=True)
class Host:
    """A namespace on the underlay that is not a node."""

    name: str
    netns: str
    ip: str


@dataclass
class Cluster:
    nodes: tuple[Node, ...]
    external: Host
    apiserver_ip: str = str(ROOT_IP)
    _echo: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(p for n in self.nodes for p in n.pods)

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def pod(self, name: str) -> Pod:
        for p in self.pods:
            if p.name == name:
                return p
        raise KeyError(name)

    def exec(self, ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a command inside a namespace (``ip netns exec``)."""
        return run(["ip", "netns", "exec", ns, *argv], check=check)

    def start_echo(self, targets: Iterable[tuple[str, str]], port: int = 8080) -> None:
        """Serve the echo protocol on ``port`` in each (name, netns) target, one process."""
        specs = [f"{name}={ns}" for name, ns in targets]
        proc = subprocess.Popen(
            [sys.executable, "-m", "lab.net.echo", "--port", str(port), *specs],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line.strip() != b"ready":
            proc.kill()
            _, err = proc.communicate()
            raise TopologyError(f"echo server did not start: {err.decode(errors='replace')}")
        self._echo.append(proc)

    def start_pod_echo(self, port: int = 8080) -> None:
        self.start_echo(((p.name, p.netns) for p in self.pods), port)

    def destroy(self) -> None:
        self._delete_namespaces()
        _batch(None, [f"link delete {UNDERLAY_BRIDGE}"], check=False)

    def renew(self) -> None:
        """Every namespace deleted and made again (empty tables: nothing a previous user left,
        no IPVS trash list); the underlay bridge and its address stay, and with them any
        socket bound there, such as the API server's."""
        self._delete_namespaces()
        veths = [f"vn{n.index}" for n in self.nodes] + ["vext"]
        # A deleted namespace is torn down in the background (minutes with large IPVS tables
        # in this kernel): its veths' root ends go with it, and their names are taken until then.
        wait_until(lambda: not any(_link_exists(v) for v in veths), timeout=900, interval=1.0)
        _create(self, underlay=False)

    def _delete_namespaces(self) -> None:
        for proc in self._echo:
            proc.kill()
            proc.wait()
        self._echo.clear()
        names = [n.netns for n in self.nodes] + [p.netns for p in self.pods] + [self.external.netns]
        _batch(None, [f"netns delete {ns}" for ns in names], check=False)

    @classmethod
    def build(cls, nodes: int = 3, pods_per_node: int = 2) -> Cluster:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
        if not 0 <= pods_per_node <= MAX_PODS:
            raise ValueError(f"pods_per_node must be 0..{MAX_PODS}, got {pods_per_node}")
        cluster = cls(
            nodes=tuple(_plan_node(i, pods_per_node) for i in range(1, nodes + 1)),
            external=Host("external", "external", str(EXTERNAL_IP)),
        )
        try:
            _create(cluster)
        except BaseException:
            cluster.destroy()
            raise
        return cluster


def _plan_node(index: int, pods: int) -> Node:
    name = f"node-{index}"
    cidr = ipaddress.IPv4Network(f"10.244.{index}.0/24")
    hosts = list(cidr.hosts())
    plan = tuple(
        Pod(
            name=f"pod-{index}-{j}",
            node=name,
            netns=f"pod-{index}-{j}",
            ip=str(hosts[9 + j]),
            host_veth=f"vp{index}x{j}",
        )
        for j in range(1, pods + 1)
    )
    return Node(
        name=name,
        index=index,
        netns=name,
        ip=str(UNDERLAY.network_address + 10 + index),
        pod_cidr=str(cidr),
        gateway=str(hosts[0]),
        pods=plan,
    )


def _create(cluster: Cluster, underlay: bool = True) -> None:
    prefix = UNDERLAY.prefixlen
    root = []
    if underlay:
        root = [
            f"link add {UNDERLAY_BRIDGE} type bridge",
            f"address add {ROOT_IP}/{prefix} dev {UNDERLAY_BRIDGE}",
            f"link set {UNDERLAY_BRIDGE} up",
        ]
    hosts: list[tuple[str, str, str]] = [(n.netns, n.ip, f"vn{n.index}") for n in cluster.nodes]
    hosts.append((cluster.external.netns, cluster.external.ip, "vext"))
    for ns, _, veth in hosts:
        root += [
            f"netns add {ns}",
            f"link add {veth} type veth peer name eth0 netns {ns}",
            f"link set {veth} master {UNDERLAY_BRIDGE} up",
        ]
    for node in cluster.nodes:
        for pod in node.pods:
            root.append(f"netns add {pod.netns}")
    _batch(None, root)
    for ns, ip, _ in hosts:
        _batch(ns, ["link set lo up", f"address add {ip}/{prefix} dev eth0", "link set eth0 up"])
    for node in cluster.nodes:
        _create_node(cluster, node)


def _create_node(cluster: Cluster, node: Node) -> None:
    cmds = [
        "link add cni0 type bridge",
        f"address add {node.gateway}/24 dev cni0",
        "link set cni0 up",
    ]
    for other in cluster.nodes:
        if other is not node:
            cmds.append(f"route add {other.pod_cidr} via {other.ip} dev eth0")
    for pod in node.pods:
        cmds += [
            f"link add {pod.host_veth} type veth peer name eth0 netns {pod.netns}",
            f"link set {pod.host_veth} master cni0 up",
            # What the bridge CNI does with hairpinMode: true, so a pod can reach itself
            # through its own Service.
            f"link set {pod.host_veth} type bridge_slave hairpin on",
        ]
    _batch(node.netns, cmds)
    for key in ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables"):
        netns.write_sysctl(node.netns, key, "1")
    restore = ["ip", "netns", "exec", node.netns, "iptables-restore", "--noflush"]
    proc = subprocess.run(restore, input=FORWARD_RULES, capture_output=True, text=True)
    if proc.returncode != 0:
        raise TopologyError(f"FORWARD rules in {node.netns}: {proc.stderr.strip()}")
    for pod in node.pods:
        _batch(
            pod.netns,
            [
                "link set lo up",
                f"address add {pod.ip}/24 dev eth0",
                "link set eth0 up",
                f"route add default via {node.gateway}",
            ],
        )


def _link_exists(name: str) -> bool:
    return run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TopologyError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _batch(ns: str | None, commands: Sequence[str], check: bool = True) -> None:
    argv = ["ip", "-force", "-batch", "-"]
    if ns is not None:
        argv[1:1] = ["-n", ns]
    proc = subprocess.run(argv, input="\n".join(commands) + "\n", capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise TopologyError(
            f"ip batch in {ns or 'root'} failed ({proc.returncode}): {proc.stderr.strip()}"
        )


def wait_until(
    predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05
) -> None:
    """Poll ``predicate`` (a callable returning truthy) until it holds or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout} s")
        time.sleep(interval)
