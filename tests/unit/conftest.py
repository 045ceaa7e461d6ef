"""The real control plane on the host, for tests of ipvsproxy's API code against it.

One etcd, kube-apiserver and kube-controller-manager (``lab/cluster/controlplane.py``) per test
session, on 127.0.0.1 at free ports (never etcd's defaults: other checkouts may be running
theirs on this host). The binaries come from ``make setup``; when they are missing the fixture
raises ``NotBuilt`` and every test that uses it fails: it is never skipped.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.cluster.controlplane import ControlPlane, free_port


@pytest.fixture(scope="session")
def controlplane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(
        Path(tmp_path_factory.mktemp("controlplane")),
        host="127.0.0.1",
        port=free_port(),
        etcd_ports=(free_port(), free_port()),
    )
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()
