"""The lab boots on hosts whose XSAVE area outgrows UML 6.1's buffer (AMX): the wrapper makes
UML fall back to the i387/SSE registers and keeps AVX out of the guest.

The CI machine may have AMX where this one has not, so the fallback is forced here
(LAB_UML_FPREGS=1) and must run real guest work: Python, OpenSSL, modprobe, IPVS and pytest.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lab.cluster import upstream
from lab.uml import guest, xstate

REPO = Path(__file__).resolve().parents[2]

AMX_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile amx_int8\n"
AVX512_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 xsaves\n"


def test_amx_is_read_from_the_cpu_flags() -> None:
    assert xstate.cpu_has_amx(AMX_CPUINFO)
    assert not xstate.cpu_has_amx(AVX512_CPUINFO)
    # a word that merely contains the name is not the flag
    assert not xstate.cpu_has_amx("flags\t: fpu amx_tile_not_really\n")
    assert not xstate.cpu_has_amx("model name\t: amx_tile in a name\n")


def test_the_override_forces_or_forbids_the_wrapper(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["/usr/bin/linux.uml", "mem=1G"]
    monkeypatch.setenv(xstate.OVERRIDE, "0")
    assert xstate.adapt(argv) == argv
    assert xstate.guest_env() == {}
    assert xstate.printf_exports() == ""
    monkeypatch.setenv(xstate.OVERRIDE, "1")
    wrapped = xstate.adapt(argv)
    assert wrapped[:3] == [sys.executable, "-I", str(REPO / "lab" / "uml" / "xstate.py")]
    assert wrapped[3:5] == argv
    assert f"GLIBC_TUNABLES={xstate.GUEST_GLIBC_TUNABLES}" in wrapped[5:]
    assert f"OPENSSL_ia32cap={xstate.GUEST_OPENSSL_IA32CAP}" in wrapped[5:]
    assert f"GODEBUG={xstate.GUEST_GODEBUG}" in wrapped[5:]
    assert "export GLIBC_TUNABLES=" in xstate.printf_exports()
    assert guest.guest_environment()["GLIBC_TUNABLES"] == xstate.GUEST_GLIBC_TUNABLES
    monkeypatch.setenv(xstate.OVERRIDE, "yes")
    with pytest.raises(ValueError, match="LAB_UML_FPREGS must be 0, 1 or unset"):
        xstate.host_needs_it()


PROBE = textwrap.dedent(
    """
    import ctypes, os, signal, sys
    sys.path.insert(0, sys.argv[1])
    from lab.uml import xstate

    libc = ctypes.CDLL(None, use_errno=True)

    class Iovec(ctypes.Structure):
        _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

    pid = os.fork()
    if pid == 0:
        libc.ptrace(0, 0, 0, 0)  # PTRACE_TRACEME
        os.kill(os.getpid(), signal.SIGSTOP)
        os._exit(0)
    os.waitpid(pid, 0)
    buf = ctypes.create_string_buffer(1 << 16)

    def regset(request, note):
        iov = Iovec(ctypes.addressof(buf), 1 << 16)
        rc = libc.ptrace(request, pid, note, ctypes.byref(iov))
        return "ok" if rc == 0 else os.strerror(ctypes.get_errno())

    fpregs = lambda: "ok" if libc.ptrace(14, pid, 0, buf) == 0 else "failed"  # GETFPREGS
    print("before", regset(0x4204, 0x202), fpregs())
    xstate.install()
    print("after", regset(0x4204, 0x202), regset(0x4204, 1), fpregs())
    libc.ptrace(7, pid, 0, 0)  # PTRACE_CONT
    os.waitpid(pid, 0)
    """
)


def test_the_filter_fails_exactly_the_xstate_regset_requests() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(REPO)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    # NT_X86_XSTATE now fails with EIO, as on a kernel without it; NT_PRSTATUS and
    # PTRACE_GETFPREGS (what UML falls back to) still work.
    assert proc.stdout.splitlines() == [
        "before ok ok",
        f"after {os.strerror(5)} ok ok",
    ]


def test_a_guest_without_xstate_runs_python_openssl_modules_and_ipvs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(xstate.OVERRIDE, "1")
    lines: list[str] = []
    script = (
        "tr '\\0' '\\n' </proc/1/environ | grep -c -e ^GLIBC_TUNABLES= -e ^OPENSSL_ia32cap=; "
        # Go programs (the lab's control plane): Go's runtime picks AVX and AVX-512 by CPUID
        f"{upstream.binary('etcd')} --version | head -1; "
        "python -c 'import hashlib, ssl; print(hashlib.sha256(b\"lab\").hexdigest()[:12])'; "
        "ipvsadm -A -t 10.0.0.1:80 -s rr && ipvsadm -a -t 10.0.0.1:80 -r 10.0.0.2:80 -m && "
        "ipvsadm -Ln | grep -c 10.0.0; "
        # a module the lab did not load up front: the kernel's own modprobe, with the exports
        "grep -c GLIBC_TUNABLES /run/lab-bin/modprobe; ip link add t0 type ifb && echo ifb"
    )
    result = guest.boot(["sh", "-c", script], on_output=lines.append, timeout=300)
    assert result.ok, result.describe()
    assert lines == [
        "2",
        f"etcd Version: {upstream.ETCD_VERSION[1:]}",
        hashlib.sha256(b"lab").hexdigest()[:12],
        "2",
        "1",
        "ifb",
    ], lines


def test_kernel_tests_run_in_a_guest_without_xstate() -> None:
    """pytest in the guest, as the kernel tests run there: its pass and its failure both reach
    the host."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "lab/uml/samples/kernel_pass_fail.py",
            "-v",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, xstate.OVERRIDE: "1"},
    )
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert "kernel_pass_fail.py::test_passes_in_guest PASSED" in proc.stdout
    assert "seen-inside-the-guest" in proc.stdout
