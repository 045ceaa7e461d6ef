"""ipvsproxy beside upstream kube-proxy (IPVS mode) and kube-router, inside the lab guest:
``python -m lab run --mem 3G -- python -m bench.peers``. ``make bench`` runs it.

One guest boot, one real API server (etcd and kube-apiserver, no controller: the benchmark
writes the EndpointSlices itself, so nothing rewrites them), the same objects for all three:
the synthetic cluster of ``lab.cluster.synthetic`` (node ports left to the API server to
allocate) plus one Service ``conn`` whose endpoint is a real echo pod. Each run of each system
gets a fresh one-node lab topology (a new network namespace: an empty IPVS table with no
trash list left by the run before) and, in turn:

- **cold start**: the proxy is started; the time until the kernel holds every Service's
  cluster-IP virtual server with all its endpoints active (read from outside: see
  ``wait_programmed``),
  and the proxy's CPU seconds until then; then, for ipvsproxy and kube-proxy, until their own
  metric says their first sync has ended (kube-proxy's goes on long after its virtual servers
  are in: it adds each ipset entry with one ``ipset add`` process). Changes start after that;
- **one change**: ``--changes`` of each kind (fewer, the same number of each, for a system
  whose changes outlast ``--change-budget``), each on a different Service, each undone by the
  next kind (endpoint added, then removed; not ready, then ready again; Service added, then
  deleted), timed from the API write's start until the virtual server polled over netlink shows
  it, with the proxy's CPU seconds until it is idle again;
- **steady state**: the proxy's CPU seconds per minute with no change, and with one change a
  second;
- **restart**: an established connection through ``conn``, SIGTERM, a new Service created
  while the proxy is down, a new proxy started: the time until the kernel shows the new Service
  (a full first sync has run), what changed in the IPVS table, ipsets and iptables rules
  otherwise, and whether the connection still answers; for ipvsproxy, also its own count of
  kernel writes in one more restart with nothing changed;
- **peak RSS** (VmHWM) of the process over the run.

Runs alternate between the systems (a different one first each round). Every proxy gets the
same settings where they share them: sync period 30 s, minimum sync period 0 (kube-router has
none), cluster CIDR 10.244.0.0/16, the node's InternalIP from its Node object, and each one's
default log verbosity (``--v=0`` for the peers, as kubeadm runs kube-proxy).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bench import kernel_view, proc
from bench.kernel_view import Dest, Prober, Table, VSKey
from lab.cluster import peers, synthetic
from lab.cluster.controlplane import ControlPlane
from lab.cluster.kube import APISERVER_PORT, REPO, SERVICE_ACCOUNT, http_get_from
from lab.cluster.kubelet import MERGE_PATCH, LabKubelets
from lab.net import netns
from lab.net.topology import Cluster

SYSTEMS = ("ipvsproxy", "kube-proxy", "kube-router")
KIND_NAMES = ("endpoint", "readiness", "service")  # change_pairs' kinds 0, 1, 2
NS = synthetic.NAMESPACE
CONN_IP = "10.96.0.10"
CONN_PORT = 80
ECHO_PORT = 8080
NEW_SERVICE_BASE = 20_000  # indices of the Services a change adds (past any cluster size)
SENTINEL_IP = "10.96.0.11"
METRICS = "127.0.0.1:10249"
ADD_ADDRESS = "10.244.255.254"  # the endpoint a change adds: outside every synthetic Service
SERVICES = f"/api/v1/namespaces/{NS}/services"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"


class PartialRun(Exception):
    """A run that failed after measuring ``result`` (its cause is the failure)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__("run failed part-way")
        self.result = result


def progress(text: str) -> None:
    print(f"bench.peers {time.strftime('%H:%M:%S')}: {text}", file=sys.stderr, flush=True)


# The objects --------------------------------------------------------------------------------


def service_object(svc: dict[str, Any]) -> dict[str, Any]:
    """A synthetic Service as a client creates it: no server-set fields, node ports left to
    the API server (it gives every port of a NodePort Service one)."""
    spec = json.loads(json.dumps(svc["spec"]))
    for port in spec["ports"]:
        port.pop("nodePort", None)
    meta = svc["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": meta["name"], "labels": meta.get("labels", {})},
        "spec": spec,
    }


def slice_object(sl: dict[str, Any], name: str) -> dict[str, Any]:
    labels = dict(sl["metadata"]["labels"])
    labels[MANAGED_BY] = "bench.ipvsproxy"  # not the controller's: none runs here anyway
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": labels},
        "addressType": "IPv4",
        "endpoints": sl["endpoints"],
        "ports": sl["ports"],
    }


@dataclass
class Entry:
    """One Service of the cluster as the API holds it, and its cluster-IP virtual server."""

    index: int
    svc: dict[str, Any]
    slice: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.svc["metadata"]["name"])

    @property
    def slice_name(self) -> str:
        return f"{self.name}-bench"

    @property
    def vs(self) -> VSKey:
        port = self.svc["spec"]["ports"][0]
        return (port["protocol"], self.svc["spec"]["clusterIP"], port["port"])

    def dests(self, endpoints: list[dict[str, Any]] | None = None) -> set[Dest]:
        port = self.slice["ports"][0]["port"]
        eps = self.slice["endpoints"] if endpoints is None else endpoints
        return {(ep["addresses"][0], port) for ep in eps if ep["conditions"].get("ready", True)}

    def expected(self) -> dict[VSKey, set[Dest]]:
        """Every cluster-IP virtual server of the Service and its active real servers."""
        out = {}
        for port, slice_port in zip(self.svc["spec"]["ports"], self.slice["ports"], strict=True):
            vs = (port["protocol"], self.svc["spec"]["clusterIP"], port["port"])
            out[vs] = {(ep["addresses"][0], slice_port["port"]) for ep in self.slice["endpoints"]}
        return out


def entry(index: int, endpoints: int) -> Entry:
    _, svc, (sl,) = synthetic.service_at(index, endpoints)
    return Entry(index, svc, sl)


def new_entry(e: Entry) -> Entry:
    """A Service shaped as ``e`` (type, ports, endpoints) that the cluster does not hold: its
    own name and cluster IP (node ports left to the API server, no load-balancer ingress)."""
    svc, sl = copy.deepcopy(e.svc), copy.deepcopy(e.slice)
    name = f"new-{e.name}"
    svc["metadata"]["name"] = name
    svc["metadata"]["labels"] = {"app": name}
    svc["spec"]["selector"] = {"app": name}
    ip = synthetic.cluster_ip(NEW_SERVICE_BASE + e.index)
    svc["spec"]["clusterIP"], svc["spec"]["clusterIPs"] = ip, [ip]
    svc["status"] = {"loadBalancer": {}}  # no ingress: e's address is e's
    sl["metadata"]["labels"]["kubernetes.io/service-name"] = name
    return Entry(NEW_SERVICE_BASE + e.index, svc, sl)


def tcp_entry(
    index: int, name: str, ip: str, port: int, target: int, endpoints: list[tuple[str, str]]
) -> Entry:
    """A one-port TCP ClusterIP Service at ``ip`` and its slice of ready ``endpoints``
    (address, node)."""
    svc = {
        "metadata": {"name": name, "labels": {}},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": ip,
            "selector": {"app": name},
            "ports": [{"name": "tcp", "protocol": "TCP", "port": port}],
        },
    }
    sl = {
        "metadata": {"labels": {"kubernetes.io/service-name": name}},
        "endpoints": [
            {"addresses": [a], "conditions": {"ready": True}, "nodeName": n} for a, n in endpoints
        ],
        "ports": [{"name": "tcp", "protocol": "TCP", "port": target}],
    }
    return Entry(index, svc, sl)


def conn_entry(pod_ip: str) -> Entry:
    """The Service of the restart's established connection: the lab's echo pod."""
    return tcp_entry(-1, "conn", CONN_IP, CONN_PORT, ECHO_PORT, [(pod_ip, "node-1")])


class API:
    """The benchmark's writes, through kube-apiserver as the admin."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp

    def create(self, e: Entry) -> None:
        self.write("POST", SERVICES, service_object(e.svc))
        self.write("POST", SLICES, slice_object(e.slice, e.slice_name))
        ingress = e.svc.get("status", {}).get("loadBalancer", {}).get("ingress")
        if ingress:
            body = {"status": {"loadBalancer": {"ingress": ingress}}}
            self.write("PATCH", f"{SERVICES}/{e.name}/status", body, content_type=MERGE_PATCH)

    def write(self, method: str, path: str, body: Any, **kw: Any) -> None:
        """One write, tried again after a timeout or a 5xx (the guest's API server is slow
        under a bulk load); a POST (409) or DELETE (404) that meets its own earlier attempt
        is done."""
        status, out = 0, ""
        for attempt in range(5):
            try:
                status, out = self.cp.request(method, path, body, timeout=60.0, **kw)
            except OSError as exc:  # a timeout: the write may or may not have happened
                status, out = 0, str(exc)
            again = {"POST": 409, "DELETE": 404}.get(method)  # its own earlier attempt did it
            if 200 <= status < 300 or (status == again and attempt > 0):
                return
            if status and status < 500:
                raise RuntimeError(f"{method} {path}: {status} {out}")
            time.sleep(1 + attempt)
        raise RuntimeError(f"{method} {path}: gave up: {status} {out}")

    def create_many(self, entries: Sequence[Entry], workers: int = 4) -> None:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(self.create, entries))

    def delete(self, e: Entry) -> None:
        self.write("DELETE", f"{SERVICES}/{e.name}", None)
        self.write("DELETE", f"{SLICES}/{e.slice_name}", None)

    def set_endpoints(self, e: Entry, endpoints: list[dict[str, Any]]) -> None:
        path = f"{SLICES}/{e.slice_name}"
        self.write("PATCH", path, {"endpoints": endpoints}, content_type=MERGE_PATCH)


# The proxies --------------------------------------------------------------------------------


@dataclass
class Identities:
    ipvsproxy: Path
    kube_proxy: Path
    admin: Path


def start(system: str, node: str, ns: str, ids: Identities, workdir: Path) -> peers.Peer:
    if system == "kube-proxy":
        return peers.kube_proxy(
            node,
            ns,
            ids.kube_proxy,
            workdir,
            verbosity=0,
            sync_period="30s",
            min_sync_period="0s",
            metrics=METRICS,
        )
    if system == "kube-router":
        extra = ["--ipvs-sync-period=30s"]
        return peers.kube_router(
            node, ns, ids.admin, workdir, extra=extra, verbosity=0, hairpin=False
        )
    argv = [
        sys.executable, "-m", "ipvsproxy", "run",
        "--kubeconfig", str(ids.ipvsproxy),
        "--hostname-override", node,
        "--cluster-cidr", peers.CLUSTER_CIDR,
        "--state-file", str(workdir / "ipvsproxy-state.json"),
        "--ipvs-sync-period", "30s",
        "--ipvs-min-sync-period", "0s",
        "--healthz-bind-address", "0.0.0.0:10256",
        "--metrics-bind-address", METRICS,
    ]  # fmt: skip
    return peers.Peer("ipvsproxy", ns, argv, workdir)


def samples(ns: str) -> list[Sample] | None:
    """Every sample the proxy's metrics address serves (prometheus-client's parser); None while
    it does not answer."""
    try:
        _, text = http_get_from(ns, f"http://{METRICS}/metrics")
    except OSError:
        return None
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def first_sync_done(ns: str) -> bool:
    """Every proxier's first sync ran to its end: kubeproxy_sync_proxy_rules_last_timestamp_seconds
    (by ip_family: one per proxier for kube-proxy, every served family's at once for
    ipvsproxy) is set in every series."""
    name = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
    values = [s.value for s in samples(ns) or () if s.name == name]
    return bool(values) and min(values) > 0


def ipvsproxy_writes(ns: str) -> int:
    """ipvsproxy's own count of kernel write operations since it started."""
    name = "ipvsproxy_netlink_operations_total"
    return int(sum(s.value for s in samples(ns) or () if s.name == name))


def own_sync_seconds(ns: str) -> dict[str, dict[str, float]] | None:
    """The proxy's own kubeproxy_sync_proxy_rules_duration_seconds histogram (count and sum
    since it started) by IP family (``ip_family``: kube-proxy's one per proxier it runs,
    ipvsproxy's one sync in each family it serves; "" for an unlabelled one, as ipvsproxy's
    before issue 18); None where it is not served."""
    out: dict[str, dict[str, float]] = {}
    for s in samples(ns) or ():
        for part in ("count", "sum"):
            if s.name == f"kubeproxy_sync_proxy_rules_duration_seconds_{part}":
                out.setdefault(s.labels.get("ip_family", ""), {})[part] = s.value
    return out or None


# Waiting for the kernel ---------------------------------------------------------------------


def poll(check: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``check`` (every 5 ms at first, backing off to 100 ms) until it holds; returns the
    monotonic time it first held."""
    began = time.monotonic()
    delay = 0.005
    while True:
        if check():
            return time.monotonic()
        elapsed = time.monotonic() - began
        if elapsed > timeout:
            raise TimeoutError(f"{what}: not seen within {timeout:g} s")
        time.sleep(delay)
        if elapsed > 0.2:
            delay = 0.02
        if elapsed > 2:
            delay = 0.1


def missing_in(table: Table, expected: dict[VSKey, set[Dest]]) -> list[VSKey]:
    """The expected virtual servers ``table`` does not hold with all their real servers."""
    out = []
    for vs, dests in expected.items():
        have = table.get(vs)
        if have is None or any(have.get(d, 0) <= 0 for d in dests):
            out.append(vs)
    return out


def missing(ns: str, expected: dict[VSKey, set[Dest]]) -> list[VSKey]:
    return missing_in(kernel_view.ipvs_table(ns), expected)


SAMPLE = 16  # virtual servers checked over netlink before the whole table is read
FEW = 500  # missing ones polled over netlink one by one; more: back to the sample


def wait_programmed(
    expected: dict[VSKey, set[Dest]],
    timeout: float,
    active: Callable[[VSKey], set[Dest] | None],
    table: Callable[[], Table],
    rng: random.Random | None = None,
) -> float:
    """The monotonic time the kernel first held every ``expected`` virtual server with all its
    real servers active, read from outside the proxy.

    The whole table (``table``) costs seconds of the guest's one CPU at 5,000 Services, taken
    from the proxy under test, and its answer is a read late. So it is read only once a random
    sample of virtual servers, each read alone over netlink (``active``), is all in. The ones
    that read misses are then polled alone until each has been seen complete: the time the
    last one was is the answer, once one more read of the whole table holds them all (else
    it starts again). A first read that misses none answers with the time it ended. Up to
    ``FEW`` virtual servers are all polled alone, without a first read."""
    began = time.monotonic()
    keys = list(expected)
    rng = rng or random.Random(0)

    def complete(vs: VSKey) -> bool:
        have = active(vs)
        return have is not None and expected[vs] <= have

    def wait(delay: float) -> None:
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"cold start: not seen within {timeout:g} s")
        time.sleep(delay)

    while True:
        while not all(complete(vs) for vs in rng.sample(keys, min(SAMPLE, len(keys)))):
            wait(0.1)
        pending = keys if len(keys) <= FEW else missing_in(table(), expected)
        done_at = time.monotonic()
        if not pending:
            return done_at
        while 0 < len(pending) <= FEW:
            pending = [vs for vs in pending if not complete(vs)]
            done_at = time.monotonic()
            if pending:
                wait(0.02)
        if not pending and not missing_in(table(), expected):
            return done_at
        wait(0.5)


# One run ------------------------------------------------------------------------------------


@dataclass
class Objects:
    """What the API server holds for this size."""

    entries: list[Entry]
    conn: Entry
    endpoints: int

    def expected(self) -> dict[VSKey, set[Dest]]:
        out: dict[VSKey, set[Dest]] = {}
        for e in [*self.entries, self.conn]:
            out.update(e.expected())
        return out


@dataclass
class Change:
    kind: str
    write: Callable[[], None]
    seen: Callable[[Prober], bool]
    seconds: float = 0.0
    cpu: float = 0.0


def change_pairs(api: API, e: Entry, kind: int, endpoints: int) -> list[Change]:
    """A change of kind ``kind`` (0: endpoint, 1: readiness, 2: Service) on ``e`` and the one
    that undoes it, with what the kernel shows when each has been programmed."""
    original = e.slice["endpoints"]
    if kind == 0:
        added = {"addresses": [ADD_ADDRESS], "conditions": {"ready": True}, "nodeName": "node-2"}
        dest = (ADD_ADDRESS, e.slice["ports"][0]["port"])
        return [
            Change("endpoint added", lambda: api.set_endpoints(e, [*original, added]),
                   lambda p: dest in (p.active(e.vs) or ())),
            Change("endpoint removed", lambda: api.set_endpoints(e, original),
                   lambda p: dest not in (p.active(e.vs) or {dest})),
        ]  # fmt: skip
    if kind == 1:
        first = json.loads(json.dumps(original))
        first[0]["conditions"] = {"ready": False, "serving": False, "terminating": False}
        dest = (original[0]["addresses"][0], e.slice["ports"][0]["port"])
        return [
            Change("endpoint not ready", lambda: api.set_endpoints(e, first),
                   lambda p: dest not in (p.active(e.vs) or {dest})),
            Change("endpoint ready again", lambda: api.set_endpoints(e, original),
                   lambda p: dest in (p.active(e.vs) or ())),
        ]  # fmt: skip
    new = new_entry(e)
    return [
        Change("service added", lambda: api.create(new),
               lambda p: p.active(new.vs) == new.dests()),
        Change("service deleted", lambda: api.delete(new), lambda p: p.active(new.vs) is None),
    ]  # fmt: skip


def run_changes(
    api: API,
    cluster: Objects,
    pid: int,
    prober: Prober,
    rounds: int,
    kinds: Sequence[int],
    timeout: float,
    budget: float = float("inf"),
) -> dict[str, list[list[float]]]:
    """Up to ``rounds`` rounds of one change of each of ``kinds`` (and its undoing), each on
    its own Service: [seconds, CPU seconds] by the change's name. No round starts once
    ``budget`` seconds have gone (the first always runs), so a system whose change takes
    minutes gets fewer changes of every kind, in equal numbers."""
    out: dict[str, list[list[float]]] = {}
    n = len(cluster.entries)
    began_all = time.monotonic()
    for i in range(rounds):
        if i and time.monotonic() - began_all > budget:
            progress(f"change budget of {budget:g} s spent after {i} rounds")
            break
        for kind in kinds:
            e = cluster.entries[(kind * rounds + i) * max(1, n // (3 * rounds)) % n]
            for change in change_pairs(api, e, kind, cluster.endpoints):
                cpu0 = proc.wait_idle(pid)
                began = time.monotonic()
                change.write()
                what = f"{change.kind} on {e.name}"
                seen = poll(partial(change.seen, prober), timeout, what)
                cpu1 = proc.wait_idle(pid)
                out.setdefault(change.kind, []).append([seen - began, cpu1 - cpu0])
    return out


def steady(api: API, cluster: Objects, pid: int, window: float) -> dict[str, float]:
    """CPU seconds per minute: idle, and with one endpoint change a second."""
    cpu0 = proc.wait_idle(pid)
    time.sleep(window)
    idle = proc.cpu_seconds(pid) - cpu0
    e = cluster.entries[len(cluster.entries) // 2]
    pair = change_pairs(api, e, 0, cluster.endpoints)
    cpu0 = proc.cpu_seconds(pid)
    began = time.monotonic()
    ticks = int(window)
    for k in range(ticks):
        pair[k % 2].write()
        time.sleep(max(0.0, began + k + 1 - time.monotonic()))
    busy = proc.cpu_seconds(pid) - cpu0
    if ticks % 2:
        pair[1].write()  # leave the Service as it was
    proc.wait_idle(pid)
    return {"idle_cpu_s_per_min": idle * 60 / window, "busy_cpu_s_per_min": busy * 60 / window}


def one_run(
    system: str,
    topo: Cluster,
    cluster: Objects,
    api: API,
    ids: Identities,
    workdir: Path,
    args: Any,
) -> dict[str, Any]:
    node = topo.nodes[0]  # fresh: set up, or renewed by the run before
    workdir.mkdir(parents=True, exist_ok=True)
    peer: peers.Peer | None = None
    prober: Prober | None = None
    try:
        topo.start_pod_echo(ECHO_PORT)
        prober = Prober(node.netns)
        expected = cluster.expected()
        began = time.monotonic()
        peer = start(system, node.name, node.netns, ids, workdir)
        pid = peer.proc.pid
        try:
            cold_at = wait_programmed(
                expected, args.timeout, prober.active, partial(kernel_view.ipvs_table, node.netns)
            )
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; missing: {missing(node.netns, expected)[:5]}") from None
        result: dict[str, Any] = {
            "cold_s": cold_at - began,
            "cold_cpu_s": proc.cpu_seconds(pid),
            "cold_peak_rss_mib": proc.peak_rss_mib(pid),
        }
        progress(f"{system}: cold start {result['cold_s']:.1f} s")
        table = kernel_view.ipvs_table(node.netns)
        result["virtual_servers"] = len(table)
        result["real_servers"] = sum(len(d) for d in table.values())
        try:
            if system != "kube-router":  # kube-proxy's first sync goes on well past the above
                synced_at = poll(partial(first_sync_done, node.netns), args.timeout, "first sync")
                result["first_sync_s"] = synced_at - began
                progress(f"{system}: first sync ended at {result['first_sync_s']:.1f} s")
            result["changes"] = run_changes(
                api,
                cluster,
                pid,
                prober,
                args.changes,
                args.kinds,
                args.change_timeout,
                args.change_budget,
            )
        except Exception as exc:  # what was measured before is kept with the error
            raise PartialRun(result) from exc
        progress(f"{system}: changes done")
        if system != "kube-router":  # its metrics are not the same
            result["own_syncs"] = own_sync_seconds(node.netns)
        if args.steady > 0:
            result["steady"] = steady(api, cluster, pid, args.steady)
        result["peak_rss_mib"] = proc.peak_rss_mib(pid)
        if args.restart:
            peer, result["restart"] = restart(
                system, peer, cluster, api, ids, node, prober, workdir
            )
            result["restart"]["peak_rss_mib"] = proc.peak_rss_mib(peer.proc.pid)
            result["peak_rss_mib"] = max(result["peak_rss_mib"], result["restart"]["peak_rss_mib"])
        if not peer.running():
            raise RuntimeError(f"{system} exited:\n{peer.logs()}")
        return result
    finally:
        if prober is not None:
            prober.close()
        if peer is not None:
            peer.stop()
        topo.renew()
        time.sleep(args.settle)  # the old namespace's tables go in the background


def sentinel_entry(endpoints: int) -> Entry:
    """The Service a restart must program: one port, its endpoints on another node (no
    loopback ipset entries), an address no other Service has."""
    eps = [(f"10.250.0.{j + 1}", "node-2") for j in range(endpoints)]
    return tcp_entry(-2, "sentinel", SENTINEL_IP, 80, 8080, eps)


def restart(
    system: str,
    peer: peers.Peer,
    cluster: Objects,
    api: API,
    ids: Identities,
    node: Any,
    prober: Prober,
    workdir: Path,
) -> tuple[peers.Peer, dict[str, Any]]:
    """A restart with a new Service to program (the sign that a first full sync has run);
    for ipvsproxy also a second restart with nothing changed, for its own write count."""
    ns = node.netns
    out: dict[str, Any] = {}
    session: netns.TCPSession | None = None
    try:
        session = netns.TCPSession(ns, CONN_IP, CONN_PORT, timeout=5)
        first = session.ask()["pod"]
    except OSError as exc:
        out["connection"] = f"none: {exc}"
        first = None
    peer.stop()
    table = kernel_view.ipvs_table(ns)
    text = kernel_view.text_state(ns)
    sentinel = sentinel_entry(cluster.endpoints)
    api.create(sentinel)
    try:
        began = time.monotonic()
        peer = start(system, node.name, ns, ids, workdir)
        seen = poll(lambda: prober.active(sentinel.vs) == sentinel.dests(), 1800, "restart")
        out["converge_s"] = seen - began
        proc.wait_idle(peer.proc.pid)
        after = kernel_view.ipvs_table(ns)
        after_text = kernel_view.text_state(ns)
        out["ipvs_changed"] = len(list(kernel_view.changed(table, after, {SENTINEL_IP})))
        for name in ("ipset", "iptables"):
            diff = text[name] ^ after_text[name]
            out[f"{name}_changed"] = len([ln for ln in diff if SENTINEL_IP not in ln])
        if session is not None and first is not None:
            try:
                out["connection"] = (
                    "survived" if session.ask()["pod"] == first else "moved to another pod"
                )
            except OSError as exc:
                out["connection"] = f"broken: {exc}"
        if system == "ipvsproxy":
            peer.stop()
            peer = start(system, node.name, ns, ids, workdir)
            poll(partial(first_sync_done, ns), 1800, "ipvsproxy's first sync")
            proc.wait_idle(peer.proc.pid)
            out["own_writes"] = ipvsproxy_writes(ns)
        return peer, out
    finally:
        if session is not None:
            session.close()
        api.delete(sentinel)


# The whole benchmark ------------------------------------------------------------------------


def set_up(workdir: Path) -> tuple[Cluster, ControlPlane, API, Identities]:
    """The one-node topology (its underlay carries the API server) and the control plane."""
    topo = Cluster.build(nodes=1, pods_per_node=1)
    cp = ControlPlane(workdir / "controlplane", host=topo.apiserver_ip, port=APISERVER_PORT)
    cp.start(controller_manager=False)
    for manifest in ("serviceaccount.yaml", "rbac.yaml"):
        cp.create_from_manifest(REPO / "deploy" / manifest)
    ids = Identities(
        ipvsproxy=cp.service_account_kubeconfig(*SERVICE_ACCOUNT, workdir / "ipvsproxy.kubeconfig"),
        kube_proxy=peers.grant_kube_proxy(cp, workdir / "kube-proxy.kubeconfig"),
        admin=cp.kubeconfig,
    )
    kubelets = LabKubelets(cp)
    kubelets.register_node(topo.nodes[0].name, topo.nodes[0].ip)
    kubelets.ensure_namespace(NS)
    return topo, cp, API(cp), ids


def summary(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "median": statistics.median(ordered),
        "p95": p95,
        "min": ordered[0],
        "max": ordered[-1],
    }


def measure(args: Any, workdir: Path) -> dict[str, Any]:
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    topo, cp, api, ids = set_up(workdir)
    out: dict[str, Any] = {"sizes": []}
    try:
        conn = conn_entry(topo.pods[0].ip)
        api.create(conn)
        entries: list[Entry] = []
        for services, endpoints in sizes:
            began = time.monotonic()
            new = [entry(i, endpoints) for i in range(len(entries), services)]
            api.create_many(new)
            entries += new
            progress(f"{services} x {endpoints} in the API ({time.monotonic() - began:.0f} s)")
            cluster = Objects(entries[:services], conn, endpoints)
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.systems}
            out["sizes"].append({"services": services, "endpoints": endpoints, "runs": runs})
            for r in range(args.runs):
                k = r % len(args.systems)
                order = args.systems[k:] + args.systems[:k]
                for system in order:
                    progress(f"{services} x {endpoints}: run {r + 1}, {system}")
                    wd = workdir / f"{services}x{endpoints}-{system}-{r}"
                    try:
                        runs[system].append(one_run(system, topo, cluster, api, ids, wd, args))
                    except Exception as exc:  # one failed run is reported; the others go on
                        cause = exc.__cause__ if isinstance(exc, PartialRun) else exc
                        progress(f"{system}: run failed: {cause}")
                        failed: dict[str, Any] = {"error": f"{type(cause).__name__}: {cause}"}
                        if isinstance(exc, PartialRun):
                            failed["partial"] = exc.result
                        runs[system].append(failed)
                    args.output.write_text(json.dumps(out, indent=2))  # each run once done
    finally:
        cp.stop()
        topo.destroy()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1000x10,5000x10", help="SxE,... in increasing order")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--changes", type=int, default=20, help="changes of each kind per run")
    p.add_argument(
        "--kinds",
        default=",".join(KIND_NAMES),
        help="which changes: endpoint (added, removed), readiness, service (added, deleted)",
    )
    p.add_argument("--steady", type=float, default=60.0, help="steady-state window, seconds")
    p.add_argument("--no-restart", dest="restart", action="store_false")
    p.add_argument("--timeout", type=float, default=1800.0, help="cold start limit, seconds")
    p.add_argument(
        "--change-timeout", type=float, default=1800.0, help="one change's limit, seconds"
    )
    p.add_argument(
        "--change-budget",
        type=float,
        default=3600.0,
        help="no new round of changes after this many seconds of one run's changes",
    )
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bench-peers"))
    p.add_argument("--output", type=Path, required=True)
    args = p.parse_args(argv)
    args.systems = args.systems.split(",")
    unknown = set(args.systems) - set(SYSTEMS)
    if unknown:
        p.error(f"unknown systems: {sorted(unknown)}")
    kinds = args.kinds.split(",")
    if set(kinds) - set(KIND_NAMES):
        p.error(f"unknown kinds: {sorted(set(kinds) - set(KIND_NAMES))}")
    args.kinds = [KIND_NAMES.index(k) for k in kinds]
    result = measure(args, args.workdir)
    args.output.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
