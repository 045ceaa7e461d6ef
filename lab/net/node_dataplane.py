"""Running a Dataplane inside one lab node's namespace."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ipvsproxy.core.plan import NodeFacts, PlanConfig
from ipvsproxy.core.ruleset import RulesConfig
from ipvsproxy.dataplane.dataplane import Backends, Dataplane
from lab.net import netns
from lab.net.topology import Cluster, Node

T = TypeVar("T")
CLUSTER_CIDR = "10.244.0.0/16"


class NodeDataplane:
    """A Dataplane whose every call runs with this thread in the node's namespace, so its
    netlink sockets and the tools it starts (ipset, iptables-restore) act on that node."""

    def __init__(self, node: Node, state: Path, **kwargs: Any) -> None:
        self.node = node
        self.state = state
        self.kwargs = kwargs
        plan_config: PlanConfig = kwargs.get("plan_config", PlanConfig())
        ip6 = node.ip6 if 6 in plan_config.families else ""  # IPv6 served: the node's too
        with netns.entered(node.netns):
            self.backends = Backends.open()
            self.backends.serve_families(plan_config.families)
            facts = NodeFacts(
                name=node.name,
                node_ips=tuple(filter(None, (node.ip, ip6))),
                local_addresses=frozenset(filter(None, (node.ip, node.gateway, ip6))),
                primary_ip=node.ip,
                primary_ip6=ip6 or None,
            )
            self.dp = Dataplane(
                facts,
                self.backends,
                state,
                plan_config=plan_config,
                rules_config=kwargs.get("rules_config", RulesConfig(cluster_cidr=CLUSTER_CIDR)),
                exclude_cidrs=kwargs.get("exclude_cidrs", ()),
                strict_arp=kwargs.get("strict_arp", False),
            )

    def run(self, fn: Callable[[Dataplane], T]) -> T:
        with netns.entered(self.node.netns):
            return fn(self.dp)

    def close(self) -> None:
        self.backends.close()


def sh(cluster: Cluster, ns: str, cmd: str, check: bool = True) -> str:
    return cluster.exec(ns, "sh", "-c", cmd, check=check).stdout


@contextmanager
def node_dataplane(cluster: Cluster, node: Node, state: Path, **kw: Any) -> Iterator[NodeDataplane]:
    ndp = NodeDataplane(node, state, **kw)
    try:
        yield ndp
    finally:
        ndp.run(lambda dp: dp.cleanup())
        ndp.close()
        subprocess.run(["true"])
