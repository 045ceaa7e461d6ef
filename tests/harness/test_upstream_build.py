"""lab.cluster.upstream: where the upstream binaries are cached and when they are built again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lab.cluster import upstream


def test_go_names_a_binary_after_the_element_before_a_major_version() -> None:
    assert upstream._go_output_name("go.etcd.io/etcd/server/v3") == "server"
    assert upstream._go_output_name("k8s.io/kubernetes/cmd/kube-proxy") == "kube-proxy"
    assert upstream._program_name("go.etcd.io/etcd/server/v3") == "etcd"
    programs = {p for c in upstream.COMPONENTS for p in c.programs}
    assert programs == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-proxy",
        "kube-router",
    }


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of lab/upstream's Go modules, and an empty cache."""
    here = tmp_path / "modules"
    for component in upstream.COMPONENTS:
        shutil.copytree(component.directory, here / component.module)
    monkeypatch.setattr(upstream, "HERE", here)
    monkeypatch.setenv("IPVSPROXY_LAB_CACHE", str(tmp_path / "cache"))
    return here


def test_the_key_follows_the_version_the_go_version_and_the_module_files(modules: Path) -> None:
    (component,) = [c for c in upstream.COMPONENTS if c.module == "etcd"]
    key = upstream.cache_key(component, "go1.26.8")
    assert key.startswith("etcd-v3.6.16-go1.26.8-")
    assert upstream.cache_key(component, "go1.27.0") != key
    with (modules / "etcd" / "go.sum").open("a") as f:
        f.write("example.com/x v1.0.0 h1:AAAA=\n")
    assert upstream.cache_key(component, "go1.26.8") != key


def test_a_missing_binary_names_make_setup(modules: Path) -> None:
    with pytest.raises(upstream.NotBuilt, match="make setup"):
        upstream.binary("kube-apiserver")
    with pytest.raises(KeyError):
        upstream.binary("kubelet")


def test_a_complete_cache_entry_is_not_built_again_and_is_linked(
    modules: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    go = "go1.26.8"
    monkeypatch.setattr(upstream, "go_version", lambda: go)

    def no_go(*args: object, **kwargs: object) -> None:
        raise AssertionError("go build ran for a cached component")

    monkeypatch.setattr(upstream, "_run_with_progress", no_go)
    for component in upstream.COMPONENTS:
        bin_dir = upstream._bin_dir(component, go)
        bin_dir.mkdir(parents=True)
        for program in component.programs:
            (bin_dir / program).write_text("#!/bin/sh\n")
    said: list[str] = []
    assert upstream.build_all(said.append) == 0.0
    assert said == []
    proxy = upstream.binary("kube-proxy")
    assert proxy.resolve() == (upstream._bin_dir(upstream.COMPONENTS[1], go) / "kube-proxy")
