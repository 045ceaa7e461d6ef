"""ipvsproxy's own calls send exactly the requests the official client's generated API methods
send (method, URL with its query, headers, body), through the same ApiClient, and fail alike.
The requests are captured where the ApiClient would send them."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ipvsproxy.kube import client as kube_client
from ipvsproxy.kube.events import EventRecorder


class Sent(Exception):
    """Raised by the capturing call_api, carrying the request."""


def capturing_client() -> Any:
    conf = client.Configuration(host="https://api.example:6443")
    conf.api_key = {"BearerToken": "t0ken"}
    conf.api_key_prefix = {"BearerToken": "Bearer"}
    api: Any = client.ApiClient(conf)

    def call_api(*request: Any, _request_timeout: Any = None) -> Any:
        raise Sent(request, _request_timeout)

    api.call_api = call_api
    return api


def sent(call: Any) -> tuple[Any, ...]:
    with pytest.raises(Sent) as exc:
        call()
    return tuple(exc.value.args)


LIST_CALLS: list[dict[str, Any]] = [
    {"limit": 500, "label_selector": "!service.kubernetes.io/headless"},
    {"limit": 500, "_continue": "tok3n", "field_selector": "metadata.name=node-1"},
    {
        "watch": True,
        "resource_version": "1234",
        "allow_watch_bookmarks": True,
        "timeout_seconds": 300,
        "label_selector": "kubernetes.io/service-name",
    },
]


@pytest.mark.parametrize("kwargs", LIST_CALLS)
@pytest.mark.parametrize(
    ("path", "generated"),
    [
        (kube_client.SERVICES, lambda api: client.CoreV1Api(api).list_service_for_all_namespaces),
        (kube_client.NODES, lambda api: client.CoreV1Api(api).list_node),
        (
            kube_client.ENDPOINT_SLICES,
            lambda api: client.DiscoveryV1Api(api).list_endpoint_slice_for_all_namespaces,
        ),
    ],
)
def test_lists_and_watches_send_what_the_generated_methods_send(
    path: str, generated: Any, kwargs: dict[str, Any]
) -> None:
    api = capturing_client()
    opts: dict[str, Any] = {"_preload_content": False, "_request_timeout": (10, 330)}
    theirs = sent(lambda: generated(api)(**kwargs, **opts))
    ours = sent(lambda: kube_client.Lister(api, path)(**kwargs, **opts))
    assert ours == theirs
    (method, url, headers, *_), timeout = ours
    assert method == "GET" and url.startswith("https://api.example:6443" + path + "?")
    assert headers["authorization"] == "Bearer t0ken" and timeout == (10, 330)


def an_event() -> dict[str, Any]:
    """A body as the daemon's EventRecorder builds it."""
    posted: list[dict[str, Any]] = []
    recorder = EventRecorder(lambda ns, body: posted.append(body), "node-1")
    assert recorder.warn("ns-1/web", "Invalid", "spec.ports[0].port: 0 is out of range")
    recorder.queue.join()
    recorder.close()
    return posted[0]


def test_an_event_is_posted_as_the_generated_method_posts_it() -> None:
    api = capturing_client()
    body: Any = an_event()
    theirs = sent(lambda: client.EventsV1Api(api).create_namespaced_event("ns-1", body))
    ours = sent(lambda: kube_client.create_event(api, "ns-1", body))
    (method, url, headers, body_sent, form), _timeout = ours
    assert (method, url, headers, form) == theirs[0][:3] + theirs[0][4:]
    assert url == "https://api.example:6443/apis/events.k8s.io/v1/namespaces/ns-1/events"
    # The same document; the generated method re-renders the time it parsed (+00:00, not Z).
    theirs_body = dict(theirs[0][3])
    assert _instant(body_sent.pop("eventTime")) == _instant(theirs_body.pop("eventTime"))
    assert body_sent == theirs_body


def _instant(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_unknown_parameters_and_preloading_are_refused() -> None:
    lister = kube_client.Lister(capturing_client(), kube_client.SERVICES)
    with pytest.raises(TypeError, match="pretty"):
        lister(pretty="true")
    with pytest.raises(ValueError, match="_preload_content"):
        lister(_preload_content=True)


class Response:
    """A RESTResponse as call_api returns it."""

    def __init__(self, status: int, data: bytes) -> None:
        self.status, self.data, self.reason = status, data, "Gone" if status == 410 else "OK"
        self.response = self
        self.headers: dict[str, str] = {}
        self.read_count = 0

    def read(self) -> bytes:
        self.read_count += 1
        return self.data

    def getheaders(self) -> dict[str, str]:
        return {}


def test_a_failed_call_raises_the_clients_api_exception_and_a_good_one_is_not_read() -> None:
    api = capturing_client()
    failed = Response(410, b'{"kind":"Status","code":410}')
    api.call_api = lambda *r, _request_timeout=None: failed
    with pytest.raises(ApiException) as exc:
        kube_client.Lister(api, kube_client.SERVICES)(limit=1)
    assert exc.value.status == 410 and failed.read_count == 1
    good = Response(200, b'{"items":[]}')
    api.call_api = lambda *r, _request_timeout=None: good
    assert kube_client.Lister(api, kube_client.SERVICES)(limit=1) is good
    assert good.read_count == 0  # the informer reads it (or streams a watch)
    kube_client.create_event(api, "ns", {})
    assert good.read_count == 1
