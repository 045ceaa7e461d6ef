"""Kubeconfig files that point kubectl and the official client at a lab API server.

Written as YAML by hand (JSON-quoted scalars are valid YAML) so the lab needs no YAML library.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DEFAULT_TOKEN = "lab-token"
NAME = "lab"


def render(server_url: str, token: str = DEFAULT_TOKEN) -> str:
    q = json.dumps
    return (
        "apiVersion: v1\n"
        "kind: Config\n"
        "preferences: {}\n"
        "clusters:\n"
        f"- name: {q(NAME)}\n"
        "  cluster:\n"
        f"    server: {q(server_url)}\n"
        "users:\n"
        f"- name: {q(NAME)}\n"
        "  user:\n"
        f"    token: {q(token)}\n"
        "contexts:\n"
        f"- name: {q(NAME)}\n"
        "  context:\n"
        f"    cluster: {q(NAME)}\n"
        f"    user: {q(NAME)}\n"
        f"current-context: {q(NAME)}\n"
    )


def write(path: str | Path, server_url: str, token: str = DEFAULT_TOKEN) -> Path:
    """Write atomically (a reader never sees half a file), readable only by the owner as a
    kubeconfig with a token should be."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(render(server_url, token))
    os.replace(tmp, target)
    return target
