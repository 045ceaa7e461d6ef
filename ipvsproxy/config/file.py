"""Reading a KubeProxyConfiguration file's text: YAML, or JSON (which is YAML too)."""

from __future__ import annotations

import importlib
import json
from typing import Any

from ipvsproxy.config.proxy_config import ConfigError

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"


def parse_config_text(text: str, source: str) -> dict[str, Any]:
    """The mapping in a KubeProxyConfiguration file's text (YAML, or JSON which is YAML too);
    errors name ``source``."""
    data: Any
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = _yaml_load(text, source)
    else:
        data = _yaml_load(text, source)
    if data is None:
        raise ConfigError(f"{source}: is empty; expected a {KIND} mapping")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must contain a {KIND} mapping, not a {type(data).__name__}")
    return data


def _yaml_load(text: str, source: str) -> Any:
    try:
        # importlib keeps mypy from needing PyYAML's stubs; the kubernetes package requires it.
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise ConfigError(f"{source}: cannot parse as JSON, and PyYAML is not installed") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: cannot parse as YAML or JSON: {exc}") from None
