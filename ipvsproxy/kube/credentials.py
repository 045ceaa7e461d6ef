"""A kubeconfig's ``tokenFile``, read again as it changes. The official client reads it once,
untrimmed; client-go re-reads it at most once a minute and trims it (its cached file token
source), which a projected service account token needs: the kubelet rotates it, and kubeadm's
kube-proxy kubeconfig.conf names it by ``tokenFile``."""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

REREAD_SECONDS = 60.0  # client-go's cachedFileTokenSource period


def token_file_of(kubeconfig: str) -> str | None:
    """The ``tokenFile`` of the current context's user (relative to the kubeconfig's
    directory), or None: no such user field, or a file that cannot be read or parsed."""
    yaml: Any = importlib.import_module("yaml")  # PyYAML ships no type hints
    try:
        with open(kubeconfig, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
        ctx = {c["name"]: c["context"] for c in doc["contexts"]}[doc["current-context"]]
        user = {u["name"]: u["user"] for u in doc["users"]}[ctx["user"]]
        path = user.get("tokenFile")
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(path, str) or not path:
        return None
    return os.path.join(os.path.dirname(os.path.abspath(kubeconfig)), path)


class TokenFile:
    """The client configuration's ``refresh_api_key_hook``: before a request, the token from
    ``path`` if ``period`` has passed since it was last read; an unreadable file keeps the
    last token (logged)."""

    def __init__(
        self, path: str, period: float = REREAD_SECONDS, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self.period = period
        self.clock = clock
        self.next_read = 0.0

    def __call__(self, configuration: Any) -> None:
        now = self.clock()
        if now < self.next_read:
            return
        self.next_read = now + self.period
        try:
            with open(self.path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            log.warning("cannot read the token file %s, keeping the last token: %s", self.path, exc)
            return
        if token:
            configuration.api_key["BearerToken"] = f"Bearer {token}"


def follow_token_file(api: Any, kubeconfig: str) -> None:
    """Makes ``api`` re-read its kubeconfig's ``tokenFile``, if it has one."""
    path = token_file_of(kubeconfig)
    if path is not None:
        api.configuration.refresh_api_key_hook = TokenFile(path)
