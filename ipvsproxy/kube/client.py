"""The few Kubernetes API calls ipvsproxy makes, through the official client's ApiClient.

The client's generated API classes (CoreV1Api, DiscoveryV1Api, EventsV1Api) wrap every method
of their groups in pydantic validators, built when the class is first used: memory spent on
every method of those groups, while ipvsproxy needs three list/watch calls and one create. So
the generated classes are never instantiated: each call is serialized and sent by the same
ApiClient (its configuration, authentication, TLS and connection pool), with the same query
parameters and headers the generated methods send, and fails with the same ApiException.
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

SERVICES = "/api/v1/services"
NODES = "/api/v1/nodes"
ENDPOINT_SLICES = "/apis/discovery.k8s.io/v1/endpointslices"
EVENTS = "/apis/events.k8s.io/v1/namespaces/{namespace}/events"

# The generated methods' keyword arguments and the query parameters they become, in the order
# they send them.
_QUERY = {
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "_continue": "continue",
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "limit": "limit",
    "resource_version": "resourceVersion",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}
_AUTH = ["BearerToken"]


def _send(api: Any, request: Any, timeout: Any, read: bool) -> Any:
    """The response (unread, as ``_preload_content=False`` returns it, unless ``read``); a
    non-2xx one raises ApiException, as the generated methods do."""
    resp = api.call_api(*request, _request_timeout=timeout)
    if read or not 200 <= resp.status <= 299:
        resp.read()
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response


class Lister:
    """``list_*_for_all_namespaces`` of one resource, as the informers call it: keyword
    arguments as the generated method takes them, the raw response back."""

    def __init__(self, api: Any, path: str) -> None:
        self.api = api
        self.path = path

    def __call__(
        self, *, _preload_content: bool = False, _request_timeout: Any = None, **params: Any
    ) -> Any:
        if _preload_content:
            raise ValueError("Lister returns the raw response: call with _preload_content=False")
        unknown = set(params) - set(_QUERY)
        if unknown:
            raise TypeError(f"unsupported list parameters: {', '.join(sorted(unknown))}")
        query = [(name, params[k]) for k, name in _QUERY.items() if params.get(k) is not None]
        request = self.api.param_serialize(
            method="GET",
            resource_path=self.path,
            query_params=query,
            header_params={"Accept": "application/json"},
            post_params=[],
            auth_settings=_AUTH,
        )
        return _send(self.api, request, _request_timeout, read=False)


def create_event(api: Any, namespace: str, body: dict[str, Any], timeout: Any = 10) -> None:
    """POST an events.k8s.io/v1 Event (EventsV1Api.create_namespaced_event)."""
    request = api.param_serialize(
        method="POST",
        resource_path=EVENTS,
        path_params={"namespace": namespace},
        body=body,
        header_params={"Accept": "application/json"},
        post_params=[],
        auth_settings=_AUTH,
    )
    _send(api, request, timeout, read=True)
