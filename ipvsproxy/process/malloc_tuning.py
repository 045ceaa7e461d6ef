"""How the C allocator keeps the daemon's memory: one arena and fixed mmap and trim
thresholds rather than glibc's defaults, which hold on to more of it (docs/performance.md).

Python keeps its small objects in its own arenas, but every larger block (dict and set tables,
lists, the API server's pages of JSON, netlink buffers) comes from malloc, where two of glibc's
defaults suit a long-running, threaded Python process poorly:
- the mmap threshold is dynamic: freeing a large block raises the threshold to its size, so
  once the first lists' buffers have come and gone, later large blocks are carved from the
  heap, fragment it, and are seldom returned to the system;
- each thread that allocates gets an arena of its own (up to 8 per core), each keeping its own
  free memory, while the interpreter's lock lets one thread run Python at a time anyway.

So ``ipvsproxy run`` sets these as it starts, before it lists anything; a matching MALLOC_*
environment variable (glibc's own tunable) set by the operator wins. Elsewhere (another C
library) nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping

# mallopt(3) parameters (glibc's malloc.h) and the environment variable that sets each
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

SETTINGS: tuple[tuple[str, int, int], ...] = (
    # (environment variable, parameter, value)
    ("MALLOC_ARENA_MAX", M_ARENA_MAX, 1),
    # 128 KiB is glibc's initial threshold; set, it stays (no dynamic adjustment).
    ("MALLOC_MMAP_THRESHOLD_", M_MMAP_THRESHOLD, 128 * 1024),
    ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, 128 * 1024),
)

Mallopt = Callable[[int, int], int]


def _glibc_mallopt() -> Mallopt | None:
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def configure(
    environ: Mapping[str, str] = os.environ, mallopt: Mallopt | None = None
) -> dict[str, int]:
    """Apply the settings the operator left alone; returns those set (by variable name)."""
    fn = mallopt if mallopt is not None else _glibc_mallopt()
    if fn is None:
        return {}
    applied = {}
    for variable, parameter, value in SETTINGS:
        if variable in environ:
            continue
        if fn(parameter, value) == 1:  # mallopt returns 1 on success
            applied[variable] = value
    return applied
