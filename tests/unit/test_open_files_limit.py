"""The soft open-files limit is raised to the hard one at start, as Go does for upstream's
kube-proxy: containerd 2.x and Docker 29 give a container a soft limit of 1,024."""

from __future__ import annotations

import os
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


def test_address_notices_are_read_on_a_descriptor_past_1023() -> None:
    """Past the old soft limit, select() cannot wait on a descriptor: the notices' socket is
    waited on with poll()."""
    from ipvsproxy.kernel.addresses import AddressEvents

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1100:
        pytest.skip(f"a soft open-files limit of {soft} cannot hold 1,100 descriptors")
    fillers = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    try:
        events = AddressEvents()
        try:
            assert events.sock.fileno() > 1023
            assert events.wait(0.01) == set()
        finally:
            events.close()
    finally:
        for fd in fillers:
            os.close(fd)
