"""A skipped test: --lab-no-skips must turn the run red."""

import pytest


def test_is_skipped() -> None:
    pytest.skip("skipping on purpose")
