"""A multi-node cluster built from network namespaces inside the lab guest, dual-stack (or
IPv6-only: ``Cluster.build(ipv4=False)``).

    guest root namespace: bridge lab0 (the underlay, 192.168.56.1/24 and
                          fc00:f853:ccd:e793::1/64; the API server lives here)
      |-- node-1 (netns): eth0 192.168.56.11 + fc00:f853:ccd:e793::11,
      |                   bridge cni0 10.244.1.1/24 + fd00:10:244:1::1/64,
      |                   pods 10.244.1.11 + fd00:10:244:1::11, 10.244.1.12 + fd00:10:244:1::12 ...
      |-- node-2 (netns): eth0 192.168.56.12 + fc00:f853:ccd:e793::12, cni0 10.244.2.1/24 + ...
      |-- external (netns): eth0 192.168.56.100 + fc00:f853:ccd:e793::100, not a node

An IPv6 address reads as its IPv4 counterpart: the IPv4 address's last number written as the
last IPv6 group (node 1's .11 is ``::11``, hexadecimal 0x11; distinct numbers stay distinct)
and node N's pod CIDR is fd00:10:244:N::/64. Every IPv6 address is added with ``nodad``:
nothing waits for duplicate-address detection.

Nodes route each other's pod CIDRs (both families) through the underlay (host-gw, as flannel's
host-gw backend does), have IPv4 and IPv6 forwarding and bridge-nf-call-iptables/-ip6tables
on, and pods default-route (both families) through their node's cni0. The external namespace
has no route to the pod or Service ranges in either family: a test that wants one adds it. As
on real nodes (Docker and many distributions set it), a node's filter FORWARD policy is DROP in
both families: the lab's "CNI" admits the connections that pods open or that are addressed to
pods (``FORWARD_RULES``, ``FORWARD_RULES6``); everything else a node forwards, such as the
replies to a client outside the pod network whose connection a Service's virtual server took to
a pod unmasqueraded, passes only by kube-proxy's own KUBE-FORWARD rules. Each namespace gets its
commands in one ``ip -batch`` process: forks are the expensive thing in this kernel.

An IPv6-only cluster is the same plan without its IPv4 half: no IPv4 address on any interface of
the nodes, the pods, the external client or lab0 (``lo`` keeps 127.0.0.1, as on a real IPv6-only
node), the IPv4 fields empty (``Node.ip``, ``pod_cidr``, ``gateway``, ``Pod.ip``, ``Host.ip``), and
the API server on the root namespace's IPv6 address.
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
# IPv6 (kind's dual-stack defaults): the underlay, node N's pod CIDR fd00:10:244:N::/64 (N
# written as IPv6 text), and the Service range the API server allocates IPv6 cluster IPs from.
UNDERLAY6 = ipaddress.IPv6Network("fc00:f853:ccd:e793::/64")
ROOT_IP6 = ipaddress.IPv6Address("fc00:f853:ccd:e793::1")
EXTERNAL_IP6 = ipaddress.IPv6Address("fc00:f853:ccd:e793::100")
POD_SUPERNET6 = ipaddress.IPv6Network("fd00:10:244::/48")
SERVICE_CIDR6 = ipaddress.IPv6Network("fd00:10:96::/112")
MAX_NODES = 80


def _forward_rules(supernet: str, extra: Sequence[str] = ()) -> str:
    """The filter table of every node: policy DROP, and what a CNI admits (by the connection's
    original direction, so both directions of it: replies too)."""
    return "\n".join(
        [
            "*filter",
            ":FORWARD DROP [0:0]",
            *extra,
            '-A FORWARD -m comment --comment "lab CNI: connections to pods" '
            f"-m conntrack --ctorigdst {supernet} -j ACCEPT",
            '-A FORWARD -m comment --comment "lab CNI: connections from pods" '
            f"-m conntrack --ctorigsrc {supernet} -j ACCEPT",
            "COMMIT",
            "",
        ]
    )


FORWARD_RULES = _forward_rules(str(POD_SUPERNET))
# IPv6 neighbour discovery is ICMPv6 (ARP, its IPv4 counterpart, never meets iptables) and is not
# tracked: bridged between two pods of a node with bridge-nf-call-ip6tables on, it must be let
# through by type or pods on one node cannot find each other.
ND_TYPES = (
    "router-solicitation",
    "router-advertisement",
    "neighbour-solicitation",
    "neighbour-advertisement",
)
FORWARD_RULES6 = _forward_rules(
    str(POD_SUPERNET6),
    [
        '-A FORWARD -m comment --comment "lab CNI: neighbour discovery" '
        f"-p ipv6-icmp -m icmp6 --icmpv6-type {t} -j ACCEPT"
        for t in ND_TYPES
    ],
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
    ip6: str = ""  # its IPv6 address (fd00:10:244:N::J), "" when planned without one


@dataclass(frozen=True)
class Node:
    name: str
    index: int
    netns: str
    ip: str
    pod_cidr: str
    gateway: str
    pods: tuple[Pod, ...]
    ip6: str = ""  # on the underlay (fc00:f853:ccd:e793::N)
    pod_cidr6: str = ""  # fd00:10:244:N::/64
    gateway6: str = ""  # cni0's IPv6 address, the pods' IPv6 default gateway


@dataclass(frozen=True)
class Host:
    """A namespace on the underlay that is not a node."""

    name: str
    netns: str
    ip: str
    ip6: str = ""


@dataclass
class Cluster:
    nodes: tuple[Node, ...]
    external: Host
    apiserver_ip: str = str(ROOT_IP)
    root_ip6: str = str(ROOT_IP6)  # the guest root namespace's address on lab0
    ipv4: bool = True  # False: an IPv6-only cluster (no IPv4 address but 127.0.0.1 on lo)
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
        _wait_for_root_veths(self)
        _create(self, underlay=False)

    def _delete_namespaces(self) -> None:
        for proc in self._echo:
            proc.kill()
            proc.wait()
        self._echo.clear()
        names = [n.netns for n in self.nodes] + [p.netns for p in self.pods] + [self.external.netns]
        _batch(None, [f"netns delete {ns}" for ns in names], check=False)

    @classmethod
    def build(cls, nodes: int = 3, pods_per_node: int = 2, ipv4: bool = True) -> Cluster:
        """Plan and create the cluster: dual-stack, or IPv6-only without ``ipv4``."""
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
        if not 0 <= pods_per_node <= MAX_PODS:
            raise ValueError(f"pods_per_node must be 0..{MAX_PODS}, got {pods_per_node}")
        cluster = cls(
            nodes=tuple(_plan_node(i, pods_per_node, ipv4) for i in range(1, nodes + 1)),
            external=Host("external", "external", _v4(ipv4, EXTERNAL_IP), str(EXTERNAL_IP6)),
            apiserver_ip=str(ROOT_IP if ipv4 else ROOT_IP6),
            ipv4=ipv4,
        )
        # A cluster destroyed just before (one of the other family) may still hold the names.
        _wait_for_root_veths(cluster)
        try:
            _create(cluster)
        except BaseException:
            cluster.destroy()
            raise
        return cluster


def _v6(network: ipaddress.IPv6Network, number: int) -> str:
    """The address of ``network`` whose last group reads as the IPv4 one's last number:
    ``::11`` for .11 (0x11: decimal digits are hexadecimal digits too, so distinct numbers stay
    distinct)."""
    return str(network.network_address + int(str(number), 16))


def _v4(ipv4: bool, value: object) -> str:
    """An IPv4 field of the plan: the value, or "" in an IPv6-only cluster."""
    return str(value) if ipv4 else ""


def _plan_node(index: int, pods: int, ipv4: bool = True) -> Node:
    name = f"node-{index}"
    cidr = ipaddress.IPv4Network(f"10.244.{index}.0/24")
    cidr6 = ipaddress.IPv6Network(f"fd00:10:244:{index}::/64")
    hosts = list(cidr.hosts())
    plan = tuple(
        Pod(
            name=f"pod-{index}-{j}",
            node=name,
            netns=f"pod-{index}-{j}",
            ip=_v4(ipv4, hosts[9 + j]),
            host_veth=f"vp{index}x{j}",
            ip6=_v6(cidr6, 10 + j),
        )
        for j in range(1, pods + 1)
    )
    return Node(
        name=name,
        index=index,
        netns=name,
        ip=_v4(ipv4, UNDERLAY.network_address + 10 + index),
        pod_cidr=_v4(ipv4, cidr),
        gateway=_v4(ipv4, hosts[0]),
        pods=plan,
        ip6=_v6(UNDERLAY6, 10 + index),
        pod_cidr6=str(cidr6),
        gateway6=_v6(cidr6, 1),
    )


def _create(cluster: Cluster, underlay: bool = True) -> None:
    prefix, prefix6 = UNDERLAY.prefixlen, UNDERLAY6.prefixlen
    root = []
    if underlay:
        root = [
            f"link add {UNDERLAY_BRIDGE} type bridge",
            *([f"address add {ROOT_IP}/{prefix} dev {UNDERLAY_BRIDGE}"] if cluster.ipv4 else []),
            f"address add {cluster.root_ip6}/{prefix6} dev {UNDERLAY_BRIDGE} nodad",
            f"link set {UNDERLAY_BRIDGE} up",
        ]
    hosts: list[tuple[str, str, str, str]] = [
        (n.netns, n.ip, n.ip6, f"vn{n.index}") for n in cluster.nodes
    ]
    ext = cluster.external
    hosts.append((ext.netns, ext.ip, ext.ip6, "vext"))
    for ns, _, _, veth in hosts:
        root += [
            f"netns add {ns}",
            f"link add {veth} type veth peer name eth0 netns {ns}",
            f"link set {veth} master {UNDERLAY_BRIDGE} up",
        ]
    for node in cluster.nodes:
        for pod in node.pods:
            root.append(f"netns add {pod.netns}")
    _batch(None, root)
    for ns, ip, ip6, _ in hosts:
        _batch(ns, ["link set lo up", *_address_commands("eth0", ip, ip6, prefix, prefix6),
                    "link set eth0 up"])  # fmt: skip
    for node in cluster.nodes:
        _create_node(cluster, node)


def _address_commands(
    dev: str, ip: str, ip6: str, prefix: int = 24, prefix6: int = 64
) -> list[str]:
    """``ip`` commands giving ``dev`` its address of each family it has ("" for none; IPv6
    without duplicate address detection, so it is usable at once)."""
    cmds = [f"address add {ip}/{prefix} dev {dev}"] if ip else []
    return cmds + ([f"address add {ip6}/{prefix6} dev {dev} nodad"] if ip6 else [])


def _create_node(cluster: Cluster, node: Node) -> None:
    cmds = ["link add cni0 type bridge", *_address_commands("cni0", node.gateway, node.gateway6)]
    cmds.append("link set cni0 up")
    for other in cluster.nodes:
        if other is not node:
            if other.pod_cidr and other.ip:
                cmds.append(f"route add {other.pod_cidr} via {other.ip} dev eth0")
            if other.pod_cidr6 and other.ip6:
                cmds.append(f"route add {other.pod_cidr6} via {other.ip6} dev eth0")
    for pod in node.pods:
        cmds += [
            f"link add {pod.host_veth} type veth peer name eth0 netns {pod.netns}",
            f"link set {pod.host_veth} master cni0 up",
            # What the bridge CNI does with hairpinMode: true, so a pod can reach itself
            # through its own Service.
            f"link set {pod.host_veth} type bridge_slave hairpin on",
        ]
    _batch(node.netns, cmds)
    for key in (
        "net.ipv4.ip_forward",
        "net.ipv6.conf.all.forwarding",
        "net.bridge.bridge-nf-call-iptables",
        "net.bridge.bridge-nf-call-ip6tables",
    ):
        netns.write_sysctl(node.netns, key, "1")
    for tool, rules in (("iptables-restore", FORWARD_RULES), ("ip6tables-restore", FORWARD_RULES6)):
        restore = ["ip", "netns", "exec", node.netns, tool, "--noflush"]
        proc = subprocess.run(restore, input=rules, capture_output=True, text=True)
        if proc.returncode != 0:
            raise TopologyError(f"FORWARD rules ({tool}) in {node.netns}: {proc.stderr.strip()}")
    for pod in node.pods:
        _batch(pod.netns, _pod_commands(node, pod))


def _pod_commands(node: Node, pod: Pod) -> list[str]:
    """A pod's eth0: an address and a default route through cni0 of each family it has."""
    cmds = ["link set lo up", *_address_commands("eth0", pod.ip, pod.ip6), "link set eth0 up"]
    if pod.ip and node.gateway:
        cmds.append(f"route add default via {node.gateway}")
    if pod.ip6 and node.gateway6:
        cmds.append(f"route add ::/0 via {node.gateway6}")
    return cmds


def _wait_for_root_veths(cluster: Cluster) -> None:
    """Until no root end of the cluster's node and external veths exists: a deleted namespace
    is torn down in the background (minutes with large IPVS tables in this kernel), its veths'
    root ends go with it, and their names are taken until then."""
    veths = {f"vn{n.index}" for n in cluster.nodes} | {"vext"}

    def gone() -> bool:
        links = run(["ip", "-o", "link", "show"]).stdout.splitlines()
        return not veths & {line.split(": ")[1].split("@")[0] for line in links}

    wait_until(gone, timeout=900, interval=1.0)


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
