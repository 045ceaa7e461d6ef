"""ipvsproxy's iptables chains, written with ``iptables-restore --noflush`` as upstream does.

Only chains named in ipvsproxy/core/ruleset.py are declared (and so flushed and rewritten);
built-in chains get our jump rules inserted once and are otherwise left alone, as are everyone
else's chains. The binaries are whatever ``iptables-restore`` / ``iptables-save`` are on PATH,
legacy or nft: the host decides, as with upstream's images.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ipvsproxy.core.ruleset import (
    JUMPS,
    OURS,
    ChainKey,
    Jump,
    chain_digest,
    chain_lines,
    missing_jumps,
    split_families,
)
from ipvsproxy.kernel.errors import ApplyError, Counters, Rejected

if TYPE_CHECKING:
    from ipvsproxy.kernel.interfaces import RulesBackend


@dataclass(frozen=True)
class Observed:
    """What iptables-save shows of ipvsproxy: its chains' rules and which jumps are in place."""

    fingerprint: str  # digest of our chains as the kernel reports them
    missing_jumps: tuple[Jump, ...]
    # Each of our chains' digest (``ruleset.chain_digest``): the fingerprint, chain by chain.
    chains: Mapping[ChainKey, str] = field(default_factory=dict)


class IPTables:
    """ipvsproxy's chains (``ipvsproxy.core.ruleset``) and the jumps to them from the built-in
    chains, through ``iptables-restore --noflush`` and ``iptables-save``.

    Owns ``counters`` and ``restore_failures``; holds no rules (``read`` returns a fingerprint
    of our chains for the caller to keep). ``apply`` writes the whole text in one restore and
    returns nothing; a refused restore raises ApplyError carrying iptables-restore's message
    and counts in ``restore_failures``. Other chains, and the built-in chains' other rules,
    are never touched."""

    def __init__(
        self, restore: str = "iptables-restore", save: str = "iptables-save", family: int = 4
    ) -> None:
        """``family`` 6: ip6tables (with its restore and save, unless others are named)."""
        self.family = family
        self.cmd = "ip6tables" if family == 6 else "iptables"
        if family == 6:
            restore = restore.replace("iptables", "ip6tables", 1)
            save = save.replace("iptables", "ip6tables", 1)
        self.restore_cmd = restore
        self.save_cmd = save
        self.counters = Counters()
        self.restore_failures = 0

    def _save(self, table: str) -> str:
        proc = subprocess.run([self.save_cmd, "-t", table], capture_output=True, text=True)
        if proc.returncode != 0:
            raise OSError(f"{self.save_cmd} -t {table} failed: {proc.stderr.strip()}")
        return proc.stdout

    def read(self) -> Observed:
        return observe({table: self._save(table) for table in ("nat", "filter")}, self.family)

    def missing_jumps_checked(self) -> tuple[Jump, ...]:
        """The jumps not in place, asked one at a time with ``iptables -C`` (as upstream's
        EnsureRule): for when iptables-save fails. A jump to a chain not created yet is
        missing too."""
        missing = []
        for jump in JUMPS:
            check = [
                self.cmd, "-w", "5", "-t", jump.table, "-C", jump.chain,
                "-m", "comment", "--comment", jump.comment, "-j", jump.target,
            ]  # fmt: skip
            if subprocess.run(check, capture_output=True).returncode != 0:
                missing.append(jump)
        return tuple(missing)

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None:
        """Rewrite our chains with ``text`` and insert the jumps that are missing."""
        payload = with_jumps(text, missing_jumps)
        proc = subprocess.run(
            [self.restore_cmd, "--noflush", "-w", "5"],
            input=payload,
            capture_output=True,
            text=True,
        )
        ok = proc.returncode == 0
        self.counters.count("restore", ok)
        if not ok:
            self.restore_failures += 1
            why = f"{self.cmd}-restore: {proc.stderr.strip()}"
            raise ApplyError([Rejected(why, 22)], 0)

    def remove(self) -> None:
        """Delete our jumps and chains (cleanup). Chains that are absent are fine."""
        for jump in JUMPS:
            while (
                subprocess.run(
                    [
                        self.cmd,
                        "-w",
                        "5",
                        "-t",
                        jump.table,
                        "-D",
                        jump.chain,
                        "-m",
                        "comment",
                        "--comment",
                        jump.comment,
                        "-j",
                        jump.target,
                    ],
                    capture_output=True,
                ).returncode
                == 0
            ):
                pass
        for table, chains in OURS.items():
            for chain in sorted(chains):
                subprocess.run([self.cmd, "-w", "5", "-t", table, "-F", chain], capture_output=True)
            for chain in sorted(chains):
                subprocess.run([self.cmd, "-w", "5", "-t", table, "-X", chain], capture_output=True)


class FamilyRules:
    """The rules of both families behind one RulesBackend: the text is
    ``ruleset.render_families``' (IPv4's, then IPv6's after its mark), each part restored by
    its family's IPTables; a missing jump is its family's (``Jump.family``). The fingerprint
    covers both families' chains."""

    def __init__(self, backends: Mapping[int, RulesBackend]) -> None:
        self.backends = dict(sorted(backends.items()))

    @property
    def counters(self) -> Counters:
        """The families' restores, counted together."""
        merged = Counters()
        for b in self.backends.values():
            for kind, n in b.counters.ok.items():
                merged.ok[kind] = merged.ok.get(kind, 0) + n
            for kind, n in b.counters.failed.items():
                merged.failed[kind] = merged.failed.get(kind, 0) + n
        return merged

    @property
    def restore_failures(self) -> int:
        return sum(b.restore_failures for b in self.backends.values())

    def read(self) -> Observed:
        seen = {f: b.read() for f, b in self.backends.items()}
        digest = hashlib.sha256(" ".join(o.fingerprint for o in seen.values()).encode())
        missing = tuple(replace(j, family=f) for f, o in seen.items() for j in o.missing_jumps)
        chains = {(f, t, c): d for f, o in seen.items() for (_f, t, c), d in o.chains.items()}
        return Observed(digest.hexdigest(), missing, chains)

    def missing_jumps_checked(self) -> tuple[Jump, ...]:
        return tuple(
            replace(j, family=f)
            for f, b in self.backends.items()
            for j in b.missing_jumps_checked()
        )

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None:
        """Each family's part of ``text`` through its restore, IPv4's first; a part refused
        raises ApplyError after the other families' are written."""
        parts = split_families(text)
        failed: list[ApplyError] = []
        for family, backend in self.backends.items():
            jumps = [j for j in missing_jumps if j.family == family]
            try:
                backend.apply(parts.get(family, ""), jumps)
            except ApplyError as exc:
                failed.append(exc)
        if failed:
            raise ApplyError([r for exc in failed for r in exc.rejected], 0)

    def remove(self) -> None:
        for backend in self.backends.values():
            backend.remove()


def restore_failures_by_family(rules: RulesBackend) -> dict[int, int]:
    """The restores each family's rules backend failed; a rules backend that is not a
    FamilyRules writes IPv4's rules (the fakes': both families' text)."""
    if isinstance(rules, FamilyRules):
        return {family: b.restore_failures for family, b in rules.backends.items()}
    return {4: rules.restore_failures}


def observe(saved: Mapping[str, str], family: int = 4) -> Observed:
    """What ``iptables-save -t TABLE`` (``saved[TABLE]``, "nat" and "filter") of ``family``
    shows of ipvsproxy."""
    ours: list[str] = []
    missing: list[Jump] = []
    chains: dict[ChainKey, str] = {}
    for table, text in saved.items():
        for chain, lines in chain_lines(table, text).items():
            ours += [f"{table} {ln}" for ln in lines]
            chains[(family, table, chain)] = chain_digest(lines)
        missing += missing_jumps(table, text)
    digest = hashlib.sha256("\n".join(sorted(ours)).encode()).hexdigest()
    return Observed(digest, tuple(missing), chains)


def with_jumps(text: str, jumps: Sequence[Jump]) -> str:
    """Insert ``-I`` lines for missing jumps just before each table's COMMIT."""
    if not jumps:
        return text
    out: list[str] = []
    table = ""
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        if line == "COMMIT":
            out += [f"-I {j.chain} 1 {j.spec()}" for j in jumps if j.table == table]
        out.append(line)
    return "\n".join(out) + "\n"
