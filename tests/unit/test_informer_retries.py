"""The informer's request rate when the API server misbehaves: 401 and 403 from the real
kube-apiserver; against a scripted server (tests/unit/fake_apiserver.py says why), a watch that
closes at once, 410 in the stream or as the answer over and over, an expired relist, a silent
socket. Time is a fake clock: the assertions are on the backoff sequence and on how
many requests a fixed number of failures costs, never on speed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import config

from ipvsproxy.config import ProxyConfig
from ipvsproxy.daemon.wiring import informers
from ipvsproxy.kube import client as kube_client
from ipvsproxy.kube.informer import Backoff, Informer
from ipvsproxy.servers.metrics import Metrics
from lab.cluster.controlplane import ControlPlane
from tests.unit.fake_apiserver import (
    GONE_EVENT,
    Answer,
    FakeAPI,
    Query,
    events,
    service_list,
    status_body,
)

# client-go's reflector backoff without jitter: 0.8 s doubling, capped at 30 s.
STEPS = [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0, 30.0]


class FakeTime:
    def __init__(self, stop: threading.Event) -> None:
        self.now = 1000.0
        self.slept: list[float] = []
        self.stop = stop

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> bool:
        self.slept.append(round(seconds, 6))
        self.now += seconds
        return self.stop.is_set()


@pytest.fixture
def stop() -> threading.Event:
    return threading.Event()


@pytest.fixture
def fake_time(stop: threading.Event) -> FakeTime:
    return FakeTime(stop)


Serve = Callable[..., FakeAPI]


@pytest.fixture
def serve(stop: threading.Event) -> Iterator[Serve]:
    servers: list[FakeAPI] = []

    def start(answer: Callable[[Query], Answer], **kw: Any) -> FakeAPI:
        servers.append(FakeAPI(answer, stop, **kw))
        return servers[-1]

    yield start
    stop.set()
    for s in servers:
        s.close()


def informer(fake: FakeAPI, stop: threading.Event, t: FakeTime, **kw: Any) -> Informer:
    return Informer(
        "services",
        kube_client.Lister(fake.api_client(), kube_client.SERVICES),
        lambda *_a: None,
        stop=stop,
        resource="services",
        clock=t.clock,
        sleep=t.sleep,
        backoff=Backoff(clock=t.clock, rand=lambda: 0.0),
        **kw,
    )


def after_watches(n: int) -> Callable[[list[Query]], bool]:
    return lambda reqs: sum(q.get("watch") == "true" for q in reqs) >= n


WATCH_ANSWERS = {
    "closed at once": Answer(),
    "410 event": events(GONE_EVENT),
    "HTTP 410": Answer(410, status_body(410, "Expired", "too old resource version: 10 (20)")),
}


@pytest.mark.parametrize("watch_answer", WATCH_ANSWERS.values(), ids=list(WATCH_ANSWERS))
def test_each_failed_watch_costs_one_relist_and_one_watch_after_a_backoff(
    serve: Serve, stop: threading.Event, fake_time: FakeTime, watch_answer: Answer
) -> None:
    """Ten failed watches: ten lists, ten watches, and client-go's backoff between each."""
    closes = 10

    def answer(q: Query) -> Answer:
        return watch_answer if q.get("watch") == "true" else service_list("10", ["a"])

    fake = serve(answer, stop_when=after_watches(closes))
    inf = informer(fake, stop, fake_time)
    inf.run()
    assert len(fake.watches()) == closes
    assert len(fake.lists()) == closes
    assert fake_time.slept == STEPS[: closes - 1]
    # The first list is served from the watch cache; every relist asks for data no older than
    # what was seen, without paging (so the watch cache can serve it too).
    assert [(q.get("resourceVersion"), q.get("limit")) for q in fake.lists()] == [("0", "500")] + [
        ("10", None)
    ] * (closes - 1)
    assert all(q.get("resourceVersion") == "10" for q in fake.watches())


def test_backoff_follows_client_go_and_resets_after_a_healthy_period() -> None:
    now = [0.0]
    rand = iter([0.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    b = Backoff(clock=lambda: now[0], rand=lambda: next(rand))
    got = []
    for _ in range(8):
        got.append(round(b.next(), 6))
        now[0] += got[-1]
    # The step doubles from 0.8 s to 30 s; jitter adds up to the step again.
    assert got == [0.8, 3.2, 4.8, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert round(b.next(), 6) == 60.0
    now[0] += 121  # two minutes without a backoff: the API server is taken as healthy again
    assert round(b.next(), 6) == 0.8


def test_a_healthy_watch_resets_the_backoff(
    serve: Serve, stop: threading.Event, fake_time: FakeTime
) -> None:
    """Four watches close at once, one lasts 3 minutes, the next closes at once: backoff
    starts again from 0.8 s."""

    def answer(q: Query) -> Answer:
        if q.get("watch") != "true":
            return service_list("10", ["a"])
        if len(fake.watches()) == 5:
            fake_time.now += 180
            return events({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "11"}}})
        return Answer()

    fake = serve(answer, stop_when=after_watches(7))
    informer(fake, stop, fake_time).run()
    # Watch 5 ends normally and is renewed at once (no backoff); watch 6 closes at once.
    assert fake_time.slept == [0.8, 1.6, 3.2, 6.4, 0.8]
    assert len(fake.lists()) == 6


EXPIRED_LIST = status_body(410, "Expired", "The resourceVersion for the provided list is too old.")
TOO_LARGE = status_body(
    504,
    "Timeout",
    "Too large resource version: 10, current: 9",
    details={
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]
    },
)


@pytest.mark.parametrize(
    "expired", [Answer(410, EXPIRED_LIST), Answer(504, TOO_LARGE)], ids=["expired", "too large"]
)
def test_a_relist_at_an_unavailable_resource_version_falls_back_to_a_quorum_list(
    serve: Serve, stop: threading.Event, fake_time: FakeTime, expired: Answer
) -> None:
    def answer(q: Query) -> Answer:
        if q.get("watch") == "true":
            return events(GONE_EVENT) if q.get("resourceVersion") == "10" else Answer()
        if q.get("resourceVersion") == "10":
            return expired
        return service_list("10" if q.get("resourceVersion") == "0" else "30", ["a"])

    fake = serve(answer, stop_when=after_watches(2))
    informer(fake, stop, fake_time).run()
    # The initial list, the relist at the last resourceVersion, then at once the latest state
    # (no resourceVersion: a quorum read, paged), and the watch goes on from there.
    assert [(q.get("resourceVersion"), q.get("limit")) for q in fake.lists()] == [
        ("0", "500"),
        ("10", None),
        (None, "500"),
    ]
    assert [q.get("resourceVersion") for q in fake.watches()] == ["10", "30"]
    assert fake_time.slept == [0.8]


def test_the_first_list_pages_from_resource_version_0(
    serve: Serve, stop: threading.Event, fake_time: FakeTime
) -> None:
    def answer(q: Query) -> Answer:
        if q.get("watch") == "true":
            return Answer()
        if q.get("continue"):
            return service_list("10", ["b"])
        return service_list("10", ["a"], token="t0k")

    fake = serve(answer, stop_when=after_watches(2))
    inf = informer(fake, stop, fake_time, page_size=1)
    inf.run()
    # Continue pages carry no resourceVersion (the API refuses both); a server that paged an
    # RV=0 list does not serve from a watch cache, so relists keep paging.
    pages = [(q.get("resourceVersion"), q.get("limit"), q.get("continue")) for q in fake.lists()]
    assert pages == [
        ("0", "1", None),
        (None, "1", "t0k"),
        ("10", "1", None),
        (None, "1", "t0k"),
    ]  # fmt: skip
    assert set(inf.cache) == {"default/a", "default/b"}


@pytest.fixture(scope="module")
def refused_kubeconfigs(
    controlplane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> dict[int, Path]:
    """Kubeconfigs the real kube-apiserver refuses: 401, a token it never issued; 403, a
    ServiceAccount that exists but that no RBAC rule allows anything."""
    d = tmp_path_factory.mktemp("refused")
    controlplane.call(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts",
        {"metadata": {"name": "no-rights"}},
    )
    return {
        401: controlplane.write_kubeconfig(d / "401", "not-a-token", user="nobody"),
        403: controlplane.service_account_kubeconfig("default", "no-rights", d / "403"),
    }


@pytest.mark.parametrize(
    ("code", "reason", "hint"),
    [(401, "Unauthorized", "token"), (403, "Forbidden", "RBAC")],
)
def test_401_and_403_back_off_and_say_what_to_fix(
    refused_kubeconfigs: dict[int, Path],
    stop: threading.Event,
    caplog: pytest.LogCaptureFixture,
    code: int,
    reason: str,
    hint: str,
) -> None:
    """Against the real kube-apiserver and its authenticator and authorizer."""
    t = FakeTime(stop)

    def sleep(seconds: float) -> bool:
        t.sleep(seconds)
        if len(t.slept) == 5:
            stop.set()
        return stop.is_set()

    new_client: Any = config.new_client_from_config
    inf = Informer(
        "services",
        kube_client.Lister(new_client(str(refused_kubeconfigs[code])), kube_client.SERVICES),
        lambda *_a: None,
        stop=stop,
        resource="services",
        clock=t.clock,
        sleep=sleep,
        backoff=Backoff(clock=t.clock, rand=lambda: 0.0),
    )
    with caplog.at_level(logging.WARNING, logger="ipvsproxy.kube.informer"):
        inf.run()
    assert t.slept == STEPS[:5]
    assert inf.counters.lists == 0
    refusals = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(refusals) == 5
    for text in refusals:
        assert f"{code} {reason}" in text
        assert "list and watch services" in text
        assert hint in text
    if code == 403:
        assert 'User "system:serviceaccount:default:no-rights" cannot list' in refusals[0]


def test_a_silent_watch_is_dropped_after_the_read_timeout_and_resumed(
    serve: Serve, stop: threading.Event, caplog: pytest.LogCaptureFixture
) -> None:
    """Quietly: an idle resource's watch is silent for the read timeout every time (the API
    server's bookmarks come about once a minute), so its resumption is logged at debug level."""

    def answer(q: Query) -> Answer:
        if q.get("watch") != "true":
            return service_list("10", ["a"])
        return Answer(silent=True) if len(fake.watches()) == 1 else Answer()

    fake = serve(answer, stop_when=after_watches(2))
    inf = Informer(
        "services",
        kube_client.Lister(fake.api_client(), kube_client.SERVICES),
        lambda *_a: None,
        stop=stop,
        read_timeout=1.5,
    )
    thread = threading.Thread(target=inf.run, daemon=True)
    with caplog.at_level(logging.DEBUG, logger="ipvsproxy.kube.informer"):
        thread.start()
        deadline = time.monotonic() + 20  # a failure bound only: the read timeout is 1.5 s
        while len(fake.watches()) < 2:
            assert time.monotonic() < deadline, "the silent watch was never noticed"
            time.sleep(0.05)
    resumed = [r for r in caplog.records if "resuming" in r.getMessage()]
    assert resumed, caplog.records
    assert all(r.levelno == logging.DEBUG for r in resumed), [r.levelname for r in resumed]
    # Resumed from where it was, without a relist.
    assert [q.get("resourceVersion") for q in fake.watches()] == ["10", "10"]
    assert len(fake.lists()) == 1


def test_the_daemon_notices_a_silent_watch_within_a_minute() -> None:
    """The mechanism above, as the daemon configures it."""
    proxy: Any = type("P", (), {"stop": threading.Event(), "metrics": Metrics()})()
    for name in ("on_service", "on_slice", "on_node"):
        setattr(proxy, name, lambda *_a: None)
    infs = informers(ProxyConfig(), object(), proxy, "node-1")
    assert {i.name for i in infs} == {"services", "endpointslices", "node"}
    for inf in infs:
        assert 0 < inf.read_timeout <= 60
