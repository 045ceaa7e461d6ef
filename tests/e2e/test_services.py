"""Services as a user sees them, on any cluster that runs ipvsproxy (the lab or a real one).

Each test makes its own Services over the cluster's echo backends, sends real traffic from pods,
nodes and outside, and deletes what it made.
"""

from __future__ import annotations

import json
from functools import partial

from tests.e2e.cluster import (
    E2ECluster,
    Source,
    answered_by,
    backends_on_distinct_nodes,
    eventually,
    services,
    wait_answered_by,
)


def _port(svc: object, name: str = "http") -> tuple[int, int]:
    """(port, nodePort) of a Service's port by name."""
    for p in svc.spec.ports:  # type: ignore[attr-defined]
        if p.name == name:
            return int(p.port), int(p.node_port or 0)
    raise KeyError(name)


def test_a_node_port_service_answers_from_every_pod_node_and_outside(cluster: E2ECluster) -> None:
    (backend,) = backends_on_distinct_nodes(cluster, 1)
    with services(cluster) as svcs:
        svc = svcs.create(
            "web",
            "web",
            {
                "type": "NodePort",
                "ports": [
                    {"name": "http", "port": 80, "targetPort": cluster.echo_port},
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": cluster.echo_port},
                ],
            },
            [backend],
        )
        vip = svc.spec.cluster_ip
        _, node_port = _port(svc)
        _, udp_node_port = _port(svc, "dns")
        want = {backend.name}
        for node in cluster.nodes:
            for source in (Source.pod(node.name), Source.on_node(node.name)):
                wait_answered_by(cluster, source, vip, 80, want)
                wait_answered_by(cluster, source, vip, 53, want, 2, "udp")
        for node in cluster.nodes:
            wait_answered_by(cluster, Source.external(), node.ip, node_port, want)
            wait_answered_by(cluster, Source.external(), node.ip, udp_node_port, want, 2, "udp")


def test_endpoints_scaled_up_and_down_are_followed(cluster: E2ECluster) -> None:
    four = backends_on_distinct_nodes(cluster, 4)
    with services(cluster) as svcs:
        svc = svcs.create(
            "scale",
            "scale",
            {"ports": [{"name": "http", "port": 80, "targetPort": cluster.echo_port}]},
            four[:1],
        )
        vip = svc.spec.cluster_ip
        first, last = cluster.nodes[0].name, cluster.nodes[-1].name
        wait_answered_by(cluster, Source.pod(first), vip, 80, {four[0].name})
        cluster.set_backends("scale", four)  # scale up
        wait_answered_by(cluster, Source.pod(last), vip, 80, {b.name for b in four}, 12)
        cluster.set_backends("scale", four[3:])  # and down
        wait_answered_by(cluster, Source.pod(first), vip, 80, {four[3].name})


def test_a_deleted_service_is_gone_from_every_node(cluster: E2ECluster) -> None:
    backends = backends_on_distinct_nodes(cluster, 2)
    with services(cluster) as svcs:
        svc = svcs.create(
            "gone",
            "gone",
            {
                "type": "NodePort",
                "ports": [{"name": "http", "port": 80, "targetPort": cluster.echo_port}],
            },
            backends,
        )
        vip = svc.spec.cluster_ip
        _, node_port = _port(svc)

        def programmed(node: str) -> bool:
            return ("TCP", vip, 80) in cluster.virtual_servers(node)

        def gone(node: str) -> bool:
            return not {
                vs for vs in cluster.virtual_servers(node) if vip == vs[1] or vs[2] == node_port
            }

        for node in cluster.nodes:
            eventually(partial(programmed, node.name), cluster.timeout, f"{vip}:80 on {node.name}")
        eventually(
            lambda: cluster.request(Source.external(), cluster.nodes[0].ip, node_port),
            cluster.timeout,
            "NodePort answers before the deletion",
        )
        svcs.delete("gone")
        for node in cluster.nodes:
            eventually(partial(gone, node.name), cluster.timeout, f"deletion on {node.name}")

        def node_port_closed(ip: str) -> bool:
            try:
                cluster.request(Source.external(), ip, node_port, timeout=1.0)
            except OSError:
                return True
            return False

        for node in cluster.nodes:
            eventually(
                partial(node_port_closed, node.ip),
                cluster.timeout,
                f"NodePort {node.ip}:{node_port} closed",
            )


def test_external_traffic_policy_local(cluster: E2ECluster) -> None:
    """Health-check node port 200 (with the local endpoint count) where the endpoint runs, 503
    elsewhere; the client address is preserved; nodes without an endpoint do not forward."""
    # Where the tests run on a node (vagrant/run-e2e.sh on the control plane), that node's own
    # traffic is not external to it: put the endpoint elsewhere.
    remote = {n.name for n in cluster.nodes if cluster.external_address(n) != n.ip}
    backend = next((b for b in cluster.backends if b.node in remote), cluster.backends[0])
    home = next(n for n in cluster.nodes if n.name == backend.node)
    others = [n for n in cluster.nodes if n.name != backend.node and n.name in remote]
    assert others, "externalTrafficPolicy Local needs a second node reached from outside"
    ext = Source.external()
    with services(cluster) as svcs:
        svc = svcs.create(
            "local",
            "local",
            {
                "type": "LoadBalancer",
                "externalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": 80, "targetPort": cluster.echo_port}],
            },
            [backend],
        )
        hc = svc.spec.health_check_node_port
        _, node_port = _port(svc)
        assert hc, "no healthCheckNodePort allocated"
        url = f"http://{home.ip}:{hc}/"
        eventually(lambda: cluster.http_get(ext, url)[0] == 200, cluster.timeout, "hc 200")
        status, body = cluster.http_get(ext, url)
        assert status == 200
        assert json.loads(body)["localEndpoints"] == 1

        def status_is(url: str, code: int) -> bool:
            return cluster.http_get(ext, url)[0] == code

        for node in others:
            other = f"http://{node.ip}:{hc}/"
            eventually(partial(status_is, other, 503), cluster.timeout, f"hc 503 on {node.name}")
            assert json.loads(cluster.http_get(ext, other)[1])["localEndpoints"] == 0
        # Through the endpoint's node the backend sees the real client address.
        eventually(
            lambda: cluster.request(ext, home.ip, node_port)["pod"] == backend.name,
            cluster.timeout,
            "NodePort on the endpoint's node",
        )
        seen = cluster.request(ext, home.ip, node_port)["client"].rsplit(":", 1)[0]
        assert seen == cluster.external_address(home)
        # A node without a local endpoint does not forward external traffic.
        for node in others:
            try:
                got = cluster.request(ext, node.ip, node_port, timeout=1.0)
            except OSError:
                continue
            raise AssertionError(f"{node.name} forwarded eTP=Local traffic to {got['pod']}")


def test_session_affinity_client_ip_sticks_to_one_pod(cluster: E2ECluster) -> None:
    backends = backends_on_distinct_nodes(cluster, 3)
    names = {b.name for b in backends}
    node = cluster.nodes[0]
    pod, ext = Source.pod(node.name), Source.external()
    with services(cluster) as svcs:
        svc = svcs.create(
            "sticky",
            "sticky",
            {
                "type": "NodePort",
                "ports": [{"name": "http", "port": 80, "targetPort": cluster.echo_port}],
            },
            backends,
        )
        vip = svc.spec.cluster_ip
        _, node_port = _port(svc)
        # Without affinity every endpoint answers: all three are programmed.
        wait_answered_by(cluster, pod, vip, 80, names, 9)
        svcs.core.patch_namespaced_service(
            "sticky", cluster.namespace, {"spec": {"sessionAffinity": "ClientIP"}}
        )
        eventually(
            lambda: len(answered_by(cluster, pod, vip, 80, 8)) == 1,
            cluster.timeout,
            f"ClusterIP from {pod} sticks to one pod",
        )
        (stuck,) = answered_by(cluster, pod, vip, 80, 8)
        assert answered_by(cluster, pod, vip, 80, 8) == {stuck}
        eventually(
            lambda: len(answered_by(cluster, ext, node.ip, node_port, 8)) == 1,
            cluster.timeout,
            "NodePort from outside sticks to one pod",
        )
        (outside,) = answered_by(cluster, ext, node.ip, node_port, 8)
        assert outside in names
        assert answered_by(cluster, ext, node.ip, node_port, 8) == {outside}
