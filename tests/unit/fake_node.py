"""A node for the dataplane's unit tests: the real ``Dataplane`` over the fake kernel
(``ipvsproxy.kernel.fakes``), its state file in the test's folder.

``node()`` starts from a fresh node's kernel with clocks the test moves; ``running_node()``
from a node already running (kube-ipvs0 and every set exist, the sysctls are set) with the
real clocks, for the tests that run the daemon's sync runner in a thread. What the kernel
refuses or raises is told to the fakes (``refuse``, ``raise_from``), never patched in.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.dataplane.dataplane import Dataplane, SyncResult
from ipvsproxy.kernel.addresses import DUMMY_DEVICE
from ipvsproxy.kernel.fakes import FakeBackends, fake_backends
from ipvsproxy.kernel.fakes.sysctls import FRESH_NODE
from ipvsproxy.kernel.sysctl import required

NODE_IP = "192.168.56.11"
NODE = NodeFacts(
    name="node-1",
    node_ips=(NODE_IP,),
    local_addresses=frozenset({NODE_IP}),
    primary_ip=NODE_IP,
)
RULES = ruleset.RulesConfig(cluster_cidr="10.244.0.0/16")


@dataclass
class Node:
    """A Dataplane over the fake kernel, with the time its clocks read unless it was given
    others."""

    kernel: FakeBackends
    dp: Dataplane
    now: list[float]  # the drain clock (time.time) and the retry clock (time.monotonic)

    def sync(self) -> SyncResult:
        return self.dp.sync()

    def reconcile(self) -> SyncResult:
        return self.dp.reconcile()


def node(tmp_path: Path, kernel: FakeBackends | None = None, **kw: Any) -> Node:
    """A Dataplane over ``kernel`` (a fresh node's by default) whose state file is in
    ``tmp_path``; ``kw`` go to ``Dataplane`` (its clocks read ``Node.now`` unless given)."""
    kernel = kernel or fake_backends()
    now = [1000.0]
    kw = {"clock": lambda: now[0], "retry_clock": lambda: now[0], **kw}
    dp = Dataplane(NODE, kernel, tmp_path / "state.json", **kw)
    return Node(kernel, dp, now)


def running_kernel() -> FakeBackends:
    """A node already running: kube-ipvs0 and every set of ours exist, the sysctls IPVS needs
    are set."""
    kernel = fake_backends()
    for name in ipset_specs.NAMES:
        kernel.ipsets.add_set(name)
    kernel.addresses.add_device(DUMMY_DEVICE)
    kernel.sysctls.values.update({**FRESH_NODE, **required(False)})
    return kernel


def running_node(tmp_path: Path) -> Node:
    """A Dataplane over ``running_kernel()`` with the real clocks and the cluster's CIDR."""
    return node(
        tmp_path,
        running_kernel(),
        clock=time.time,
        retry_clock=time.monotonic,
        rules_config=RULES,
    )


def refuse_ipvs(kernel: FakeBackends, address: str) -> None:
    """The kernel refuses every IPVS operation on ``address`` (EINVAL); the rest of a batch
    applies."""
    kernel.ipvs.refuse(errno.EINVAL, lambda op: address in str(op), times=None)
