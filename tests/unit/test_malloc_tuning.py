"""The daemon's malloc settings: each applied unless the operator set glibc's own variable."""

from __future__ import annotations

import subprocess
import sys

from ipvsproxy.process import malloc_tuning
from ipvsproxy.process.malloc_tuning import M_ARENA_MAX, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


class Recorder:
    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def __call__(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return self.result


def test_every_setting_is_applied_when_the_operator_set_none() -> None:
    rec = Recorder()
    applied = malloc_tuning.configure({}, rec)
    assert rec.calls == [(M_ARENA_MAX, 1), (M_MMAP_THRESHOLD, 131072), (M_TRIM_THRESHOLD, 131072)]
    assert applied == {
        "MALLOC_ARENA_MAX": 1,
        "MALLOC_MMAP_THRESHOLD_": 131072,
        "MALLOC_TRIM_THRESHOLD_": 131072,
    }


def test_the_operators_variable_wins() -> None:
    rec = Recorder()
    applied = malloc_tuning.configure({"MALLOC_ARENA_MAX": "4"}, rec)
    assert (M_ARENA_MAX, 1) not in rec.calls
    assert "MALLOC_ARENA_MAX" not in applied
    assert set(applied) == {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"}


def test_a_setting_the_library_refuses_is_not_reported() -> None:
    assert malloc_tuning.configure({}, Recorder(result=0)) == {}


def test_glibc_accepts_them() -> None:
    """In a fresh interpreter (this one's allocator is left as it is)."""
    code = "from ipvsproxy.process import malloc_tuning; print(sorted(malloc_tuning.configure({})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == str(
        ["MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"]
    )
