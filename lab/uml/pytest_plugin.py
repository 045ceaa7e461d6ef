"""Pytest integration of the kernel lab: ``@pytest.mark.kernel`` tests run inside the guest.

On the host, kernel tests are collected like any other and moved to the end. When the first one
is due, one guest boots and runs all of them with pytest; each report the guest makes is sent
back over the console as one JSON line and replayed on the host as that test's own report, as
it arrives. So failures, tracebacks and captured output show in the host's pytest output, the
session boots one kernel whatever the number of kernel tests, and a guest that panics, hangs or
never runs a test turns that test red: nothing a kernel test claims can pass by not running.

``--lab-no-skips`` (used by ``make test``) makes any skipped test fail the session.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import threading
from collections.abc import Iterator
from typing import IO, Any

import pytest

from lab.uml import guest

REPORT_PREFIX = "@@LAB-REPORT "
IN_GUEST = os.environ.get("LAB_IN_GUEST") == "1"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lab", "ipvsproxy kernel lab")
    group.addoption(
        "--lab-no-skips",
        action="store_true",
        help="fail the session if any test was skipped",
    )
    group.addoption(
        "--lab-timeout",
        type=float,
        default=2400.0,
        help="seconds the one guest boot that runs all kernel tests may take (default 2400)",
    )
    group.addoption(
        "--lab-mem",
        default="3G",
        help="guest memory (default 3G: the control plane runs in the guest)",
    )
    group.addoption(
        "--e2e-kubeconfig",
        default=None,
        metavar="PATH",
        help="run tests/e2e on the host against the real cluster of this kubeconfig "
        "(ipvsproxy deployed on it) instead of in the kernel lab",
    )
    group.addoption(
        "--lab-guest-report",
        default=None,
        help="(internal) inside the guest: where to write test reports for the host",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kernel: runs inside the lab's User-Mode Linux kernel (one boot per session)"
    )
    report_path = config.getoption("--lab-guest-report")
    if report_path:
        config.pluginmanager.register(GuestReporter(config, report_path), "lab-guest-reporter")
    elif not IN_GUEST:
        config.pluginmanager.register(HostRunner(config), "lab-host-runner")
    config.pluginmanager.register(SkipGuard(config), "lab-skip-guard")


def is_kernel(item: pytest.Item) -> bool:
    return item.get_closest_marker("kernel") is not None


class GuestReporter:
    """Inside the guest: send every test report to the host as one console line."""

    def __init__(self, config: pytest.Config, path: str) -> None:
        self.config = config
        self.out: IO[str] = open(path, "w", buffering=1)  # noqa: SIM115 - lives for the session

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = self.config.hook.pytest_report_to_serializable(config=self.config, report=report)
        self.out.write("\n" + REPORT_PREFIX + json.dumps(data) + "\n")
        self.out.flush()

    def pytest_unconfigure(self) -> None:
        self.out.close()


class GuestSession:
    """One guest boot running a list of kernel tests, collecting their reports as they come."""

    def __init__(self, config: pytest.Config, nodeids: list[str]) -> None:
        self.config = config
        self.nodeids = nodeids
        self.reports: dict[str, list[pytest.TestReport]] = collections.defaultdict(list)
        self.done_ids: set[str] = set()
        self.output: collections.deque[str] = collections.deque(maxlen=200)
        self.finished = False
        self.failure: str | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="lab-guest", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def command(self) -> list[str]:
        # The guest starts in the repository, so it finds the same rootdir and ini file and
        # hence the same node ids; the ini file is named in case the host was given another.
        ini = ["-c", str(self.config.inipath)] if self.config.inipath else []
        return [
            sys.executable,
            "-m",
            "pytest",
            *ini,
            "-p",
            "no:cacheprovider",
            "--color=no",
            "-q",
            "--lab-guest-report",
            "/dev/console",
            *self.nodeids,
        ]

    def _on_line(self, line: str) -> None:
        # pytest's own progress output in the guest shares the console and does not always end
        # its lines, so a report can start mid-line.
        before, mark, payload = line.partition(REPORT_PREFIX)
        if before:
            with self.cond:
                self.output.append(before)
        if not mark:
            return
        data = json.loads(payload)
        report = self.config.hook.pytest_report_from_serializable(config=self.config, data=data)
        with self.cond:
            self.reports[report.nodeid].append(report)
            if report.when == "teardown":
                self.done_ids.add(report.nodeid)
            self.cond.notify_all()

    def _run(self) -> None:
        failure: str | None = None
        try:
            result = guest.boot(
                self.command(),
                on_output=self._on_line,
                timeout=self.config.getoption("--lab-timeout"),
                mem=self.config.getoption("--lab-mem"),
            )
            if result.rc is None:
                failure = result.describe()
            elif result.rc not in (0, 1):  # 1 is "some tests failed", already reported
                failure = f"pytest in the guest exited with status {result.rc}"
        except Exception as exc:  # any failure to boot fails the kernel tests
            failure = f"the lab guest could not run: {exc}"
        with self.cond:
            self.failure = failure
            self.finished = True
            self.cond.notify_all()

    def wait_for(self, nodeid: str) -> tuple[list[pytest.TestReport], str | None]:
        """Block until ``nodeid`` has completed in the guest (or the guest ended)."""
        with self.cond:
            while nodeid not in self.done_ids and not self.finished:
                self.cond.wait()
            return list(self.reports.get(nodeid, [])), self.failure

    def guest_output(self) -> str:
        with self.cond:
            return "\n".join(self.output)


class HostRunner:
    """On the host: run kernel tests through one guest session instead of in this process."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.kernel_ids: list[str] = []
        self.session: GuestSession | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        host = [i for i in items if not is_kernel(i)]
        kernel = [i for i in items if is_kernel(i)]
        items[:] = host + kernel
        self.kernel_ids = [i.nodeid for i in kernel]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> bool | None:
        if not is_kernel(item):
            return None
        if self.session is None:
            self.session = GuestSession(self.config, self.kernel_ids)
            self.session.start()
        item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        reports, failure = self.session.wait_for(item.nodeid)
        if not _complete(reports):
            reports.append(self._missing(item, reports, failure))
        for report in reports:
            item.ihook.pytest_runtest_logreport(report=report)
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        return True

    def _missing(
        self, item: pytest.Item, reports: list[pytest.TestReport], failure: str | None
    ) -> pytest.TestReport:
        assert self.session is not None
        why = failure or "the guest finished without running this test"
        text = (
            f"kernel test did not complete in the lab guest: {why}\n"
            f"--- guest pytest output (tail) ---\n{self.session.guest_output()}"
        )
        return pytest.TestReport(
            nodeid=item.nodeid,
            location=item.location,
            keywords={k: 1 for k in item.keywords},
            outcome="failed",
            longrepr=text,
            when="call" if reports else "setup",
            sections=[],
            duration=0.0,
        )


def _complete(reports: list[pytest.TestReport]) -> bool:
    """A test ran to the end: set-up, a call unless set-up did not pass, and teardown."""
    whens = {r.when: r for r in reports}
    setup = whens.get("setup")
    if setup is None or "teardown" not in whens:
        return False
    return not setup.passed or "call" in whens


class SkipGuard:
    """Counts skips so ``--lab-no-skips`` can fail the session over them."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.skipped: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skipped.append(report.nodeid)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped:
            self.skipped.append(report.nodeid)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.skipped and self.config.getoption("--lab-no-skips"):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.skipped and self.config.getoption("--lab-no-skips"):
            terminalreporter.write_sep(
                "=", "skipped tests fail this run (--lab-no-skips)", red=True
            )
            for nodeid in self.skipped:
                terminalreporter.write_line(f"SKIPPED is a failure here: {nodeid}")


LAB_FAMILIES = ("dual-stack", "ipv6-only")


@pytest.fixture(scope="session")
def lab_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Inside the guest: a 3-node cluster with 2 pods a node, echo servers on port 8080 in
    every pod and on port 9090 in every node (hostNetwork). Dual-stack; a module that
    parametrizes it indirectly with "ipv6-only" gets an IPv6-only one. pytest keeps one
    instance of it at a time: the other family's is torn down first, and built again for the
    next test that wants it."""
    from lab.net.topology import Cluster

    if not IN_GUEST:
        pytest.fail("lab_cluster is only available to @pytest.mark.kernel tests")
    family = getattr(request, "param", "dual-stack")
    if family not in LAB_FAMILIES:
        pytest.fail(f"lab_cluster: {family!r} is none of {', '.join(LAB_FAMILIES)}")
    cluster = Cluster.build(nodes=3, pods_per_node=2, ipv4=family == "dual-stack")
    try:
        cluster.start_pod_echo(port=8080)
        cluster.start_echo(((n.name, n.netns) for n in cluster.nodes), port=9090)
        yield cluster
    finally:
        cluster.destroy()
