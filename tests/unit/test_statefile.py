"""The state file: what it writes, that it writes only on change, and that it reads back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.identities import EndpointIdentity, ServiceIdentity, VirtualServerIdentity
from ipvsproxy.core.virtual_servers import DestKey, Protocol, ServiceKey
from ipvsproxy.dataplane.statefile import (
    SERVERS_PER_PIECE,
    STATE_FILE_MAX_BYTES,
    State,
    StateFile,
    StateLock,
    StateLocked,
)


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
    assert text == json.dumps(state.to_json(json.loads(text)["generation"]))
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
    assert text == json.dumps(state.to_json(json.loads(text)["generation"]))
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
    doc = json.loads(path.read_text())
    assert doc == state.to_json(doc["generation"])
    assert StateFile(path).load() == state


def _journalled(tmp_path: Path, digest: str) -> tuple[Path, StateFile, State]:
    """A state file with its snapshot of ``sample()`` and one journal line after it (the
    rules digest set to ``digest``)."""
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    sf.save(state)
    state.rules_digest = digest
    sf.save(state)
    return path, sf, state


def test_a_torn_last_line_is_ignored_and_the_next_save_rewrites(tmp_path: Path) -> None:
    path, sf, _ = _journalled(tmp_path, "one")
    with sf.journal.open("a") as f:
        f.write('{"rules": ["tw')  # a crash while appending
    reader = StateFile(path)
    loaded = reader.load()
    assert loaded.rules_digest == "one"
    loaded.rules_digest = "two"
    assert reader.save(loaded)
    assert not reader.journal.exists()  # rewritten as a snapshot, the torn line gone
    doc = json.loads(path.read_text())
    assert doc == loaded.to_json(doc["generation"])
    assert StateFile(path).load() == loaded


def test_a_loaded_state_is_not_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    StateFile(path).save(sample())
    sf = StateFile(path)
    state = sf.load()
    assert not sf.save(state)
    assert sf.save(replace(state, rules_digest="changed"))


# -- robustness: what a crash, a full disk or a second instance must not break -------------------


@pytest.mark.parametrize(
    "content",
    [
        "",  # empty
        "{",  # truncated JSON
        '{"version": 1, "virtualServers": [["10.96.0.1", "TCP"',  # truncated document
        '{"version": 99, "virtualServers": []}',  # written by a newer ipvsproxy
        '{"version": 1, "virtualServers": [["10.96.0.1", "XYZ", 80]]}',  # corrupt content
        "[1, 2, 3]",  # not an object
        "\x00\xff\xfe garbage",  # not even text
    ],
)
def test_a_corrupt_empty_or_newer_file_loads_as_empty_and_says_why(
    tmp_path: Path, content: str
) -> None:
    path = tmp_path / "state.json"
    path.write_bytes(content.encode("latin-1"))
    sf = StateFile(path)
    assert sf.load() == State()
    assert sf.unreadable is not None and "state.json" in sf.unreadable
    # The next save replaces it with a readable snapshot.
    assert sf.save(sample())
    again = StateFile(path)
    assert again.load() == sample()
    assert again.unreadable is None


def test_a_bad_journal_line_keeps_what_came_before_it_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    sf.save(sample())
    state = sample()
    state.rules_digest = "a"
    sf.save(state)
    with sf.journal.open("a") as f:
        f.write('not json\n{"rules": ["c", "d"]}\n')
    reader = StateFile(path)
    assert reader.load() == state
    assert reader.unreadable is not None and "journal" in reader.unreadable
    assert reader.save(state)  # rewritten whole: the bad lines are gone
    assert not reader.journal.exists()
    assert StateFile(path).load() == state


def test_a_crash_between_rename_and_journal_removal_replays_no_old_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    sf.save(state)
    state.rules_digest = "old"
    sf.save(state)  # a journal line setting "old"
    assert sf.journal.exists()
    state.rules_digest = "new"
    for i in range(4000):  # a change larger than the journal may grow: a new snapshot
        state.virtual_servers.add(ServiceKey(f"10.97.{i // 250}.{i % 250}", Protocol.TCP, 80))
    real_unlink = Path.unlink

    def crash(self: Path, missing_ok: bool = False) -> None:
        if self == sf.journal:
            raise KeyboardInterrupt("killed after the rename")
        real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", crash)
    with pytest.raises(KeyboardInterrupt):
        sf.save(state)
    monkeypatch.undo()
    assert sf.journal.exists()  # the old journal survived the crash
    assert StateFile(path).load() == state  # its "old" line is not replayed over "new"


def test_writes_are_fsynced_file_then_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync " + os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    sf.save(state)
    tmp_name = events[0].removeprefix("fsync ")
    assert tmp_name != "state.json" and events[1:] == ["replace", f"fsync {tmp_path.name}"]
    events.clear()
    state.rules_digest = "changed"
    sf.save(state)  # a journal line: the new journal file, then its directory entry
    assert events == ["fsync state.json.journal", f"fsync {tmp_path.name}"]
    events.clear()
    state.rules_digest = "again"
    sf.save(state)
    assert events == ["fsync state.json.journal"]


def test_temporary_files_never_pile_up(tmp_path: Path) -> None:
    import signal

    path = tmp_path / "state.json"
    for i in range(3):  # killed three times while writing a snapshot, before its rename
        pid = os.fork()
        if pid == 0:  # the child: SIGKILLed where the rename would be

            def killed(src: Any, dst: Any) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            os.replace = killed  # type: ignore[assignment]
            state = sample()
            state.rules_digest = str(i)
            StateFile(path).save(state)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    left = list(tmp_path.iterdir())
    assert len(left) == 1 and left[0] != path  # one temporary file, however many crashes
    sf = StateFile(path)
    assert sf.load() == State()
    assert list(tmp_path.iterdir()) == left  # a reader leaves it: it may be the daemon's
    assert sf.open() == State()
    assert list(tmp_path.iterdir()) == []  # cleaned at the next start
    sf.save(sample())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


@pytest.mark.parametrize("errno_", ["ENOSPC", "EROFS"])
def test_a_failed_write_raises_and_the_next_save_writes_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno_: str
) -> None:
    import errno
    import os

    code = getattr(errno, errno_)
    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    sf.save(state)
    real_open = os.open

    def failing_open(p: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if code == errno.EROFS and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(code, os.strerror(code), str(p))
        return real_open(p, flags, mode, **kw)

    def failing_fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "open", failing_open)
    monkeypatch.setattr(os, "fsync", failing_fsync)
    for digest in ("one", "two"):  # a journal line, then (failed before) a snapshot
        state.rules_digest = digest
        with pytest.raises(OSError) as exc:
            sf.save(state)
        assert exc.value.errno == code
    state.identities.clear()  # a snapshot-sized change
    with pytest.raises(OSError):
        sf.save(state)
    monkeypatch.undo()
    assert sf.save(state)  # writes again once the disk has room
    assert StateFile(path).load() == state
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _hold_lock(path: Path) -> subprocess.Popen[str]:
    """A second process that takes the state file's lock and holds it until its stdin closes."""
    code = (
        "import sys; from pathlib import Path; "
        "from ipvsproxy.dataplane.statefile import StateLock; "
        f"lock = StateLock.acquire(Path({str(path)!r}), wait=False); "
        "print('locked', flush=True); sys.stdin.read()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
    return proc


def test_a_second_instance_is_told_who_holds_the_lock_and_waits_for_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    holder = _hold_lock(path)
    try:
        with pytest.raises(StateLocked) as exc:
            StateLock.acquire(path, wait=False)
        assert f"pid {holder.pid}" in str(exc.value) and "state.json.lock" in str(exc.value)
        told: list[str] = []
        got: list[StateLock] = []
        waiter = threading.Thread(
            target=lambda: got.append(StateLock.acquire(path, wait=True, on_wait=told.append))
        )
        waiter.start()
        waiter.join(timeout=2)
        assert waiter.is_alive() and not got  # still waiting while the other one runs
        assert len(told) == 1 and f"pid {holder.pid}" in told[0] and "waiting" in told[0]
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
    waiter.join(timeout=60)
    assert got and str(os.getpid()) in got[0].path.read_text()
    got[0].release()
    StateLock.acquire(path, wait=False).release()


def test_cleanup_refuses_while_the_daemon_holds_the_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ipvsproxy import cli

    path = tmp_path / "state.json"
    path.write_text("{}")
    holder = _hold_lock(path)
    try:
        assert cli.main(["cleanup", "--state-file", str(path)]) == 1
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
    err = capsys.readouterr().err
    assert f"pid {holder.pid}" in err and "state.json.lock" in err
    assert path.read_text() == "{}"  # nothing touched


# -- hostile or damaged files: reported, what can be read is kept, never a crash -----------------

_GOOD_VS = ["10.96.0.2", "UDP", 53]


@pytest.mark.parametrize(
    "bad_entry",
    [
        ["10.96.0.1", "TCP", 1e400],  # a float too large for an int (OverflowError)
        ["10.96.0.1", "TCP", 10**30],  # no port
        ["10.96.0.1", "TCP", -1],
        ["10.96.0.1", "TCP", True],
        ["10.96.0.1", "TCP", "80"],
        [None, "TCP", 80],  # would break sorting at the next save
        ["not an address", "TCP", 80],
        ["10.96.0.1", "TCP"],
        "10.96.0.1",
        {"address": "10.96.0.1"},
        ["10.96.0.1", ["TCP"], 80],
    ],
)
def test_a_bad_virtual_server_entry_is_skipped_and_the_rest_kept(
    tmp_path: Path, bad_entry: Any
) -> None:
    path = tmp_path / "state.json"
    doc = sample().to_json("g1")
    doc["virtualServers"] = [_GOOD_VS, bad_entry, ["192.168.56.11", "TCP", 30080]]
    path.write_text(json.dumps(doc))
    sf = StateFile(path)
    loaded = sf.load()
    assert loaded == sample()  # everything else, the good virtual servers among it
    assert sf.unreadable is not None and "virtualServers" in sf.unreadable
    assert sf.save(loaded)  # rewritten whole, without the bad entry
    again = StateFile(path)
    assert again.load() == sample() and again.unreadable is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("drainingSince", [["10.96.0.2", "UDP", 53, "10.244.1.9", 53, 1e400]]),  # inf
        ("drainingSince", [["10.96.0.2", "UDP", 53, "10.244.1.9", 1e400, 1.0]]),
        ("drainingSince", [["10.96.0.2", "UDP", 53, "10.244.1.9", 53, "soon"]]),
        ("drainingSince", "everything"),
        ("rulesDigest", ["abc"]),
        ("identities", {"ns/svc": {"virtualServers": [["10.96.0.9", "TCP", 1e400]]}}),
        ("identities", {"ns/svc": {"endpoints": [[None, {"a": 1}, 2]]}}),
        ("identities", {"ns/svc": "junk"}),
        ("identities", [1, 2]),
        ("virtualServers", None),
    ],
)
def test_a_bad_field_is_reported_and_nothing_else_is_lost(
    tmp_path: Path, field: str, value: Any
) -> None:
    path = tmp_path / "state.json"
    good = sample()
    doc = good.to_json("g1")
    doc[field] = (
        value
        if field != "identities" or not isinstance(value, dict)
        else {
            **doc["identities"],
            **value,
        }
    )
    path.write_text(json.dumps(doc))
    sf = StateFile(path)
    loaded = sf.load()  # never raises
    assert sf.unreadable is not None and field in sf.unreadable
    # What the damaged field held is gone, every other field is as written.
    if field != "virtualServers":
        assert loaded.virtual_servers == good.virtual_servers
    if field != "identities" or isinstance(value, dict):
        assert {k: v for k, v in loaded.identities.items() if k != "ns/svc"} == good.identities
    assert sf.save(loaded)  # and the file is readable again
    assert StateFile(path).load() == loaded


def test_deep_nesting_or_a_huge_file_is_unreadable_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    nested = '{"version": 1, "virtualServers": ' + "[" * 200_000 + "]" * 200_000 + "}"
    path.write_text(nested)
    sf = StateFile(path)
    assert sf.open() == State()
    assert sf.unreadable is not None
    kept = tmp_path / "state.json.unreadable"
    assert kept.read_text() == nested  # the writer keeps a copy before it writes anew
    kept.unlink()
    with path.open("wb") as f:  # sparse: larger than any state file ipvsproxy writes
        f.truncate(STATE_FILE_MAX_BYTES + 1)
    sf = StateFile(path)
    assert sf.open() == State()
    assert sf.unreadable is not None and "large" in sf.unreadable
    assert not kept.exists()  # not copied: no more than a state file is ever read


def test_a_damaged_journal_line_loses_only_itself(tmp_path: Path) -> None:
    path, sf, state = _journalled(tmp_path, "a")
    gen = json.loads(path.read_text())["generation"]
    damaged = [
        f'{{"gen": "{gen}", "rules": ["x", "y"',  # torn, then a line appended after it
        f'{{"gen": "{gen}", "vs+": [["10.96.0.1", "TCP", 1e400]], "vs-": []}}',
        f'{{"gen": "{gen}", "draining": [[' + "[" * 100_000,
        "\x00\x00\x00\x00",
    ]
    with sf.journal.open("a") as f:
        f.write("\n".join(damaged) + "\n")
    state.rules_digest = "b"
    state.virtual_servers.add(ServiceKey("10.96.7.7", Protocol.TCP, 443))
    sf.save(state)  # appended after the damaged lines
    reader = StateFile(path)
    assert reader.load() == state
    assert reader.unreadable is not None and "journal" in reader.unreadable


def test_a_line_whose_check_fails_is_skipped(tmp_path: Path) -> None:
    path, sf, _ = _journalled(tmp_path, "a")
    text = sf.journal.read_text()
    assert '"a"' in text
    for damaged in (
        text.replace('"a"', '"z"'),  # valid JSON, not what was written
        text.replace('"sum": "', '"sum": "g'),  # the check itself damaged
    ):
        sf.journal.write_text(damaged)
        reader = StateFile(path)
        assert reader.load().rules_digest == "abc"
        assert reader.unreadable is not None and "journal" in reader.unreadable


def test_an_append_cut_short_by_a_full_disk_loses_no_later_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = sample()
    sf.save(state)
    real_write = os.write
    full = [True]

    def short_write(fd: int, data: bytes) -> int:
        """The disk fills up: a part of the line is written, then nothing."""
        if not full[0] or not os.readlink(f"/proc/self/fd/{fd}").endswith(".journal"):
            return real_write(fd, data)
        if len(data) > 8:
            return real_write(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", short_write)
    state.rules_digest = "one"
    try:
        sf.save(state)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    full[0] = False  # room again
    for digest in ("two", "three"):
        state.rules_digest = digest
        state.virtual_servers.add(ServiceKey("10.96.8.8", Protocol.TCP, len(digest)))
        sf.save(state)
    assert StateFile(path).load() == state


def test_an_append_after_a_torn_line_starts_on_a_new_line(tmp_path: Path) -> None:
    path, sf, state = _journalled(tmp_path, "one")
    with sf.journal.open("a") as f:  # a line cut short behind the writer's back
        f.write('{"gen": "x", "rules": ["tw')
    state.rules_digest = "two"
    sf.save(state)
    assert StateFile(path).load() == state


def test_a_state_directory_that_cannot_be_written_does_not_stop_open(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    sf = StateFile(blocker / "state.json")  # every write fails (ENOTDIR), as read-only
    assert sf.open() == State()
    with pytest.raises(OSError):
        sf.save(sample())


def test_a_read_only_state_directory_does_not_stop_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    path = tmp_path / "state.json"
    StateFile(path).save(sample())

    def read_only(*_args: Any, **_kw: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "unlink", read_only)
    monkeypatch.setattr(Path, "unlink", read_only)
    sf = StateFile(path)
    assert sf.open() == sample()
    assert sf.unreadable is None


def test_many_bad_entries_are_counted_not_each_kept(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    doc = sample().to_json("g1")
    doc["virtualServers"] = [["10.96.0.1", "TCP", "x" * 1000]] * 10_000
    path.write_text(json.dumps(doc))
    sf = StateFile(path)
    assert sf.load().virtual_servers == set()
    assert sf.unreadable is not None and "10000 parts" in sf.unreadable
    assert len(sf.unreadable) < 1000  # a few said, and each short


def test_no_more_of_a_journal_than_a_state_file_may_hold_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ipvsproxy.dataplane import statefile

    path = tmp_path / "state.json"
    sf = StateFile(path)
    state = State(rules_digest="0")
    sf.save(state)
    for i in range(1, 40):
        state.rules_digest = str(i)
        sf.save(state)
    lines = sf.journal.read_bytes().splitlines(keepends=True)
    limit = sum(len(line) for line in lines[:10]) + 5  # ten lines and a part of the 11th
    monkeypatch.setattr(statefile, "STATE_FILE_MAX_BYTES", limit)
    reader = StateFile(path)
    assert reader.load().rules_digest == "10"  # what the first ten lines say
    assert reader.unreadable is not None and "journal" in reader.unreadable
    state.rules_digest = "40"
    assert reader.save(state)
    assert not reader.journal.exists()  # rewritten as a snapshot
