"""``ipvsproxy run``: informers feed changed Services to the dataplane; a runner syncs them.

Watch events only mark Services as changed. The runner applies the marked ones no more often
than minSyncPeriod, and every syncPeriod runs a full reconcile that reads the kernel back.
Nothing is written to the kernel before Services and EndpointSlices have both completed their
first list. SIGTERM leaves the dataplane in place: traffic keeps flowing while the pod restarts.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ipvsproxy.config import ProxyConfig
from ipvsproxy.core.node_addresses import (
    FALLBACK_NODE_IP,
    local_addresses,
    node_ip,
    node_port_addresses,
    pod_cidr,
    uses_node_addresses,
)
from ipvsproxy.core.plan import NodeFacts, PlanConfig
from ipvsproxy.core.ruleset import RulesConfig
from ipvsproxy.core.service_ports import LABEL_SERVICE_NAME
from ipvsproxy.dataplane.dataplane import Backends, Dataplane, SyncResult
from ipvsproxy.dataplane.statefile import StateLock
from ipvsproxy.kernel.addresses import AddressEvents
from ipvsproxy.kube import client as kubeapi
from ipvsproxy.kube import slim
from ipvsproxy.kube.events import EventRecorder
from ipvsproxy.kube.informer import Informer, Kept
from ipvsproxy.process import gc_tuning
from ipvsproxy.servers.healthz import HealthState, json_route, serve_routes
from ipvsproxy.servers.healthz import serve as serve_health
from ipvsproxy.servers.httpserver import HTTPServer
from ipvsproxy.servers.metrics import Metrics
from ipvsproxy.servers.service_health import HealthCheckServers, Target
from ipvsproxy.status import view

log = logging.getLogger("ipvsproxy")
POD_CIDR_WAIT = 300.0  # upstream waits 5 minutes for the Node's pod CIDR (NodeCIDR)
TRIGGER_ANNOTATION = slim.TRIGGER_ANNOTATION


def rules_config(cfg: ProxyConfig, node_pod_cidr: str | None = None) -> RulesConfig:
    """The rules' settings; ``node_pod_cidr`` is the Node's pod CIDR (detectLocalMode
    NodeCIDR)."""
    local = {
        "NodeCIDR": node_pod_cidr,
        "BridgeInterface": cfg.bridge_interface,
        "InterfaceNamePrefix": cfg.interface_name_prefix,
    }
    return RulesConfig(
        masquerade_all=cfg.masquerade_all,
        masquerade_bit=cfg.masquerade_bit,
        cluster_cidr=cfg.cluster_cidr,
        detect_local=cfg.detect_local_mode,
        local_value=local.get(cfg.detect_local_mode),
    )


def node_facts(name: str, backends: Backends, cfg: ProxyConfig, node_ip: str) -> NodeFacts:
    """This node's addresses as the kernel has them now, and its node IP."""
    addrs = backends.addresses.indexed()
    dummy = backends.addresses.device_index()
    return NodeFacts(
        name=name,
        node_ips=node_port_addresses(addrs, dummy, cfg.node_port_addresses, node_ip),
        local_addresses=local_addresses(addrs, dummy),
        primary_ip=node_ip,
    )


class Proxy:
    """Owns the caches of Services and EndpointSlices and the marks of what changed."""

    def __init__(self, cfg: ProxyConfig, dataplane: Dataplane, metrics: Metrics) -> None:
        self.cfg = cfg
        self.dp = dataplane
        self.metrics = metrics
        self.health = HealthState(timeout=2 * cfg.sync_period)
        self.services: dict[str, Kept] = {}
        self.slices: dict[str, dict[str, Kept]] = {}  # service key -> slice key -> slice
        self.dirty: dict[str, float | None] = {}  # service key -> trigger time
        self.cond = threading.Condition()
        self.stop = threading.Event()
        self.informers: list[Informer] = []
        self.events: EventRecorder | None = None
        self.health_checks = HealthCheckServers(
            proxy_healthy=lambda: self.health.status(node_check=False)[0] == 200,
            report=self._warn,
        )
        self._reported: dict[tuple[str, str], int] = {}  # counter totals already exported
        # Held while a sync changes the dataplane, so /status reads a consistent state.
        self.sync_lock = threading.Lock()
        self.last_sync: float | None = None  # wall time of the last sync without errors
        self.node: Kept | None = None  # this node's Node object, once seen
        self.addresses_stale = threading.Event()  # the kernel said the node's addresses changed
        self._addresses_read = time.monotonic()  # when refresh_node last read them
        self._addresses_error: str | None = None  # why the last read failed, if it did

    # -- events ------------------------------------------------------------------------------

    def _warn(self, service: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.warn(service, reason, message)

    def _mark(self, service: str, trigger: float | None) -> None:
        with self.cond:
            if service not in self.dirty or self.dirty[service] is None:
                self.dirty[service] = trigger
            if self.synced():  # upstream queues nothing before its initial lists are done
                self.health.queued()
            self.metrics.last_queued.set(time.time())
            self.cond.notify_all()

    def on_service(self, key: str, _old: Kept | None, new: Kept | None) -> None:
        with self.cond:
            if new is None:
                self.services.pop(key, None)
            else:
                self.services[key] = new
        self.metrics.service_total.inc()
        self._mark(key, None)

    def on_node(self, _key: str, _old: Kept | None, new: Kept | None) -> None:
        """/healthz fails while this node is going away, so load balancers drain it first. A
        changed node IP re-plans the Services that read it at the next sync."""
        meta = (new or {}).get("metadata") or {}
        taints = ((new or {}).get("spec") or {}).get("taints") or []
        deleting = new is None or bool(meta.get("deletionTimestamp"))
        autoscaled = any(t.get("key") == "ToBeDeletedByClusterAutoscaler" for t in taints)
        with self.health.lock:
            self.health.node_eligible = not (deleting or autoscaled)
        with self.cond:
            before = self.node_ip()
            if new is not None:  # a deleted Node keeps its last addresses
                self.node = new
            changed = self.node_ip() != before
        if changed:
            log.info("node IP is now %s", self.node_ip())
            self._mark_node_dependent()

    def node_ip(self) -> str:
        """Upstream's detectNodeIPs: bindAddress, else the Node's, else 127.0.0.1."""
        return node_ip(self.cfg.bind_address, self.node) or FALLBACK_NODE_IP

    def wait_for_node(self, pod_cidr_timeout: float = POD_CIDR_WAIT) -> bool:
        """Until the Node informer's first list is done, so the first sync uses the Node's
        IP (upstream waits for the Node too). A node IP neither bindAddress nor the Node gives
        is upstream's 127.0.0.1, with its warning; a Node that appears later is followed.
        With detectLocalMode NodeCIDR, also until the Node has a pod CIDR, as upstream: False
        when it has none within ``pod_cidr_timeout`` (the daemon exits)."""
        informer = next((i for i in self.informers if i.name == "node"), None)
        while informer is not None and not informer.synced.wait(0.1):
            if self.stop.is_set():
                return True
        if self.cfg.detect_local_mode == "NodeCIDR" and not self._wait_pod_cidr(pod_cidr_timeout):
            log.error(
                "detectLocalMode NodeCIDR: node %s has no spec.podCIDRs after %g s; it tells "
                "pod traffic from other traffic by it (use ClusterCIDR or another mode where "
                "nodes get no pod CIDR)",
                self.dp.node.name,
                pod_cidr_timeout,
            )
            return False
        with self.cond:
            found = node_ip(self.cfg.bind_address, self.node)
        if found is None:
            log.warning(
                "can't determine this node's IP (no Node %s with an InternalIP or ExternalIP, "
                "no --bind-address), assuming %s; if this is incorrect, please set the "
                "--bind-address flag",
                self.dp.node.name,
                FALLBACK_NODE_IP,
            )
        return True

    def _wait_pod_cidr(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            with self.cond:
                if pod_cidr(self.node) is not None:
                    return True
            if self.stop.is_set() or time.monotonic() >= deadline:
                return self.stop.is_set()
            self.stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))

    def _mark_node_dependent(self) -> None:
        with self.cond:
            keys = [k for k, svc in self.services.items() if uses_node_addresses(svc)]
        for key in keys:
            self._mark(key, None)

    def refresh_node(self) -> None:
        """Bring the dataplane's node facts up to date: the node IP, and the node's addresses
        read again from the kernel when a notice said they changed or a sync period has passed
        since the last read (notices can be lost). When the facts changed, the Services that
        read them are re-planned in this sync. Called with ``sync_lock`` held, before the marks
        are taken."""
        self._refresh_local_detector()
        ip = self.node_ip()
        now = time.monotonic()
        stale = self.addresses_stale.is_set() or now - self._addresses_read >= self.cfg.sync_period
        if not stale and ip == self.dp.node.primary_ip:
            return
        self.addresses_stale.clear()  # a notice from now on is for the next sync
        try:
            facts = node_facts(self.dp.node.name, self.dp.backends, self.cfg, ip)
        except Exception as exc:  # the facts last read stay; read again at the next sync
            self.addresses_stale.set()
            if str(exc) != self._addresses_error:
                log.warning("reading the node's addresses: %s; keeping those last read", exc)
            self._addresses_error = str(exc)
            return
        self._addresses_read, self._addresses_error = now, None
        if facts == self.dp.node:
            return
        log.info(
            "node addresses: node IP %s, NodePorts on %s",
            facts.primary_ip,
            ", ".join(facts.node_ips) or "no address",
        )
        self.dp.node = facts
        self._mark_node_dependent()

    def _refresh_local_detector(self) -> None:
        """detectLocalMode NodeCIDR: the rules follow the Node's pod CIDR (re-rendered at this
        sync when it changed). Upstream exits to be restarted instead."""
        with self.cond:
            wanted = rules_config(self.cfg, pod_cidr(self.node))
        if wanted != self.dp.rules_config:
            log.info("local traffic detector: %s", wanted.if_not_local() or "none")
            self.dp.rules_config = wanted

    def watch_addresses(self, events: AddressEvents) -> None:
        """Until stopped: an address added to or removed from any interface but kube-ipvs0
        re-plans, at the next sync, the Services that read the node's addresses."""
        while not self.stop.is_set():
            try:
                changed = events.wait(1.0)
            except OSError as exc:
                log.warning("address notices: %s; addresses are re-read every sync period", exc)
                return
            if changed is not None:
                changed.discard(self.dp.backends.addresses.device_index())  # our own binds
                if not changed:
                    continue
            self.addresses_stale.set()
            self._mark_node_dependent()

    def on_slice(self, key: str, old: Kept | None, new: Kept | None) -> None:
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
        if not name:
            return
        service = f"{meta.get('namespace')}/{name}"
        with self.cond:
            bucket = self.slices.setdefault(service, {})
            if new is None:
                bucket.pop(key, None)
            else:
                bucket[key] = new
        self.metrics.endpoint_total.inc()
        self._mark(service, _trigger_time(new))

    # -- syncing -----------------------------------------------------------------------------

    def synced(self) -> bool:
        """Services and EndpointSlices have completed their first list (the Node need not)."""
        return all(i.synced.is_set() for i in self.informers if i.name != "node")

    def _take(self) -> dict[str, float | None]:
        with self.cond:
            dirty, self.dirty = self.dirty, {}
            return dirty

    def _replan(self) -> dict[str, float | None]:
        """Hand every Service marked since the last sync to the dataplane; return the marks."""
        self.refresh_node()
        dirty = self._take()
        for service in sorted(dirty):
            with self.cond:
                svc = self.services.get(service)
                slices = list(self.slices.get(service, {}).values())
            try:
                error = self.dp.update_service(service, svc, slices)
            except Exception as exc:  # a bug: this Service's error, the others go on
                log.exception("cannot plan service %s", service)
                error = self.dp.errors[service] = f"cannot plan: {type(exc).__name__}: {exc}"
            if error:
                log.warning("cannot program service %s: %s", service, error)
                if self.events is not None:
                    self.events.warn(service, "InvalidService", error)
        # Services another one's update took a virtual server from (issue 13 B8).
        notices, self.dp.notices = self.dp.notices, {}
        for service, note in sorted(notices.items()):
            log.warning("cannot program service %s: %s", service, note)
            if self.events is not None:
                self.events.warn(service, "InvalidService", note)
        return dirty

    def _converge(self, how: Callable[[], SyncResult]) -> SyncResult:
        with self.sync_lock:
            dirty: dict[str, float | None] = {}

            def replan_and_sync() -> SyncResult:
                dirty.update(self._replan())
                return how()

            result = gc_tuning.paused_for(replan_and_sync, lambda r: r.full)
            self._record(result, dirty)
        self._health_checks()
        return result

    def status_document(self) -> dict[str, Any]:
        """The daemon's side of ``ipvsproxy status``: desired IPVS state and names."""
        with self.sync_lock:
            with self.cond:
                pending = len(self.dirty)
            desired = self.dp.desired
            return view.daemon_document(
                node=self.dp.node.name,
                virtual_servers=desired.virtual_servers,
                real_servers=desired.real_servers,
                identities=self.dp.state.identities,
                last_sync=self.last_sync,
                pending=pending,
                invalid=self._invalid(),
            )

    def _invalid(self) -> dict[str, str]:
        """Services that cannot be planned, and those whose programming failed."""
        invalid = dict(self.dp.errors)
        for service, failure in self.dp.failed.items():
            if service:
                why = f"failed to program: {failure.reason}"
                invalid[service] = f"{invalid[service]}; {why}" if service in invalid else why
        return invalid

    def apply_changes(self) -> SyncResult:
        return self._converge(self.dp.sync)

    def reconcile(self) -> SyncResult:
        return self._converge(self.dp.reconcile)

    def _health_checks(self) -> None:
        """One server per eTP=Local Service's healthCheckNodePort, with this node's count, on
        the node-port addresses."""
        wanted: dict[int, Target] = {}
        with self.cond:
            for key, svc in self.services.items():
                spec = svc.get("spec") or {}
                port = int(spec.get("healthCheckNodePort") or 0)
                if not port or spec.get("externalTrafficPolicy") != "Local":
                    continue
                local = {
                    addr
                    for sl in self.slices.get(key, {}).values()
                    for ep in sl.get("endpoints") or []
                    if ep.get("nodeName") == self.dp.node.name
                    and (ep.get("conditions") or {}).get("ready", True) is not False
                    for addr in (ep.get("addresses") or [])[:1]
                }
                wanted[port] = Target(key, len(local))
        # Upstream listens on nodePortAddresses' matches when it is set, else everywhere.
        addresses = self.dp.node.node_ips if self.cfg.node_port_addresses else None
        self.health_checks.sync(wanted, addresses)

    def _record(self, result: SyncResult, dirty: Mapping[str, float | None]) -> None:
        m = self.metrics
        m.sync_duration.observe(result.seconds)
        snap = self.dp.snapshot()
        totals = dict(snap.operations)
        totals["restore", "failures"] = snap.restore_failures
        totals["state_file", "failures"] = snap.state_write_failures
        for (kind, outcome), n in totals.items():
            delta = n - self._reported.get((kind, outcome), 0)
            if delta <= 0:
                continue
            if outcome == "failures":
                failures = m.restore_failures if kind == "restore" else m.state_write_failures
                failures.inc(delta)
            else:
                m.netlink_ops.labels(kind, outcome).inc(delta)
        self._reported = totals
        m.draining.set(snap.draining)
        m.no_local_endpoints.labels("External").set(snap.no_local_endpoints)
        with self.cond:
            pending = len(self.dirty)
        m.endpoint_pending.set(pending)
        m.service_pending.set(pending)
        m.failed_services.set(snap.failed_services)
        m.kernel_problems.set(snap.kernel_problems)
        for service, why in sorted(result.failed.items()):
            log.warning("cannot program service %s: %s", service or "(deleted)", why)
            if service and self.events is not None:
                self.events.warn(service, "FailedToProgram", why)
        if result.errors:
            m.sync_errors.inc()
            for err in result.errors:
                log.error("sync: %s", err)
        if not result.complete:
            return  # upstream's sync whose iptables-restore failed: not marked updated
        # As upstream, a sync that ran to its end marks the proxier updated, per-object
        # failures included (they are reported above), and clears what was queued.
        now = time.time()
        self.last_sync = now
        m.last_sync.set(now)
        for trigger in dirty.values():
            if trigger is not None:
                m.programming_duration.observe(max(0.0, now - trigger))
        self.health.updated(now)
        log.info(
            "%s sync: %d writes in %.3f s, %d services changed",
            "full" if result.full else "incremental",
            result.writes,
            result.seconds,
            len(dirty),
        )

    def _contained(self, how: Callable[[], SyncResult]) -> SyncResult:
        """A sync whose exception escaped the dataplane's own containment (a bug): logged and
        counted, the kernel read back at the next sync, and the runner goes on."""
        try:
            return how()
        except Exception as exc:
            log.exception("sync failed")
            self.metrics.sync_errors.inc()
            self.dp.observed = None
            return SyncResult(full=True, errors=[f"{type(exc).__name__}: {exc}"], complete=False)

    def run(self) -> None:
        """The sync runner: until stopped."""
        self.health.updated()  # as upstream's SyncLoop: healthy while the lists come in
        while not self.synced():
            if self.stop.wait(0.1):
                return
        log.info("initial lists done: %d services", len(self.services))
        # The first full sync is due at once. (0.0 would delay it until the monotonic clock,
        # which starts near 0 when the node boots, passes one sync period.)
        last_full = -math.inf
        last_sync = 0.0
        # A sync that did not run to its end (rules not written, or it raised) is retried
        # after its own backoff; a failed Service is retried by the dataplane on its own.
        backoff, retry_at = 0.0, math.inf
        while not self.stop.is_set():
            now = time.monotonic()
            if now - last_full >= self.cfg.sync_period:
                result = self._contained(self.reconcile)
                last_full = last_sync = time.monotonic()
            else:
                with self.cond:
                    due = min(last_full + self.cfg.sync_period, retry_at, self._next_retry())
                    if not self.dirty:
                        self.cond.wait(timeout=max(0.0, due - now))
                    retry = min(retry_at, self._next_retry())
                    has_work = bool(self.dirty) or retry <= time.monotonic()
                if not has_work or self.stop.is_set():
                    continue
                pause = last_sync + self.cfg.min_sync_period - time.monotonic()
                if pause > 0 and self.stop.wait(pause):
                    return
                result = self._contained(self.apply_changes)
                last_sync = time.monotonic()
            if result.complete:
                backoff, retry_at = 0.0, math.inf
            else:
                backoff = min(30.0, max(1.0, backoff * 2))
                retry_at = time.monotonic() + backoff

    def _next_retry(self) -> float:
        """time.monotonic() of the dataplane's next retry of a failed Service (inf: none)."""
        retry = self.dp.next_retry()
        return math.inf if retry is None else retry


def _trigger_time(obj: Kept | None) -> float | None:
    if not obj:
        return None
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(TRIGGER_ANNOTATION)
    if not text:
        return None
    import datetime

    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def conntrack_sysctls(cfg: ProxyConfig, cores: int) -> dict[str, str]:
    """Upstream's conntrack settings (0 leaves the kernel's value)."""
    values: dict[str, str] = {}
    if cfg.conntrack_max_per_core > 0:
        limit = max(cfg.conntrack_max_per_core * cores, cfg.conntrack_min)
        values["net/netfilter/nf_conntrack_max"] = str(limit)
    for name, seconds in (
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            cfg.conntrack_tcp_established_timeout,
        ),
        ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", cfg.conntrack_tcp_close_wait_timeout),
        ("net/netfilter/nf_conntrack_udp_timeout", cfg.conntrack_udp_timeout),
        ("net/netfilter/nf_conntrack_udp_timeout_stream", cfg.conntrack_udp_stream_timeout),
    ):
        if seconds > 0:
            values[name] = str(int(seconds))
    if cfg.conntrack_tcp_be_liberal:  # upstream only ever sets it, never back to 0
        values["net/netfilter/nf_conntrack_tcp_be_liberal"] = "1"
    return values


def apply_kernel_settings(cfg: ProxyConfig, backends: Backends) -> None:
    """Conntrack limits and IPVS timeouts, once at start; a refusal is logged, not fatal
    (in a network namespace other than the host's, nf_conntrack_max is read-only)."""
    import os

    for name, value in conntrack_sysctls(cfg, os.cpu_count() or 1).items():
        try:
            if backends.sysctls.ensure({name: value}):
                log.info("set %s = %s", name, value)
        except OSError as exc:
            log.warning("cannot set %s = %s: %s", name, value, exc)
    if cfg.tcp_timeout or cfg.tcp_fin_timeout or cfg.udp_timeout:
        try:
            backends.ipvs.set_timeouts(
                int(cfg.tcp_timeout), int(cfg.tcp_fin_timeout), int(cfg.udp_timeout)
            )
        except Exception as exc:  # ApplyError names the operation
            log.warning("cannot set IPVS timeouts: %s", exc)


def start_server(
    what: str,
    start: Callable[[], object],
    hard_fail: bool,
    stop: threading.Event,
    retry: float = 5.0,
) -> bool:
    """Start a server; when its port cannot be bound, False with bindAddressHardFail (the
    daemon exits), else the error is logged and the server tried again every ``retry`` seconds
    (upstream's behaviour either way)."""
    try:
        start()
        return True
    except OSError as exc:
        if hard_fail:
            log.error("cannot start the %s server: %s (bindAddressHardFail: exiting)", what, exc)
            return False
        log.error("cannot start the %s server: %s; trying again every %g s", what, exc, retry)

    def again() -> None:
        while not stop.wait(retry):
            try:
                start()
            except OSError:
                continue
            log.info("the %s server started", what)
            return

    threading.Thread(target=again, name=f"start-{what}", daemon=True).start()
    return True


def set_oom_score_adj(value: int, path: str = "/proc/self/oom_score_adj") -> None:
    """The daemon's oom_score_adj (upstream's oomScoreAdj, -999 by default); a refusal is
    logged, not fatal (upstream logs it too)."""
    try:
        Path(path).write_text(f"{value}\n")
    except OSError as exc:
        log.warning("cannot set oom_score_adj to %d: %s", value, exc)


def api_client(cfg: ProxyConfig) -> Any:
    from kubernetes import client, config

    from_file: Any = config.new_client_from_config
    in_cluster: Any = config.load_incluster_config
    if cfg.kubeconfig or not cfg.master:
        if cfg.kubeconfig:
            api = from_file(config_file=cfg.kubeconfig)
        else:
            conf = client.Configuration()
            in_cluster(client_configuration=conf)
            api = client.ApiClient(conf)
        if cfg.master:
            api.configuration.host = cfg.master
        return api
    conf = client.Configuration()
    conf.host = cfg.master
    return client.ApiClient(conf)


def serve_metrics(cfg: ProxyConfig, metrics: Metrics, proxy: Proxy) -> list[HTTPServer]:
    """/metrics, and /status next to it or on its own address (--status-bind-address)."""
    status = {"/status": json_route(lambda: (200, proxy.status_document()))}
    servers = []
    apart = cfg.status_bind_address not in (None, cfg.metrics_bind_address)
    if cfg.metrics_bind_address:
        servers.append(metrics.serve(cfg.metrics_bind_address, {} if apart else status))
    if apart and cfg.status_bind_address:
        servers.append(serve_routes(cfg.status_bind_address, status, "status", workers=2))
    return servers


def informers(cfg: ProxyConfig, api: Any, proxy: Proxy, node_name: str) -> list[Informer]:
    """Services and EndpointSlices that this proxy serves, and this node's Node object."""
    watch_timeout = max(1, int(cfg.watch_timeout))
    proxied = "!service.kubernetes.io/headless"
    if cfg.service_proxy_name:
        proxied += f",service.kubernetes.io/service-proxy-name={cfg.service_proxy_name}"
    else:
        proxied += ",!service.kubernetes.io/service-proxy-name"
    return [
        Informer(
            "services",
            kubeapi.Lister(api, kubeapi.SERVICES),
            proxy.on_service,
            stop=proxy.stop,
            resource="services",
            label_selector=proxied,
            watch_timeout=watch_timeout,
            transform=slim.service,
        ),
        Informer(
            "endpointslices",
            kubeapi.Lister(api, kubeapi.ENDPOINT_SLICES),
            proxy.on_slice,
            stop=proxy.stop,
            resource="endpointslices.discovery.k8s.io",
            label_selector=LABEL_SERVICE_NAME,
            watch_timeout=watch_timeout,
            transform=slim.endpoint_slice,
        ),
        Informer(
            "node",
            kubeapi.Lister(api, kubeapi.NODES),
            proxy.on_node,
            stop=proxy.stop,
            resource="nodes",
            field_selector=f"metadata.name={node_name}",
            watch_timeout=watch_timeout,
        ),
    ]


def run(cfg: ProxyConfig) -> int:
    for warning in cfg.warnings:
        log.warning("config: %s", warning)
    set_oom_score_adj(cfg.oom_score_adj)
    # Held for the process's life, taken before anything touches the kernel or binds a port:
    # a second instance on the node (a DaemonSet update with maxSurge) waits here for the
    # first to exit; meanwhile the kubelet's probes reach the first one's health port.
    lock = _lock_state(Path(cfg.state_path))
    api = api_client(cfg)
    node_name = cfg.hostname_override or socket.gethostname()
    backends = Backends.open()
    apply_kernel_settings(cfg, backends)
    events = AddressEvents()  # before the first read, so no change falls in between
    # The node IP is provisional until the Node object is listed (wait_for_node).
    facts = node_facts(
        node_name, backends, cfg, node_ip(cfg.bind_address, None) or FALLBACK_NODE_IP
    )
    dp = Dataplane(
        facts,
        backends,
        Path(cfg.state_path),
        plan_config=PlanConfig(scheduler=cfg.scheduler, proxy_name=cfg.service_proxy_name),
        rules_config=rules_config(cfg),
        exclude_cidrs=cfg.exclude_cidrs,
        grace_seconds=drain_seconds(cfg),
        strict_arp=cfg.strict_arp,
    )
    metrics = Metrics()
    proxy = Proxy(cfg, dp, metrics)
    servers: list[tuple[str, Callable[[], object]]] = []
    if cfg.healthz_bind_address:
        servers.append(("health", lambda: serve_health(proxy.health, cfg.healthz_bind_address)))
    servers.append(("metrics", lambda: serve_metrics(cfg, metrics, proxy)))
    for what, start in servers:
        if not start_server(what, start, cfg.bind_address_hard_fail, proxy.stop):
            return 1
    proxy.informers = informers(cfg, api, proxy, node_name)
    proxy.events = EventRecorder(lambda ns, body: kubeapi.create_event(api, ns, body), node_name)
    proxy.health_checks.node = node_name
    for inf in proxy.informers:
        threading.Thread(target=inf.run, name=f"informer-{inf.name}", daemon=True).start()

    def stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping, leaving the dataplane in place", signum)
        proxy.stop.set()
        with proxy.cond:
            proxy.cond.notify_all()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if not proxy.wait_for_node():
        return 1
    threading.Thread(
        target=proxy.watch_addresses, args=(events,), name="addresses", daemon=True
    ).start()
    log.info("ipvsproxy on node %s, node IP %s", node_name, proxy.node_ip())
    proxy.run()
    backends.close()
    events.close()
    if lock is not None:
        lock.release()
    return 0


def drain_seconds(cfg: ProxyConfig) -> float:
    """The bound on a TCP real server's graceful termination; 0 in the config: none."""
    return cfg.ipvs_drain_timeout or math.inf


def _lock_state(path: Path) -> StateLock | None:
    try:
        return StateLock.acquire(path, wait=True, on_wait=log.warning)
    except OSError as exc:  # e.g. a read-only directory: the proxy still runs
        log.warning("cannot lock the state file %s: %s; running without the lock", path, exc)
        return None
