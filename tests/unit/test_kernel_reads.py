"""One failing kernel read or one unwritable sysctl does not stop the rest of a full sync
(issue 13 A4): iptables-save failing, an IPVS, address or ipset dump failing, an ipset type the
kernel lacks. Over the fake kernel (``tests.unit.fake_node``), told which reads fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import OpKind
from ipvsproxy.dataplane.dataplane import Dataplane
from ipvsproxy.kernel.fakes import FakeBackend, SetOp
from ipvsproxy.kernel.fakes.ipsets import IPSET_ERR_TYPE_NOT_SUPPORTED
from tests.unit.fake_node import Node, refuse_ipvs, running_node
from tests.unit.k8s_objects import service
from tests.unit.test_containment import Boom, _good, _good2, _programmed, _update


@pytest.fixture
def h(tmp_path: Path) -> Node:
    return running_node(tmp_path)


def _read_failed() -> Boom:
    return Boom("read failed")


READS = {
    "iptables": ("iptables", "read"),
    "ipvs": ("ipvs", "each_service"),
    "addresses": ("addresses", "bound"),
    "ipsets": ("ipsets", "each_part"),
}


def _ipvs_programmed(dp: Dataplane, service: str) -> bool:
    obs, plan = dp.observed, dp.desired.plans[service]
    assert obs is not None
    return all(obs.services.get(k) == vs for k, vs in plan.virtual_servers.items())


@pytest.mark.parametrize("part", sorted(READS))
def test_a_failing_read_of_one_backend_does_not_stop_the_others(h: Node, part: str) -> None:
    dp = h.dp
    backend, method = READS[part]
    fake: FakeBackend[Any] = getattr(h.kernel, backend)
    failing = fake.raise_from(method, _read_failed(), times=None)
    _update(dp, "good", _good())
    _update(dp, "good2", _good2())
    restores = dp.backends.iptables.counters.ok.get("restore", 0)
    result = dp.sync()
    assert result.full and any("read failed" in e for e in result.errors), result.errors
    obs = dp.observed
    assert obs is not None
    plan = dp.desired.plans["default/good2"]
    if part != "addresses":
        assert set(plan.bind) <= obs.bound
    if part != "ipvs":
        assert _ipvs_programmed(dp, "default/good") and _ipvs_programmed(dp, "default/good2")
    if part != "ipsets":
        for name, entries in plan.members.items():
            assert set(entries) <= obs.members.get(name, set()), name
    assert dp.backends.iptables.counters.ok.get("restore", 0) == restores + 1  # the rules written
    # The read works again: the next sync reconciles what was left.
    fake.raisings.remove(failing)
    assert dp.sync().errors == []
    _programmed(dp, "default/good")
    _programmed(dp, "default/good2")


def test_an_ipset_type_the_kernel_lacks_fails_only_the_services_using_it(h: Node) -> None:
    dp = h.dp
    missing = ipset_specs.NODE_PORT_TCP
    ipsets = h.kernel.ipsets
    del ipsets.sets[missing], ipsets.types[missing]
    create = SetOp(OpKind.ADD, missing)
    ipsets.refuse(IPSET_ERR_TYPE_NOT_SUPPORTED, lambda op: op == create, times=None)
    _update(dp, "good", _good())
    _update(dp, "good2", _good2())  # a NodePort: a member of the missing set
    result = dp.sync()
    assert set(dp.failed) == {"default/good2"}, (result.errors, dp.failed)
    _programmed(dp, "default/good")
    assert _ipvs_programmed(dp, "default/good2")


def test_an_unwritable_sysctl_is_reported_once_and_the_others_are_set(h: Node) -> None:
    dp = h.dp
    for name in ("net/ipv4/vs/conntrack", "net/ipv4/ip_forward"):
        h.kernel.sysctls.values[name] = "0"
    h.kernel.sysctls.raise_from(
        "ensure",
        PermissionError(13, "Permission denied"),
        lambda values: "net/ipv4/vs/conntrack" in values,
        times=None,
    )
    _update(dp, "good", _good())
    result = dp.sync()
    assert result.sysctls_set == ["net/ipv4/ip_forward"]
    assert [e for e in result.errors if "sysctl" in e] == [
        "cannot set sysctl net/ipv4/vs/conntrack=1: [Errno 13] Permission denied"
    ]
    assert list(dp.sysctl_failures) == ["net/ipv4/vs/conntrack"]
    _programmed(dp, "default/good")
    assert dp.reconcile().errors == []  # reported once


def test_the_daemon_counts_kernel_problems_in_a_metric(h: Node) -> None:
    from tests.unit.test_containment import _proxy

    proxy = _proxy(h.dp)
    h.kernel.iptables.raise_from("read", _read_failed(), times=None)
    proxy.on_service("default/good", None, _good()[0])
    result = proxy.apply_changes()
    assert result.complete  # the rules were written all the same
    value = proxy.metrics.registry.get_sample_value("ipvsproxy_kernel_problems")
    assert value == 1.0


def test_a_failed_service_stays_failed_while_its_part_of_the_kernel_cannot_be_read(
    h: Node,
) -> None:
    dp = h.dp
    refuse_ipvs(h.kernel, "10.96.0.20")
    dp.update_service("default/bad", service("bad", "10.96.0.20"), [])
    dp.sync()
    assert list(dp.failed) == ["default/bad"]
    unread = h.kernel.ipvs.raise_from("each_service", _read_failed(), times=None)
    dp.reconcile()  # IPVS unread: bad was not tried
    assert list(dp.failed) == ["default/bad"]
    h.kernel.ipvs.raisings.remove(unread)
    dp.reconcile()  # tried, refused again
    assert list(dp.failed) == ["default/bad"] and dp.failed["default/bad"].attempts == 2


def test_a_failed_service_not_tried_for_an_unread_part_is_not_due_at_once_again(
    h: Node,
) -> None:
    """A failed Service that a sync could not try (its part of the kernel unread) backs off
    as if it failed again: else its retry stays due, and the runner (which syncs whenever a
    retry is due, every sync a full one while a part is unread) reads the whole kernel back
    every minSyncPeriod (0 by default from a config file) for as long as the read fails."""
    dp = h.dp
    now = [1000.0]
    dp.failures.clock = lambda: now[0]
    refuse_ipvs(h.kernel, "10.96.0.20")
    dp.update_service("default/bad", service("bad", "10.96.0.20"), [])
    dp.sync()
    assert list(dp.failed) == ["default/bad"]
    h.kernel.ipvs.raise_from("each_service", _read_failed(), times=None)
    for _ in range(3):
        retry = dp.next_retry()
        assert retry is not None
        now[0] = max(now[0], retry)  # the runner syncs when the retry is due
        dp.sync()  # a full sync (IPVS unread): bad cannot be tried
        assert list(dp.failed) == ["default/bad"]
        next_retry = dp.next_retry()
        assert next_retry is not None and next_retry > now[0], (next_retry, now[0])


def test_ipv6_forwarding_off_is_reported_once_and_never_written(tmp_path: Path) -> None:
    """Serving IPv6, ``net.ipv6.conf.all.forwarding`` is read, never written: turning it on
    turns off router advertisements on every interface with accept_ra 1 (the node could lose
    its IPv6 default route), and upstream leaves it alone. Off, the pods' IPv6 replies cannot
    cross the node: that is reported once, as an unwritable sysctl is."""
    from ipvsproxy.core.plan import PlanConfig
    from tests.unit.fake_node import node

    h = node(tmp_path, plan_config=PlanConfig(families=(4, 6)))
    h.kernel.sysctls.values["net/ipv6/conf/all/forwarding"] = "0"
    _update(h.dp, "good", _good())
    result = h.dp.sync()
    assert [e for e in result.errors if "forwarding" in e] == [
        "sysctl net/ipv6/conf/all/forwarding is 0, not 1: IPv6 Services' replies from pods "
        "are not forwarded (ipvsproxy does not set it: turning IPv6 forwarding on turns off "
        "router advertisements on the node's interfaces)"
    ]
    assert h.kernel.sysctls.values["net/ipv6/conf/all/forwarding"] == "0"
    assert "net/ipv6/conf/all/forwarding" in h.dp.sysctl_failures
    assert h.dp.sysctls()["net/ipv6/conf/all/forwarding"] == "0"
    _programmed(h.dp, "default/good")
    assert [e for e in h.dp.reconcile().errors if "forwarding" in e] == []  # reported once


def test_ipv6_forwarding_is_not_read_where_ipv6_is_not_served(tmp_path: Path) -> None:
    from tests.unit.fake_node import node

    h = node(tmp_path)
    del h.kernel.sysctls.values["net/ipv6/conf/all/forwarding"]  # IPv6 disabled at boot
    _update(h.dp, "good", _good())
    assert h.dp.sync().errors == []
    assert "net/ipv6/conf/all/forwarding" not in h.dp.sysctls()
