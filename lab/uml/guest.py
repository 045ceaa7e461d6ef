"""Boot the Debian User-Mode Linux kernel with the host filesystem as root and run a command.

linux.uml exits 0 whatever happens inside, so success is only ever taken from the exit status
that our init script prints between markers on the console. A guest that panics, dies or hangs
is reported as a failure that carries the tail of its console.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.uml import xstate

REPO = Path(__file__).resolve().parents[2]
INIT = Path(__file__).resolve().parent / "guest-init.sh"
KERNEL = Path("/usr/bin/linux.uml")
UML_MODULES = Path("/usr/lib/uml/modules")

BEGIN_MARK = "@@LAB-BEGIN@@"
END_MARK = "@@LAB-END rc="
SETUP_FAILED_MARK = "@@LAB-SETUP-FAILED@@"

# Everything the dataplane and the lab need, loaded before the command runs. The kernel's own
# module auto-loading also works in the guest (see setup.sh), but loading up front makes a
# missing module a set-up failure instead of an obscure error deep inside a test.
MODULES = (
    "ip_vs",
    "ip_vs_rr",
    "ip_vs_wrr",
    "ip_vs_lc",
    "ip_vs_wlc",
    "ip_vs_sh",
    "ip_vs_dh",
    "ip_vs_sed",
    "ip_vs_nq",
    "ip_vs_mh",
    "ip_vs_fo",
    "ip_vs_ovf",
    "ip_vs_lblc",
    "ip_vs_lblcr",
    "xt_ipvs",
    "dummy",
    "veth",
    "bridge",
    "br_netfilter",
    "ip_set",
    "ip_set_hash_ip",
    "ip_set_hash_ipport",
    "ip_set_hash_ipportip",
    "ip_set_hash_ipportnet",
    "ip_set_hash_net",
    "ip_set_bitmap_port",
    "xt_set",
    "ip_tables",
    "iptable_nat",
    "iptable_filter",
    "iptable_mangle",
    "iptable_raw",
    "xt_MASQUERADE",
    "xt_mark",
    "xt_comment",
    "xt_addrtype",
    "xt_conntrack",
    "xt_physdev",
    "xt_multiport",
    "xt_tcpudp",
    "xt_nat",
    "xt_statistic",
    "sctp",
    "nf_reject_ipv4",
    "ipt_REJECT",
    "nf_conntrack",
    "nf_conntrack_netlink",
    "nf_nat",
    "sch_ingress",
    "ip6_tables",
    "ip6table_nat",
    "ip6table_filter",
    "ip6t_REJECT",
)

# iptables front-ends that the guest's PATH points at the legacy backend: the UML kernel has no
# nft nat table. The host's alternatives are never touched.
IPTABLES_SHIMS = {
    "iptables": "iptables-legacy",
    "iptables-save": "iptables-legacy-save",
    "iptables-restore": "iptables-legacy-restore",
    "ip6tables": "ip6tables-legacy",
    "ip6tables-save": "ip6tables-legacy-save",
    "ip6tables-restore": "ip6tables-legacy-restore",
}

GUEST_BIN = "/run/lab-bin"
CONNTRACK_MAX = 262144
GUEST_MODROOT = "/run/modroot"


class LabUnavailable(RuntimeError):
    """The host cannot boot the lab kernel (package missing, not Linux, ...)."""


@dataclass
class GuestResult:
    """How a guest run ended. ``rc`` is the command's exit status, or None if it never said."""

    rc: int | None
    reason: str
    console_tail: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def describe(self) -> str:
        tail = "\n".join(self.console_tail)
        return f"{self.reason}\n--- guest console (last {len(self.console_tail)} lines) ---\n{tail}"


def kernel_release() -> str:
    if not KERNEL.exists():
        raise LabUnavailable(
            f"{KERNEL} not found: install the Debian package user-mode-linux (make setup does this)"
        )
    releases = sorted(p.name for p in UML_MODULES.iterdir()) if UML_MODULES.is_dir() else []
    if not releases:
        raise LabUnavailable(f"no UML modules under {UML_MODULES}")
    return releases[-1]


def guest_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment commands see in the guest: the venv first, legacy iptables before it."""
    path = [GUEST_BIN]
    if sys.prefix != sys.base_prefix:
        path.append(str(Path(sys.prefix) / "bin"))
    path += ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    env = {
        "PATH": ":".join(path),
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "PYTHONUNBUFFERED": "1",
        # The guest shares the host's files: keep it from racing the host over __pycache__.
        "PYTHONDONTWRITEBYTECODE": "1",
        "LAB_IN_GUEST": "1",
        "TMPDIR": "/run/tmp",
        "LAB_REPO": str(REPO),
        # lab/ is not installed in the venv (it is not part of the wheel).
        "PYTHONPATH": str(REPO),
    }
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    for name in (
        "IPVSPROXY_LAB_CACHE",
        "XDG_CACHE_HOME",
    ):  # where lab.cluster.upstream's builds are
        if name in os.environ:
            env[name] = os.environ[name]
    # On hosts where UML cannot keep AVX state (AMX hosts), nothing in the guest may use AVX.
    env.update(xstate.guest_env())
    if extra:
        env.update(extra)
    return env


def _env_script(env: Mapping[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())


def _setup_script(release: str, modules: Sequence[str]) -> str:
    lines = ["# written by lab/uml/guest.py for one guest run", "set -ex"]
    lines += [
        f"mkdir -p {GUEST_BIN} {GUEST_MODROOT}/lib/modules",
        f"ln -s {UML_MODULES / release} {GUEST_MODROOT}/lib/modules/{release}",
        # A modprobe that finds the UML modules, for the kernel's auto-loading and for tools
        # such as iptables-legacy that run modprobe themselves.
        f"printf '#!/bin/sh\\n{xstate.printf_exports()}"
        f'exec /sbin/modprobe -d {GUEST_MODROOT} "$@"\\n\' '
        f"> {GUEST_BIN}/modprobe",
        f"chmod +x {GUEST_BIN}/modprobe",
        f"echo {GUEST_BIN}/modprobe > /proc/sys/kernel/modprobe",
    ]
    lines += [f"ln -s /usr/sbin/{dst} {GUEST_BIN}/{src}" for src, dst in IPTABLES_SHIMS.items()]
    if modules:
        lines.append(f"/sbin/modprobe -d {GUEST_MODROOT} -a {' '.join(modules)}")
    if "nf_conntrack" in modules:
        # The conntrack limit is global, read-only in the node namespaces, and one that the
        # proxy cannot raise is fatal (upstream's and ipvsproxy's): the kernel's own default on
        # a node of more than 4 GiB, above what upstream's defaults compute for the guest's CPU.
        lines.append(f"echo {CONNTRACK_MAX} > /proc/sys/net/netfilter/nf_conntrack_max")
    lines += ["ip link set lo up"]
    return "\n".join(lines) + "\n"


MAX_MAP_COUNT = 1 << 20
MAX_MAP_COUNT_FILE = Path("/proc/sys/vm/max_map_count")


def raise_map_count(path: Path = MAX_MAP_COUNT_FILE, wanted: int = MAX_MAP_COUNT) -> None:
    """UML maps guest memory into its host process a page at a time: a guest process of a
    few hundred MB (ipvsproxy holding 10,000 Services) passed the host's default limit of
    65,530 mappings, and the guest died ("UML ran out of memory on the host side"). Raise the
    limit where we may (root); leave it where it is already higher or we may not."""
    try:
        if int(path.read_text()) < wanted:
            path.write_text(str(wanted))
    except (OSError, ValueError):
        pass


def boot(
    command: Sequence[str],
    *,
    on_output: Callable[[str], None] | None = None,
    timeout: float = 3600.0,
    mem: str = "3G",
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    modules: Sequence[str] = MODULES,
) -> GuestResult:
    """Run ``command`` in a fresh guest and return how it ended.

    Each line the command prints is passed to ``on_output`` as it arrives (console noise from
    the kernel before and after the command is kept only for the failure report).
    """
    release = kernel_release()
    if not command:
        raise ValueError("no command given")
    raise_map_count()
    run_dir = Path(tempfile.mkdtemp(prefix="ipvsproxy-lab-"))
    try:
        (run_dir / "setup.sh").write_text(_setup_script(release, modules))
        (run_dir / "env.sh").write_text(_env_script(guest_environment(env)))
        (run_dir / "command.sh").write_text(
            ". /run/lab/env.sh\n"
            f"cd {shlex.quote(str(cwd))} || exit 125\n"
            f"exec {shlex.join(command)}\n"
        )
        argv = [
            str(KERNEL),
            f"mem={mem}",
            "rootfstype=hostfs",
            "rootflags=/",
            "rw",
            f"init={INIT}",
            f"labdir={run_dir}",
            f"uml_dir={run_dir}",
            "quiet",
            "loglevel=3",
            "con=null",
            "con0=null,fd:1",
            "ssl=null",
        ]
        return _supervise(xstate.adapt(argv), on_output or _print_line, timeout, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _print_line(line: str) -> None:
    print(line, flush=True)


class _Console:
    """Splits the guest console into the command's output and the kernel's noise."""

    def __init__(self, on_output: Callable[[str], None]) -> None:
        self.on_output = on_output
        self.tail: collections.deque[str] = collections.deque(maxlen=80)
        self.started = False
        self.rc: int | None = None
        self.panic: str | None = None
        self.setup_failed = False

    def feed(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r\n").replace("\r", "")
        self.tail.append(line)
        if "Kernel panic" in line and self.panic is None:
            self.panic = line.strip()
        if self.rc is not None:
            return
        if not self.started:
            self.started = line.strip() == BEGIN_MARK
            self.setup_failed = self.setup_failed or line.strip() == SETUP_FAILED_MARK
            return
        if END_MARK in line:
            before, _, after = line.partition(END_MARK)
            if before:
                self.on_output(before)
            self.rc = int(after.split("@@", 1)[0])
            return
        self.on_output(line)


def _supervise(
    argv: list[str], on_output: Callable[[str], None], timeout: float, run_dir: Path
) -> GuestResult:
    start = time.monotonic()
    console = _Console(on_output)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "TMPDIR": _memory_dir(run_dir)},
    )
    assert proc.stdout is not None
    stream = proc.stdout

    def pump() -> None:
        for raw in iter(stream.readline, b""):
            console.feed(raw)

    reader = threading.Thread(target=pump, name="lab-console", daemon=True)
    reader.start()
    timed_out = False
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        if proc.poll() is None:
            _kill(proc)
        reader.join(timeout=10)
    seconds = time.monotonic() - start
    tail = list(console.tail)
    if timed_out:
        return GuestResult(None, f"guest did not finish within {timeout:.0f} s", tail, seconds)
    if console.panic:
        return GuestResult(None, f"guest kernel panicked: {console.panic}", tail, seconds)
    if console.setup_failed:
        return GuestResult(None, "guest set-up failed (see its console)", tail, seconds)
    if console.rc is None:
        where = "before the command started" if not console.started else "while it ran"
        return GuestResult(
            None,
            f"guest died {where} without reporting an exit status "
            f"(linux.uml exit status {proc.returncode})",
            tail,
            seconds,
        )
    return GuestResult(console.rc, f"command exited with status {console.rc}", tail, seconds)


def _memory_dir(run_dir: Path) -> str:
    """Where UML keeps the file that backs guest memory: tmpfs if the host has one."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return str(shm)
    return str(run_dir)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    # UML runs as several host processes; they share the session we gave it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
