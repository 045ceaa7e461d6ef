"""Start ``ipvsproxy`` with a deliberately broken dataplane, for tests of the tests.

    python -m lab.faults NAME run --kubeconfig ... (ipvsproxy's own arguments)

The fault is patched into this process before ipvsproxy's command line runs; ipvsproxy itself
is not changed. A demo or an end-to-end test that still passes with a fault injected proves
nothing, so each fault breaks something those checks must notice.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

FAULTS: dict[str, str] = {
    "drop-real-servers": "IPVS real servers are never programmed (virtual servers are)",
}


def _drop_real_servers() -> None:
    from ipvsproxy.core.diff import DestOp, OpKind
    from ipvsproxy.kernel import ipvs

    original: Callable[..., int] = ipvs.IPVS.apply

    def apply(self: Any, ops: Sequence[Any]) -> int:
        kept = [op for op in ops if not (isinstance(op, DestOp) and op.kind is OpKind.ADD)]
        return original(self, kept)

    ipvs.IPVS.apply = apply  # type: ignore[method-assign]


_INJECT: dict[str, Callable[[], None]] = {"drop-real-servers": _drop_real_servers}


def inject(name: str) -> None:
    if name not in _INJECT:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(sorted(FAULTS))}")
    _INJECT[name]()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in FAULTS:
        known = "\n".join(f"  {k}: {v}" for k, v in FAULTS.items())
        print(
            f"usage: python -m lab.faults NAME IPVSPROXY-ARGS...\nfaults:\n{known}", file=sys.stderr
        )
        return 2
    inject(args[0])
    print(f"lab.faults: injected {args[0]}: {FAULTS[args[0]]}", file=sys.stderr, flush=True)
    from ipvsproxy.cli import main as ipvsproxy_main

    return ipvsproxy_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
