"""pyproject.toml's promises: every third-party package the product imports is declared, with
a floor that has what the code uses; development tools stay out of the published metadata; a
LICENSE file for the license it names."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# import name -> distribution name
DISTRIBUTIONS = {
    "kubernetes": "kubernetes",
    "prometheus_client": "prometheus-client",
    "pyroute2": "pyroute2",
    "urllib3": "urllib3",
    "yaml": "PyYAML",
}
DEV_TOOLS = {"pytest", "hypothesis", "mypy", "ruff", "import-linter", "mutmut", "matplotlib"}


def _requirements() -> dict[str, str]:
    """Distribution name (lowercase) -> its specifier, from ``dependencies``."""
    found = {}
    for req in PROJECT["dependencies"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(.*)", req)
        assert m, req
        found[m.group(1).lower()] = m.group(2)
    return found


def _third_party_imports() -> set[str]:
    names = set()
    for path in (ROOT / "ipvsproxy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names.add(str(node.args[0].value).split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "ipvsproxy"}


def test_every_imported_package_is_declared() -> None:
    imported = _third_party_imports()
    assert imported <= set(DISTRIBUTIONS), imported - set(DISTRIBUTIONS)
    declared = _requirements()
    for name in imported:
        assert DISTRIBUTIONS[name].lower() in declared, f"{DISTRIBUTIONS[name]} is not declared"


def test_kubernetes_floor_is_the_first_release_with_what_the_client_uses() -> None:
    """kube/client.py calls ApiClient.param_serialize and ApiException.from_response, which came
    with the client's move to openapi-generator 7 in 37.0.0; 36.0.3 has neither (it still
    imports six)."""
    from kubernetes.client import ApiClient
    from kubernetes.client.exceptions import ApiException

    assert _requirements()["kubernetes"] == ">=37.0.0"
    assert callable(ApiClient.param_serialize)
    assert callable(ApiException.from_response)
    installed = tuple(int(x) for x in importlib.metadata.version("kubernetes").split(".")[:2])
    assert installed >= (37, 0)


def test_development_tools_are_not_published() -> None:
    """No extra of the published metadata installs a development tool: they are a dependency
    group (PEP 735), which the Makefile and vagrant/run-e2e.sh install with --group."""
    extras = PROJECT.get("optional-dependencies", {})
    published = {re.split(r"[<>=!~\[ ;]", r)[0].lower() for reqs in extras.values() for r in reqs}
    assert not published & DEV_TOOLS, published & DEV_TOOLS
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    dev = {re.split(r"[<>=!~\[ ;]", r)[0].lower() for r in groups["dev"] if isinstance(r, str)}
    assert dev >= DEV_TOOLS - {"mutmut"}
    assert "--group dev" in (ROOT / "Makefile").read_text()
    assert "pyproject.toml:dev" in (ROOT / "vagrant" / "run-e2e.sh").read_text()


def test_license_file_and_classifiers() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    # PEP 639: an SPDX expression and the file; setuptools deprecates the table form and
    # license classifiers (BuildBackendWarning: unsupported from 2027-02-18)
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    assert "setuptools>=77" in build  # the first with PEP 639's fields
    classifiers = set(PROJECT["classifiers"])
    assert not any(c.startswith("License ::") for c in classifiers)
    assert "Operating System :: POSIX :: Linux" in classifiers
    assert PROJECT["requires-python"] == ">=3.11"
    assert "Programming Language :: Python :: 3.11" in classifiers
