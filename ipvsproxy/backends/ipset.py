"""ipsets: members added and removed in netlink batches; sets created, read and destroyed with
the ipset tool.

Members change with every endpoint change, so they go as batched nfnetlink requests (pyroute2's
IPSet sends one request per entry and waits for each ack), each with its own ack: a refused
member is named and the rest of the batch applies. Creating, listing and destroying sets is
rare and the tool knows each set type's revisions; ``ipset restore`` stops at the first line the
kernel refuses, so such a batch is resumed after that line and every line's outcome is known.
"""

from __future__ import annotations

import errno
import re
import subprocess
from collections.abc import Collection, Iterable, Sequence

from ipvsproxy import ipsets as S
from ipvsproxy.backends.errors import ApplyError, Rejected
from ipvsproxy.backends.ipvs import Counters
from ipvsproxy.diff import MemberOp, OpKind
from ipvsproxy.netlink import ipset_messages as msgs
from ipvsproxy.netlink.sock import NETLINK_NETFILTER, NetlinkSocket

_ERROR_LINE = re.compile(r"Error in line (\d+): (.*)")


def _create_line(spec: S.IPSetSpec) -> str:
    if spec.type.startswith("bitmap:"):
        return f"create {spec.name} {spec.type} range 0-65535"
    return f"create {spec.name} {spec.type} family inet hashsize 1024 maxelem 65536"


def normalize_entry(set_type: str, entry: str) -> str:
    """``ipset save`` prints a /32 net without its prefix; the planner always writes one."""
    if set_type == "hash:ip,port,net":
        head, _, net = entry.rpartition(",")
        if "/" not in net:
            return f"{head},{net}/32"
    return entry


class IPSets:
    def __init__(self, binary: str = "ipset") -> None:
        self.binary = binary
        self.counters = Counters()
        self.sock = NetlinkSocket(NETLINK_NETFILTER)

    def close(self) -> None:
        self.sock.close()

    def _run(
        self, args: Sequence[str], stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, *args], input=stdin, capture_output=True, text=True, check=False
        )

    def read(self) -> dict[str, set[str]]:
        """Members of every ipvsproxy-named set that exists (others are not ours to read)."""
        proc = self._run(["save"])
        if proc.returncode != 0:
            raise OSError(f"ipset save failed: {proc.stderr.strip()}")
        sets: dict[str, set[str]] = {}
        types: dict[str, str] = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "create" and parts[1] in S.NAMES:
                sets[parts[1]] = set()
                types[parts[1]] = parts[2]
            elif len(parts) >= 3 and parts[0] == "add" and parts[1] in sets:
                sets[parts[1]].add(normalize_entry(types[parts[1]], parts[2]))
        return sets

    def ensure(self, existing: Collection[str], names: Iterable[str] = S.NAMES) -> int:
        """Create the sets that are missing; returns how many were created."""
        missing = [S.BY_NAME[n] for n in sorted(names) if n not in existing]
        if not missing:
            return 0
        lines = [_create_line(spec) for spec in missing]
        self._restore(lines, [f"create ipset {s.name}" for s in missing], "create_set")
        return len(missing)

    def apply(self, ops: Sequence[MemberOp]) -> int:
        if not ops:
            return 0
        requests = []
        for op in ops:
            seq = self.sock.next_seq()
            set_type = S.BY_NAME[op.set_name].type
            add = op.kind is OpKind.ADD
            requests.append((seq, msgs.member_message(seq, add, op.set_name, set_type, op.entry)))
        rejected, failed = [], set()
        for i, (op, outcome) in enumerate(zip(ops, self.sock.execute(requests), strict=True)):
            self.counters.count(f"{op.kind}_member", outcome.ok)
            if not outcome.ok:
                reason = msgs.ERRORS.get(outcome.errno, outcome.message)
                rejected.append(Rejected(f"{op}: {reason}", outcome.errno))
                failed.add(i)
        if rejected:
            raise ApplyError(rejected, len(ops) - len(rejected), frozenset(failed))
        return len(ops)

    def destroy(self, names: Iterable[str]) -> None:
        ours = [n for n in names if n in S.NAMES]
        for name in ours:
            self._run(["flush", name])
        if ours:
            self._restore(
                [f"destroy {n}" for n in ours], [f"destroy ipset {n}" for n in ours], "destroy"
            )

    def _restore(self, lines: list[str], what: list[str], kind: str) -> None:
        rejected: list[Rejected] = []
        failed: set[int] = set()
        start = 0
        while start < len(lines):
            proc = self._run(["restore"], "\n".join(lines[start:]) + "\n")
            if proc.returncode == 0:
                self._count(kind, len(lines) - start, True)
                break
            match = _ERROR_LINE.search(proc.stderr)
            if match is None:
                raise OSError(f"ipset restore failed: {proc.stderr.strip()}")
            bad = start + int(match.group(1)) - 1
            self._count(kind, bad - start, True)
            self._count(kind, 1, False)
            rejected.append(Rejected(f"{what[bad]}: {match.group(2).strip()}", errno.EINVAL))
            failed.add(bad)
            start = bad + 1
        if rejected:
            raise ApplyError(rejected, len(lines) - len(rejected), frozenset(failed))

    def _count(self, kind: str, n: int, ok: bool) -> None:
        for _ in range(n):
            self.counters.count(kind, ok)
