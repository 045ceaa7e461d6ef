"""What a proxy process costs, read from /proc from outside it: CPU seconds (every thread, plus
the children it has waited for, such as ``iptables-restore`` and ``ipset``) and peak RSS."""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """The process's CPU time so far: each thread's run time in nanoseconds from schedstat
    (finer than the clock tick a change can cost less than), and its waited-for children's
    user and system time (in ticks: /proc has nothing finer for them)."""
    own = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            own += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended between the listing and the read
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    children = int(fields[13]) + int(fields[14])  # cutime, cstime (fields 16 and 17)
    return own / 1e9 + children / TICK


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the most resident memory the process has held since it started."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for process {pid}")


def wait_idle(
    pid: int, window: float = 0.25, threshold: float = 0.005, timeout: float = 60.0
) -> float:
    """Wait until the process spends under ``threshold`` CPU seconds in two windows in a row
    (done with the work it was given); returns its CPU seconds then."""
    deadline = time.monotonic() + timeout
    last = cpu_seconds(pid)
    quiet = 0
    while time.monotonic() < deadline:
        time.sleep(window)
        now = cpu_seconds(pid)
        quiet = quiet + 1 if now - last < threshold else 0
        last = now
        if quiet >= 2:
            break
    return last
