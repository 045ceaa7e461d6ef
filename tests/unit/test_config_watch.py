"""A change of the --config file stops the daemon with a reason, so the kubelet restarts it with
the new file: upstream's kube-proxy watches the file (fsnotify) and exits with "content of the
proxy server's configuration file was updated" (cmd/kube-proxy/app/options.go, eventHandler)."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import pytest

from ipvsproxy.config import load
from ipvsproxy.daemon.config_watch import REASON, ConfigWatch, start_config_watch

TEXT = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n"


def _file(tmp_path: Path, text: str = TEXT) -> Path:
    path = tmp_path / "config.conf"
    path.write_text(text)
    return path


def test_load_keeps_the_files_path_and_the_content_it_read(tmp_path: Path) -> None:
    path = _file(tmp_path)
    cfg = load(["--config", str(path)])
    assert (cfg.config_file, cfg.config_content) == (str(path), TEXT.encode())
    assert load([]).config_file is None


def test_unchanged_file_is_no_change(tmp_path: Path) -> None:
    path = _file(tmp_path)
    watch = ConfigWatch(str(path), TEXT.encode())
    assert watch.poll() is None
    path.write_text(TEXT)  # written again, same content (a touch): no restart
    assert watch.poll() is None


def test_a_write_is_a_change(tmp_path: Path) -> None:
    path = _file(tmp_path)
    watch = ConfigWatch(str(path), TEXT.encode())
    path.write_text(TEXT + "ipvs: {scheduler: wrr}\n")
    assert watch.poll() == REASON


def test_a_configmap_update_is_a_change(tmp_path: Path) -> None:
    """The kubelet updates a ConfigMap volume by swapping the ..data symlink to a new directory."""
    old, new = tmp_path / "..2026_1", tmp_path / "..2026_2"
    old.mkdir()
    new.mkdir()
    (old / "config.conf").write_text(TEXT)
    (new / "config.conf").write_text(TEXT.replace("ipvs", "ipvs\nclusterCIDR: 10.0.0.0/8"))
    (tmp_path / "..data").symlink_to(old.name)
    (tmp_path / "config.conf").symlink_to("..data/config.conf")
    watch = ConfigWatch(str(tmp_path / "config.conf"), TEXT.encode())
    assert watch.poll() is None
    (tmp_path / "..tmp").symlink_to(new.name)
    os.replace(tmp_path / "..tmp", tmp_path / "..data")
    assert watch.poll() == REASON


def test_a_file_that_cannot_be_read_is_no_change(tmp_path: Path) -> None:
    """As upstream (a Remove event is no error there): the running configuration stays."""
    path = _file(tmp_path)
    watch = ConfigWatch(str(path), TEXT.encode())
    path.unlink()
    assert watch.poll() is None


def test_the_watch_stops_the_daemon_with_the_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = _file(tmp_path)
    cfg = load(["--config", str(path)])
    stop = threading.Event()
    stopped: list[str] = []
    watch = start_config_watch(cfg, stop, lambda: stopped.append("stop"), period=0.01)
    assert watch is not None
    path.write_text(TEXT + "clusterCIDR: 10.0.0.0/8\n")
    assert watch.done.wait(5)
    assert watch.reason == REASON and stopped == ["stop"]
    assert any(
        r.levelno == logging.ERROR and REASON in r.getMessage() and str(path) in r.getMessage()
        for r in caplog.records
    )


def test_the_watch_ends_with_the_daemon(tmp_path: Path) -> None:
    cfg = load(["--config", str(_file(tmp_path))])
    stop = threading.Event()
    watch = start_config_watch(cfg, stop, lambda: None, period=0.01)
    assert watch is not None
    stop.set()
    assert watch.done.wait(5)
    assert watch.reason is None


def test_no_file_no_watch() -> None:
    assert start_config_watch(load([]), threading.Event(), lambda: None) is None
