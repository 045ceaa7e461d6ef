"""Upstream proxies as peers in the lab: kube-proxy in IPVS mode (the reference behaviour) and
kube-router with only its service proxy, each in a lab node namespace of its own (each owns the
IPVS table, ipsets and chains of its namespace).

kube-proxy is configured as kubeadm configures it: a KubeProxyConfiguration file with mode ipvs
and the cluster CIDR, acting as kubeadm's kube-system/kube-proxy ServiceAccount bound to the
``system:node-proxier`` ClusterRole. What the lab kernel needs on top (see
UPSTREAM-K8S-FACTS.md): conntrack ``maxPerCore: 0`` and TCP timeouts ``0s`` (the conntrack table
size is global and read-only in a network namespace, and a failure to set it is fatal) and
``detectLocalMode: ClusterCIDR``. It waits for its Node object and exits if the Node's addresses
change: register Nodes first and leave them alone while it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from lab.cluster import upstream
from lab.cluster.controlplane import ControlPlane

CLUSTER_CIDR = "10.244.0.0/16,fd00:10:244::/48"  # dual-stack: the pods of both families
SERVICE_CIDR = "10.96.0.0/12"
KUBE_PROXY_SA = ("kube-system", "kube-proxy")  # kubeadm's


def kube_proxy_config(
    node: str,
    kubeconfig: Path,
    *,
    healthz: str = "0.0.0.0:10256",
    metrics: str = "127.0.0.1:10249",
    sync_period: str = "10s",
    min_sync_period: str = "0s",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """kubeadm's KubeProxyConfiguration for IPVS mode, with what the lab kernel needs."""
    config: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "ipvs",
        "bindAddress": "0.0.0.0",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": node,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "healthzBindAddress": healthz,
        "metricsBindAddress": metrics,
        "detectLocalMode": "ClusterCIDR",
        "conntrack": {
            "maxPerCore": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "ipvs": {"syncPeriod": sync_period, "minSyncPeriod": min_sync_period},
    }
    config.update(extra or {})
    return config


class Peer:
    """One upstream proxy process in a node namespace; its log in ``workdir/<name>.log``."""

    def __init__(
        self,
        name: str,
        netns: str,
        argv: list[str],
        workdir: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.netns = netns
        self.log_path = workdir / f"{name}.log"
        self._log: IO[bytes] = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, *argv],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )

    def running(self) -> bool:
        return self.proc.poll() is None

    def logs(self, tail: int = 6000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-tail:]
        return ""

    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM (neither proxy cleans up on SIGTERM: the dataplane stays), then SIGKILL."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def kube_proxy(
    node: str, netns: str, kubeconfig: Path, workdir: Path, verbosity: int = 2, **config: Any
) -> Peer:
    """Start upstream kube-proxy (IPVS mode) for lab node ``node`` in namespace ``netns``
    (``verbosity``: its ``--v``; kubeadm's DaemonSet leaves it at 0)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"kube-proxy-{node}.yaml"
    path.write_text(json.dumps(kube_proxy_config(node, kubeconfig, **config), indent=2))
    argv = [str(upstream.binary("kube-proxy")), f"--config={path}", f"--v={verbosity}"]
    return Peer(f"kube-proxy-{node}", netns, argv, workdir)


def kube_proxy_cleanup(netns: str) -> subprocess.CompletedProcess[str]:
    """``kube-proxy --cleanup``: removes its IPVS, chains, ipsets and kube-ipvs0."""
    return subprocess.run(
        ["ip", "netns", "exec", netns, str(upstream.binary("kube-proxy")), "--cleanup", "--v=2"],
        capture_output=True,
        text=True,
    )


def kube_router(
    node: str,
    netns: str,
    kubeconfig: Path,
    workdir: Path,
    extra: Sequence[str] = (),
    verbosity: int = 2,
    hairpin: bool = True,
) -> Peer:
    """Start kube-router with only its service proxy (IPVS) for lab node ``node`` (``extra``:
    more of its flags; ``verbosity``: its ``-v``, 0 by default upstream: at 2 it logs a line
    per virtual server compared, hundreds of MB a sync at thousands of Services; ``hairpin``:
    ``--hairpin-mode``, not its default, which looks up each local endpoint's pod interface)."""
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        str(upstream.binary("kube-router")),
        f"--kubeconfig={kubeconfig}",
        "--run-service-proxy=true",
        "--run-router=false",
        "--run-firewall=false",
        "--run-loadbalancer=false",
        f"--hostname-override={node}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--health-port=0",
        "--metrics-port=0",
        f"--v={verbosity}",
        # as the lab bridge has hairpin on: a pod reaches itself via its Service
        *(["--hairpin-mode"] if hairpin else []),
        *extra,
    ]
    return Peer(f"kube-router-{node}", netns, argv, workdir, env={"NODE_NAME": node})


def grant_kube_proxy(controlplane: ControlPlane, kubeconfig: Path) -> Path:
    """kubeadm's identity for kube-proxy: ServiceAccount kube-system/kube-proxy bound to the
    bootstrap ClusterRole system:node-proxier; a kubeconfig acting as it."""
    ns, name = KUBE_PROXY_SA
    for path, body in (
        (
            f"/api/v1/namespaces/{ns}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "kubeadm:node-proxier"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:node-proxier",
                },
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
            },
        ),
    ):
        status, out = controlplane.request("POST", path, body)
        if status >= 300 and status != 409:
            raise RuntimeError(f"POST {path}: {status} {out}")
    return controlplane.service_account_kubeconfig(ns, name, kubeconfig)
