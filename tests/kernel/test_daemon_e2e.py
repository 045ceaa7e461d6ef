"""`ipvsproxy run` in every node namespace against the real control plane, as an operator runs
it: a kubeconfig acting as deploy/'s ServiceAccount, kube-proxy's flags, real traffic
(``lab.cluster.kube.LabKube``).

What a user of any cluster sees (Services reachable from pods, nodes and outside, endpoints
followed, deletion, externalTrafficPolicy Local, session affinity) is in tests/e2e, which runs
on the lab and on real clusters. Here is what only the lab can do: start the daemons and watch
/healthz before the first sync, taint a Node object, stop kube-apiserver and compact etcd,
compare every node's kernel state before and after cleanup, start with bad flags.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from lab.cluster.kube import (
    APISERVER_PORT,
    SERVICE_ACCOUNT,
    Daemons,
    LabKube,
    healthz,
    http_get_from,
    metrics,
    sync_count,
    wait_for,
)
from lab.net import netns
from lab.net.topology import UNDERLAY_BRIDGE, Cluster, Node
from tests.unit.metric_shapes import golden, sample_value, shapes, upstream_names

pytestmark = pytest.mark.kernel


def bind(check: Callable[[str], bool], ns: str) -> Callable[[], bool]:
    """``check`` for one namespace, fixed now (a loop variable would move on)."""
    return lambda: check(ns)


@pytest.fixture
def kube(lab_cluster: Cluster, tmp_path: Path) -> Iterator[LabKube]:
    """API server and slice controller started; the test starts the daemons."""
    flags = ("--watch-timeout", "3s", "--service-traffic-metrics", "50")
    lab = LabKube(lab_cluster, tmp_path, daemon_flags=flags)
    lab.start_apiserver()
    lab.start_controller()
    try:
        yield lab
    finally:
        print(lab.logs())  # shown with a failure's report
        lab.stop(cleanup=True)


@contextmanager
def nodes_cut_off_from_the_api() -> Iterator[None]:
    """New connections from the nodes to kube-apiserver are refused (a TCP reset, as from a
    stopped server) until the block ends; the test itself still reaches the server over lo."""
    rule = ["INPUT", "-i", UNDERLAY_BRIDGE, "-p", "tcp", "--dport", str(APISERVER_PORT)]
    rule += ["--syn", "-j", "REJECT", "--reject-with", "tcp-reset"]
    subprocess.run(["iptables", "-I", *rule], check=True)
    try:
        yield
    finally:
        subprocess.run(["iptables", "-D", *rule], check=True)


def http_service(core: Any, disc: Any, name: str, pod: Any) -> str:
    """A selectorless ClusterIP Service on port 80 with ``pod`` as its one endpoint (8080):
    its ClusterIP."""
    body = {
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    }
    core.create_namespaced_service("default", body)
    disc.create_namespaced_endpoint_slice("default", slice_body(name, [pod]))
    return str(core.read_namespaced_service(name, "default").spec.cluster_ip)


def slice_body(name: str, pods: list[Any]) -> dict[str, Any]:
    """A hand-written slice, for a Service without a selector."""
    return {
        "metadata": {"name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": [p.ip], "nodeName": p.node, "conditions": {"ready": True}} for p in pods
        ],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }


def test_health_taint_and_metrics_follow_the_daemon(lab_cluster: Cluster, kube: LabKube) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(kube.api)
    disc: Any = client.DiscoveryV1Api(kube.api)
    kube.start_daemons()
    n1, n2 = lab_cluster.nodes[0], lab_cluster.nodes[1]
    # /healthz is 200 from the start, before the first sync too (upstream's "healthy while
    # starting"); the first sync shows in the metrics.
    first: list[int] = []

    def serving() -> bool:
        first.append(healthz(n1)[0])
        return True

    wait_for(serving, 60, "healthz serving")
    assert first[0] == 200
    for node in (n1, n2):  # each node's first sync done
        kube.wait_first_sync(node)
    # A node the cluster autoscaler is removing fails /healthz (load balancers drain it)
    # while /livez and /readyz (the DaemonSet's probes: its pod stays available) stay 200.
    taint = {"key": "ToBeDeletedByClusterAutoscaler", "effect": "NoSchedule"}
    core.patch_node("node-2", {"spec": {"taints": [taint]}})
    wait_for(lambda: healthz(n2)[0] == 503, 30, "tainted node unhealthy")
    assert healthz(n2, "/livez")[0] == 200
    assert healthz(n2, "/readyz")[0] == 200
    assert json.loads(healthz(n2)[1])["nodeEligible"] is False
    core.patch_node("node-2", {"spec": {"taints": None}})
    # A Service without a selector: its slice is written by hand (the lab's controller leaves
    # it alone, as upstream's does).
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

    wait_for(lambda: answers(n1.pods[1].netns, vip, 80) == {"pod-1-1"}, 30, "ClusterIP")
    # The endpoint itself through its own Service (hairpin, masqueraded by KUBE-LOOP-BACK).
    wait_for(lambda: answers(n1.pods[0].netns, vip, 80) == {"pod-1-1"}, 30, "hairpin")
    wait_for(lambda: answers("external", n2.ip, 30500) == {"pod-1-1"}, 30, "NodePort")
    syncs_before = sync_count(n1)
    disc.replace_namespaced_endpoint_slice(
        "web-1", "default", slice_body("web", list(lab_cluster.pods[:4]))
    )
    want = {p.name for p in lab_cluster.pods[:4]}
    wait_for(lambda: answers(n2.pods[1].netns, vip, 80, 12) == want, 30, "scale up")
    assert [s.metadata.name for s in disc.list_namespaced_endpoint_slice("default").items] == [
        "web-1"
    ]
    # Metrics moved with the syncs.
    status, text = http_get_from(n1.netns, "http://127.0.0.1:10249/metrics")
    assert status == 200
    assert sync_count(n1) > syncs_before
    for name in (
        "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        "kubeproxy_sync_proxy_rules_service_changes_total",
        'ipvsproxy_netlink_operations_total{kind="add_dest",outcome="ok"}',
        'kubeproxy_proxy_healthz_total{code="200"}',
    ):
        assert name in text, name
    # Upstream's series as the checked-in list has them, and upstream's other routes.
    found = shapes(text)
    expected = golden()
    for name in upstream_names(found):
        assert found[name].key() == expected[name].key(), name
    assert "_created" not in text
    # The opt-in per-Service traffic series counted the requests through n1's IPVS.
    web = {"namespace": "default", "service": "web", "port": "http", "protocol": "TCP"}
    conns = sample_value(text, "ipvsproxy_service_connections_total", **web)
    assert conns is not None and conns > 0, text
    assert http_get_from(n1.netns, "http://127.0.0.1:10249/proxyMode") == (200, "ipvs")
    configz = json.loads(http_get_from(n1.netns, "http://127.0.0.1:10249/configz")[1])
    assert configz["kubeproxy.config.k8s.io"]["kind"] == "KubeProxyConfiguration"
    core.delete_namespaced_service("web", "default")
    for node in lab_cluster.nodes:
        wait_for(
            bind(lambda ns: vip not in lab_cluster.exec(ns, "ipvsadm", "-Ln").stdout, node.netns),
            30,
            f"delete on {node.name}",
        )
    assert "kubeproxy_sync_proxy_rules_last_timestamp_seconds" in metrics(n1)
    status, body = healthz(n1)
    assert status == 200 and "lastUpdated" in json.loads(body)
    # A dual-stack node: both families served, both with NodePort addresses.
    assert not {"unservedIPFamilies", "noNodePortAddressIPFamilies"} & json.loads(body).keys()
    # Upstream's body: the proxiers' health, and each family's.
    assert json.loads(body)["healthy"] is True
    assert set(json.loads(body)["status"]) == {"IPv4", "IPv6"}


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


def ipvs_rules(cluster: Cluster, node: Node) -> str:
    return cluster.exec(node.netns, "ipvsadm", "-Sn").stdout


def node_dump(cluster: Cluster, node: Node) -> str:
    cmd = "ipvsadm -Sn; ipset list -n | sort; ip -o link | sed 's/^[0-9]*: //' | cut -d' ' -f1-2"
    return (
        cluster.exec(node.netns, "sh", "-c", cmd).stdout
        + _tables(cluster.exec(node.netns, "iptables-save").stdout)
        + "\n# ip6tables\n"
        + _tables(cluster.exec(node.netns, "ip6tables-save").stdout)
    )


def test_outage_compaction_health_checks_and_cleanup(
    lab_cluster: Cluster, kube: LabKube, tmp_path: Path
) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(kube.api)
    disc: Any = client.DiscoveryV1Api(kube.api)
    n1, n2 = lab_cluster.nodes[0], lab_cluster.nodes[1]
    before = {n.name: node_dump(lab_cluster, n) for n in lab_cluster.nodes}
    daemons = kube.start_daemons()
    for node in lab_cluster.nodes:
        kube.wait_first_sync(node)  # a daemon that did not start fails here, with its logs
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

        old_ip = http_service(core, disc, "old", n1.pods[1])
        wait_for(
            lambda: all(f"{old_ip}:80" in ipvs_rules(lab_cluster, n) for n in lab_cluster.nodes),
            60,
            "the Service to delete during the outage, on every node",
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
        # kube-apiserver goes away for longer than a watch request lasts (--watch-timeout 3s)
        # and etcd's history is compacted meanwhile: the restarted server's watch cache starts
        # after the daemons' last resourceVersion, so their watches resume at a version that is
        # gone (410) and must relist. The nodes reach the restarted server only once its
        # /readyz passes, as behind an HA cluster's load balancer: a lone server that is still
        # filling its RBAC caches answers 403, and a list after a 403 reads the latest state
        # without ever meeting the 410 (that path: tests/unit/test_informer_retries.py).
        # A Service deleted while the nodes are cut off must go from every node, and a Service
        # made afterwards must be programmed.
        cp = kube.controlplane
        with nodes_cut_off_from_the_api():
            cp.stop_apiserver(grace=3)
            cp.compact()
            time.sleep(8)
            cp.start_apiserver()  # returns once /readyz answers 200
            core.delete_namespaced_service("old", "default")
            disc.delete_namespaced_endpoint_slice("old-1", "default")
        late_ip = http_service(core, disc, "late", n2.pods[1])
        # Through the outage each informer's backoff grew to client-go's cap, 30 s plus up to
        # 100% jitter; as client-go's reflector, it waits one backoff before its next watch and
        # another before the relist that follows the 410: the bounds allow for both and a sync, on
        # every node.
        wait_for(
            lambda: netns.tcp_request(n1.pods[1].netns, late_ip, 80, timeout=2)["pod"] == "pod-2-2",
            150,
            "a change after the restart",
        )
        wait_for(
            lambda: all(
                f"{old_ip}:80" not in ipvs_rules(lab_cluster, n) for n in lab_cluster.nodes
            ),
            150,
            "the Service deleted during the outage removed from every node",
        )
        stop.set()
        t.join(timeout=10)
        assert failures == []
        # A 410 reaches an informer either as the answer to its watch ("is gone") or, when
        # the outage ended its watch and it lists again first, as the answer to that list at
        # the compacted resourceVersion ("is not available"): both then list the latest state.
        logs = daemons.logs()
        gone = "is gone (" in logs or "is not available (" in logs
        assert gone, "no informer saw 410 Gone"
    finally:
        stop.set()
        daemons.stop()
    # SIGTERM left the dataplane in place: traffic keeps flowing while the pods restart.
    assert netns.tcp_request(n2.pods[0].netns, vip, 80)["pod"] == "pod-1-1"
    # Cleanup after the run leaves every node exactly as it was before.
    for node, proc in zip(lab_cluster.nodes, daemons.cleanup(), strict=True):
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


def test_a_conntrack_limit_it_cannot_raise_stops_the_start_with_the_reason(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """A limit above the kernel's that cannot be written (nf_conntrack_max is read-only in a
    network namespace) is fatal, as upstream's platformSetup: exit 1 naming the setting and
    why, before anything is programmed; the kernel's limit as it was."""
    node = lab_cluster.nodes[2]
    limit = netns.read_sysctl(node.netns, "net.netfilter.nf_conntrack_max")
    before = node_dump(lab_cluster, node)
    proc = lab_cluster.exec(
        node.netns,
        "timeout",  # a daemon that went on would wait for its API server for good
        "120",
        sys.executable,
        "-m",
        "ipvsproxy",
        "run",
        "--master",
        "http://127.0.0.1:1",
        "--state-file",
        str(tmp_path / "s.json"),
        "--conntrack-min",
        str(int(limit) + 1),
        check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "could not set conntrack parameters from kube-proxy configuration: can't set sysctl "
        f"net/netfilter/nf_conntrack_max to {int(limit) + 1}: [Errno 13] Permission denied"
    ) in proc.stderr, proc.stderr
    assert node_dump(lab_cluster, node) == before
    assert netns.read_sysctl(node.netns, "net.netfilter.nf_conntrack_max") == limit


def test_a_config_file_change_stops_the_daemon_and_leaves_the_dataplane(
    lab_cluster: Cluster, kube: LabKube, tmp_path: Path
) -> None:
    """The daemon as kubeadm's DaemonSet runs kube-proxy: --config FILE, JSON logs. Every log
    line is component-base's JSON; a change of the file's content stops the daemon (exit 1, the
    reason upstream gives), and what it programmed stays in the kernel."""
    from kubernetes import client

    node = lab_cluster.nodes[0]
    config = tmp_path / "config.conf"
    config.write_text(
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"
        "mode: ipvs\nlogging:\n  format: json\n"
    )
    daemons = Daemons(
        lab_cluster, kube.daemon_kubeconfig, tmp_path, ("--config", str(config)), nodes=[node]
    )
    kube.daemons = daemons  # stopped and cleaned up by the fixture
    cluster_ip = http_service(
        client.CoreV1Api(kube.api), client.DiscoveryV1Api(kube.api), "conf", lab_cluster.pods[0]
    )
    kube.wait_first_sync(node)
    wait_for(lambda: f"{cluster_ip}:80" in ipvs_rules(lab_cluster, node), 30, "Service programmed")
    programmed = node_dump(lab_cluster, node)
    config.write_text(config.read_text() + "ipvs:\n  scheduler: wrr\n")
    wait_for(lambda: node.name in daemons.exited(), 30, "the daemon's exit")
    assert daemons.exited() == {node.name: 1}
    lines = (tmp_path / f"{node.name}.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line is JSON
    assert len(records) > 3 and all({"ts", "caller", "msg"} <= set(r) for r in records)
    reason = "content of the proxy server's configuration file was updated"
    stops = [r for r in records if reason in json.dumps(r)]
    assert stops and "v" not in stops[0]  # logged as an error, as upstream
    assert node_dump(lab_cluster, node) == programmed


def bound_token(kube: LabKube, secret: str) -> str:
    """A token of deploy/'s ServiceAccount bound to a new Secret: deleting the Secret revokes
    it, as deleting a Pod revokes its projected token."""
    namespace, account = SERVICE_ACCOUNT
    cp = kube.controlplane
    cp.call("POST", f"/api/v1/namespaces/{namespace}/secrets", {"metadata": {"name": secret}})
    out = cp.call(
        "POST",
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": secret}},
        },
    )
    return str(out["status"]["token"])


def test_a_rotated_token_file_is_read_again(
    lab_cluster: Cluster, kube: LabKube, tmp_path: Path
) -> None:
    """kubeadm's kubeconfig.conf names the pod's projected token by tokenFile, which the kubelet
    rotates: after the old token is revoked, the daemon goes on with the file's new one (read
    again at most once a minute, as client-go does)."""
    from kubernetes import client

    node = lab_cluster.nodes[0]
    token = tmp_path / "token"
    token.write_text(bound_token(kube, "token-a") + "\n")
    kubeconfig = json.loads(kube.daemon_kubeconfig.read_text())
    kubeconfig["users"][0]["user"] = {"tokenFile": str(token)}
    (tmp_path / "kubeconfig").write_text(json.dumps(kubeconfig))
    daemons = Daemons(
        lab_cluster, tmp_path / "kubeconfig", tmp_path, kube.daemon_flags, nodes=[node]
    )
    kube.daemons = daemons
    kube.wait_first_sync(node)
    token.write_text(bound_token(kube, "token-b") + "\n")
    namespace = SERVICE_ACCOUNT[0]
    kube.controlplane.call("DELETE", f"/api/v1/namespaces/{namespace}/secrets/token-a")
    log = tmp_path / f"{node.name}.log"
    rejected = "rejected ipvsproxy's credentials (401 Unauthorized"
    # the watches renew every 3 s (--watch-timeout); once token-a is refused, no request the
    # daemon makes succeeds until it reads the file again (within a minute of its first read)
    wait_for(lambda: rejected in log.read_text(errors="replace"), 60, "token-a refused")
    core, disc = client.CoreV1Api(kube.api), client.DiscoveryV1Api(kube.api)
    cluster_ip = http_service(core, disc, "rotated", lab_cluster.pods[0])
    wait_for(lambda: f"{cluster_ip}:80" in ipvs_rules(lab_cluster, node), 150, "new Service")
    assert daemons.exited() == {}
