"""Differential tests: upstream kube-proxy (IPVS mode, node-2) and ipvsproxy (node-3) given the
same Services and Pods by one real control plane must program the same IPVS virtual and real
servers and the same ipset members, and pass the same traffic, except for the differences
``compare.ALLOWED`` names (each one in the README's "Differences from kube-proxy").

One control plane and one pair of proxies for the module (kube-apiserver alone takes ~33 s to
start in the guest); the whole corpus at once, then the same corpus changed through the live API.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.topology import Cluster
from tests.differential import compare, corpus
from tests.differential.compare import Difference
from tests.differential.harness import DiffLab, Snapshot

pytestmark = pytest.mark.kernel

# Shapes neither proxy programs: their ClusterIP (if any) has no virtual server.
UNPROXIED = {"proxy-name", "headless", "external-name"}


@pytest.fixture(scope="module")
def lab(lab_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DiffLab]:
    d = DiffLab(lab_cluster, Path(tmp_path_factory.mktemp("differential")))
    try:
        d.start()
        d.apply(corpus.SHAPES)
        yield d
    finally:
        print(d.logs()[-20000:])
        d.stop()


def programmed(services: list[dict[str, object]]) -> set[tuple[str, str]]:
    """The ClusterIP virtual servers both proxies must have."""
    keys = set()
    for svc in services:
        md, spec = svc["metadata"], svc["spec"]
        assert isinstance(md, dict) and isinstance(spec, dict)
        if md["name"] in UNPROXIED:
            continue
        for p in spec.get("ports") or []:
            keys.add((p.get("protocol", "TCP"), f"{spec['clusterIP']}:{p['port']}"))
    return keys


def report(title: str, diffs: list[Difference]) -> list[Difference]:
    """Print every difference with the allowed entry that explains it; return the rest."""
    left, used = compare.unexplained(diffs)
    print(f"== {title}: {len(diffs)} differences, {len(left)} unexplained")
    for name, ds in sorted(used.items()):
        for d in ds:
            print(f"   allowed ({name}): {d}")
    for d in left:
        print(f"   NEW: {d}")
    return left


def compare_all(lab: DiffLab, title: str) -> tuple[list[Difference], set[str]]:
    services = lab.services()
    keys = programmed(services)

    def ready(snap: Snapshot) -> bool:
        return keys <= set(snap.ipvs)

    diffs = lab.wait_settled(services, ready)
    up, ours = lab.traffic(services)
    diffs += compare.diff_traffic(up, ours, lambda probe: probe.partition("/")[0].split()[0])
    print(f"== {title}: {len(up)} probes per node")
    for probe in sorted(up):
        print(
            f"   {probe}: {up[probe]!r}"
            + ("" if up[probe] == ours.get(probe) else f" | ours {ours.get(probe)!r}")
        )
    _, used = compare.unexplained(diffs)
    return report(title, diffs), set(used)


def test_the_corpus_as_created(lab: DiffLab) -> None:
    lab.wait_slices({s.name: len(s.pods) for s in corpus.SHAPES if s.pods})
    left, used = compare_all(lab, "corpus as created")
    assert not left, "differences from kube-proxy not in compare.ALLOWED:\n" + "\n".join(
        map(str, left)
    )
    # Each allowed difference is seen here: an entry nothing exercises would rot unseen.
    assert used == {a.name for a in compare.ALLOWED}
