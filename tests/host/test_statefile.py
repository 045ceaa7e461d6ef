"""The state file: what it writes, that it writes only on change, and that it reads back."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from ipvsproxy.identity import EndpointIdentity, ServiceIdentity, VirtualServerIdentity
from ipvsproxy.model import DestKey, Protocol, ServiceKey
from ipvsproxy.statefile import SERVERS_PER_PIECE, State, StateFile


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


def test_each_change_is_one_journal_line_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    assert sf.save(state)
    snapshot = path.read_text()
    assert not sf.save(state)
    # A replan that yields an equal identity (a new object) writes nothing.
    state.identities["ns/svc-03"] = identity("ns/svc-03", "10.96.1.3", {"10.244.1.3": "ns/p3"})
    assert not sf.save(state)
    drained = (ServiceKey("10.96.1.7", Protocol.TCP, 80), DestKey("10.244.1.7", 80))
    changes: list[Callable[[State], object]] = [
        lambda s: s.identities.__setitem__(
            "ns/svc-07", identity("ns/svc-07", "10.96.1.7", {"10.244.1.8": "ns/q8"})
        ),
        lambda s: s.draining_since.__setitem__(drained, 1800.25),
        lambda s: s.identities.pop("ns/svc-08"),
        lambda s: s.identities.__setitem__("ns/new", identity("ns/new", "10.96.2.1", {})),
        lambda s: s.virtual_servers.add(ServiceKey("10.96.0.3", Protocol.TCP, 443)),
        lambda s: s.virtual_servers.discard(ServiceKey("10.96.0.2", Protocol.UDP, 53)),
        lambda s: s.draining_since.pop(drained),
        lambda s: setattr(s, "rules_digest", "xyz"),
        lambda s: setattr(s, "iptables_fingerprint", "uvw"),
    ]
    for n, change in enumerate(changes, 1):
        change(state)
        assert sf.save(state)
        assert not sf.save(state)
        assert path.read_text() == snapshot  # the snapshot is left alone
        assert len(sf.journal.read_text().splitlines()) == n
        assert StateFile(path).load() == state
    # A loaded state file goes on journalling where it was.
    again = StateFile(path)
    assert again.load() == state
    state.identities["ns/svc-09"] = identity("ns/svc-09", "10.96.1.9", {})
    assert again.save(state)
    assert len(again.journal.read_text().splitlines()) == len(changes) + 1
    assert StateFile(path).load() == state


def test_many_virtual_servers_are_written_in_pieces_as_one_document(tmp_path: Path) -> None:
    state = sample()
    for i in range(2 * SERVERS_PER_PIECE + 7):  # three pieces, the last one short
        proto = (Protocol.TCP, Protocol.UDP, Protocol.SCTP)[i % 3]
        state.virtual_servers.add(ServiceKey(f"10.{i % 7}.{i // 250}.{i % 250}", proto, i % 9))
    sf = StateFile(tmp_path / "state.json")
    assert sf.save(state)
    text = (tmp_path / "state.json").read_text()
    assert text == json.dumps(state.to_json())
    assert StateFile(tmp_path / "state.json").load() == state


def test_a_journal_as_large_as_the_snapshot_is_folded_into_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = State()
    sf.save(state)
    for i in range(2000):  # a small snapshot: its journal may grow to JOURNAL_MIN_BYTES
        name = f"ns/svc-{i}"
        state.identities[name] = identity(name, f"10.97.{i // 250}.{i % 250}", {})
        assert sf.save(state)
        if not sf.journal.exists():
            break
    else:
        raise AssertionError("the journal was never folded into the snapshot")
    assert json.loads(path.read_text()) == state.to_json()
    assert StateFile(path).load() == state


def test_a_torn_last_line_is_ignored_and_the_next_save_rewrites(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    sf.save(state)
    state.rules_digest = "one"
    sf.save(state)
    with sf.journal.open("a") as f:
        f.write('{"rules": ["tw')  # a crash while appending
    reader = StateFile(path)
    loaded = reader.load()
    assert loaded.rules_digest == "one"
    loaded.rules_digest = "two"
    assert reader.save(loaded)
    assert not reader.journal.exists()  # rewritten as a snapshot, the torn line gone
    assert json.loads(path.read_text()) == loaded.to_json()
    assert StateFile(path).load() == loaded


def test_a_bad_journal_line_before_the_last_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    sf.save(sample())
    sf.journal.write_text('{"rules": ["a", "b"]}\nnot json\n{"rules": ["c", "d"]}\n')
    with pytest.raises(ValueError, match=r"state\.json is unreadable"):
        StateFile(path).load()


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
