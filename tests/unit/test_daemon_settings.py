"""Daemon pieces that need no kernel: conntrack settings, the local detector, JSON logs."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest

from ipvsproxy.config import build
from ipvsproxy.daemon.changes import TRIGGER_ANNOTATION, trigger_time
from ipvsproxy.daemon.kernel_settings import conntrack_floors, conntrack_sysctls
from ipvsproxy.daemon.node import rules_config
from ipvsproxy.daemon.wiring import drain_seconds, set_oom_score_adj, start_server


def test_conntrack_settings_follow_upstream() -> None:
    cfg = build(None, [])
    # max(maxPerCore x cores, min): 32768 x 2 < 131072; the hash size a quarter of it.
    assert conntrack_floors(cfg, cores=2) == {MAX: 131072, HASHSIZE: 32768}
    values = conntrack_sysctls(cfg)
    assert values["net/netfilter/nf_conntrack_tcp_timeout_established"] == "86400"
    assert values["net/netfilter/nf_conntrack_tcp_timeout_close_wait"] == "3600"
    assert "net/netfilter/nf_conntrack_udp_timeout" not in values  # 0 leaves it
    cfg = build(None, ["--conntrack-max-per-core", "0", "--conntrack-udp-timeout", "30s"])
    assert conntrack_floors(cfg, cores=64) == {}
    values = conntrack_sysctls(cfg)
    assert values["net/netfilter/nf_conntrack_udp_timeout"] == "30"
    assert "net/netfilter/nf_conntrack_tcp_be_liberal" not in values  # false leaves it
    cfg = build(None, ["--conntrack-tcp-be-liberal"])
    assert conntrack_sysctls(cfg)["net/netfilter/nf_conntrack_tcp_be_liberal"] == "1"


def test_oom_score_adj_is_written_at_start(tmp_path: Any) -> None:
    target = tmp_path / "oom_score_adj"
    set_oom_score_adj(build(None, []).oom_score_adj, str(target))
    assert target.read_text() == "-999\n"  # upstream's default
    set_oom_score_adj(-1000, str(tmp_path / "missing" / "oom_score_adj"))  # logged only


def test_a_server_that_cannot_bind_exits_only_with_bind_address_hard_fail() -> None:
    import socket

    stop = threading.Event()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started: list[Any] = []

        def start() -> None:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
                s.bind(("127.0.0.1", port))
            started.append(port)

        assert not start_server("health", start, True, stop)
        assert start_server("health", start, False, stop, retry=0.05)
    deadline = time.monotonic() + 10
    while not started and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    assert started == [port]  # tried again until the port was free


def test_the_tcp_drain_bound_is_a_setting_and_zero_means_none() -> None:
    assert drain_seconds(build(None, [])) == 15 * 60  # the default: 15 minutes
    assert drain_seconds(build(None, ["--ipvs-drain-timeout", "2m"])) == 120.0
    # 0: as upstream, a real server drains until it has no connections left.
    assert drain_seconds(build(None, ["--ipvs-drain-timeout", "0"])) == math.inf


def test_local_detector_comes_from_the_configuration() -> None:
    cfg = build(None, ["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cni0"])
    assert rules_config(cfg).if_not_local() == "! -i cni0"
    cfg = build(None, ["--cluster-cidr", "10.244.0.0/16"])
    assert rules_config(cfg).if_not_local() == "! -s 10.244.0.0/16"


def test_programming_latency_starts_at_the_trigger_annotation() -> None:
    sl = {"metadata": {"annotations": {TRIGGER_ANNOTATION: "2026-12-02T15:04:05Z"}}}
    assert trigger_time(sl) == 1796223845.0
    assert trigger_time({"metadata": {}}) is None
    assert trigger_time({"metadata": {"annotations": {TRIGGER_ANNOTATION: "garbage"}}}) is None


# -- conntrack limits and required sysctls at start (upstream's platformSetup, NewProxier) -----

MAX = "net/netfilter/nf_conntrack_max"
HASHSIZE = "/sys/module/nf_conntrack/parameters/hashsize"


def _started(monkeypatch: Any, cores: int, node: dict[str, str], *flags: str) -> Any:
    """The fake kernel after the daemon's start-up settings on a node of ``cores`` CPUs whose
    settings ``node`` changes from a fresh node's."""
    from ipvsproxy.daemon.kernel_settings import apply_kernel_settings
    from ipvsproxy.kernel.fakes import fake_backends

    monkeypatch.setattr("os.cpu_count", lambda: cores)
    kernel = fake_backends()
    kernel.sysctls.values.update(node)
    apply_kernel_settings(build(None, list(flags)), kernel)
    return kernel


def test_nf_conntrack_max_is_raised_never_lowered(monkeypatch: Any) -> None:
    """A node tuned to 1,048,576 keeps it (4 CPUs: upstream wants 131,072); one below is
    raised, and the hash size with it to a quarter of the limit (kube-proxy's setSysctls)."""
    tuned = _started(monkeypatch, 4, {MAX: "1048576", HASHSIZE: "262144"})
    assert tuned.sysctls.values[MAX] == "1048576"
    assert tuned.sysctls.values[HASHSIZE] == "262144"
    low = _started(monkeypatch, 8, {MAX: "65536", HASHSIZE: "16384"})
    assert low.sysctls.values[MAX] == "262144"  # 32768 x 8
    assert low.sysctls.values[HASHSIZE] == "65536"  # 262144 / 4
    # The hash size follows the computed limit, also where the node's limit is higher.
    small_hash = _started(monkeypatch, 4, {MAX: "1048576", HASHSIZE: "16384"})
    assert small_hash.sysctls.values[MAX] == "1048576"
    assert small_hash.sysctls.values[HASHSIZE] == "32768"  # 131072 / 4


def test_nf_conntrack_max_is_capped_as_upstream(monkeypatch: Any) -> None:
    """maxPerCore x CPUs is capped at 1,048,576 (also above conntrack.min); min alone is not
    (getConntrackMax)."""
    big = _started(monkeypatch, 64, {MAX: "65536", HASHSIZE: "16384"})
    assert big.sysctls.values[MAX] == "1048576"  # not 32768 x 64
    assert big.sysctls.values[HASHSIZE] == "262144"
    floor = _started(monkeypatch, 1, {MAX: "65536"}, "--conntrack-min", "2000000")
    assert floor.sysctls.values[MAX] == "2000000"


def test_a_sysctl_that_cannot_be_written_stops_the_start_with_its_reason(
    monkeypatch: Any,
) -> None:
    """As upstream, each setting it needs that cannot be set is fatal (conntrack's at
    platformSetup, IPVS's at NewProxier): the daemon exits naming the setting and why."""
    import errno

    from ipvsproxy.daemon.kernel_settings import apply_kernel_settings
    from ipvsproxy.kernel.fakes import fake_backends

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    for name in (
        MAX,
        HASHSIZE,
        "net/netfilter/nf_conntrack_tcp_timeout_established",
        "net/ipv4/vs/conntrack",
        "net/ipv4/ip_forward",
    ):
        kernel = fake_backends()
        kernel.sysctls.values[HASHSIZE] = "16384"  # below 131072 / 4: raised
        kernel.sysctls.refuse(errno.EACCES, name.__eq__, times=None)
        with pytest.raises(RuntimeError) as raised:
            apply_kernel_settings(build(None, []), kernel)
        assert name in str(raised.value) and "Permission denied" in str(raised.value)
    # IPVS timeouts that cannot be set are logged only, as upstream.
    kernel = fake_backends()
    kernel.ipvs.raise_from("set_timeouts", OSError(errno.EPERM, "Operation not permitted"))
    apply_kernel_settings(build(None, ["--ipvs-tcp-timeout", "900s"]), kernel)


def test_a_read_only_sys_leaves_the_hash_size_with_a_warning(
    monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod is not privileged, so /sys is read-only (EROFS): a hash size that should be
    raised is left as it is with a warning naming it, where upstream's privileged pod raises
    it; the start goes on (a small hash table slows lookups, a proxy that exits serves none),
    and every other setting is still made."""
    import errno

    from ipvsproxy.daemon.kernel_settings import apply_kernel_settings
    from ipvsproxy.kernel.fakes import fake_backends

    monkeypatch.setattr("os.cpu_count", lambda: 4)
    kernel = fake_backends()
    kernel.sysctls.values[HASHSIZE] = "16384"  # below 131072 / 4
    kernel.sysctls.refuse(errno.EROFS, HASHSIZE.__eq__, times=None)
    apply_kernel_settings(build(None, []), kernel)
    assert kernel.sysctls.values[HASHSIZE] == "16384"
    assert kernel.sysctls.values[MAX] == "131072"
    assert kernel.sysctls.values["net/ipv4/vs/conntrack"] == "1"
    assert kernel.sysctls.values["net/ipv4/ip_forward"] == "1"
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(HASHSIZE in m and "32768" in m and "16384" in m for m in warned), warned
