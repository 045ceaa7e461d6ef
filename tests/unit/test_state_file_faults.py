"""A state file that cannot be written or read: the node is programmed all the same, the
problem is said (log, ``ipvsproxy_state_file_write_failures_total``, /healthz, ``status``),
and ``cleanup`` still removes what is ipvsproxy's and nothing else.

A read-only directory is a read-only bind mount where the host allows one, else the errors
such a directory gives (EROFS) told to the calls that write; a directory that is a file
(ENOTDIR) fails every write as root too."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.config import build
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.daemon.proxy import Proxy
from ipvsproxy.kernel.fakes import FakeBackends
from ipvsproxy.servers.metrics import Metrics
from ipvsproxy.status import view
from tests.unit.fake_node import NODE_IP, Node, node
from tests.unit.test_containment import Recorder
from tests.unit.test_dataplane_fake_kernel import (
    POD_A,
    POD_B,
    WEB,
    _with_foreign_state,
    foreign,
    node_port,
    ok,
    put,
    web,
)
from tests.unit.test_proxy_health import Synced

NODE_PORT = ServiceKey(NODE_IP, Protocol.TCP, 30080)


def _not_a_directory(tmp_path: Path) -> Path:
    """A state directory no write can go to, as root too: it is a file."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    return blocker


def _read_only(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """``folder`` as on a read-only filesystem: every call that would write in it fails
    with EROFS (reads work)."""
    real_open, real_unlink, real_path_unlink = os.open, os.unlink, Path.unlink
    real_replace = os.replace

    def inside(path: Any) -> bool:
        return Path(path).resolve().is_relative_to(folder.resolve())

    def erofs(path: Any) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    def open_(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if inside(path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise erofs(path)
        return real_open(path, flags, mode, **kw)

    def unlink(path: Any, *args: Any, **kw: Any) -> None:
        if inside(path):
            raise erofs(path)
        real_unlink(path, *args, **kw)

    def path_unlink(self: Path, missing_ok: bool = False) -> None:
        if inside(self):
            raise erofs(self)
        real_path_unlink(self, missing_ok)

    def replace(src: Any, dst: Any, **kw: Any) -> None:
        if inside(src) or inside(dst):
            raise erofs(dst)
        real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "unlink", unlink)
    monkeypatch.setattr(Path, "unlink", path_unlink)
    monkeypatch.setattr(os, "replace", replace)


def test_an_unwritable_state_directory_does_not_stop_the_node(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    n = node(_not_a_directory(tmp_path))
    put(n, "web", web(POD_A))
    ok(n.sync())
    assert WEB in n.kernel.ipvs.virtual_servers  # programmed all the same
    assert n.dp.snapshot().state_write_failures >= 1
    problem = n.dp.state_problem
    assert problem is not None and "not-a-directory/state.json" in problem
    assert "cannot write the state file" in caplog.text


def test_a_read_only_state_directory_does_not_stop_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = node(tmp_path)  # a state file from an earlier run, then the folder turns read-only
    put(written, "web", web(POD_A))
    ok(written.sync())
    _read_only(monkeypatch, tmp_path)
    n = node(tmp_path, written.kernel)
    assert n.dp.state.virtual_servers == {WEB}  # read as written
    put(n, "web", web(POD_A, POD_B))
    ok(n.sync())
    assert len(n.kernel.ipvs.real_servers[WEB]) == 2
    assert n.dp.state_problem is not None and "Read-only file system" in n.dp.state_problem


def _proxy(n: Node) -> Any:
    proxy: Any = Proxy(build(None, []), n.dp, Metrics())
    proxy.events = Recorder()
    proxy.informers = [Synced("services"), Synced("endpointslices")]
    return proxy


def test_the_state_file_problem_is_on_healthz_and_in_status(tmp_path: Path) -> None:
    blocker = _not_a_directory(tmp_path)
    proxy = _proxy(node(blocker))
    proxy.reconcile()
    code, body = proxy.health.status(node_check=True)
    assert code == 200  # said, never a failure: the node is programmed
    assert "state.json" in body["stateFile"]
    doc = proxy.status_document()
    assert "state.json" in doc["stateFileProblem"]
    report = view.build_report({}, view.Sources("url", view.parse_daemon_document(doc)), 0.0)
    assert "state.json" in report["stateFile"]["daemonProblem"]
    assert any("state.json" in line for line in view.header_lines(report))
    # Writable again: the problem is gone from both.
    blocker.unlink()
    blocker.mkdir()
    proxy.reconcile()
    assert "stateFile" not in proxy.health.status(node_check=True)[1]
    assert proxy.status_document()["stateFileProblem"] is None


def _cleanup(monkeypatch: pytest.MonkeyPatch, kernel: FakeBackends, state: Path) -> int:
    """``ipvsproxy cleanup`` over the fake ``kernel``."""
    from ipvsproxy import cli
    from ipvsproxy.kernel.backends import Backends

    monkeypatch.setattr(Backends, "open", staticmethod(lambda: kernel))
    monkeypatch.setattr("ipvsproxy.kernel.families.ipv6_unavailable", lambda: "not here")
    return cli.main(["cleanup", "--state-file", str(state)])


def _ours_and_foreign(tmp_path: Path) -> tuple[FakeBackends, dict[str, Any]]:
    """A node where ipvsproxy programmed a ClusterIP and a NodePort beside foreign state;
    its state file in ``tmp_path``."""
    kernel = _with_foreign_state()
    before = foreign(kernel)
    n = node(tmp_path, kernel)
    put(n, "web", web(POD_A))
    put(n, "np", node_port("np", "10.96.0.30", 30080, POD_B))
    ok(n.sync())
    assert {WEB, NODE_PORT} <= n.kernel.ipvs.virtual_servers.keys()
    return kernel, before


def test_cleanup_works_in_a_read_only_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    kernel, before = _ours_and_foreign(tmp_path)
    _read_only(monkeypatch, tmp_path)
    assert _cleanup(monkeypatch, kernel, tmp_path / "state.json") == 0
    assert WEB not in kernel.ipvs.virtual_servers and NODE_PORT not in kernel.ipvs.virtual_servers
    assert foreign(kernel) == before
    err = capsys.readouterr().err
    assert "state file" in err and "Read-only file system" in err


@pytest.mark.parametrize("damage", ["lost", "corrupt", "under a file"])
def test_cleanup_without_the_state_file_removes_our_node_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str
) -> None:
    """The state file is all that names a NodePort virtual server as ours; without it the
    NodePort set, as for a node taken over from kube-proxy, still does (foreign ones on node
    addresses stay)."""
    kernel, before = _ours_and_foreign(tmp_path)
    state = tmp_path / "state.json"
    (tmp_path / "state.json.journal").unlink(missing_ok=True)
    if damage == "lost":
        state.unlink()
    elif damage == "corrupt":
        state.write_text('{"version": 1, "virtualServers": [["x"' + "[" * 100_000)
    else:
        state = _not_a_directory(tmp_path) / "state.json"
    assert _cleanup(monkeypatch, kernel, state) == 0
    assert WEB not in kernel.ipvs.virtual_servers and NODE_PORT not in kernel.ipvs.virtual_servers
    assert foreign(kernel) == before


_UNSHARE = shutil.which("unshare")


def _bind_read_only(folder: Path, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` (Python) run with ``folder`` bound read-only over itself, in a mount
    namespace of its own (root with CAP_SYS_ADMIN: the host's namespaces are untouched)."""
    assert _UNSHARE is not None
    shell = 'mount --bind -o ro "$1" "$1" && exec "$2" -c "$3"'
    return subprocess.run(
        [
            _UNSHARE,
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            shell,
            "sh",
            str(folder),
            sys.executable,
            script,
        ],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
        timeout=120,
        check=False,
    )


def test_cleanup_and_a_sync_in_a_read_only_bind_mount(tmp_path: Path) -> None:
    """As the kernel gives it: EROFS even to removing a file that does not exist."""
    if _UNSHARE is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare(1) for a read-only bind mount")
    probe = _bind_read_only(tmp_path, "print('ok')")
    if probe.returncode != 0:
        pytest.skip(f"no read-only bind mount here: {probe.stderr.strip()}")
    _ours_and_foreign(tmp_path)
    written = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    script = f"""
import json
from pathlib import Path
from ipvsproxy import cli
from ipvsproxy.kernel import families
from ipvsproxy.kernel.backends import Backends
from tests.unit.fake_node import node
from tests.unit.test_dataplane_fake_kernel import POD_A, _with_foreign_state, foreign, put, web
kernel = _with_foreign_state()
before = foreign(kernel)
n = node(Path({str(tmp_path)!r}), kernel)  # run: a sync
put(n, "web", web(POD_A))
result = n.sync()
synced = sorted(str(k) for k in kernel.ipvs.virtual_servers)
Backends.open = staticmethod(lambda: kernel)  # cleanup: the CLI, over the same kernel
families.ipv6_unavailable = lambda: "not here"
code = cli.main(["cleanup", "--state-file", {str(tmp_path / "state.json")!r}])
print(json.dumps({{"errors": result.errors, "problem": n.dp.state_problem,
                  "failures": n.dp.snapshot().state_write_failures, "synced": synced,
                  "code": code, "left": sorted(str(k) for k in kernel.ipvs.virtual_servers),
                  "foreign kept": foreign(kernel) == before}}))
"""
    done = _bind_read_only(tmp_path, script)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["errors"] == [] and out["failures"] >= 1 and str(WEB) in out["synced"]
    assert "Read-only file system" in out["problem"]
    assert out["code"] == 0 and str(WEB) not in out["left"] and out["foreign kept"]
    assert "Read-only file system" in done.stderr  # cleanup said it
    assert {f.name: f.read_bytes() for f in tmp_path.iterdir()} == written


def test_the_lock_holds_in_a_read_only_state_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock file an earlier run left is locked read-only: a second instance still waits."""
    from ipvsproxy.dataplane.statefile import StateLock, StateLocked

    StateLock.acquire(tmp_path / "state.json", wait=False).release()  # the lock file exists
    _read_only(monkeypatch, tmp_path)
    lock = StateLock.acquire(tmp_path / "state.json", wait=False)
    try:
        with pytest.raises(StateLocked):
            StateLock.acquire(tmp_path / "state.json", wait=False)
    finally:
        lock.release()
    StateLock.acquire(tmp_path / "state.json", wait=False).release()
