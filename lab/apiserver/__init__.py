"""A Kubernetes API server for tests: what a kube-proxy reads, over the real REST protocol.

No real kube-apiserver can run on the machines that develop and test ipvsproxy, so this
pure-stdlib server speaks the protocol well enough for the unmodified official client and
kubectl: Services (with status), EndpointSlices, Nodes, Namespaces and Events; get, list with
selectors and consistent paging, create, update, patch, delete, and watch with bookmarks,
resumption from a resourceVersion and 410 after compaction.

    from lab.apiserver import APIServer
    with APIServer(bookmark_interval=1.0) as srv:
        srv.write_kubeconfig("kubeconfig")
        ...  # point kubernetes.config.new_client_from_config at it
"""

from lab.apiserver.cli import cli_main
from lab.apiserver.kubeconfig import write as write_kubeconfig
from lab.apiserver.server import APIServer

__all__ = ["APIServer", "cli_main", "write_kubeconfig"]
