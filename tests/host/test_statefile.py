"""The state file: what it writes, that it writes only on change, and that it reads back."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from ipvsproxy.identity import EndpointIdentity, ServiceIdentity, VirtualServerIdentity
from ipvsproxy.model import DestKey, Protocol, ServiceKey
from ipvsproxy.statefile import State, StateFile


def identity(service: str, address: str, pods: dict[str, str]) -> ServiceIdentity:
    key = ServiceKey(address, Protocol.TCP, 80)
    vs = VirtualServerIdentity(service, "http", 80, "ClusterIP", "ClusterIP")
    return ServiceIdentity.of(
        {key: vs}, {ip: EndpointIdentity(pod, "node-1") for ip, pod in pods.items()}
    )


def sample() -> State:
    state = State(
        virtual_servers={
            ServiceKey("10.96.0.2", Protocol.UDP, 53),
            ServiceKey("192.168.56.11", Protocol.TCP, 30080),
        },
        draining_since={
            (ServiceKey("10.96.0.2", Protocol.UDP, 53), DestKey("10.244.1.9", 53)): 1700.5
        },
        rules_digest="abc",
        iptables_fingerprint="def",
    )
    for i in range(30):
        name = f"ns/svc-{i:02d}"
        state.identities[name] = identity(name, f"10.96.1.{i}", {f"10.244.1.{i}": f"ns/p{i}"})
    return state


def test_the_document_is_the_json_of_to_json(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "state.json")
    state = sample()
    assert sf.save(state)
    text = (tmp_path / "state.json").read_text()
    assert text == json.dumps(state.to_json())
    assert StateFile(tmp_path / "state.json").load() == state


def test_only_a_change_is_written_and_each_change_is(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    assert sf.save(state)
    assert not sf.save(state)
    # A replan that yields an equal identity (a new object) writes nothing.
    state.identities["ns/svc-03"] = identity("ns/svc-03", "10.96.1.3", {"10.244.1.3": "ns/p3"})
    assert not sf.save(state)
    changes: list[Callable[[State], object]] = [
        lambda s: s.identities.__setitem__(
            "ns/svc-07", identity("ns/svc-07", "10.96.1.7", {"10.244.1.7": "ns/q7"})
        ),
        lambda s: s.identities.pop("ns/svc-08"),
        lambda s: s.identities.__setitem__("ns/new", identity("ns/new", "10.96.2.1", {})),
        lambda s: s.virtual_servers.add(ServiceKey("10.96.0.3", Protocol.TCP, 443)),
        lambda s: s.virtual_servers.discard(ServiceKey("10.96.0.2", Protocol.UDP, 53)),
        lambda s: s.draining_since.clear(),
        lambda s: setattr(s, "rules_digest", "xyz"),
        lambda s: setattr(s, "iptables_fingerprint", "uvw"),
    ]
    for change in changes:
        change(state)
        assert sf.save(state)
        assert path.read_text() == json.dumps(state.to_json())
        assert not sf.save(state)
    assert StateFile(path).load() == state


def test_a_loaded_state_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    StateFile(path).save(sample())
    sf = StateFile(path)
    state = sf.load()
    assert not sf.save(state)
    assert sf.save(replace(state, rules_digest="changed"))


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text('{"version": 99}')
    with pytest.raises(ValueError, match=r"state\.json is unreadable: unsupported state file"):
        StateFile(path).load()
    path.write_text("{")
    with pytest.raises(ValueError, match="unreadable"):
        StateFile(path).load()
    assert StateFile(tmp_path / "absent.json").load() == State()
