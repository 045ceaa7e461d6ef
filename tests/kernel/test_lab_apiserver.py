"""The test API server in the guest's root namespace is reachable from every node namespace,
by the official client, as a kube-proxy on each node will reach it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.apiserver import APIServer
from lab.topology import Cluster

pytestmark = pytest.mark.kernel


@pytest.fixture
def underlay_apiserver(lab_cluster: Cluster) -> Iterator[APIServer]:
    srv = APIServer(host=lab_cluster.apiserver_ip, port=6443, bookmark_interval=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_every_node_reaches_the_apiserver_with_the_official_client(
    lab_cluster: Cluster, underlay_apiserver: APIServer, tmp_path: Path
) -> None:
    from kubernetes import client, config

    new_client: Any = config.new_client_from_config

    kubeconfig = tmp_path / "kubeconfig"
    underlay_apiserver.write_kubeconfig(str(kubeconfig))
    assert f"http://{lab_cluster.apiserver_ip}:6443" in kubeconfig.read_text()
    api: Any = client.CoreV1Api(new_client(config_file=str(kubeconfig)))
    api.create_namespaced_service(
        "default",
        {"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}},
    )
    for node in lab_cluster.nodes:
        # A client of its own per node (connections are pooled), which opens its connection
        # while this thread is inside the node's namespace.
        node_api: Any = client.CoreV1Api(new_client(config_file=str(kubeconfig)))
        with netns.entered(node.netns):
            services = node_api.list_namespaced_service("default", _request_timeout=5)
        assert [s.metadata.name for s in services.items] == ["web"]
        assert services.items[0].spec.cluster_ip.startswith("10.96.")
