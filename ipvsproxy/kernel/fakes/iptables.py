"""A fake of iptables: the chains of each table with their rules, written as
``iptables-restore --noflush`` writes them."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from ipvsproxy.core.ruleset import JUMPS, OURS, Jump
from ipvsproxy.kernel.errors import ApplyError, Rejected
from ipvsproxy.kernel.fakes.faults import FakeBackend
from ipvsproxy.kernel.iptables import Observed, observe, with_jumps

# The built-in chains of each table: a restore never flushes them, nothing deletes them.
BUILT_IN = {
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
}
# Targets that are not chains (a rule may jump to one of these or to a chain that exists).
TARGETS = frozenset(
    {"ACCEPT", "DROP", "RETURN", "REJECT", "MARK", "MASQUERADE", "SNAT", "DNAT", "LOG"}
)
_TARGET = re.compile(r"(?:^|\s)-j\s+(\S+)")
_MATCH_SET = re.compile(r"--match-set\s+(\S+)")
_MATCH = re.compile(r"(?:^|\s)-m\s+(\S+)")


class Refused(Exception):
    """A command iptables refuses."""


class FakeIPTables(FakeBackend[str]):
    """iptables: ``tables`` of chains, each with its rules (what follows ``-A CHAIN``); a
    refusal matches a restore's whole input. ``sets`` are the ipsets that exist (a rule may
    match only those); ``lacks_matches`` are the matches (``-m NAME``) the kernel lacks (no
    xt_NAME module): a rule that uses one is refused, as its whole restore."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict[str, list[str]]] = {
            t: {c: [] for c in chains} for t, chains in BUILT_IN.items()
        }
        self.restore_failures = 0
        self.sets: Callable[[], Collection[str]] = frozenset
        self.lacks_matches: set[str] = set()

    def run(self, table: str, command: str) -> None:
        """``iptables -t TABLE COMMAND`` (-N, -A, -I, -D, -F, -X), counting no write; raises
        ``Refused`` as iptables would fail."""
        _command(self.tables[table], BUILT_IN[table], command, self.sets(), self.lacks_matches)

    def save(self, table: str) -> str:
        """``iptables-save -t TABLE``."""
        chains = self.tables[table]
        lines = [f"*{table}"]
        lines += [f":{c} {'ACCEPT' if c in BUILT_IN[table] else '-'} [0:0]" for c in chains]
        lines += [f"-A {c} {rule}" for c, rules in chains.items() for rule in rules]
        return "\n".join([*lines, "COMMIT", ""])

    def referenced_sets(self) -> set[str]:
        return {
            name
            for chains in self.tables.values()
            for rules in chains.values()
            for rule in rules
            for name in _MATCH_SET.findall(rule)
        }

    def read(self) -> Observed:
        self.on_call("read")
        return observe({table: self.save(table) for table in ("nat", "filter")})

    def missing_jumps_checked(self) -> tuple[Jump, ...]:
        self.on_call("missing_jumps_checked")
        return tuple(j for j in JUMPS if not self._in_place(j))

    def _in_place(self, jump: Jump) -> bool:
        chains = self.tables[jump.table]
        return jump.target in chains and jump.spec() in chains.get(jump.chain, [])

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None:
        """``iptables-restore --noflush``: each table's part is one transaction, committed
        at its COMMIT; a declared chain of ours is created or flushed."""
        self.on_call("apply", text, missing_jumps)
        payload = with_jumps(text, missing_jumps)
        refused = self._refused(payload)
        why = f"iptables-restore: {os.strerror(refused)}" if refused else None
        if why is None:
            try:
                self._restore(payload)
            except Refused as exc:
                why = f"iptables-restore: {exc}"
        self.counters.count("restore", why is None)
        if why is not None:
            self.restore_failures += 1
            raise ApplyError([Rejected(why, errno.EINVAL)], 0)

    def _restore(self, payload: str) -> None:
        table: str | None = None
        chains: dict[str, list[str]] = {}
        sets = self.sets()
        for n, line in enumerate(payload.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            if line.startswith("*"):
                table = line[1:]
                if table not in self.tables:
                    raise Refused(f"line {n}: no table {table}")
                chains = {c: list(rules) for c, rules in self.tables[table].items()}
            elif table is None:
                raise Refused(f"line {n}: outside a table")
            elif line == "COMMIT":
                self.tables[table], table = chains, None
            elif line.startswith(":"):
                chain = line[1:].split(" ", 1)[0]
                if chain not in BUILT_IN[table]:
                    chains[chain] = []  # created, or flushed: --noflush flushes a declared chain
            else:
                try:
                    _command(chains, BUILT_IN[table], line, sets, self.lacks_matches)
                except Refused as exc:
                    raise Refused(f"line {n}: {exc}") from None
        if table is not None:
            raise Refused(f"no COMMIT for table {table}")

    def remove(self) -> None:
        self.on_call("remove")
        for jump in JUMPS:
            while self._try(jump.table, f"-D {jump.chain} {jump.spec()}"):
                pass
        for table, names in OURS.items():
            for chain in sorted(names):
                self._try(table, f"-F {chain}")
            for chain in sorted(names):
                self._try(table, f"-X {chain}")

    def _try(self, table: str, command: str) -> bool:
        try:
            self.run(table, command)
        except Refused:
            return False
        return True


def _command(
    chains: dict[str, list[str]],
    built_in: Sequence[str],
    command: str,
    sets: Collection[str],
    lacks: Collection[str] = (),
) -> None:
    """One iptables command on a table's ``chains``; a rule using a match in ``lacks`` is
    refused."""
    verb, _, rest = command.partition(" ")
    chain, _, spec = rest.partition(" ")
    if verb == "-N":
        if chain in chains:
            raise Refused(f"chain {chain} exists")
        chains[chain] = []
        return
    if chain not in chains:
        raise Refused(f"no chain {chain}")
    rules = chains[chain]
    if verb == "-F":
        rules.clear()
    elif verb == "-X":
        if chain in built_in or rules:
            raise Refused(f"chain {chain} is built in or not empty")
        if any(target == chain for r in _all_rules(chains) for target in _TARGET.findall(r)):
            raise Refused(f"chain {chain} is referenced")
        del chains[chain]
    elif verb == "-D":
        if spec not in rules:
            raise Refused(f"no such rule in {chain}: {spec}")
        rules.remove(spec)
    elif verb in ("-A", "-I"):
        position = 0
        if verb == "-I":
            first, _, after = spec.partition(" ")
            if first.isdigit():
                position, spec = int(first) - 1, after
        for target in _TARGET.findall(spec):
            if target not in TARGETS and target not in chains:
                raise Refused(f"no chain or target {target}")
        for name in _MATCH_SET.findall(spec):
            if name not in sets:
                raise Refused(f"set {name} does not exist")
        for match in _MATCH.findall(spec):
            if match in lacks:  # iptables-legacy's words
                raise Refused(f"Couldn't load match `{match}':No such file or directory")
        if verb == "-A":
            rules.append(spec)
        else:
            rules.insert(position, spec)
    else:
        raise Refused(f"unknown command {verb}")


def _all_rules(chains: Mapping[str, list[str]]) -> Iterator[str]:
    for rules in chains.values():
        yield from rules
