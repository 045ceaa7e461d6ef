"""The --config file's watch: when its content changes the daemon stops, with the reason, and
exits non-zero so the kubelet restarts it with the new file, as upstream's kube-proxy exits on a
write or rename of it (cmd/kube-proxy/app/options.go). Polled, not inotify: a ConfigMap volume
changes by swapping a symlink two levels up, and comparing the bytes read through the path sees
that, an in-place write and a rename alike, where an unchanged rewrite is no change."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from ipvsproxy.config import ProxyConfig

log = logging.getLogger(__name__)

REASON = "content of the proxy server's configuration file was updated"
POLL_SECONDS = 2.0
RETRY_MAX = 60.0  # the longest pause after failures in a row


class ConfigWatch:
    def __init__(self, path: str, content: bytes) -> None:
        self.path = path
        self.content = content
        self.reason: str | None = None
        self.done = threading.Event()

    def poll(self) -> str | None:
        """The reason to restart, or None: unchanged, or unreadable (a removed file is no
        change for upstream either; the running configuration stays)."""
        try:
            now = Path(self.path).read_bytes()
        except OSError:
            return None
        return None if now == self.content else REASON

    def run(
        self,
        stop: threading.Event,
        request_stop: Callable[[], None],
        period: float,
        failed: Callable[[str], object] = lambda _helper: None,
    ) -> None:
        """Polls every ``period`` until ``stop``, or until a change: logs it and stops the
        daemon. Whatever a poll raises is logged and counted (``failed``), and polling goes on
        after a pause that doubles while failures repeat."""
        failures = 0
        try:
            while not stop.wait(min(RETRY_MAX, period * 2**failures)):
                try:
                    reason = self.poll()
                except Exception:
                    failures += 1
                    log.exception("config watch of %s failed (%d in a row)", self.path, failures)
                    failed("config-watch")
                    continue
                failures = 0
                if reason is not None:
                    self.reason = reason
                    log.error("%s (%s): exiting to be restarted with it", reason, self.path)
                    request_stop()
                    return
        finally:
            self.done.set()


def start_config_watch(
    cfg: ProxyConfig,
    stop: threading.Event,
    request_stop: Callable[[], None],
    period: float = POLL_SECONDS,
    failed: Callable[[str], object] = lambda _helper: None,
) -> ConfigWatch | None:
    """Watches ``cfg``'s --config file in a thread; None when there is no file."""
    if cfg.config_file is None or cfg.config_content is None:
        return None
    watch = ConfigWatch(cfg.config_file, cfg.config_content)
    threading.Thread(
        target=watch.run,
        args=(stop, request_stop, period, failed),
        name="config-watch",
        daemon=True,
    ).start()
    return watch
