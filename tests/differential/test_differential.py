"""Differential tests: upstream kube-proxy (IPVS mode, node-2) and ipvsproxy (node-3) given the
same Services and Pods by one real control plane must program the same IPVS virtual and real
servers and the same ipset members, and pass the same traffic, except for the differences
``compare.ALLOWED`` names (each one in the README's "Differences from kube-proxy").

One control plane and one pair of proxies for the module (kube-apiserver alone takes ~33 s to
start in the guest); the whole corpus at once, then the same corpus changed through the live API.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.net.topology import Cluster
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
        print(d.logs())
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
            for ip in spec.get("clusterIPs") or [spec["clusterIP"]]:
                host = f"[{ip}]" if ":" in ip else ip
                keys.add((p.get("protocol", "TCP"), f"{host}:{p['port']}"))
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

    began = time.monotonic()
    diffs = lab.wait_settled(services, ready)
    settled = time.monotonic()
    up, ours = lab.traffic(services)
    traffic = compare.diff_traffic(up, ours, shape_of)

    def probe_shapes(shapes: set[str]) -> tuple[dict[str, object], dict[str, object]]:
        return lab.traffic([s for s in services if s["metadata"]["name"] in shapes])

    _, transient = compare.reprobe(compare.unexplained(traffic)[0], probe_shapes)
    diffs += [d for d in traffic if d not in transient]
    print(
        f"== {title}: settled in {settled - began:.1f} s; {len(up)} probes per node "
        f"in {time.monotonic() - settled:.1f} s"
    )
    for probe in sorted(up):
        print(
            f"   {probe}: {up[probe]!r}"
            + ("" if up[probe] == ours.get(probe) else f" | ours {ours.get(probe)!r}")
        )
    for d in transient:
        print(f"   transient (the same on both at a re-probe): {d}")
    _, used = compare.unexplained(diffs)
    return report(title, diffs), set(used)


def shape_of(probe: str) -> str:
    return probe.partition("/")[0].split()[0]


def test_the_corpus_as_created(lab: DiffLab) -> None:
    lab.wait_slices()
    left, used = compare_all(lab, "corpus as created")
    assert not left, "differences from kube-proxy not in compare.ALLOWED:\n" + "\n".join(
        map(str, left)
    )
    # Each allowed difference the corpus shows is seen here: an entry nothing exercises
    # would rot unseen.
    assert used == {a.name for a in compare.ALLOWED if a.in_corpus}
    assert_topology_exercised(lab)


# What the topology shapes' ClusterIPs must reach from a pod: their local pods when the hints
# cover the node, every pod when they do not.
TOPOLOGY = {
    "prefer-same-zone": ("local-1", "local-2"),
    "prefer-same-node": ("local-1", "local-2"),
    "prefer-same-zone-itp-local": ("local-1", "local-2"),
    "prefer-same-zone-remote": ("pod-1-1", "pod-1-2"),
}


def assert_topology_exercised(lab: DiffLab) -> None:
    """Both proxies agreeing is no proof on its own: two that ignored hints would agree too."""
    services = [s for s in lab.services() if s["metadata"]["name"] in TOPOLOGY]
    up, ours = lab.traffic(services)
    for results in (up, ours):
        for shape, want in TOPOLOGY.items():
            outcome = results[f"{shape}/80 TCP clusterIP from pod"]
            assert isinstance(outcome, tuple) and outcome[0] == want, (shape, outcome)


# Live changes: each step changes every shape the same way through the API.


def pods(lab: DiffLab, node: int, index: int) -> list[tuple[str, str]]:
    """(shape, Pod) of every shape's Pod on lab pod ``pod-NODE-INDEX``."""
    return [
        (shape, name)
        for shape, states in lab.model.items()
        for name in states
        if name == f"{shape}-{node}-{index}"
    ]


def scale_down(lab: DiffLab) -> None:
    """The second pod on each node leaves its Service's selector (label removed)."""
    for node in (1, 2, 3):
        for shape, pod in pods(lab, node, 2):
            lab.select(shape, pod, False)


def scale_up(lab: DiffLab) -> None:
    """They come back, and the shapes without a local endpoint gain one on each node."""
    for node in (1, 2, 3):
        for shape, pod in pods(lab, node, 2):
            lab.select(shape, pod, True)
    for name in ("etp-local-none", "itp-local-none"):
        for node in (2, 3):
            lab.add_pod(corpus.shape(name), corpus.PodSpec(node, 1))


def not_ready(lab: DiffLab) -> None:
    """The first pod on each proxied node fails its readiness probe."""
    for node in (2, 3):
        for shape, pod in pods(lab, node, 1):
            lab.set_ready(shape, pod, False)


def ready_again(lab: DiffLab) -> None:
    for node in (2, 3):
        for shape, pod in pods(lab, node, 1):
            lab.set_ready(shape, pod, True)


def terminate(lab: DiffLab) -> None:
    """The first pod on each proxied node is deleted with a grace period: terminating."""
    for node in (2, 3):
        for shape, pod in pods(lab, node, 1):
            if not lab.model[shape][pod].terminating:
                lab.terminate(shape, pod)


def delete_some(lab: DiffLab) -> None:
    """The terminating pods go for good, and every other Service is deleted."""
    for shape, states in list(lab.model.items()):
        for pod, state in list(states.items()):
            if state.terminating:
                lab.delete_pod(shape, pod)
    for shape in sorted(lab.model)[::2]:
        lab.delete_service(shape)


def delete_all(lab: DiffLab) -> None:
    for shape in sorted(lab.model):
        lab.delete_service(shape)


STEPS = (scale_down, scale_up, not_ready, ready_again, terminate, delete_some, delete_all)


def test_the_corpus_changed_live(lab: DiffLab) -> None:
    """After each step, once the EndpointSlices say what the step did, the two nodes are
    compared again as the corpus was."""
    failed: dict[str, list[Difference]] = {}
    for step in STEPS:
        step(lab)
        lab.wait_slices()
        left, _ = compare_all(lab, step.__name__)
        if left:
            failed[step.__name__] = left
    assert not failed, "differences from kube-proxy not in compare.ALLOWED:\n" + "\n".join(
        f"after {step}: {d}" for step, ds in failed.items() for d in ds
    )
