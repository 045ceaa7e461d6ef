"""EndpointSlices reduced to endpoints: the API's edge cases (pure: no kernel)."""

from __future__ import annotations

from typing import Any

from ipvsproxy.model import Protocol
from ipvsproxy.objects import Endpoint, slice_endpoints
from tests.host.k8s_objects import endpoint, endpoint_slice


def endpoints(*slices: dict[str, Any]) -> list[Endpoint]:
    return slice_endpoints(slices, "http", Protocol.TCP)


def test_absent_conditions_mean_ready_and_serving() -> None:
    # EndpointConditions: "nil should be interpreted as ready"; serving defaults to ready.
    bare = {"addresses": ["10.244.1.11"], "nodeName": "node-1"}
    empty = {"addresses": ["10.244.1.12"], "nodeName": "node-1", "conditions": {}}
    unready = {"addresses": ["10.244.1.13"], "conditions": {"ready": False}}
    eps = {e.address: e for e in endpoints(endpoint_slice("web", [bare, empty, unready]))}
    for address in ("10.244.1.11", "10.244.1.12"):
        e = eps[address]
        assert (e.ready, e.serving, e.terminating) == (True, True, False), address
    e = eps["10.244.1.13"]
    assert (e.ready, e.serving, e.terminating) == (False, False, False)


def test_the_ready_copy_of_a_duplicated_endpoint_wins_in_either_order() -> None:
    ready = endpoint("10.244.1.11")
    unready = endpoint("10.244.1.11", ready=False, serving=False)
    for first, second in ((ready, unready), (unready, ready)):
        a = endpoint_slice("web", [first], name="web-a")
        b = endpoint_slice("web", [second], name="web-b")
        (e,) = endpoints(a, b)
        assert e.address == "10.244.1.11" and e.ready and e.serving
        # Within one slice too.
        (e,) = endpoints(endpoint_slice("web", [first, second]))
        assert e.ready


def test_only_the_first_address_of_an_endpoint_is_used() -> None:
    # The API allows up to 100 addresses per endpoint; consumers use the first (upstream too).
    ep = {**endpoint("10.244.1.11"), "addresses": ["10.244.1.11", "10.244.1.99"]}
    assert [e.address for e in endpoints(endpoint_slice("web", [ep]))] == ["10.244.1.11"]
