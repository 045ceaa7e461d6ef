"""Command line of the kernel lab."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.net.topology import UNDERLAY_BRIDGE
from lab.uml import guest

POD_ECHO_PORT = 8080
NODE_ECHO_PORT = 9090


def _cmd_run(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("lab run: no command given (python -m lab run -- CMD ARGS...)", file=sys.stderr)
        return 2
    try:
        result = guest.boot(command, timeout=args.timeout, mem=args.mem)
    except guest.LabUnavailable as exc:
        print(f"lab run: {exc}", file=sys.stderr)
        return 3
    if result.rc is None:
        print(f"lab run: FAILED: {result.describe()}", file=sys.stderr)
        return 3
    return result.rc


def _cmd_cluster(args: argparse.Namespace) -> int:
    from lab.net import netns
    from lab.net.topology import Cluster, TopologyError

    if not Path("/proc/net/ip_vs").exists():
        print(
            "lab cluster: this kernel has no IPVS; run it in the lab guest:\n"
            "  python -m lab run -- python -m lab cluster ...",
            file=sys.stderr,
        )
        return 2
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        cluster = Cluster.build(nodes=args.nodes, pods_per_node=args.pods)
    except (TopologyError, ValueError) as exc:
        print(f"lab cluster: {exc}", file=sys.stderr)
        return 2
    try:
        cluster.start_pod_echo(port=POD_ECHO_PORT)
        cluster.start_echo(((n.name, n.netns) for n in cluster.nodes), port=NODE_ECHO_PORT)
        _print_topology(cluster)
        if command:
            return subprocess.run(command).returncode
        return _check_connectivity(cluster, netns.tcp_request)
    finally:
        cluster.destroy()


def _print_topology(cluster: Any) -> None:
    print(f"underlay {UNDERLAY_BRIDGE} {cluster.apiserver_ip}/24 (guest root namespace)")
    for node in cluster.nodes:
        print(f"{node.name:10} {node.ip:15} pods {node.pod_cidr} via cni0 {node.gateway}")
        for pod in node.pods:
            print(f"  {pod.name:10} {pod.ip:15} echo tcp+udp :{POD_ECHO_PORT}")
    print(f"{cluster.external.name:10} {cluster.external.ip:15} (not a node)")


def _check_connectivity(cluster: Any, request: Any) -> int:
    failures = 0
    for client in cluster.pods:
        for server in cluster.pods:
            try:
                got = request(client.netns, server.ip, POD_ECHO_PORT, timeout=2.0)["pod"]
            except OSError as exc:
                got = f"error: {exc}"
            ok = got == server.name
            failures += not ok
            print(
                f"{client.name} -> {server.ip}:{POD_ECHO_PORT} answered by {got}"
                f"{'' if ok else '  <-- WRONG'}"
            )
    print("connectivity ok" if not failures else f"connectivity: {failures} failures")
    return 0 if not failures else 1


def _cmd_apiserver(args: argparse.Namespace) -> int:
    """The real control plane (etcd, kube-apiserver, kube-controller-manager) until SIGTERM."""
    import signal
    import tempfile

    from lab.cluster.controlplane import ControlPlane, ControlPlaneError, free_port
    from lab.cluster.upstream import NotBuilt

    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"lab apiserver: --listen wants HOST:PORT, not {args.listen!r}", file=sys.stderr)
        return 2
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lab-controlplane-"))
    # etcd at free ports: never at its defaults, where another checkout's may be running
    cp = ControlPlane(workdir, host=host, port=int(port), etcd_ports=(free_port(), free_port()))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        cp.start(timeout=args.timeout)
        shutil.copyfile(cp.kubeconfig, args.kubeconfig)
        took = ", ".join(f"{k} {v:.1f} s" for k, v in cp.start_seconds.items())
        print(f"lab apiserver: {cp.url} ready ({took}); kubeconfig {args.kubeconfig}", flush=True)
        print(f"lab apiserver: etcd {cp.etcd_client}; logs and keys in {workdir}", flush=True)
        while not stop.wait(1.0):
            for name in ("etcd", "kube-apiserver", "kube-controller-manager"):
                if not cp.running(name):
                    print(f"lab apiserver: {name} exited:\n{cp.log_tail(name)}", file=sys.stderr)
                    return 1
        return 0
    except (ControlPlaneError, NotBuilt) as exc:
        print(f"lab apiserver: {exc}", file=sys.stderr)
        return 1
    finally:
        cp.stop()


def _cmd_peer(args: argparse.Namespace) -> int:
    """An upstream proxy in a lab node namespace, until SIGTERM/SIGINT."""
    import signal
    import tempfile

    from lab.cluster import peers
    from lab.cluster.upstream import NotBuilt

    if not Path("/proc/net/ip_vs").exists():
        print("lab peer: this kernel has no IPVS; run it in the lab guest", file=sys.stderr)
        return 2
    netns_name = args.netns or args.node
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"lab-{args.proxy}-"))
    start = peers.kube_proxy if args.proxy == "kube-proxy" else peers.kube_router
    try:
        peer = start(args.node, netns_name, Path(args.kubeconfig), workdir)
    except NotBuilt as exc:
        print(f"lab peer: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"lab peer: {args.proxy} on {args.node} (netns {netns_name}), log {peer.log_path}")
    while not stop.wait(1.0):
        if not peer.running():
            print(f"lab peer: {args.proxy} exited:\n{peer.logs()}", file=sys.stderr)
            return 1
    peer.stop()
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from lab import demo

    return demo.main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = parser.add_subparsers(dest="what", metavar="COMMAND", required=True)
    run = sub.add_parser(
        "run",
        help="boot the lab kernel, run a command inside it, exit with its status",
        description="Boot the UML kernel with this filesystem as root, load ipvsproxy's "
        "modules, run CMD in the repository with the venv's environment and exit with its "
        "status. A guest that panics, dies or times out exits with status 3.",
    )
    run.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    run.add_argument("--mem", default="3G", help="guest memory (default 3G)")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    run.set_defaults(func=_cmd_run)
    cluster = sub.add_parser(
        "cluster",
        help="(inside the guest) build the node/pod topology, run CMD in it, tear it down",
        description="Build N node namespaces on an underlay bridge with M pods each, echo "
        f"servers on port {POD_ECHO_PORT} in every pod and {NODE_ECHO_PORT} in every node, "
        "then run CMD (or check pod-to-pod connectivity) and tear everything down.",
    )
    cluster.add_argument("--nodes", type=int, default=3)
    cluster.add_argument("--pods", type=int, default=2, help="pods per node")
    cluster.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    cluster.set_defaults(func=_cmd_cluster)
    demo = sub.add_parser(
        "demo",
        help="boot a 3-node lab cluster running ipvsproxy, send traffic, show who answered",
        description="Boot the lab kernel; build 3 nodes, start the real control plane (etcd, "
        "kube-apiserver, kube-controller-manager), register Nodes and Pods, and start "
        "ipvsproxy run on every node; apply lab/demo/app.yaml; "
        "send traffic from pods, nodes and outside; print who answered and the client "
        "address the pod saw, then ipvsproxy status. Exits 1 if any expectation failed.",
    )
    from lab.demo import add_arguments as demo_arguments

    demo_arguments(demo)
    demo.set_defaults(func=_cmd_demo)
    api = sub.add_parser(
        "apiserver",
        help="run the real control plane: etcd, kube-apiserver, kube-controller-manager",
        description="Start etcd, kube-apiserver (RBAC on, Service range 10.96.0.0/12, "
        "NodePorts 30000-32767) and kube-controller-manager (EndpointSlice and "
        "EndpointSlice-mirroring controllers), write an admin kubeconfig once /readyz "
        "answers, and run until SIGTERM/SIGINT. Built by `make setup` (lab/upstream).",
    )
    api.add_argument("--listen", default="127.0.0.1:6443", help="HOST:PORT (default %(default)s)")
    api.add_argument("--kubeconfig", required=True, help="where to write the admin kubeconfig")
    api.add_argument("--workdir", help="certificates, keys and logs (default: a new temp dir)")
    api.add_argument("--timeout", type=float, default=300.0, help="start timeout, seconds")
    api.set_defaults(func=_cmd_apiserver)
    peer = sub.add_parser(
        "peer",
        help="(inside the guest) run upstream kube-proxy (IPVS) or kube-router in a node",
        description="Run upstream kube-proxy in IPVS mode, configured as kubeadm does (a "
        "KubeProxyConfiguration file), or kube-router with only its service proxy, in a lab "
        "node namespace until SIGTERM/SIGINT. The Node object must exist.",
    )
    peer.add_argument("proxy", choices=("kube-proxy", "kube-router"))
    peer.add_argument("--node", required=True, help="the Node's name (node-1, ...)")
    peer.add_argument("--kubeconfig", required=True)
    peer.add_argument("--netns", help="namespace to run in (default: the node's name)")
    peer.add_argument("--workdir", help="config and log (default: a new temp dir)")
    peer.set_defaults(func=_cmd_peer)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    rc: int = args.func(args)
    return rc
