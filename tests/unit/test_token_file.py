"""A kubeconfig's tokenFile is read again as it changes, as client-go does (its cached token
source re-reads the file at most once a minute, trimmed): the kubelet rotates a projected
service account token, and kubeadm's kube-proxy kubeconfig.conf names it by tokenFile."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ipvsproxy.config import ProxyConfig
from ipvsproxy.daemon.wiring import api_client
from ipvsproxy.kube.credentials import TokenFile, token_file_of

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- cluster: {{server: "https://10.0.0.1:6443"}}
  name: default
contexts:
- context: {{cluster: default, user: {user}}}
  name: default
- context: {{cluster: default, user: default}}
  name: other
current-context: default
users:
- name: default
  user: {{tokenFile: {token}}}
- name: static
  user: {{token: abc}}
"""


def _kubeconfig(tmp_path: Path, user: str = "default", token: str = "sa/token") -> Path:
    path = tmp_path / "kubeconfig.conf"
    path.write_text(KUBECONFIG.format(user=user, token=token))
    (tmp_path / "sa").mkdir(exist_ok=True)
    (tmp_path / "sa" / "token").write_text("token-1")
    return path


def _bearer(api: Any) -> str:
    value: str = api.configuration.auth_settings()["BearerToken"]["value"]
    return value


def test_token_file_of_the_current_context_relative_to_the_kubeconfig(tmp_path: Path) -> None:
    assert token_file_of(str(_kubeconfig(tmp_path))) == str(tmp_path / "sa" / "token")
    assert token_file_of(str(_kubeconfig(tmp_path, token="/abs/token"))) == "/abs/token"
    assert token_file_of(str(_kubeconfig(tmp_path, user="static"))) is None
    assert token_file_of(str(tmp_path / "missing")) is None


def test_the_daemons_client_follows_a_rotated_token(tmp_path: Path) -> None:
    cfg = dataclasses.replace(ProxyConfig(), kubeconfig=str(_kubeconfig(tmp_path)))
    api = api_client(cfg)
    assert _bearer(api) == "Bearer token-1"
    (tmp_path / "sa" / "token").write_text("token-2\n")  # rotated; trimmed as client-go does
    hook = api.configuration.refresh_api_key_hook
    assert isinstance(hook, TokenFile)
    hook.next_read = 0.0  # the minute has passed
    assert _bearer(api) == "Bearer token-2"


def test_a_token_is_read_at_most_once_a_period(tmp_path: Path) -> None:
    _kubeconfig(tmp_path)
    now = [100.0]
    hook = TokenFile(str(tmp_path / "sa" / "token"), period=60.0, clock=lambda: now[0])
    conf: Any = type("Conf", (), {"api_key": {}})()
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer token-1"
    (tmp_path / "sa" / "token").write_text("token-2")
    now[0] = 159.0
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer token-1"
    now[0] = 160.0
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer token-2"


def test_an_unreadable_token_file_keeps_the_last_token(tmp_path: Path) -> None:
    _kubeconfig(tmp_path)
    hook = TokenFile(str(tmp_path / "sa" / "token"), period=0.0)
    conf: Any = type("Conf", (), {"api_key": {}})()
    hook(conf)
    (tmp_path / "sa" / "token").unlink()
    hook(conf)
    assert conf.api_key["BearerToken"] == "Bearer token-1"
