"""A kernel that lacks a set type or an iptables match one Service needs fails that Service
only (issue 28, item 4).

Over the fake kernel (``tests.unit.fake_node``), told to lack the match (``FakeIPTables.
lacks_matches``, as a kernel without xt_physdev) or the set type (``FakeIPSets.
unsupported_types``, as one without ip_set_hash_ipportnet): the rules the kernel can hold are
written, the Services that need the rest fail (Warning Event, status, metric), the sync runs to
its end, and /livez stays 200 while the sync loop runs.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from ipvsproxy.core import ipset_specs
from tests.unit.fake_node import Node, node, running_node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service
from tests.unit.test_proxy_health import TIMEOUT, _proxy

POD = "10.244.1.11"
WEB_IP, EXT_IP, LB_IP = "10.96.0.10", "10.96.0.20", "10.96.0.30"
EXTERNAL = "203.0.113.7"
VIP = "198.51.100.9"


def _put(n: Node, name: str, svc: dict[str, Any]) -> None:
    n.dp.update_service(f"default/{name}", svc, [endpoint_slice(name, [endpoint(POD)])])


def web() -> dict[str, Any]:
    return service("web", WEB_IP)


def ext() -> dict[str, Any]:
    return service("ext", EXT_IP, externalIPs=[EXTERNAL])


def lb() -> dict[str, Any]:
    ports = [{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}]
    return service(
        "lb",
        LB_IP,
        type="LoadBalancer",
        ports=ports,
        loadBalancerSourceRanges=["192.0.2.0/24"],
        status={"loadBalancer": {"ingress": [{"ip": VIP}]}},
    )


def rules(n: Node) -> str:
    return n.kernel.iptables.save("nat") + n.kernel.iptables.save("filter")


def test_a_match_the_kernel_lacks_fails_only_the_services_that_need_it(tmp_path: Path) -> None:
    n = node(tmp_path)
    n.kernel.iptables.lacks_matches.add("physdev")
    _put(n, "web", web())
    _put(n, "ext", ext())
    result = n.sync()
    assert result.complete, result.errors
    assert set(result.failed) == {"default/ext"}
    assert "physdev" in result.failed["default/ext"]
    text = rules(n)
    # The other Services' rules are in: the cluster IPs' masquerade and accept rules.
    assert f"--match-set {ipset_specs.CLUSTER_IP} dst,dst -j ACCEPT" in text
    assert "KUBE-MARK-MASQ" in text
    assert "physdev" not in text and f"--match-set {ipset_specs.EXTERNAL_IP} dst,dst -j" not in (
        n.kernel.iptables.save("nat")
    )
    # The kernel gains the match: the failed Service's retry writes its rules.
    n.kernel.iptables.lacks_matches.clear()
    n.now[0] += 60
    result = n.sync()
    assert result.complete and result.failed == {}, (result.errors, result.failed)
    assert n.dp.failed == {}
    assert "--physdev-is-in" in rules(n)


def test_a_set_type_the_kernel_lacks_fails_only_the_services_that_need_it(
    tmp_path: Path,
) -> None:
    n = node(tmp_path)
    n.kernel.ipsets.unsupported_types.add("hash:ip,port,net")
    _put(n, "web", web())
    _put(n, "lb", lb())
    result = n.sync()
    assert result.complete, result.errors
    assert set(result.failed) == {"default/lb"}
    assert ipset_specs.LOAD_BALANCER_SOURCE_CIDR not in n.kernel.ipsets.sets
    text = rules(n)
    assert f"--match-set {ipset_specs.CLUSTER_IP} dst,dst -j ACCEPT" in text
    assert ipset_specs.LOAD_BALANCER_SOURCE_CIDR not in text
    # A later sync writes nothing new and still fails only that Service.
    n.now[0] += 60
    again = n.sync()
    assert again.complete and set(again.failed) <= {"default/lb"}, again.errors


def test_the_other_services_rules_stay_and_livez_stays_200(tmp_path: Path) -> None:
    """Through the daemon: the failed Service is reported (Warning Event, status, metric),
    /healthz and /livez stay 200 while syncs run."""
    h = running_node(tmp_path)
    h.kernel.iptables.lacks_matches.add("physdev")
    proxy = _proxy(h)
    for name, svc in (("web", web()), ("ext", ext())):
        sl = endpoint_slice(name, [endpoint(POD)])
        proxy.on_service(f"default/{name}", None, svc)
        proxy.on_slice(f"default/{sl['metadata']['name']}", None, sl)
    for sync in (proxy.reconcile, proxy.apply_changes, proxy.reconcile):
        result = sync()
        assert result.complete, result.errors
        later = time.time() + TIMEOUT + 1
        assert proxy.health.live(now=later)[0] == 200
        assert proxy.health.status(node_check=True, now=later)[0] == 200
    assert {s for s, r, _ in proxy.events.events if r == "FailedToProgram"} == {"default/ext"}
    assert proxy.metrics.registry.get_sample_value("ipvsproxy_failed_services") == 1.0
    assert "default/ext" in proxy.status_document()["invalidServices"]
    assert "default/web" not in proxy.status_document()["invalidServices"]
    assert f"--match-set {ipset_specs.CLUSTER_IP} dst,dst -j ACCEPT" in rules(h)


def test_the_ipvs_match_lacking_fails_only_the_services_with_an_out_filter(
    tmp_path: Path,
) -> None:
    """KUBE-IPVS-OUT-FILTER's rules (-m ipvs, a load-balancer VIP whose source ranges exclude
    the node) are the Services' own too: without xt_ipvs only those fail."""
    n = node(tmp_path)
    n.kernel.iptables.lacks_matches.add("ipvs")
    _put(n, "web", web())
    _put(n, "lb", lb())
    result = n.sync()
    assert result.complete, result.errors
    assert set(result.failed) == {"default/lb"}
    assert "ipvs" in result.failed["default/lb"]
    assert f"--match-set {ipset_specs.CLUSTER_IP} dst,dst -j ACCEPT" in rules(n)
    assert "--vaddr" not in rules(n)
    n.kernel.iptables.lacks_matches.clear()
    n.now[0] += 60
    result = n.sync()
    assert result.complete and result.failed == {}, (result.errors, result.failed)
    assert f"-m ipvs --vaddr {VIP}" in rules(n)
