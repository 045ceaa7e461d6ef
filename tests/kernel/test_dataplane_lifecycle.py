"""Ownership, restart adoption, cost of one change at scale, and rejected operations."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.plan import PlanConfig
from ipvsproxy.dataplane.dataplane import Dataplane
from ipvsproxy.kernel.sysctl import not_as_expected
from lab.net import netns
from lab.net.node_dataplane import NodeDataplane, node_dataplane, sh
from lab.net.topology import Cluster, Node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel


def sync_ok(dp: Dataplane) -> Any:
    result = dp.sync()
    assert result.errors == []
    return result


def test_foreign_state_survives_syncs_and_cleanup(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    ns = n1.netns
    foreign = [
        "ipvsadm -A -t 10.96.200.1:80 -s rr",  # a foreign virtual server in the service range
        "ipvsadm -a -t 10.96.200.1:80 -r 10.244.1.11:8080 -m",
        f"ipvsadm -A -t {n1.ip}:31999 -s rr",  # and one on a node address
        "ipset create FOREIGN-SET hash:ip",
        "ipset add FOREIGN-SET 192.0.2.1",
        "iptables -t nat -N FOREIGN-CHAIN",
        "iptables -t nat -A FOREIGN-CHAIN -j RETURN",
        "iptables -t filter -I INPUT -s 192.0.2.99 -j DROP",
    ]
    sh(lab_cluster, ns, " && ".join(foreign))
    try:

        def snapshot() -> tuple[str, str, str, str]:
            return (
                sh(lab_cluster, ns, "ipvsadm -Sn | grep -E '10.96.200.1|31999' | sort"),
                sh(lab_cluster, ns, "ipset list FOREIGN-SET | tail -n 2"),
                sh(lab_cluster, ns, "iptables -t nat -S FOREIGN-CHAIN"),
                sh(lab_cluster, ns, "iptables -S INPUT | grep 192.0.2.99"),
            )

        before = snapshot()
        assert "10.96.200.1:80" in before[0] and "31999" in before[0]
        sl = endpoint_slice("web", [endpoint(n1.pods[0].ip)])
        svc = service("web", "10.96.0.10")
        with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
            for _ in range(3):
                ndp.run(lambda dp: (dp.update_service("default/web", svc, [sl]), sync_ok(dp)))
                ndp.run(lambda dp: dp.reconcile())
            ndp.run(lambda dp: (dp.update_service("default/web", None, []), sync_ok(dp)))
            ndp.run(lambda dp: dp.reconcile())
            assert snapshot() == before
        # node_dataplane ran a cleanup of ipvsproxy's own state on exit.
        assert snapshot() == before
        assert "kube-ipvs0" not in sh(lab_cluster, ns, "ip link")
        assert "KUBE-" not in sh(lab_cluster, ns, "ipset list -n")
        assert "KUBE-" not in sh(lab_cluster, ns, "iptables-save")
    finally:
        sh(
            lab_cluster,
            ns,
            "ipvsadm -C; ipset destroy FOREIGN-SET; iptables -t nat -F FOREIGN-CHAIN;"
            " iptables -t nat -X FOREIGN-CHAIN; iptables -D INPUT -s 192.0.2.99 -j DROP",
            check=False,
        )


def test_restart_adopts_the_kernel_with_zero_writes(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    state = tmp_path / "state.json"
    objects = [
        (
            service("a", "10.96.3.1"),
            [endpoint_slice("a", [endpoint(p.ip, p.node) for p in lab_cluster.pods[:3]])],
        ),
        (
            service(
                "b",
                "10.96.3.2",
                type="NodePort",
                sessionAffinity="ClientIP",
                ports=[{"name": "http", "port": 80, "nodePort": 30300, "protocol": "TCP"}],
            ),
            [endpoint_slice("b", [endpoint(n1.pods[0].ip)])],
        ),
    ]

    def load(dp: Dataplane) -> Any:
        for svc, slices in objects:
            dp.update_service(f"default/{svc['metadata']['name']}", svc, slices)
        return sync_ok(dp)

    first = NodeDataplane(n1, state)
    first.run(load)
    with netns.TCPSession(n1.pods[1].netns, "10.96.3.1", 80) as session:
        backend = session.ask()["pod"]
        first.close()  # the process goes away; the kernel keeps everything
        second = NodeDataplane(n1, state)
        try:
            result = second.run(load)
            assert result.full
            assert result.writes == 0
            assert second.backends.writes() == 0
            # The established connection never noticed.
            assert session.ask()["pod"] == backend
            assert netns.tcp_request("external", n1.ip, 30300)["pod"] == n1.pods[0].name
        finally:
            second.run(lambda dp: dp.cleanup())
            second.close()


def test_one_endpoint_change_among_1000_services_costs_a_few_writes(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    pods = lab_cluster.pods

    def slices(i: int, extra: bool = False) -> list[dict[str, Any]]:
        eps = [
            endpoint(pods[(i + k) % len(pods)].ip, pods[(i + k) % len(pods)].node) for k in range(3)
        ]
        if extra:
            eps.append(endpoint("10.244.3.99", "node-3"))
        return [endpoint_slice(f"s{i}", eps)]

    services = {i: service(f"s{i}", f"10.97.{i // 250}.{i % 250 + 1}") for i in range(1000)}
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:

        def load(dp: Dataplane) -> Any:
            for i, svc in services.items():
                dp.update_service(f"default/s{i}", svc, slices(i))
            return sync_ok(dp)

        cold = ndp.run(load)
        assert len(ndp.run(lambda dp: dp.backends.ipvs.services())) == 1000
        assert cold.writes >= 4000
        ipvs = ndp.backends.ipvs
        sends_before = ipvs.sock.sends
        # One endpoint added to one Service: one real server added, nothing else.
        add = ndp.run(
            lambda dp: (dp.update_service("default/s7", services[7], slices(7, True)), sync_ok(dp))[
                1
            ]
        )
        assert add.writes == 1
        assert ipvs.sock.sends - sends_before == 1
        assert "10.244.3.99:8080" in sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.97.0.8:80")
        # And removed again (an idle TCP real server goes at once).
        remove = ndp.run(
            lambda dp: (dp.update_service("default/s7", services[7], slices(7)), sync_ok(dp))[1]
        )
        assert remove.writes <= 2
        assert "10.244.3.99" not in sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.97.0.8:80")


def test_rejected_operations_name_the_object_and_the_rest_applies(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    from ipvsproxy.core.plan import PlanConfig

    n1 = lab_cluster.node("node-1")
    sl = endpoint_slice("x", [endpoint(n1.pods[0].ip)])
    with node_dataplane(
        lab_cluster, n1, tmp_path / "s.json", plan_config=PlanConfig(scheduler="nosuch")
    ) as ndp:
        result = ndp.run(
            lambda dp: (dp.update_service("default/x", service("x", "10.96.4.1"), [sl]), dp.sync())[
                1
            ]
        )
        assert any("add virtual server TCP 10.96.4.1:80" in e for e in result.errors), result.errors
        # The rest of the sync went through: the address is bound and the rules are in place.
        assert "10.96.4.1/32" in sh(lab_cluster, n1.netns, "ip addr show kube-ipvs0")
        assert "KUBE-SERVICES" in sh(lab_cluster, n1.netns, "iptables -t nat -S")


def test_exclude_cidrs_are_never_touched(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    sh(
        lab_cluster,
        n1.netns,
        "ip link add kube-ipvs0 type dummy; ip addr add 10.100.0.5/32 dev kube-ipvs0;"
        " ipvsadm -A -t 10.100.0.5:80 -s rr",
    )
    with node_dataplane(
        lab_cluster, n1, tmp_path / "s.json", exclude_cidrs=["10.100.0.0/16"]
    ) as ndp:
        ndp.run(
            lambda dp: (dp.update_service("default/w", service("w", "10.96.5.1"), []), sync_ok(dp))
        )
        ndp.run(lambda dp: dp.reconcile())
        assert "10.100.0.5/32" in sh(lab_cluster, n1.netns, "ip addr show kube-ipvs0")
        assert "10.100.0.5:80" in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    # Cleanup removed ipvsproxy's own address and kept the excluded one (and so the device).
    addrs = sh(lab_cluster, n1.netns, "ip addr show kube-ipvs0")
    assert "10.100.0.5/32" in addrs and "10.96.5.1" not in addrs
    assert "10.100.0.5:80" in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    sh(lab_cluster, n1.netns, "ip link del kube-ipvs0", check=False)
    sh(lab_cluster, n1.netns, "ipvsadm -D -t 10.100.0.5:80", check=False)


def test_sysctls_are_set_and_reported(lab_cluster: Cluster, tmp_path: Path) -> None:
    n3 = lab_cluster.node("node-3")
    for name in ("expire_nodest_conn", "expire_quiescent_template"):
        sh(lab_cluster, n3.netns, f"echo 0 > /proc/sys/net/ipv4/vs/{name}")
    with node_dataplane(lab_cluster, n3, tmp_path / "s.json", strict_arp=True) as ndp:
        result = ndp.run(lambda dp: dp.sync())
        assert "net/ipv4/vs/expire_nodest_conn" in result.sysctls_set
        assert "net/ipv4/conf/all/arp_announce" in result.sysctls_set
        assert ndp.run(lambda dp: dp.sysctls()) == {
            "net/ipv4/vs/conntrack": "1",
            "net/ipv4/vs/expire_nodest_conn": "1",
            "net/ipv4/vs/expire_quiescent_template": "1",
            "net/ipv4/ip_forward": "1",
            "net/ipv4/conf/all/arp_ignore": "1",
            "net/ipv4/conf/all/arp_announce": "2",
        }
        assert ndp.run(lambda dp: dp.reconcile()).sysctls_set == []


def test_ipv6_forwarding_off_is_reported_and_left_alone(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """Serving IPv6, the node's real net.ipv6.conf.all.forwarding is read, reported when off
    and never written (turning it on would turn off router advertisements)."""
    n3 = lab_cluster.node("node-3")
    path = "/proc/sys/net/ipv6/conf/all/forwarding"
    sh(lab_cluster, n3.netns, f"echo 0 > {path}")
    try:
        both = PlanConfig(families=(4, 6))
        with node_dataplane(lab_cluster, n3, tmp_path / "s.json", plan_config=both) as ndp:
            result = ndp.run(lambda dp: dp.sync())
            assert [e for e in result.errors if "forwarding" in e] == [
                not_as_expected("net/ipv6/conf/all/forwarding", "0", "1")
            ], result.errors
            assert sh(lab_cluster, n3.netns, f"cat {path}").strip() == "0"
            assert ndp.run(lambda dp: dp.sysctls())["net/ipv6/conf/all/forwarding"] == "0"
            assert ndp.run(lambda dp: dp.reconcile()).errors == []
    finally:
        sh(lab_cluster, n3.netns, f"echo 1 > {path}")


def test_reconcile_repairs_drift_of_every_kind(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    svc = service("d", "10.96.6.1")
    sl = endpoint_slice("d", [endpoint(p.ip, p.node) for p in lab_cluster.pods[:2]])
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        ndp.run(lambda dp: (dp.update_service("default/d", svc, [sl]), sync_ok(dp)))
        healthy = sh(lab_cluster, n1.netns, "ipvsadm -Sn; ipset save; ip -o addr show kube-ipvs0")
        rules = sh(lab_cluster, n1.netns, "iptables-save | grep -v '^#' | sed 's/\\[[0-9:]*\\]//'")
        sh(
            lab_cluster,
            n1.netns,
            f"ipvsadm -d -t 10.96.6.1:80 -r {lab_cluster.pods[0].ip}:8080;"
            " ipset del KUBE-CLUSTER-IP 10.96.6.1,tcp:80;"
            " iptables -t nat -F KUBE-SERVICES;"
            " iptables -t nat -D PREROUTING -m comment --comment 'kubernetes service portals'"
            " -j KUBE-SERVICES",
        )
        # Traffic to the drifted ones is off: the incremental sync does not look at the kernel.
        assert ndp.run(lambda dp: dp.sync()).writes == 0
        repaired = ndp.run(lambda dp: dp.reconcile())
        assert repaired.errors == []
        assert repaired.writes == 3  # the real server, the ipset member, one iptables-restore
        assert (
            sh(lab_cluster, n1.netns, "ipvsadm -Sn; ipset save; ip -o addr show kube-ipvs0")
            == healthy
        )
        assert (
            sh(lab_cluster, n1.netns, "iptables-save | grep -v '^#' | sed 's/\\[[0-9:]*\\]//'")
            == rules
        )
        assert ndp.run(lambda dp: dp.reconcile()).writes == 0
        # An address removed by hand comes back too.
        sh(lab_cluster, n1.netns, "ip addr del 10.96.6.1/32 dev kube-ipvs0")
        assert ndp.run(lambda dp: dp.reconcile()).writes == 1
        assert netns.tcp_request(n1.pods[1].netns, "10.96.6.1", 80)["pod"] in {"pod-1-1", "pod-1-2"}


def test_refused_virtual_servers_are_blamed_on_their_service(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    from ipvsproxy.core.plan import PlanConfig

    n1 = lab_cluster.node("node-1")
    cfg = PlanConfig(scheduler="nosuch")
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json", plan_config=cfg) as ndp:
        ndp.run(
            lambda dp: (
                dp.update_service("ns1/bad", service("bad", "10.96.8.1", namespace="ns1"), []),
                dp.sync(),
            )
        )
        assert list(ndp.dp.failed) == ["ns1/bad"]
        assert "10.96.8.1:80" in ndp.dp.failed["ns1/bad"].reason


def test_cleanup_in_a_read_only_state_directory_removes_ours(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """The state directory bound read-only over itself (EROFS even to removing a file that is
    not there): ``ipvsproxy cleanup`` removes the ClusterIP and the NodePort it programmed,
    says that it cannot write the state file, and succeeds."""
    n1 = lab_cluster.node("node-1")
    state = tmp_path / "state.json"
    svc = node_port_service("ro", "10.96.7.7", 30703)
    slices = [endpoint_slice("ro", [endpoint(n1.pods[0].ip)])]
    proxy = NodeDataplane(n1, state)
    try:
        proxy.run(lambda dp: (dp.update_service("default/ro", svc, slices), sync_ok(dp)))
    finally:
        proxy.close()
    node_port = f"{n1.ip}:30703"
    assert node_port in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    written = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    read_only = 'mount --bind -o ro "$1" "$1" && shift && exec "$@"'
    try:
        done = lab_cluster.exec(
            n1.netns, "unshare", "-m", "--propagation", "private", "sh", "-c", read_only, "sh",
            str(tmp_path), sys.executable, "-m", "ipvsproxy", "cleanup", "--state-file",
            str(state), check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "Read-only file system" in done.stderr
        ipvs = sh(lab_cluster, n1.netns, "ipvsadm -Ln")
        assert "10.96.7.7" not in ipvs and node_port not in ipvs
        assert "kube-ipvs0" not in sh(lab_cluster, n1.netns, "ip link")
    finally:
        sh(lab_cluster, n1.netns, f"ipvsadm -D -t {node_port}", check=False)
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == written


def killed_after_the_kernel_write(
    node: Node, state: Path, name: str, svc: dict[str, Any], slices: list[dict[str, Any]]
) -> None:
    """A proxy that programs ``svc`` and dies right after its IPVS write, before anything
    else (the state file's save included) happens."""
    proxy = NodeDataplane(node, state)
    applied = proxy.backends.ipvs.apply

    def killed(ops: Any) -> Any:
        applied(ops)
        raise SystemExit("killed after the kernel write, before the state file's save")

    proxy.backends.ipvs.apply = killed  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            proxy.run(lambda dp: (dp.update_service(name, svc, slices), dp.sync()))
    finally:
        proxy.close()


def node_port_service(name: str, ip: str, node_port: int) -> dict[str, Any]:
    port = {"name": "http", "port": 80, "nodePort": node_port, "protocol": "TCP"}
    return service(name, ip, type="NodePort", ports=[port])


@pytest.mark.parametrize("restart_with", ["the state file as it was", "a corrupt state file"])
def test_a_node_port_written_but_never_recorded_is_removed_later(
    lab_cluster: Cluster, tmp_path: Path, restart_with: str
) -> None:
    """Killed between the kernel write and the state file's save: the NodePort's virtual
    server (on a node address, not kube-ipvs0) must still be ipvsproxy's after a restart."""
    n1 = lab_cluster.node("node-1")
    state = tmp_path / "state.json"
    svc = node_port_service("np", "10.96.7.1", 30700)
    slices = [endpoint_slice("np", [endpoint(n1.pods[0].ip)])]
    killed_after_the_kernel_write(n1, state, "default/np", svc, slices)
    node_port = f"{n1.ip}:30700"
    try:
        assert node_port in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
        if restart_with == "a corrupt state file":
            state.write_text('{"version": 1, "virtualSer')
        with node_dataplane(lab_cluster, n1, state) as second:
            # The restarted proxy lists the Service, programs it, then it is deleted.
            second.run(lambda dp: (dp.update_service("default/np", svc, slices), sync_ok(dp)))
            assert netns.tcp_request("external", n1.ip, 30700)["pod"] == n1.pods[0].name
            second.run(lambda dp: (dp.update_service("default/np", None, []), sync_ok(dp)))
            assert node_port not in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    finally:
        sh(lab_cluster, n1.netns, f"ipvsadm -D -t {node_port}", check=False)


def test_a_node_port_deleted_while_the_proxy_was_down_is_removed_at_restart(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    state = tmp_path / "state.json"
    svc = node_port_service("gone", "10.96.7.2", 30701)
    killed_after_the_kernel_write(n1, state, "default/gone", svc, [])
    node_port = f"{n1.ip}:30701"
    try:
        assert node_port in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
        with node_dataplane(lab_cluster, n1, state) as second:
            second.run(sync_ok)  # the Service no longer exists
            assert node_port not in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    finally:
        sh(lab_cluster, n1.netns, f"ipvsadm -D -t {node_port}", check=False)


def test_cleanup_with_an_empty_state_file_removes_what_the_kernel_shows_is_ours(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    state = tmp_path / "state.json"
    proxy = NodeDataplane(n1, state)
    try:
        sl = endpoint_slice("c", [endpoint(n1.pods[0].ip)])
        proxy.run(
            lambda dp: (
                dp.update_service("default/c", service("c", "10.96.7.5"), [sl]),
                sync_ok(dp),
            )
        )
    finally:
        proxy.close()
    assert "10.96.7.5:80" in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    state.write_text("")  # e.g. a crash of an older version, or a full disk
    done = lab_cluster.exec(
        n1.netns, sys.executable, "-m", "ipvsproxy", "cleanup", "--state-file", str(state),
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "unreadable" in done.stderr and "falling back" in done.stderr
    assert "10.96.7.5" not in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
    assert "kube-ipvs0" not in sh(lab_cluster, n1.netns, "ip link")
