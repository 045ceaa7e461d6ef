"""The real Kubernetes control plane for the lab: etcd, kube-apiserver and
kube-controller-manager (its EndpointSlice and EndpointSlice-mirroring controllers), built from
their Go modules by ``lab.cluster.upstream``.

kube-apiserver listens on ``host:port`` (an IPv4 or IPv6 address: the kubeconfigs name it
``https://[addr]:port``, its self-signed certificate carries it) with RBAC on (``Node,RBAC``), a
dual-stack Service range (kubeadm's 10.96.0.0/12, primary, and kind's fd00:10:96::/112: a Service
is IPv4 unless its ``ipFamilyPolicy``/``ipFamilies`` ask for IPv6; ``service_cidrs=SERVICE_CIDR6``
makes an IPv6-only cluster, whose Services are IPv6 unless they ask otherwise), the NodePort range
(30000-32767), its own self-signed serving certificate (the kubeconfig trusts exactly that), and a
static token for the admin (group system:masters).
:meth:`ControlPlane.service_account_kubeconfig` issues a token for a ServiceAccount through the
TokenRequest API, so a client can act as that account and nothing more.

etcd keeps its data in memory (``/dev/shm``) without fsync: a lab cluster lives for one test
session. Tests stop and start kube-apiserver (:meth:`stop_apiserver`, :meth:`start_apiserver`)
and compact etcd (:meth:`compact`) to produce outages and 410s with the real server.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from lab.cluster import upstream

SERVICE_CIDR = "10.96.0.0/12"  # the primary (IPv4) Service range
SERVICE_CIDR6 = "fd00:10:96::/112"  # the secondary (IPv6) one
SERVICE_CIDRS = f"{SERVICE_CIDR},{SERVICE_CIDR6}"
NODE_PORT_RANGE = "30000-32767"
ETCD_PORTS = (2379, 2380)  # etcd's own defaults: client, peer
ADMIN_USER = "lab-admin"


class ControlPlaneError(RuntimeError):
    """A component did not start, or exited; the message carries the end of its log."""


class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager as child processes.

    ``workdir`` holds certificates, keys, kubeconfigs and the components' logs. etcd listens
    on 127.0.0.1 at ``etcd_ports`` (client, peer): on a shared host, tests pass free ports so
    that two control planes never meet on etcd's defaults.
    """

    def __init__(
        self,
        workdir: Path,
        host: str = "127.0.0.1",
        port: int = 6443,
        etcd_ports: tuple[int, int] = ETCD_PORTS,
        service_cidrs: str = SERVICE_CIDRS,
    ) -> None:
        self.workdir = workdir
        self.host = host
        self.port = port
        self.service_cidrs = service_cidrs  # the primary range first
        self.etcd_client = f"http://127.0.0.1:{etcd_ports[0]}"
        self.etcd_peer = f"http://127.0.0.1:{etcd_ports[1]}"
        self.kubeconfig = workdir / "kubeconfig"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._token = secrets.token_hex(16)
        self._etcd_dir: Path | None = None
        self.start_seconds: dict[str, float] = {}

    # Paths ------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"

    @property
    def ca_file(self) -> Path:
        """kube-apiserver's self-signed serving certificate and its CA, as it writes them."""
        return self.workdir / "certs" / "apiserver.crt"

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def log_tail(self, name: str, chars: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log(name).read_text(errors="replace")[-chars:]
        return ""

    # Lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 300.0, controller_manager: bool = True) -> ControlPlane:
        """Start all three (or etcd and kube-apiserver alone: a client then writes the
        EndpointSlices) and write the admin kubeconfig once /readyz answers 200."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_secrets()
        self._timed("etcd", self.start_etcd, timeout)
        self._timed("kube-apiserver", lambda t: self.start_apiserver(t), timeout)
        self.write_kubeconfig(self.kubeconfig, self._token)
        if controller_manager:
            self._timed("kube-controller-manager", self.start_controller_manager, timeout)
        return self

    def _timed(self, name: str, start: Any, timeout: float) -> None:
        began = time.monotonic()
        start(timeout)
        self.start_seconds[name] = time.monotonic() - began

    def _write_secrets(self) -> None:
        key = self.workdir / "sa.key"
        if not key.exists():
            subprocess.run(
                ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
            )
        # token,user,uid,"group1,group2"
        (self.workdir / "tokens.csv").write_text(
            f'{self._token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        )

    def start_etcd(self, timeout: float = 120.0) -> None:
        if self._etcd_dir is None:
            shm = Path("/dev/shm")
            self._etcd_dir = Path(
                tempfile.mkdtemp(prefix="lab-etcd-", dir=shm if shm.is_dir() else None)
            )
        self._spawn(
            "etcd",
            [
                str(upstream.binary("etcd")),
                "--name=lab",
                f"--data-dir={self._etcd_dir}",
                f"--listen-client-urls={self.etcd_client}",
                f"--advertise-client-urls={self.etcd_client}",
                f"--listen-peer-urls={self.etcd_peer}",
                f"--initial-advertise-peer-urls={self.etcd_peer}",
                f"--initial-cluster=lab={self.etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._wait("etcd", lambda: _http_ok(f"{self.etcd_client}/health"), timeout)

    def start_apiserver(self, timeout: float = 240.0) -> None:
        w = self.workdir
        self._spawn(
            "kube-apiserver",
            [
                str(upstream.binary("kube-apiserver")),
                f"--etcd-servers={self.etcd_client}",
                f"--bind-address={self.host}",
                f"--advertise-address={self.host}",
                f"--secure-port={self.port}",
                f"--cert-dir={w / 'certs'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={w / 'sa.key'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                f"--token-auth-file={w / 'tokens.csv'}",
                "--authorization-mode=Node,RBAC",
                # no token controller runs: ServiceAccount tokens come from TokenRequest
                "--disable-admission-plugins=ServiceAccount",
                f"--service-cluster-ip-range={self.service_cidrs}",
                f"--service-node-port-range={NODE_PORT_RANGE}",
                # no kubernetes.default endpoints pointing at a loopback address
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait("kube-apiserver", self._ready, timeout)

    def start_controller_manager(self, timeout: float = 120.0) -> None:
        self._spawn(
            "kube-controller-manager",
            [
                str(upstream.binary("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                "--controllers=endpointslice-controller,endpointslice-mirroring-controller",
                "--leader-elect=false",
                # only node IPAM reads it; given so the two never disagree about the cluster
                f"--service-cluster-ip-range={self.service_cidrs}",
                "--secure-port=0",
                "--v=1",
            ],
        )
        # It has no health endpoint with --secure-port=0: running for a moment is the check.
        self._wait("kube-controller-manager", lambda: True, timeout)

    def stop_apiserver(self, grace: float = 20.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds. kube-apiserver's graceful shutdown
        outlasts 20 s while a client keeps a connection open (measured on the host with the
        official Python client): tests that only need it gone pass a short grace."""
        self._stop("kube-apiserver", grace)

    def stop(self, grace: float = 3.0) -> None:
        """Stop everything and forget etcd's data (a lab cluster is thrown away: no reason
        to wait out kube-apiserver's graceful shutdown). Safe to call twice."""
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop(name, grace)
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        if self._etcd_dir is not None:
            shutil.rmtree(self._etcd_dir, ignore_errors=True)
            self._etcd_dir = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # Processes --------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        if name in self.procs and self.procs[name].poll() is None:
            raise ControlPlaneError(f"{name} is already running")
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = self.log(name).open("ab")
        self.procs[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def _wait(self, name: str, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        proc = self.procs[name]
        while True:
            if (rc := proc.poll()) is not None:
                raise ControlPlaneError(f"{name} exited with {rc}:\n{self.log_tail(name)}")
            with contextlib.suppress(OSError, ValueError):
                if ready():
                    return
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not ready within {timeout:g} s:\n{self.log_tail(name)}"
                )
            time.sleep(0.25)

    def _stop(self, name: str, grace: float = 20.0) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def running(self, name: str) -> bool:
        proc = self.procs.get(name)
        return proc is not None and proc.poll() is None

    # The API ----------------------------------------------------------------------------

    def _ready(self) -> bool:
        if not self.ca_file.exists():
            return False
        status, _ = self.request("GET", "/readyz")
        return status == 200

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> tuple[int, Any]:
        """One API request as the admin (or ``token``): (status, decoded JSON or text)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self.ssl_context(), timeout=timeout) as resp:
                return int(resp.status), _decode(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read())

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        """As :meth:`request`, raising ControlPlaneError on any status but 2xx."""
        status, out = self.request(method, path, body, **kw)
        if not 200 <= status < 300:
            raise ControlPlaneError(f"{method} {path}: {status} {out}")
        return out

    def write_kubeconfig(self, path: Path, token: str, user: str = ADMIN_USER) -> Path:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "lab",
                            "cluster": {"server": self.url, "certificate-authority-data": ca},
                        }
                    ],
                    "users": [{"name": user, "user": {"token": token}}],
                    "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
                    "current-context": "lab",
                },
                indent=2,
            )
        )
        return path

    def service_account_kubeconfig(
        self, namespace: str, name: str, path: Path, seconds: int = 86400
    ) -> Path:
        """A kubeconfig acting as ServiceAccount ``namespace/name`` (which must exist), with a
        token from the TokenRequest API."""
        out = self.call(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": seconds},
            },
        )
        return self.write_kubeconfig(path, out["status"]["token"], user=f"{namespace}-{name}")

    def create_from_manifest(self, path: Path) -> list[str]:
        """Create every object of a YAML manifest (``deploy/rbac.yaml`` and the like) as the
        admin, as ``kubectl create -f`` would; the objects' "kind/name"."""
        import yaml  # type: ignore[import-untyped]

        made = []
        for obj in yaml.safe_load_all(path.read_text()):
            if not obj:
                continue
            kind, md = obj["kind"], obj["metadata"]
            group, plural, namespaced = _KINDS[kind]
            base = f"/apis/{group}" if "/" in group else f"/api/{group}"
            ns = f"/namespaces/{md.get('namespace', 'default')}" if namespaced else ""
            status, out = self.request("POST", f"{base}{ns}/{plural}", obj)
            if status >= 300 and status != 409:
                raise ControlPlaneError(f"creating {kind} {md['name']} from {path}: {status} {out}")
            made.append(f"{kind}/{md['name']}")
        return made

    # etcd -------------------------------------------------------------------------------

    def etcd_revision(self) -> int:
        out = self._etcd_post("/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
        return int(out["header"]["revision"])

    def compact(self) -> int:
        """Compact etcd to its current revision (what a long-running cluster does every 5
        minutes): watches and lists at older resource versions get 410 Gone. The revision."""
        rev = self.etcd_revision()
        self._etcd_post("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    def etcd_put(self, key: str, value: str) -> int:
        """Write a key outside kube-apiserver's /registry prefix: etcd's revision moves on
        while no API object changes (as any other write to a shared etcd would). The revision."""
        out = self._etcd_post(
            "/v3/kv/put",
            {
                "key": base64.b64encode(key.encode()).decode(),
                "value": base64.b64encode(value.encode()).decode(),
            },
        )
        return int(out["header"]["revision"])

    def _etcd_post(self, path: str, body: dict[str, Any]) -> Any:
        """etcd's gRPC gateway (JSON over HTTP on the client port): no etcdctl needed."""
        req = urllib.request.Request(
            self.etcd_client + path, data=json.dumps(body).encode(), method="POST"
        )
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the kernel's choice; free until someone binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


# kind: (group/version, plural, namespaced), for the kinds the lab creates from manifests
_KINDS = {
    "Namespace": ("v1", "namespaces", False),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "ConfigMap": ("v1", "configmaps", True),
    "ClusterRole": ("rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("rbac.authorization.k8s.io/v1", "rolebindings", True),
}


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return int(resp.status) == 200
