"""Informers against the real kube-apiserver with the official client: list, watch events, a
watch renewed when its timeoutSeconds ends, and an outage with a change and a compaction that
relists and reports only what differs."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, config

from ipvsproxy.kube.informer import Informer, Kept
from lab.cluster.controlplane import ControlPlane

Events = list[tuple[str, Kept | None, Kept | None]]


@pytest.fixture
def core(controlplane: ControlPlane) -> Any:
    new_client: Any = config.new_client_from_config
    return client.CoreV1Api(new_client(str(controlplane.kubeconfig)))


def namespace(api: Any, name: str) -> str:
    api.create_namespace({"metadata": {"name": name}})
    return name


def svc(name: str, port: int = 80) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"ports": [{"port": port}]}}


def wait(check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def restart_after_history_moved_on(cp: ControlPlane) -> None:
    """kube-apiserver goes away (SIGKILL a second after SIGTERM) and comes back after etcd's
    revision moved on (a write outside /registry, while it is down): its new watch cache starts
    after every resourceVersion a client saw before, so a watch resuming from one of them is
    answered 410 Gone."""
    cp.stop_apiserver(grace=1)
    cp.etcd_put("/lab-test/revision", str(time.time()))
    cp.start_apiserver()


class Gate:
    """The informer's backoff sleep, which the test can shut: while shut, an informer whose
    request failed waits here (``parked`` is set) instead of retrying."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.open = threading.Event()
        self.open.set()
        self.parked = threading.Event()

    def __call__(self, delay: float) -> bool:
        if not self.open.is_set():
            self.parked.set()
            self.open.wait()
        return self.stop.wait(min(delay, 0.2))


def test_lists_watches_then_relists_only_the_change_after_an_outage(
    controlplane: ControlPlane, core: Any
) -> None:
    cp, api = controlplane, core
    ns = namespace(api, "informer-outage")
    for i in range(5):
        api.create_namespaced_service(ns, svc(f"s{i}"))
    events: Events = []
    stop = threading.Event()
    gate = Gate(stop)
    inf = Informer(
        "services",
        functools.partial(api.list_namespaced_service, ns),
        lambda k, o, n: events.append((k, o, n)),
        stop=stop,
        page_size=2,
        watch_timeout=2,
        sleep=gate,
    )
    threading.Thread(target=inf.run, daemon=True).start()
    try:
        wait(inf.synced.is_set)
        assert sorted(k for k, o, n in events if o is None) == [f"{ns}/s{i}" for i in range(5)]
        assert inf.counters.lists == 1
        # Watch: an update and a delete arrive in order.
        events.clear()
        api.patch_namespaced_service("s1", ns, {"metadata": {"labels": {"x": "y"}}})
        api.delete_namespaced_service("s2", ns)
        wait(lambda: len(events) >= 2)
        assert [(k, o is not None, n is not None) for k, o, n in events] == [
            (f"{ns}/s1", True, True),
            (f"{ns}/s2", True, False),
        ]
        # The watch ends (timeoutSeconds) and is renewed from the last resourceVersion.
        wait(lambda: inf.counters.watches >= 2)
        # An outage: the informer's requests fail and it waits in its backoff (held shut here,
        # so what follows happens before it retries). A Service is created after the restart
        # and etcd is compacted; the informer's resourceVersion is then older than the new
        # watch cache: it relists, and the relist reports only the Service that changed.
        events.clear()
        gate.open.clear()
        cp.stop_apiserver(grace=1)
        wait(gate.parked.is_set)
        cp.etcd_put("/lab-test/revision", str(time.time()))
        cp.start_apiserver()
        api.create_namespaced_service(ns, svc("new", 81))
        cp.compact()
        gate.open.set()
        wait(lambda: inf.counters.lists >= 2)
        wait(lambda: any(k == f"{ns}/new" for k, _, _ in events))
        assert [k for k, _, _ in events] == [f"{ns}/new"]
        assert set(inf.cache) == {f"{ns}/{n}" for n in ("s0", "s1", "s3", "s4", "new")}
    finally:
        stop.set()
        gate.open.set()


def test_a_watch_from_an_expired_resource_version_relists(
    controlplane: ControlPlane, core: Any
) -> None:
    """The real server's 410 for a watch from a resourceVersion it no longer has: the watch
    ends asking for a relist, which asks for data no older than what was seen and reports
    only the change."""
    cp, api = controlplane, core
    ns = namespace(api, "informer-gone")
    api.create_namespaced_service(ns, svc("old"))
    events: Events = []
    inf = Informer(
        "services",
        functools.partial(api.list_namespaced_service, ns),
        lambda k, o, n: events.append((k, o, n)),
        stop=threading.Event(),
    )
    inf.relist()
    seen = inf.resource_version
    restart_after_history_moved_on(cp)
    api.create_namespaced_service(ns, svc("new"))
    cp.compact()
    events.clear()
    assert inf.watch_once() is False
    assert inf.counters.relists_after_gone == 1
    assert inf.resource_version == seen
    inf.relist()
    assert [k for k, _, _ in events] == [f"{ns}/new"]
    assert set(inf.cache) == {f"{ns}/old", f"{ns}/new"}
