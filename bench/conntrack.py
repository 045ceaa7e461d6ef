"""The UDP conntrack cleanup of one virtual server on a node whose table is large, inside the
lab guest: ``python -m lab run -- python -m bench.conntrack --entries 10000 --output F``.

The table holds ``--entries`` UDP entries to other places (a DNS-heavy node's) and 100 stale
ones to the target. Measured, per way: the time of the cleanup, the entries Python received,
and the peak of Python's allocations during it (tracemalloc). The ways: ipvsproxy's
(``Conntrack.flush_stale``: one dump filtered in the kernel, streamed) and then, for
reference, the whole UDP table listed through pyroute2 as the cleanup did before (slow in the
guest: about 30 s a thousand entries; ``--no-pyroute2`` skips it). Times come from a
User-Mode Linux kernel: compare the two ways of one run, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kernel.conntrack import Conntrack, Stale
from ipvsproxy.kernel.netlink import ct_messages
from ipvsproxy.kernel.netlink.sock import NETLINK_NETFILTER, NetlinkSocket
from lab.net import netns

NS = "bench-conntrack"
PORT = 53
TARGET = ServiceKey("10.96.0.10", Protocol.UDP, PORT)
STALE = 100


def fill(entries: int) -> None:
    """``entries`` UDP entries to 250 other addresses on the target's port, and ``STALE``
    to the target answered by a real server that is gone."""
    rows = [
        (f"10.1.{i // 60000}.{i // 240 % 250}", 1024 + i % 240, f"10.96.1.{i % 250}", "10.244.9.8")
        for i in range(entries)
    ]
    rows += [("10.2.0.1", 1024 + i, TARGET.address, "10.244.9.9") for i in range(STALE)]
    with netns.entered(NS), NetlinkSocket(NETLINK_NETFILTER) as sock:
        requests = []
        for client, port, dst, by in rows:
            seq = sock.next_seq()
            orig, reply = (client, port, dst, PORT), (by, PORT, client, port)
            requests.append(
                (seq, ct_messages.create_request(socket.AF_INET, seq, orig, reply, 3600))
            )
        refused = [o for o in sock.execute(requests) if not o.ok]
    if refused:
        raise SystemExit(f"{len(refused)} entries refused: {refused[0].message}")


def measured(work: Callable[[], int]) -> dict[str, Any]:
    tracemalloc.start()
    start = time.perf_counter()
    received = work()
    seconds = time.perf_counter() - start
    _now, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"seconds": round(seconds, 3), "received": received, "peak_mib": round(peak / 2**20, 2)}


def ipvsproxy_way() -> int:
    with netns.entered(NS):
        ct = Conntrack()
        try:
            out = ct.flush_stale({TARGET: Stale({("10.244.9.1", PORT)})})
        finally:
            ct.close()
    if out != {TARGET: STALE}:
        raise SystemExit(f"unexpected outcome {out} after {ct.examined} entries")
    return ct.examined


def whole_table_way() -> int:
    """The whole UDP table listed through pyroute2, as the cleanup of several targets did."""
    from pyroute2 import Conntrack as CT
    from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

    with netns.entered(NS):
        ct = CT(nfgen_family=socket.AF_INET)
        try:
            match = NFCTAttrTuple(family=socket.AF_INET, proto=socket.IPPROTO_UDP)
            return len(list(ct.dump_entries(tuple_orig=match)))
        finally:
            ct.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--output", type=Path)
    parser.add_argument("--no-pyroute2", action="store_true", help="skip the reference way")
    args = parser.parse_args()
    # The table's limit is the host namespace's: room for the benchmark's entries.
    subprocess.run(["sysctl", "-qw", f"net.netfilter.nf_conntrack_max={args.entries * 2 + 1000}"])
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NS], check=True)
    try:
        fill(args.entries)
        result = {"entries": args.entries, "ipvsproxy": measured(ipvsproxy_way)}
        if not args.no_pyroute2:  # read-only: the table is the same, but for the stale ones
            result["whole_table_pyroute2"] = measured(whole_table_way)
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
