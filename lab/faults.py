"""Start ``ipvsproxy run`` with a deliberately broken dataplane, for tests of the tests.

    python -m lab.faults NAME run --kubeconfig ... (ipvsproxy's own arguments)

The fault is a backend wrapped behind its interface (``ipvsproxy.kernel.interfaces``), handed
to the daemon in place of ``Backends.open``; ipvsproxy itself is not changed. A demo or an
end-to-end test that still passes with a fault injected proves nothing, so each fault breaks
something those checks must notice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence

from ipvsproxy.core.diff import DestOp, OpKind, ServiceOp
from ipvsproxy.core.virtual_servers import (
    DestKey,
    ObservedDest,
    Seen,
    ServiceKey,
    Traffic,
    VirtualServer,
)
from ipvsproxy.kernel.backends import Backends
from ipvsproxy.kernel.interfaces import IPVSBackend

FAULTS: dict[str, str] = {
    "drop-real-servers": "IPVS real servers are never programmed (virtual servers are)",
}


class DropRealServers:
    """An IPVS backend that never adds a real server: it passes every other operation on to
    ``ipvs`` and reports the batch as the kernel answered it."""

    def __init__(self, ipvs: IPVSBackend) -> None:
        self.ipvs = ipvs
        self.counters = ipvs.counters

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int:
        kept = [op for op in ops if not (isinstance(op, DestOp) and op.kind is OpKind.ADD)]
        return self.ipvs.apply(kept)

    def services(self) -> dict[ServiceKey, VirtualServer]:
        return self.ipvs.services()

    def each_service(self) -> Iterator[VirtualServer]:
        return self.ipvs.each_service()

    def dests(self, key: ServiceKey) -> dict[DestKey, Seen]:
        return self.ipvs.dests(key)

    def services_with_traffic(self) -> dict[ServiceKey, tuple[VirtualServer, Traffic]]:
        return self.ipvs.services_with_traffic()

    def dests_with_traffic(self, key: ServiceKey) -> dict[DestKey, tuple[ObservedDest, Traffic]]:
        return self.ipvs.dests_with_traffic(key)

    def read_timeouts(self) -> tuple[int, int, int]:
        return self.ipvs.read_timeouts()

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        self.ipvs.set_timeouts(tcp, tcp_fin, udp)

    def close(self) -> None:
        self.ipvs.close()


def _drop_real_servers() -> Backends:
    b = Backends.open()
    return Backends(
        DropRealServers(b.ipvs), b.addresses, b.ipsets, b.iptables, b.conntrack, b.sysctls
    )


_OPEN: dict[str, Callable[[], Backends]] = {"drop-real-servers": _drop_real_servers}


def backends(name: str) -> Callable[[], Backends]:
    """What the daemon opens in place of ``Backends.open`` with fault ``name``."""
    if name not in _OPEN:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    return _OPEN[name]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] not in FAULTS or args[1] != "run":
        known = "\n".join(f"  {k}: {v}" for k, v in FAULTS.items())
        print(
            f"usage: python -m lab.faults NAME run IPVSPROXY-ARGS...\nfaults:\n{known}",
            file=sys.stderr,
        )
        return 2
    open_backends = backends(args[0])
    print(f"lab.faults: injected {args[0]}: {FAULTS[args[0]]}", file=sys.stderr, flush=True)
    from ipvsproxy.cli import cmd_run

    return cmd_run(args[2:], open_backends)


if __name__ == "__main__":
    sys.exit(main())
