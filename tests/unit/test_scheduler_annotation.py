"""A Service's own IPVS scheduler: the annotation ipvsproxy.io/scheduler (kube-router's
kube-router.io/service.scheduler, named for ipvsproxy) overrides ipvs.scheduler for that
Service's virtual servers; a name that is not an IPVS scheduler makes the Service invalid, which
its Warning Event and `ipvsproxy status` report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.plan import SVC_F_SCHED_SH_PORT, NodeFacts, PlanConfig, plan_service
from ipvsproxy.core.service_ports import SCHEDULER_ANNOTATION, InvalidObject, service_ports
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kube import slim
from tests.unit.fake_node import node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

NODE = NodeFacts(name="node-1", node_ips=("192.168.56.11",), primary_ip="192.168.56.11")
KEY = ServiceKey("10.96.0.70", Protocol.TCP, 80)


def annotated(value: str | None) -> dict[str, Any]:
    svc = service("w", "10.96.0.70")
    if value is not None:
        svc["metadata"]["annotations"] = {SCHEDULER_ANNOTATION: value, "other": "x"}
    return svc


def test_the_annotation_names_the_services_scheduler() -> None:
    assert SCHEDULER_ANNOTATION == "ipvsproxy.io/scheduler"
    assert {sp.scheduler for sp in service_ports(annotated("wlc"))} == {"wlc"}
    assert {sp.scheduler for sp in service_ports(annotated(None))} == {None}


def test_an_unknown_scheduler_is_an_invalid_service() -> None:
    with pytest.raises(InvalidObject) as exc:
        service_ports(annotated("fastest"))
    assert str(exc.value).startswith(
        "service default/w: annotation ipvsproxy.io/scheduler: 'fastest' is not an IPVS scheduler"
    )
    plan = plan_service(annotated("fastest"), [], NODE, PlanConfig())
    assert plan.error is not None and "'fastest'" in plan.error
    assert not plan.virtual_servers


def test_the_plan_uses_the_annotation_over_the_configuration() -> None:
    vs = plan_service(annotated("sh"), [], NODE, PlanConfig(scheduler="lc")).virtual_servers[KEY]
    assert (vs.scheduler, vs.flags) == ("sh", 0)
    vs = plan_service(annotated(None), [], NODE, PlanConfig(scheduler="lc")).virtual_servers[KEY]
    assert vs.scheduler == "lc"
    # mh takes its flag whichever way it is chosen.
    vs = plan_service(annotated("mh"), [], NODE, PlanConfig()).virtual_servers[KEY]
    assert (vs.scheduler, vs.flags) == ("mh", SVC_F_SCHED_SH_PORT)
    vs = plan_service(annotated("rr"), [], NODE, PlanConfig(scheduler="mh")).virtual_servers[KEY]
    assert (vs.scheduler, vs.flags) == ("rr", 0)


def test_the_informers_slim_service_keeps_the_annotation_only() -> None:
    kept = slim.service(annotated("wrr"))
    assert dict(kept["metadata"]["annotations"]) == {SCHEDULER_ANNOTATION: "wrr"}
    assert {sp.scheduler for sp in service_ports(kept)} == {"wrr"}
    assert "annotations" not in slim.service(annotated(None))["metadata"]


def test_a_change_of_the_annotation_reprograms_the_virtual_server(tmp_path: Path) -> None:
    """Set, changed and removed: the kernel's virtual server follows (one SET each); an unknown
    name is the Service's error, which status reports as invalid."""
    n = node(tmp_path)
    key = ServiceKey("10.96.0.10", Protocol.TCP, 80)
    svc = service("web", key.address)
    slices = [endpoint_slice("web", [endpoint("10.244.1.11")])]

    def scheduler(value: str | None) -> str:
        svc["metadata"]["annotations"] = {} if value is None else {SCHEDULER_ANNOTATION: value}
        n.dp.update_service("default/web", svc, slices)
        result = n.sync()
        assert (result.errors, result.failed) == ([], {})
        return n.kernel.ipvs.virtual_servers[key].scheduler

    assert scheduler(None) == "rr"
    assert scheduler("wlc") == "wlc"
    assert scheduler(None) == "rr"
    svc["metadata"]["annotations"] = {SCHEDULER_ANNOTATION: "nope"}
    n.dp.update_service("default/web", svc, slices)
    assert "'nope' is not an IPVS scheduler" in n.dp.errors["default/web"]
