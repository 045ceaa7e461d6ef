"""The lab API server against the unmodified official ``kubernetes`` client.

Each test drives the server only through the client's public API (CoreV1Api, DiscoveryV1Api,
EventsV1Api, kubernetes.watch.Watch), so a pass means a real client library accepts what the
server says: list/watch semantics, resumption, 410 handling, bookmarks, selectors, paging,
the status subresource, errors and defaulting. Two requests the client cannot make (a
malformed body, the lab's compaction endpoint) use the standard library's HTTP client.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from lab.apiserver import APIServer

# The client's watch and config modules have no annotations; Any keeps mypy --strict content.
Watch: Any = watch.Watch
new_client_from_config: Any = config.new_client_from_config

REPO = Path(__file__).resolve().parents[2]
CIDR = ipaddress.ip_network("10.96.0.0/12")
NODE_PORTS = range(30000, 32768)


@pytest.fixture
def server() -> Iterator[APIServer]:
    with APIServer(host="127.0.0.1", port=0, bookmark_interval=1.0) as srv:
        yield srv


@pytest.fixture
def api(server: APIServer, tmp_path: Path) -> Iterator[Any]:
    path = server.write_kubeconfig(tmp_path / "kubeconfig")
    api_client = new_client_from_config(str(path))
    yield api_client
    api_client.close()


@pytest.fixture
def core(api: Any) -> Any:
    return client.CoreV1Api(api)


def service(name: str, labels: dict[str, str] | None = None, **spec: Any) -> Any:
    spec.setdefault("ports", [client.V1ServicePort(port=80)])
    return client.V1Service(
        metadata=client.V1ObjectMeta(name=name, labels=labels),
        spec=client.V1ServiceSpec(**spec),
    )


def status_body(exc: ApiException) -> dict[str, Any]:
    assert exc.body is not None
    body = json.loads(exc.body)
    assert body["kind"] == "Status" and body["status"] == "Failure", body
    assert body["code"] == exc.status, body
    return body  # type: ignore[no-any-return]


class Collector:
    """Runs Watch.stream in a thread so a test can write while it watches."""

    def __init__(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.watch: Any = Watch()
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(func, args, kwargs), daemon=True)
        self.thread.start()

    def _run(self, func: Callable[..., Any], args: Any, kwargs: Any) -> None:
        try:
            for event in self.watch.stream(func, *args, **kwargs):
                self.events.put(event)
        except BaseException as exc:
            self.error = exc
        finally:
            self.events.put(None)

    def take(
        self, count: int, timeout: float = 5.0, bookmarks: bool = False
    ) -> list[dict[str, Any]]:
        """The next ``count`` events (bookmarks skipped unless asked for)."""
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < count:
            event = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            assert event is not None, f"stream ended after {got} (error {self.error!r})"
            if bookmarks or event["type"] != "BOOKMARK":
                got.append(event)
        return got

    def rest(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Every event until the stream ends by itself."""
        got: list[dict[str, Any]] = []
        while (event := self.events.get(timeout=timeout)) is not None:
            got.append(event)
        self.thread.join(timeout)
        return got


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"].metadata.name) for e in events]


def rv(obj: Any) -> int:
    return int(obj.metadata.resource_version)


def test_list_and_watch_see_creates_updates_and_deletes_in_order(core: Any) -> None:
    listed = core.list_namespaced_service("default")
    assert listed.items == [] and listed.kind == "ServiceList" and listed.api_version == "v1"
    start = listed.metadata.resource_version
    watchers = [
        Collector(
            core.list_namespaced_service, "default", resource_version=start, timeout_seconds=10
        )
        for _ in range(2)
    ]
    created = core.create_namespaced_service("default", service("web", {"app": "web"}))
    created.metadata.labels["tier"] = "front"
    updated = core.replace_namespaced_service("web", "default", created)
    deleted = core.delete_namespaced_service("web", "default")

    for collector in watchers:
        events = collector.take(3)
        assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
        assert all(isinstance(e["object"], client.V1Service) for e in events)
        assert [rv(e["object"]) for e in events] == [rv(created), rv(updated), rv(deleted)]
        assert int(start) < rv(created) < rv(updated) < rv(deleted)
        assert events[0]["object"].spec.cluster_ip == created.spec.cluster_ip
        assert events[1]["object"].metadata.labels == {"app": "web", "tier": "front"}
        assert events[2]["object"].metadata.uid == created.metadata.uid
        assert events[2]["raw_object"]["kind"] == "Service"
        collector.watch.stop()
    assert core.list_namespaced_service("default").items == []


def test_watch_resumed_from_a_resource_version_misses_nothing(core: Any) -> None:
    core.create_namespaced_service("default", service("a"))
    start = core.list_namespaced_service("default").metadata.resource_version
    first = Collector(
        core.list_namespaced_service, "default", resource_version=start, timeout_seconds=10
    )
    core.create_namespaced_service("default", service("b"))
    core.patch_namespaced_service("a", "default", {"metadata": {"labels": {"v": "1"}}})
    seen = first.take(2)
    assert summary(seen) == [("ADDED", "b"), ("MODIFIED", "a")]
    first.watch.stop()
    first.thread.join(5)
    last = seen[-1]["object"].metadata.resource_version
    assert first.watch.resource_version == last

    # Changes while nobody watches...
    core.create_namespaced_service("default", service("c"))
    core.patch_namespaced_service("a", "default", {"metadata": {"labels": {"v": "2"}}})
    core.delete_namespaced_service("b", "default")

    resumed = Collector(
        core.list_namespaced_service, "default", resource_version=last, timeout_seconds=2
    )
    events = [e for e in resumed.rest() if e["type"] != "BOOKMARK"]
    assert summary(events) == [("ADDED", "c"), ("MODIFIED", "a"), ("DELETED", "b")]
    assert events[1]["object"].metadata.labels == {"v": "2"}
    versions = [rv(e["object"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(last)


def test_watch_from_a_compacted_resource_version_gets_410_and_a_relist_recovers(
    server: APIServer, core: Any
) -> None:
    old = core.list_namespaced_service("default").metadata.resource_version
    core.create_namespaced_service("default", service("a"))
    compacted = server.compact()
    expected = f"Expired: too old resource version: {old} ({compacted})"

    # The raw stream: HTTP 200, then one ERROR event carrying a 410 Status, then the end.
    resp = core.list_namespaced_service(
        "default",
        watch=True,
        resource_version=old,
        timeout_seconds=5,
        _preload_content=False,
        _request_timeout=10,
    )
    assert resp.status == 200
    lines = [json.loads(line) for line in resp.read().decode().splitlines() if line]
    assert len(lines) == 1 and lines[0]["type"] == "ERROR"
    assert lines[0]["object"]["code"] == 410 and lines[0]["object"]["reason"] == "Expired"
    assert lines[0]["object"]["message"] == f"too old resource version: {old} ({compacted})"

    # Watch.stream with a timeout does not retry: the 410 surfaces at once.
    with pytest.raises(ApiException) as no_retry:
        list(
            Watch().stream(
                core.list_namespaced_service, "default", resource_version=old, timeout_seconds=5
            )
        )
    assert no_retry.value.status == 410 and no_retry.value.reason == expected
    # Without one it retries once from the same version, then gives up the same way.
    with pytest.raises(ApiException) as retried:
        list(
            Watch().stream(
                core.list_namespaced_service, "default", resource_version=old, _request_timeout=10
            )
        )
    assert retried.value.status == 410 and retried.value.reason == expected

    relisted = core.list_namespaced_service("default")
    assert [s.metadata.name for s in relisted.items] == ["a"]
    fresh = Collector(
        core.list_namespaced_service,
        "default",
        resource_version=relisted.metadata.resource_version,
        timeout_seconds=10,
    )
    core.create_namespaced_service("default", service("b"))
    assert summary(fresh.take(1)) == [("ADDED", "b")]
    fresh.watch.stop()


def test_compaction_over_http_for_out_of_process_tests(server: APIServer, core: Any) -> None:
    core.create_namespaced_service("default", service("a"))
    request = urllib.request.Request(f"{server.url}/lab/compact", method="POST")
    with urllib.request.urlopen(request, timeout=5) as resp:
        answer = json.loads(resp.read())
    assert answer == {
        "resourceVersion": core.list_namespaced_service("default").metadata.resource_version
    }
    with pytest.raises(ApiException) as gone:
        list(
            Watch().stream(
                core.list_namespaced_service, "default", resource_version="1", timeout_seconds=5
            )
        )
    assert gone.value.status == 410


def test_bookmarks_arrive_only_when_asked_for(core: Any) -> None:
    start = core.list_namespaced_service("default").metadata.resource_version
    asked = Collector(
        core.list_namespaced_service,
        "default",
        resource_version=start,
        allow_watch_bookmarks=True,
        timeout_seconds=3,
    )
    silent = Collector(
        core.list_namespaced_service, "default", resource_version=start, timeout_seconds=3
    )
    time.sleep(1.5)
    created = core.create_namespaced_service("default", service("a"))

    events = asked.rest()
    marks = [e for e in events if e["type"] == "BOOKMARK"]
    # About one per second of the 3 s stream, the last one right before the stream ends.
    assert len(marks) >= 2 and events[-1]["type"] == "BOOKMARK", [e["type"] for e in events]
    for mark in marks:
        assert mark["raw_object"]["kind"] == "Service" and mark["raw_object"]["apiVersion"] == "v1"
        assert set(mark["raw_object"]["metadata"]) == {"resourceVersion"}
    versions = [int(m["raw_object"]["metadata"]["resourceVersion"]) for m in marks]
    assert versions == sorted(versions) and versions[0] >= int(start)
    assert versions[-1] >= rv(created)
    assert asked.watch.resource_version == str(versions[-1])
    assert [e["type"] for e in events if e["type"] != "BOOKMARK"] == ["ADDED"]

    assert [e["type"] for e in silent.rest()] == ["ADDED"]


def test_watch_list_sends_initial_events_then_an_end_bookmark(core: Any) -> None:
    for name in ("a", "b"):
        core.create_namespaced_service("default", service(name))
    stream = Collector(
        core.list_namespaced_service,
        "default",
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=10,
    )
    first = stream.take(3, bookmarks=True)
    assert [e["type"] for e in first] == ["ADDED", "ADDED", "BOOKMARK"]
    end = first[2]["raw_object"]["metadata"]
    assert end["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(end["resourceVersion"]) == max(rv(e["object"]) for e in first[:2])
    core.delete_namespaced_service("a", "default")
    assert summary(stream.take(1)) == [("DELETED", "a")]
    stream.watch.stop()


def test_label_and_field_selectors_on_list(core: Any) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="other")))
    for ns, name, labels in [
        ("default", "a", {"app": "a", "tier": "web"}),
        ("default", "b", {"app": "b"}),
        ("other", "c", {"app": "c", "tier": "db"}),
        ("other", "d", None),
    ]:
        core.create_namespaced_service(ns, service(name, labels))

    def names(**kwargs: Any) -> list[str]:
        return [s.metadata.name for s in core.list_service_for_all_namespaces(**kwargs).items]

    assert names(label_selector="app=a") == ["a"]
    assert names(label_selector="app==b") == ["b"]
    assert names(label_selector="app!=a") == ["b", "c", "d"]
    assert names(label_selector="app in (a, c)") == ["a", "c"]
    assert names(label_selector="app notin (a,c)") == ["b", "d"]
    assert names(label_selector="tier") == ["a", "c"]
    assert names(label_selector="!tier") == ["b", "d"]
    assert names(label_selector="app,tier=web") == ["a"]
    assert names(field_selector="metadata.namespace=other") == ["c", "d"]
    assert names(field_selector="metadata.name!=a,metadata.namespace==default") == ["b"]
    assert names(label_selector="app", field_selector="metadata.namespace=other") == ["c"]
    assert [
        s.metadata.name for s in core.list_namespaced_service("other", label_selector="tier").items
    ] == ["c"]

    with pytest.raises(ApiException) as bad_label:
        core.list_service_for_all_namespaces(label_selector="app in (a")
    assert bad_label.value.status == 400 and status_body(bad_label.value)["reason"] == "BadRequest"
    with pytest.raises(ApiException) as bad_field:
        core.list_service_for_all_namespaces(field_selector="spec.foo=bar")
    assert bad_field.value.status == 400
    assert '"spec.foo" is not a known field selector' in status_body(bad_field.value)["message"]


def test_selector_watches_see_objects_move_in_and_out(core: Any) -> None:
    start = core.list_namespaced_service("default").metadata.resource_version
    by_label = Collector(
        core.list_namespaced_service,
        "default",
        label_selector="app=web",
        resource_version=start,
        timeout_seconds=10,
    )
    by_name = Collector(
        core.list_namespaced_service,
        "default",
        field_selector="metadata.name=y",
        resource_version=start,
        timeout_seconds=10,
    )
    core.create_namespaced_service("default", service("x", {"app": "other"}))
    core.patch_namespaced_service("x", "default", {"metadata": {"labels": {"app": "web"}}})
    core.patch_namespaced_service(
        "x", "default", {"spec": {"ports": [{"port": 80, "name": "http"}]}}
    )
    moved_out = core.patch_namespaced_service(
        "x", "default", {"metadata": {"labels": {"app": "off"}}}
    )
    core.create_namespaced_service("default", service("y", {"app": "web"}))
    core.delete_namespaced_service("y", "default")

    events = by_label.take(5)
    assert summary(events) == [
        ("ADDED", "x"),
        ("MODIFIED", "x"),
        ("DELETED", "x"),
        ("ADDED", "y"),
        ("DELETED", "y"),
    ]
    # Leaving the selector reads as a delete of the last state that matched, at the change's RV.
    assert events[2]["object"].metadata.labels == {"app": "web"}
    assert rv(events[2]["object"]) == rv(moved_out)
    assert events[1]["object"].spec.ports[0].name == "http"
    assert summary(by_name.take(2)) == [("ADDED", "y"), ("DELETED", "y")]
    by_label.watch.stop()
    by_name.watch.stop()


def test_paging_is_complete_and_consistent_against_concurrent_writes(core: Any) -> None:
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="other")))
    original = set()
    for i in range(24):
        ns = "default" if i % 2 else "other"
        core.create_namespaced_service(ns, service(f"svc-{i:02d}", {"batch": "one"}))
        original.add((ns, f"svc-{i:02d}"))

    first = core.list_service_for_all_namespaces(limit=7)
    snapshot = first.metadata.resource_version
    assert len(first.items) == 7 and first.metadata.remaining_item_count == 17
    seen = [(s.metadata.namespace, s.metadata.name) for s in first.items]
    # Writes between pages: none of them may show in the rest of this list.
    core.create_namespaced_service("default", service("new-one"))
    core.delete_namespaced_service("svc-23", "default")
    core.delete_namespaced_service(seen[0][1], seen[0][0])
    core.patch_namespaced_service("svc-21", "default", {"metadata": {"labels": {"batch": "two"}}})

    token = first.metadata._continue
    pages = 1
    while token:
        page = core.list_service_for_all_namespaces(limit=7, _continue=token)
        assert page.metadata.resource_version == snapshot
        seen += [(s.metadata.namespace, s.metadata.name) for s in page.items]
        for item in page.items:
            assert rv(item) <= int(snapshot) and item.metadata.labels == {"batch": "one"}
        token = page.metadata._continue
        pages += 1
        if token:
            assert page.metadata.remaining_item_count == 24 - len(seen)
    assert pages == 4 and len(seen) == len(set(seen)) and set(seen) == original

    filtered = core.list_service_for_all_namespaces(limit=5, label_selector="batch=one")
    assert len(filtered.items) == 5 and filtered.metadata.remaining_item_count is None
    assert filtered.metadata._continue


def test_an_expired_continue_token_gets_410(server: APIServer, core: Any) -> None:
    for i in range(5):
        core.create_namespaced_service("default", service(f"s{i}"))
    first = core.list_namespaced_service("default", limit=2)
    assert [s.metadata.name for s in first.items] == ["s0", "s1"]
    core.create_namespaced_service("default", service("s9"))
    server.compact()
    with pytest.raises(ApiException) as expired:
        core.list_namespaced_service("default", limit=2, _continue=first.metadata._continue)
    body = status_body(expired.value)
    assert expired.value.status == 410 and body["reason"] == "Expired"
    assert body["message"].startswith("The provided continue parameter is too old")
    # The 410 carries a token that continues, inconsistently, from the latest state.
    rest = core.list_namespaced_service("default", _continue=body["metadata"]["continue"])
    assert [s.metadata.name for s in rest.items] == ["s2", "s3", "s4", "s9"]


def test_status_subresource_sets_load_balancer_ingress_and_replace_keeps_it(core: Any) -> None:
    created = core.create_namespaced_service("default", service("lb", type="LoadBalancer"))
    assert created.status.load_balancer.ingress is None

    created.status = client.V1ServiceStatus(
        load_balancer=client.V1LoadBalancerStatus(
            ingress=[client.V1LoadBalancerIngress(ip="203.0.113.10")]
        )
    )
    created.spec.session_affinity = "ClientIP"  # a status write must not change the spec
    written = core.replace_namespaced_service_status("lb", "default", created)
    assert [i.ip for i in written.status.load_balancer.ingress] == ["203.0.113.10"]
    assert written.status.load_balancer.ingress[0].ip_mode == "VIP"
    assert written.spec.session_affinity == "None" and rv(written) > rv(created)

    fetched = core.read_namespaced_service("lb", "default")
    fetched.metadata.labels = {"edited": "yes"}
    fetched.status = None
    replaced = core.replace_namespaced_service("lb", "default", fetched)
    assert replaced.metadata.labels == {"edited": "yes"}
    assert [i.ip for i in replaced.status.load_balancer.ingress] == ["203.0.113.10"]

    patch = {"status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.11", "ipMode": "Proxy"}]}}}
    patched = core.patch_namespaced_service_status("lb", "default", patch)
    assert [(i.ip, i.ip_mode) for i in patched.status.load_balancer.ingress] == [
        ("203.0.113.11", "Proxy")
    ]
    status_only = core.read_namespaced_service_status("lb", "default")
    assert status_only.status.load_balancer.ingress[0].ip == "203.0.113.11"

    with pytest.raises(ApiException) as bad:
        core.patch_namespaced_service_status(
            "lb", "default", {"status": {"loadBalancer": {"ingress": [{"ip": "not-an-ip"}]}}}
        )
    assert bad.value.status == 422
    assert (
        status_body(bad.value)["details"]["causes"][0]["field"]
        == "status.loadBalancer.ingress[0].ip"
    )


def test_errors_are_status_objects_with_the_real_codes_and_reasons(core: Any) -> None:
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_service("nope", "default")
    body = status_body(missing.value)
    assert missing.value.status == 404 and body["reason"] == "NotFound"
    assert body["message"] == 'services "nope" not found'
    assert body["details"] == {"name": "nope", "kind": "services"}

    first = core.create_namespaced_service("default", service("dup"))
    with pytest.raises(ApiException) as dup:
        core.create_namespaced_service("default", service("dup"))
    assert dup.value.status == 409 and status_body(dup.value)["reason"] == "AlreadyExists"
    assert status_body(dup.value)["message"] == 'services "dup" already exists'

    core.patch_namespaced_service("dup", "default", {"metadata": {"labels": {"v": "2"}}})
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_service("dup", "default", first)
    body = status_body(stale.value)
    assert stale.value.status == 409 and body["reason"] == "Conflict"
    assert body["message"] == (
        'Operation cannot be fulfilled on services "dup": the object has been modified; please '
        "apply your changes to the latest version and try again"
    )

    with pytest.raises(ApiException) as bad_ip:
        core.create_namespaced_service("default", service("bad", cluster_ip="not-an-ip"))
    body = status_body(bad_ip.value)
    assert bad_ip.value.status == 422 and body["reason"] == "Invalid"
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: "not-an-ip": must be a valid IP address, '
            "(e.g. 10.9.8.7 or 2001:db8::ffff)",
            "field": "spec.clusterIPs[0]",
        }
    ]
    assert body["message"].startswith('Service "bad" is invalid: spec.clusterIPs[0]: Invalid value')

    with pytest.raises(ApiException) as in_namespace:
        core.create_namespaced_service("missing", service("x"))
    assert in_namespace.value.status == 404
    assert status_body(in_namespace.value)["message"] == 'namespaces "missing" not found'


@pytest.mark.parametrize(
    ("spec", "field", "reason"),
    [
        ({"cluster_ip": "192.168.0.10"}, "spec.clusterIPs", "FieldValueInvalid"),
        ({"ports": [client.V1ServicePort(port=0)]}, "spec.ports[0].port", "FieldValueInvalid"),
        ({"ports": [client.V1ServicePort(port=70000)]}, "spec.ports[0].port", "FieldValueInvalid"),
        ({"ports": []}, "spec.ports", "FieldValueRequired"),
        (
            {"type": "NodePort", "ports": [client.V1ServicePort(port=80, node_port=40000)]},
            "spec.ports[0].nodePort",
            "FieldValueInvalid",
        ),
        (
            {
                "ports": [
                    client.V1ServicePort(port=80, name="a"),
                    client.V1ServicePort(port=81, name="a"),
                ]
            },
            "spec.ports[1].name",
            "FieldValueDuplicate",
        ),
        ({"type": "Bogus"}, "spec.type", "FieldValueNotSupported"),
    ],
)
def test_invalid_services_get_422_with_the_field(
    core: Any, spec: dict[str, Any], field: str, reason: str
) -> None:
    with pytest.raises(ApiException) as invalid:
        core.create_namespaced_service("default", service("svc", **spec))
    body = status_body(invalid.value)
    assert invalid.value.status == 422 and body["reason"] == "Invalid"
    # The first cause is the one provoked (a port of 0 also defaults targetPort to 0).
    assert (body["details"]["causes"][0]["field"], body["details"]["causes"][0]["reason"]) == (
        field,
        reason,
    )
    assert core.list_namespaced_service("default").items == []


def test_more_422s_bad_names_taken_node_ports_and_immutable_cluster_ip(core: Any) -> None:
    with pytest.raises(ApiException) as bad_name:
        core.create_namespaced_service("default", service("Bad_Name"))
    cause = status_body(bad_name.value)["details"]["causes"][0]
    assert bad_name.value.status == 422 and cause["field"] == "metadata.name"
    assert "DNS-1035 label" in cause["message"]

    taken = core.create_namespaced_service("default", service("np", type="NodePort"))
    port = taken.spec.ports[0].node_port
    clash = service("np2", type="NodePort", ports=[client.V1ServicePort(port=80, node_port=port)])
    with pytest.raises(ApiException) as allocated:
        core.create_namespaced_service("default", clash)
    cause = status_body(allocated.value)["details"]["causes"][0]
    assert (
        cause["field"] == "spec.ports[0].nodePort"
        and "provided port is already allocated" in cause["message"]
    )

    taken.spec.cluster_ip = "10.96.5.5"
    taken.spec.cluster_ips = ["10.96.5.5"]
    with pytest.raises(ApiException) as immutable:
        core.replace_namespaced_service("np", "default", taken)
    cause = status_body(immutable.value)["details"]["causes"][0]
    assert cause["field"] == "spec.clusterIPs[0]" and "may not change once set" in cause["message"]


def test_malformed_bodies_get_400_and_the_server_keeps_serving(
    server: APIServer, core: Any
) -> None:
    # The official client always serializes bodies itself, so a malformed one needs raw HTTP.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    for body in (
        b"{not json",
        b"[1, 2]",
        b'{"metadata": {"name": 5}}',
        b'{"spec": {"ports": [{"port": "80"}]}}',
    ):
        conn.request(
            "POST",
            "/api/v1/namespaces/default/services",
            body=body,
            headers={"Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        status = json.loads(resp.read())
        assert resp.status == 400 and status["reason"] == "BadRequest" and status["code"] == 400, (
            status
        )
    conn.request("POST", "/api/v1/namespaces/default/services/x", body=b"{}")
    resp = conn.getresponse()
    assert resp.status == 405 and json.loads(resp.read())["reason"] == "MethodNotAllowed"
    conn.close()
    assert core.create_namespaced_service("default", service("fine")).metadata.name == "fine"


def test_service_defaulting_allocates_ips_and_ports(core: Any) -> None:
    plain = core.create_namespaced_service("default", service("plain"))
    s = plain.spec
    assert ipaddress.ip_address(s.cluster_ip) in CIDR and s.cluster_ips == [s.cluster_ip]
    assert ipaddress.IPv4Address(s.cluster_ip) >= ipaddress.IPv4Address("10.96.0.10")
    assert (s.type, s.session_affinity, s.internal_traffic_policy) == (
        "ClusterIP",
        "None",
        "Cluster",
    )
    assert (s.ip_families, s.ip_family_policy, s.external_traffic_policy) == (
        ["IPv4"],
        "SingleStack",
        None,
    )
    assert (s.ports[0].protocol, s.ports[0].target_port, s.ports[0].node_port) == ("TCP", 80, None)
    assert (
        plain.metadata.uid and plain.metadata.generation == 1 and plain.metadata.creation_timestamp
    )

    other = core.create_namespaced_service("default", service("other"))
    assert other.spec.cluster_ip != s.cluster_ip
    assert (
        core.create_namespaced_service(
            "default", service("headless", cluster_ip="None")
        ).spec.cluster_ip
        == "None"
    )
    external = core.create_namespaced_service(
        "default", service("ext", type="ExternalName", external_name="example.com", ports=None)
    )
    assert external.spec.cluster_ip is None and external.spec.ip_families is None

    two_ports = [
        client.V1ServicePort(port=80, name="http"),
        client.V1ServicePort(port=443, name="https"),
    ]
    node_port = core.create_namespaced_service(
        "default", service("np", type="NodePort", ports=two_ports)
    )
    allocated = [p.node_port for p in node_port.spec.ports]
    assert all(p in NODE_PORTS for p in allocated) and len(set(allocated)) == 2
    assert node_port.spec.external_traffic_policy == "Cluster"
    fixed = service(
        "fixed", type="NodePort", ports=[client.V1ServicePort(port=80, node_port=30080)]
    )
    assert core.create_namespaced_service("default", fixed).spec.ports[0].node_port == 30080

    local = core.create_namespaced_service(
        "default", service("lb", type="LoadBalancer", external_traffic_policy="Local")
    )
    assert local.spec.health_check_node_port in NODE_PORTS
    assert local.spec.health_check_node_port != local.spec.ports[0].node_port
    assert local.spec.allocate_load_balancer_node_ports is True
    sticky = core.create_namespaced_service(
        "default", service("sticky", session_affinity="ClientIP")
    )
    assert sticky.spec.session_affinity_config.client_ip.timeout_seconds == 10800

    # A replace that leaves allocated values out keeps them, as on a real cluster.
    bare = service("np", type="NodePort", ports=[client.V1ServicePort(port=80, name="http")])
    kept = core.replace_namespaced_service("np", "default", bare)
    assert kept.spec.cluster_ip == node_port.spec.cluster_ip
    assert kept.spec.ports[0].node_port == allocated[0]
    assert kept.metadata.generation == 2
    # A no-op write is not a write: same resourceVersion.
    again = core.replace_namespaced_service("np", "default", kept)
    assert rv(again) == rv(kept)


def test_endpoint_slices_create_list_by_service_watch_and_delete(api: Any) -> None:
    discovery: Any = client.DiscoveryV1Api(api)

    def slice_for(svc: str, name: str, *ips: str) -> Any:
        return client.V1EndpointSlice(
            metadata=client.V1ObjectMeta(name=name, labels={"kubernetes.io/service-name": svc}),
            address_type="IPv4",
            endpoints=[
                client.V1Endpoint(
                    addresses=[ip], conditions=client.V1EndpointConditions(ready=True)
                )
                for ip in ips
            ],
            ports=[client.DiscoveryV1EndpointPort(port=8080)],
        )

    made = discovery.create_namespaced_endpoint_slice(
        "default", slice_for("web", "web-1", "10.244.0.5")
    )
    assert made.ports[0].protocol == "TCP" and made.ports[0].name == ""
    discovery.create_namespaced_endpoint_slice("default", slice_for("api", "api-1", "10.244.0.9"))
    listed = discovery.list_namespaced_endpoint_slice(
        "default", label_selector="kubernetes.io/service-name=web"
    )
    assert [s.metadata.name for s in listed.items] == ["web-1"]
    assert listed.items[0].endpoints[0].addresses == ["10.244.0.5"]
    assert len(discovery.list_endpoint_slice_for_all_namespaces().items) == 2

    watcher = Collector(
        discovery.list_namespaced_endpoint_slice,
        "default",
        label_selector="kubernetes.io/service-name=web",
        resource_version=listed.metadata.resource_version,
        timeout_seconds=10,
    )
    discovery.create_namespaced_endpoint_slice("default", slice_for("web", "web-2", "10.244.1.5"))
    discovery.create_namespaced_endpoint_slice("default", slice_for("api", "api-2", "10.244.1.9"))
    discovery.patch_namespaced_endpoint_slice(
        "web-1",
        "default",
        {"endpoints": [{"addresses": ["10.244.0.6"], "conditions": {"ready": False}}]},
    )
    gone = discovery.delete_namespaced_endpoint_slice("web-2", "default")
    assert gone["status"] == "Success" and gone["details"]["name"] == "web-2"
    events = watcher.take(3)
    assert summary(events) == [("ADDED", "web-2"), ("MODIFIED", "web-1"), ("DELETED", "web-2")]
    assert events[1]["object"].endpoints[0].addresses == ["10.244.0.6"]
    assert events[1]["object"].endpoints[0].conditions.ready is False
    assert isinstance(events[1]["object"], client.V1EndpointSlice)
    watcher.watch.stop()

    for bad, field in [
        (
            slice_for("web", "bad-1", "10.244.0.7").model_copy(update={"address_type": "Bogus"}),
            "addressType",
        ),
        (slice_for("web", "bad-2", "not-an-ip"), "endpoints[0].addresses[0]"),
        (
            slice_for("web", "bad-3").model_copy(
                update={"endpoints": [client.V1Endpoint(addresses=[])]}
            ),
            "endpoints[0].addresses",
        ),
    ]:
        with pytest.raises(ApiException) as invalid:
            discovery.create_namespaced_endpoint_slice("default", bad)
        assert invalid.value.status == 422
        assert [c["field"] for c in status_body(invalid.value)["details"]["causes"]] == [field]


def test_events_create_list_and_both_event_apis(api: Any, core: Any) -> None:
    svc = core.create_namespaced_service("default", service("web"))
    ref = client.V1ObjectReference(
        kind="Service", namespace="default", name="web", uid=svc.metadata.uid
    )
    core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="web.1"),
            involved_object=ref,
            reason="SyncedLoadBalancer",
            message="programmed 1 virtual server",
            type="Normal",
            event_time=svc.metadata.creation_timestamp,
            action="Sync",
            reporting_component="ipvsproxy",
            reporting_instance="ipvsproxy-node-1",
        ),
    )
    other_ref = client.V1ObjectReference(kind="Node", name="node-1")
    core.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="node.1"), involved_object=other_ref, reason="Started"
        ),
    )
    events = core.list_namespaced_event("default")
    assert [e.metadata.name for e in events.items] == ["node.1", "web.1"]
    only_web = core.list_event_for_all_namespaces(
        field_selector="involvedObject.name=web,involvedObject.kind=Service"
    )
    assert [(e.metadata.name, e.message) for e in only_web.items] == [
        ("web.1", "programmed 1 virtual server")
    ]
    assert [
        e.metadata.name
        for e in core.list_namespaced_event("default", field_selector="reason=Started").items
    ] == ["node.1"]

    events_v1: Any = client.EventsV1Api(api)
    seen = events_v1.read_namespaced_event("web.1", "default")
    assert (seen.regarding.name, seen.note, seen.reporting_controller) == (
        "web",
        "programmed 1 virtual server",
        "ipvsproxy",
    )
    events_v1.create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(name="web.2"),
            event_time=svc.metadata.creation_timestamp,
            regarding=ref,
            note="removed 1 real server",
            reason="Synced",
            action="Sync",
            type="Warning",
            reporting_controller="ipvsproxy",
            reporting_instance="ipvsproxy-node-1",
        ),
    )
    converted = core.read_namespaced_event("web.2", "default")
    assert (converted.involved_object.name, converted.message, converted.reporting_component) == (
        "web",
        "removed 1 real server",
        "ipvsproxy",
    )
    with pytest.raises(ApiException) as incomplete:
        events_v1.create_namespaced_event(
            "default",
            client.EventsV1Event(
                metadata=client.V1ObjectMeta(name="web.3"),
                event_time=svc.metadata.creation_timestamp,
                type="Normal",
            ),
        )
    assert incomplete.value.status == 422


def test_nodes_namespaces_and_discovery(api: Any, core: Any) -> None:
    assert {"default", "kube-system"} <= {n.metadata.name for n in core.list_namespace().items}
    made = core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="team")))
    assert made.status.phase == "Active" and made.metadata.labels == {
        "kubernetes.io/metadata.name": "team"
    }
    core.create_namespaced_service("team", service("web"))

    node = client.V1Node(
        metadata=client.V1ObjectMeta(name="node-1"),
        spec=client.V1NodeSpec(pod_cidr="10.244.1.0/24"),
    )
    created = core.create_node(node)
    assert created.spec.pod_cidrs == ["10.244.1.0/24"]
    core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name="node-2")))
    ready = {
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "192.0.2.1"}],
        }
    }
    patched = core.patch_node_status("node-1", ready)
    assert patched.status.addresses[0].address == "192.0.2.1"
    assert [
        n.metadata.name for n in core.list_node(field_selector="metadata.name=node-1").items
    ] == ["node-1"]

    resources = {r.name: r for r in core.get_api_resources().resources}
    assert resources["services"].short_names == ["svc"] and "watch" in resources["services"].verbs
    assert {"services/status", "nodes", "nodes/status", "events", "namespaces"} <= set(resources)
    assert not resources["nodes"].namespaced
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"discovery.k8s.io", "events.k8s.io"} <= groups
    assert client.VersionApi(api).get_code().git_version == "v1.34.0-ipvsproxy-lab"

    # Deleting a namespace takes what is in it along; the system ones cannot go.
    core.delete_namespace("team")
    assert (
        core.list_service_for_all_namespaces(field_selector="metadata.namespace=team").items == []
    )
    with pytest.raises(ApiException) as kept:
        core.delete_namespace("default")
    assert kept.value.status == 403


def test_stop_ends_watch_streams(server: APIServer, core: Any) -> None:
    streams = [
        Collector(core.list_namespaced_service, "default", timeout_seconds=60) for _ in range(3)
    ]
    core.create_namespaced_service("default", service("a"))
    for stream in streams:
        assert summary(stream.take(1)) == [("ADDED", "a")]
    started = time.monotonic()
    server.stop()
    for stream in streams:
        assert stream.rest(timeout=5) == []
        assert stream.error is None
    assert time.monotonic() - started < 5


def test_cli_serves_writes_kubeconfig_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kc"
    code = "import sys; from lab.apiserver import cli_main; sys.exit(cli_main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--listen", "127.0.0.1:0", "--kubeconfig", str(kubeconfig)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("lab apiserver listening on http://127.0.0.1:"), line
        api_client = new_client_from_config(str(kubeconfig))
        try:
            listed: Any = client.CoreV1Api(api_client).list_namespace()
            names = {n.metadata.name for n in listed.items}
        finally:
            api_client.close()
        assert "default" in names
        assert line.endswith(api_client.configuration.host)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_restarted_server_keeps_its_objects_and_resource_versions(tmp_path: Path) -> None:
    srv = APIServer(host="127.0.0.1", port=0).start()
    port = srv.port
    try:
        api_client = new_client_from_config(str(srv.write_kubeconfig(tmp_path / "kc")))
        core: Any = client.CoreV1Api(api_client)
        core.create_namespaced_service("default", service("kept"))
        rv = core.list_service_for_all_namespaces().metadata.resource_version
        srv.stop()
        srv.start()
        assert srv.port == port  # the same address, as a restarted apiserver has
        again = core.list_service_for_all_namespaces()
        assert [s.metadata.name for s in again.items] == ["kept"]
        assert again.metadata.resource_version == rv
        core.create_namespaced_service("default", service("after"))
        assert int(core.list_service_for_all_namespaces().metadata.resource_version) > int(rv)
    finally:
        srv.stop()
