"""Run linux.uml on hosts whose CPU state is too big for it (AMX): ``python lab/uml/xstate.py
/usr/bin/linux.uml ARGS...``.

Debian bookworm's UML (6.1) saves and restores its processes' FPU state with
``PTRACE_GETREGSET``/``PTRACE_SETREGSET NT_X86_XSTATE`` in a fixed buffer. On a host with AMX
the XSAVE area is 11008 bytes; the host kernel refuses a ``SETREGSET`` of any other size
(EFAULT), so every guest process dies at its first context switch: "Kernel panic - not syncing:
Attempted to kill init! exitcode=0x0000000b". UML falls back to the i387/SSE registers
(``PTRACE_GETFPREGS``) when its start-up probe of ``GETREGSET NT_X86_XSTATE`` fails, so this
wrapper installs a seccomp filter that makes exactly those two ptrace requests fail with EIO and
then executes linux.uml. Guest processes then keep their x87/SSE state but not AVX (measured:
``modprobe -a`` of the lab's modules fails with EINVAL when glibc uses AVX), so the guest's
environment tells glibc, OpenSSL and Go programs not to use AVX, including the modprobe the
kernel runs to load modules on demand (SCTP's cookie HMAC, md5, is loaded that way). ``adapt()`` and
``printf_exports()`` do it, only on hosts that need it.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
EIO = 5
AUDIT_ARCH_X86_64 = 0xC000003E
NR_PTRACE = 101
PTRACE_GETREGSET = 0x4204
PTRACE_SETREGSET = 0x4205
NT_X86_XSTATE = 0x202
# BPF: ld [k] (absolute word), jeq #k, ret #k
_LD, _JEQ, _RET = 0x20, 0x15, 0x06
# struct seccomp_data: nr @0, arch @4, args[i] @16 + 8 i (low word first)
_NR, _ARCH, _ARG0, _ARG2 = 0, 4, 16, 32

# glibc's string functions and OpenSSL pick AVX code by CPUID; in the guest they must not.
GUEST_GLIBC_TUNABLES = (
    "glibc.cpu.hwcaps=-AVX,-AVX2,-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD,"
    "-AVX_Fast_Unaligned_Load"
)
# capability words: CPUID.1 (EDX:ECX), CPUID.7 (EBX...): clear AVX, AVX2, AVX-512 F/DQ/BW/VL
GUEST_OPENSSL_IA32CAP = "~0x1000000000000000:~0xC0030020"
# Go's runtime and standard library (the lab's etcd, kube-apiserver, kube-proxy) pick AVX,
# AVX2 and AVX-512 by CPUID too: without this they crash ("gzip: invalid checksum", the
# garbage collector's "traceback did not unwind completely", SIGSEGV in sync.Map). Each AVX-512
# feature is its own switch (the garbage collector's AVX-512 scan needs VL, BW and DQ).
GUEST_GODEBUG = ",".join(
    f"cpu.{name}=off"
    for name in ("avx", "avx2", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
)


def _stmt(code: int, k: int) -> bytes:
    return struct.pack("HBBI", code, 0, 0, k)


def _jump(k: int, jt: int, jf: int) -> bytes:
    return struct.pack("HBBI", _JEQ, jt, jf, k)


def program() -> list[bytes]:
    return [
        _stmt(_LD, _ARCH),
        _jump(AUDIT_ARCH_X86_64, 1, 0),
        _stmt(_RET, SECCOMP_RET_ALLOW),
        _stmt(_LD, _NR),
        _jump(NR_PTRACE, 1, 0),
        _stmt(_RET, SECCOMP_RET_ALLOW),
        _stmt(_LD, _ARG0),
        _jump(PTRACE_GETREGSET, 1, 0),
        _jump(PTRACE_SETREGSET, 0, 3),
        _stmt(_LD, _ARG2),
        _jump(NT_X86_XSTATE, 0, 1),
        _stmt(_RET, SECCOMP_RET_ERRNO | EIO),
        _stmt(_RET, SECCOMP_RET_ALLOW),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install() -> None:
    """Make ptrace(GETREGSET/SETREGSET, NT_X86_XSTATE) fail with EIO in this process and its
    children from now on."""
    insns = program()
    buf = ctypes.create_string_buffer(b"".join(insns))
    prog = _SockFprog(len(insns), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


# LAB_UML_FPREGS=1 forces the wrapper on any host (how the fallback is tested on hosts without
# AMX), =0 forbids it; unset or empty: decided by the CPU.
OVERRIDE = "LAB_UML_FPREGS"


def cpu_has_amx(cpuinfo: str) -> bool:
    """AMX tile state in the CPU flags: its XSAVE area (11008 bytes) outgrows UML 6.1's buffer."""
    return any(
        line.startswith("flags") and "amx_tile" in line.split() for line in cpuinfo.splitlines()
    )


def host_needs_it() -> bool:
    """UML must fall back to the i387/SSE registers on this host (or the override says so)."""
    forced = os.environ.get(OVERRIDE, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise ValueError(f"{OVERRIDE} must be 0, 1 or unset, not {forced!r}")
    try:
        return cpu_has_amx(Path("/proc/cpuinfo").read_text())
    except OSError:
        return False


def guest_env() -> dict[str, str]:
    """What every guest process needs in its environment on this host (nothing, mostly)."""
    if not host_needs_it():
        return {}
    return {
        "GLIBC_TUNABLES": GUEST_GLIBC_TUNABLES,
        "OPENSSL_ia32cap": GUEST_OPENSSL_IA32CAP,
        "GODEBUG": GUEST_GODEBUG,
    }


def printf_exports() -> str:
    """``guest_env()`` as ``export`` lines for a ``printf`` format: for scripts the kernel runs
    with its own environment (the modprobe it calls to load modules on demand)."""
    return "".join(f"export {k}={v}\\n" for k, v in guest_env().items())


def adapt(argv: Sequence[str]) -> list[str]:
    """A linux.uml command line that boots on this host: unchanged where nothing is needed;
    on an AMX host, run through this wrapper with the guest's environment on the kernel command
    line (the kernel hands ``KEY=VALUE`` parameters it does not know to init)."""
    env = guest_env()
    if not env:
        return list(argv)
    # By path, isolated: the supervisor starts linux.uml with a bare environment and any cwd.
    wrapper = [sys.executable, "-I", str(Path(__file__).resolve())]
    return [*wrapper, *argv, *(f"{k}={v}" for k, v in env.items())]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python lab/uml/xstate.py /usr/bin/linux.uml ARGS...", file=sys.stderr)
        return 2
    install()
    os.execv(args[0], args)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
