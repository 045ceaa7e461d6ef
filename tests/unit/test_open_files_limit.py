"""The soft open-files limit is raised to the hard one at start, as Go does for upstream's
kube-proxy: containerd 2.x and Docker 29 give a container a soft limit of 1,024."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import pytest

LOWERED = 256

# ``ipvsproxy run`` up to the daemon proper, which answers the soft limit it was started with.
SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from ipvsproxy import cli
    from ipvsproxy.daemon import wiring

    def daemon(cfg, *_):
        print("soft", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        return 0

    wiring.run = daemon
    sys.exit(cli.main(["run"]))
    """
)


def lowered() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (LOWERED, hard))


def test_run_raises_the_soft_open_files_limit_to_the_hard_one() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard <= LOWERED:
        pytest.skip(f"the hard open-files limit {hard} leaves nothing to raise")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        preexec_fn=lowered,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["soft", str(hard)]
    assert f"open files limit raised from {LOWERED} to {hard}" in done.stderr
