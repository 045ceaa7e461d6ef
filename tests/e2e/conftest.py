"""tests/e2e run against the kernel lab (kernel-marked, in the guest) or, with
``--e2e-kubeconfig PATH``, against that real cluster from the host."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import E2ECluster

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--e2e-kubeconfig"):
        return
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.kernel)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call":
        item.stash[FAILED] = report.failed
    return report


FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="package")
def e2e_cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[E2ECluster]:
    kubeconfig = request.config.getoption("--e2e-kubeconfig")
    if kubeconfig:
        from tests.e2e.real import RealCluster

        real = RealCluster.setup(Path(kubeconfig))
        try:
            yield real
        finally:
            real.teardown()
        return
    from tests.e2e.lab import LabE2E

    topo: Any = request.getfixturevalue("lab_cluster")
    with LabE2E.started(topo, tmp_path_factory.mktemp("e2e")) as lab:
        yield lab


@pytest.fixture
def cluster(request: pytest.FixtureRequest, e2e_cluster: E2ECluster) -> Iterator[E2ECluster]:
    """The cluster for one test; on failure the daemons' logs (lab) go with the report."""
    yield e2e_cluster
    logs = getattr(e2e_cluster, "logs", None)
    if request.node.stash.get(FAILED, False) and logs is not None:
        print(logs())
