"""`ipvsproxy run` in every node namespace against the lab API server, as an operator runs it:
a kubeconfig, kube-proxy's flags, real traffic."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.apiserver import APIServer
from lab.topology import Cluster, Node

pytestmark = pytest.mark.kernel


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{what} did not hold within {timeout} s")


def bind(check: Callable[[str], bool], ns: str) -> Callable[[], bool]:
    """``check`` for one namespace, fixed now (a loop variable would move on)."""
    return lambda: check(ns)


class Daemons:
    def __init__(
        self, cluster: Cluster, kubeconfig: Path, workdir: Path, extra: tuple[str, ...] = ()
    ) -> None:
        self.cluster = cluster
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        for node in cluster.nodes:
            log = (workdir / f"{node.name}.log").open("wb")
            self.procs[node.name] = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    sys.executable,
                    "-m",
                    "ipvsproxy",
                    "run",
                    "--kubeconfig",
                    str(kubeconfig),
                    "--hostname-override",
                    node.name,
                    "--cluster-cidr",
                    "10.244.0.0/16",
                    "--state-file",
                    str(workdir / f"{node.name}.json"),
                    "--ipvs-sync-period",
                    "10s",
                    "--ipvs-min-sync-period",
                    "100ms",
                    "--healthz-bind-address",
                    "0.0.0.0:10256",
                    "--metrics-bind-address",
                    "127.0.0.1:10249",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.workdir = workdir

    def logs(self) -> str:
        return "\n".join(
            f"--- {n} ---\n" + (self.workdir / f"{n}.log").read_text()[-3000:] for n in self.procs
        )

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(timeout=20)


HEALTHZ = "http://127.0.0.1:10256/healthz"


def sync_count(node: Node) -> float:
    text = http_get(node, "http://127.0.0.1:10249/metrics")[1]
    for line in text.splitlines():
        if line.startswith("kubeproxy_sync_proxy_rules_duration_seconds_count"):
            return float(line.split()[-1])
    raise AssertionError("no sync duration histogram")


def http_get(node: Node, url: str) -> tuple[int, str]:
    return http_get_from(node.netns, url)


@pytest.fixture
def api(lab_cluster: Cluster, tmp_path: Path) -> Iterator[tuple[APIServer, Any, Path]]:
    from kubernetes import config

    new_client: Any = config.new_client_from_config
    srv = APIServer(host=lab_cluster.apiserver_ip, port=6443, bookmark_interval=1.0).start()
    kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield srv, new_client(str(kubeconfig)), kubeconfig
    finally:
        srv.stop()


def slice_body(name: str, pods: list[Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [p.ip], "nodeName": p.node, "conditions": {"ready": True}} for p in pods
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def test_services_through_the_api_reach_every_node(
    lab_cluster: Cluster, api: tuple[APIServer, Any, Path], tmp_path: Path
) -> None:
    from kubernetes import client

    _srv, api_client, kubeconfig = api
    core: Any = client.CoreV1Api(api_client)
    disc: Any = client.DiscoveryV1Api(api_client)
    daemons = Daemons(lab_cluster, kubeconfig, tmp_path)
    try:
        n1, n2 = lab_cluster.nodes[0], lab_cluster.nodes[1]
        # Before the first sync /healthz is 503; after it, 200.
        first: list[int] = []

        def serving() -> bool:
            first.append(http_get(n1, "http://127.0.0.1:10256/healthz")[0])
            return True

        wait_for(serving, 60, "healthz serving")
        assert first[0] == 503
        for node in (n1, n2):  # each node's first sync done
            wait_for(bind(lambda ns: http_get_from(ns, HEALTHZ)[0] == 200, node.netns), 60, "200")
        # A node the cluster autoscaler is removing fails /healthz (load balancers drain it)
        # while /livez stays 200.
        taint = {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}
        core.create_node({"metadata": {"name": "node-2"}, "spec": {"taints": [taint]}})
        wait_for(lambda: http_get(n2, HEALTHZ)[0] == 503, 30, "tainted node unhealthy")
        assert http_get(n2, "http://127.0.0.1:10256/livez")[0] == 200
        assert json.loads(http_get(n2, HEALTHZ)[1])["nodeEligible"] is False
        core.delete_node("node-2")
        core.create_namespaced_service(
            "default",
            {
                "metadata": {"name": "web"},
                "spec": {
                    "type": "NodePort",
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30500}],
                },
            },
        )
        vip = core.read_namespaced_service("web", "default").spec.cluster_ip
        disc.create_namespaced_endpoint_slice("default", slice_body("web", [lab_cluster.pods[0]]))

        def answers(ns: str, ip: str, port: int, n: int = 4) -> set[str]:
            return {netns.tcp_request(ns, ip, port, timeout=2)["pod"] for _ in range(n)}

        for node in lab_cluster.nodes:
            wait_for(
                bind(lambda ns: answers(ns, vip, 80) == {"pod-1-1"}, node.pods[0].netns),
                30,
                f"ClusterIP from {node.name}",
            )
        wait_for(lambda: answers("external", n2.ip, 30500) == {"pod-1-1"}, 30, "NodePort")
        syncs_before = sync_count(n1)
        # Scale up: every pod answers; then down again.
        disc.replace_namespaced_endpoint_slice(
            "web-1", "default", slice_body("web", list(lab_cluster.pods[:4]))
        )
        want = {p.name for p in lab_cluster.pods[:4]}
        wait_for(lambda: answers(n2.pods[1].netns, vip, 80, 12) == want, 30, "scale up")
        disc.replace_namespaced_endpoint_slice(
            "web-1", "default", slice_body("web", [lab_cluster.pods[3]])
        )
        wait_for(
            lambda: answers(n1.pods[1].netns, vip, 80) == {lab_cluster.pods[3].name},
            30,
            "scale down",
        )
        # Metrics moved with the syncs.
        status, text = http_get(n1, "http://127.0.0.1:10249/metrics")
        assert status == 200
        assert sync_count(n1) > syncs_before
        for name in (
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "kubeproxy_sync_proxy_rules_endpoint_changes_total",
            "kubeproxy_sync_proxy_rules_service_changes_total",
            'ipvsproxy_netlink_operations_total{kind="add_dest",outcome="ok"}',
        ):
            assert name in text, name
        # Delete: gone from every node.
        core.delete_namespaced_service("web", "default")
        for node in lab_cluster.nodes:
            wait_for(
                bind(
                    lambda ns: vip not in lab_cluster.exec(ns, "ipvsadm", "-Ln").stdout, node.netns
                ),
                30,
                f"delete on {node.name}",
            )
        status, body = http_get(n1, "http://127.0.0.1:10256/healthz")
        assert status == 200 and "lastUpdated" in json.loads(body)
    except BaseException:
        print(daemons.logs())
        raise
    finally:
        daemons.stop()
        for node in lab_cluster.nodes:
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    sys.executable,
                    "-m",
                    "ipvsproxy",
                    "cleanup",
                    "--state-file",
                    str(tmp_path / f"{node.name}.json"),
                ],
                capture_output=True,
            )


BUILTIN = {"INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"}


def _tables(save: str) -> str:
    """iptables-save without counters, and without tables that hold nothing: a table appears in
    the dump once anything has used it in this namespace and cannot be unloaded, but with only
    its built-in chains at policy ACCEPT and no rule it is the same as absent."""
    out: list[str] = []
    table: list[str] = []
    for line in save.splitlines():
        if line.startswith("#"):
            continue
        line = re.sub(r" \[\d+:\d+\]$", "", line)
        table.append(line)
        if line == "COMMIT":
            empty = all(
                ln.startswith("*")
                or ln == "COMMIT"
                or (
                    ln.startswith(":")
                    and ln[1:].split()[0] in BUILTIN
                    and ln.split()[1] == "ACCEPT"
                )
                for ln in table
            )
            if not empty:
                out += table
            table = []
    return "\n".join(out)


def node_dump(cluster: Cluster, node: Node) -> str:
    cmd = "ipvsadm -Sn; ipset list -n | sort; ip -o link | sed 's/^[0-9]*: //' | cut -d' ' -f1-2"
    return cluster.exec(node.netns, "sh", "-c", cmd).stdout + _tables(
        cluster.exec(node.netns, "iptables-save").stdout
    )


def test_outage_compaction_health_checks_and_cleanup(
    lab_cluster: Cluster, api: tuple[APIServer, Any, Path], tmp_path: Path
) -> None:
    import threading

    from kubernetes import client

    from lab.apiserver.resources import lookup

    srv, api_client, kubeconfig = api
    core: Any = client.CoreV1Api(api_client)
    disc: Any = client.DiscoveryV1Api(api_client)
    n1, n2 = lab_cluster.nodes[0], lab_cluster.nodes[1]
    before = {n.name: node_dump(lab_cluster, n) for n in lab_cluster.nodes}
    daemons = Daemons(lab_cluster, kubeconfig, tmp_path, ("--watch-timeout", "3s"))
    failures: list[str] = []
    stop = threading.Event()
    try:
        core.create_namespaced_service(
            "default",
            {
                "metadata": {"name": "lb"},
                "spec": {
                    "type": "LoadBalancer",
                    "externalTrafficPolicy": "Local",
                    "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                },
            },
        )
        svc = core.read_namespaced_service("lb", "default")
        vip, hc = svc.spec.cluster_ip, svc.spec.health_check_node_port
        disc.create_namespaced_endpoint_slice("default", slice_body("lb", [n1.pods[0]]))
        wait_for(
            lambda: netns.tcp_request(n2.pods[0].netns, vip, 80, timeout=2)["pod"] == "pod-1-1",
            60,
            "ClusterIP",
        )
        # eTP=Local health check node port: 200 where the endpoint is, 503 elsewhere.
        ext = lab_cluster.external
        wait_for(lambda: http_get_from(ext.netns, f"http://{n1.ip}:{hc}/")[0] == 200, 30, "hc 200")
        _code, body = http_get_from(ext.netns, f"http://{n1.ip}:{hc}/")
        assert json.loads(body)["localEndpoints"] == 1
        wait_for(lambda: http_get_from(ext.netns, f"http://{n2.ip}:{hc}/")[0] == 503, 30, "hc 503")
        assert (
            json.loads(http_get_from(ext.netns, f"http://{n2.ip}:{hc}/")[1])["localEndpoints"] == 0
        )

        def traffic() -> None:
            while not stop.is_set():
                try:
                    netns.tcp_request(n2.pods[0].netns, vip, 80, timeout=2)
                except OSError as exc:
                    failures.append(str(exc))
                stop.wait(0.2)

        t = threading.Thread(target=traffic, daemon=True)
        t.start()
        # The API server goes away for longer than a watch request lasts. Meanwhile a Service
        # appears in its store and history is compacted: the daemons' watches resume from a
        # resourceVersion that is gone (410) and must relist.
        srv.stop()
        late = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "late", "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        }
        srv.ops.create(lookup("", "v1", "services"), "default", late)  # type: ignore[arg-type]
        srv.compact()
        time.sleep(8)
        srv.start()
        late_ip = core.read_namespaced_service("late", "default").spec.cluster_ip
        disc.create_namespaced_endpoint_slice("default", slice_body("late", [n2.pods[1]]))
        wait_for(
            lambda: netns.tcp_request(n1.pods[1].netns, late_ip, 80, timeout=2)["pod"] == "pod-2-2",
            60,
            "a change after the restart",
        )
        stop.set()
        t.join(timeout=10)
        assert failures == []
        relists = "relisting" in daemons.logs()
        assert relists, "no informer saw 410 Gone"
    except BaseException:
        print(daemons.logs())
        raise
    finally:
        stop.set()
        daemons.stop()
    # SIGTERM left the dataplane in place: traffic keeps flowing while the pods restart.
    assert netns.tcp_request(n2.pods[0].netns, vip, 80)["pod"] == "pod-1-1"
    # Cleanup after the run leaves every node exactly as it was before.
    for node in lab_cluster.nodes:
        proc = lab_cluster.exec(
            node.netns,
            sys.executable,
            "-m",
            "ipvsproxy",
            "cleanup",
            "--state-file",
            str(tmp_path / f"{node.name}.json"),
        )
        assert proc.returncode == 0, proc.stderr
        assert node_dump(lab_cluster, node) == before[node.name]
    # And a second cleanup, with nothing left to remove, succeeds.
    assert (
        lab_cluster.exec(
            n1.netns,
            sys.executable,
            "-m",
            "ipvsproxy",
            "cleanup",
            "--state-file",
            str(tmp_path / "n1.json"),
        ).returncode
        == 0
    )


def http_get_from(ns: str, url: str) -> tuple[int, str]:
    with netns.entered(ns):
        try:
            with urllib.request.urlopen(url, timeout=3) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--proxy-mode", "iptables"], "ipvs"),
        (["--cluster-cidr", "10.244.0.0/33"], "--cluster-cidr"),
        (["--ipvs-scheduler", "fastest"], "--ipvs-scheduler"),
        (["--ipvs-min-sync-period", "1m", "--ipvs-sync-period", "10s"], "min"),
        (["--healthz-bind-address", "nowhere:99999"], "--healthz-bind-address"),
    ],
)
def test_an_invalid_configuration_touches_nothing(
    lab_cluster: Cluster, tmp_path: Path, flags: list[str], message: str
) -> None:
    node = lab_cluster.nodes[2]
    before = node_dump(lab_cluster, node)
    proc = lab_cluster.exec(
        node.netns,
        sys.executable,
        "-m",
        "ipvsproxy",
        "run",
        "--kubeconfig",
        "/nonexistent",
        "--state-file",
        str(tmp_path / "s.json"),
        *flags,
        check=False,
    )
    assert proc.returncode == 1
    assert "invalid configuration" in proc.stderr and message in proc.stderr
    assert node_dump(lab_cluster, node) == before
    assert not (tmp_path / "s.json").exists()
