"""One kernel test passes, one fails: the host run must report exactly that."""

import pytest

pytestmark = pytest.mark.kernel


def test_passes_in_guest() -> None:
    with open("/proc/net/ip_vs") as f:  # exists only in the lab kernel
        assert "IP Virtual Server" in f.read()


def test_fails_in_guest() -> None:
    guest_value = "seen-inside-the-guest"
    assert guest_value == "something else"
