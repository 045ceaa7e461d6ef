"""Daemon pieces that need no kernel: conntrack settings, the local detector, JSON logs."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

from ipvsproxy.config import build
from ipvsproxy.daemon.changes import TRIGGER_ANNOTATION, trigger_time
from ipvsproxy.daemon.kernel_settings import conntrack_sysctls
from ipvsproxy.daemon.node import rules_config
from ipvsproxy.daemon.wiring import drain_seconds, set_oom_score_adj, start_server


def test_conntrack_settings_follow_upstream() -> None:
    cfg = build(None, [])
    values = conntrack_sysctls(cfg, cores=2)
    # max(maxPerCore x cores, min): 32768 x 2 < 131072.
    assert values["net/netfilter/nf_conntrack_max"] == "131072"
    assert values["net/netfilter/nf_conntrack_tcp_timeout_established"] == "86400"
    assert values["net/netfilter/nf_conntrack_tcp_timeout_close_wait"] == "3600"
    assert "net/netfilter/nf_conntrack_udp_timeout" not in values  # 0 leaves it
    cfg = build(None, ["--conntrack-max-per-core", "0", "--conntrack-udp-timeout", "30s"])
    values = conntrack_sysctls(cfg, cores=64)
    assert "net/netfilter/nf_conntrack_max" not in values
    assert values["net/netfilter/nf_conntrack_udp_timeout"] == "30"
    assert "net/netfilter/nf_conntrack_tcp_be_liberal" not in values  # false leaves it
    cfg = build(None, ["--conntrack-tcp-be-liberal"])
    assert conntrack_sysctls(cfg, cores=2)["net/netfilter/nf_conntrack_tcp_be_liberal"] == "1"


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
