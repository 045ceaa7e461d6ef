"""The guest kernel panics in the first test: both tests must fail on the host."""

import pytest

pytestmark = pytest.mark.kernel


def test_panics_the_guest() -> None:
    with open("/proc/sysrq-trigger", "w") as f:
        f.write("c")


def test_never_runs() -> None:
    pass
