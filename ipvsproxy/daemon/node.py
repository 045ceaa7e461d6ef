"""This node: its Node object and the addresses the kernel holds, kept current in the
dataplane's node facts and rules settings."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from ipvsproxy.config import ProxyConfig
from ipvsproxy.core.node_addresses import (
    FALLBACK_NODE_IP,
    local_addresses,
    node_ip,
    node_port_addresses,
    pod_cidr,
    uses_node_addresses,
)
from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.core.ruleset import RulesConfig
from ipvsproxy.core.topology import ZONE_LABEL, reads_zone, zone_of
from ipvsproxy.daemon.changes import ChangeTracker
from ipvsproxy.dataplane.dataplane import Backends, Dataplane
from ipvsproxy.kernel.addresses import AddressEvents
from ipvsproxy.kube.informer import Informer, Kept
from ipvsproxy.servers.healthz import HealthState

log = logging.getLogger("ipvsproxy")
POD_CIDR_WAIT = 300.0  # upstream waits 5 minutes for the Node's pod CIDR (NodeCIDR)
NOTICE_RETRY = 1.0  # the first pause after the address notices failed; doubled up to 60 s
NOTICE_RETRY_MAX = 60.0


def rules_config(
    cfg: ProxyConfig, node_pod_cidr: str | None = None, node_pod_cidr6: str | None = None
) -> RulesConfig:
    """The rules' settings; ``node_pod_cidr`` and ``node_pod_cidr6`` are the Node's pod CIDRs
    of each family (detectLocalMode NodeCIDR)."""
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
        cluster_cidr6=cfg.cluster_cidr6,
        local_value6=node_pod_cidr6 if cfg.detect_local_mode == "NodeCIDR" else None,
    )


def node_facts(
    name: str,
    backends: Backends,
    cfg: ProxyConfig,
    node_ip: str,
    zone: str = "",
    families: tuple[int, ...] = (4,),
    node_ip6: str | None = None,
) -> NodeFacts:
    """This node's addresses of ``families`` as the kernel has them now, its node IPs and its
    zone."""
    addrs = backends.addresses.indexed()
    dummy = backends.addresses.device_index()
    ports = node_port_addresses(addrs, dummy, cfg.node_port_addresses, node_ip, families, node_ip6)
    return NodeFacts(
        name=name,
        node_ips=ports,
        local_addresses=local_addresses(addrs, dummy, families),
        primary_ip=node_ip,
        zone=zone,
        primary_ip6=node_ip6,
    )


class NodeTracker:
    """This node as the daemon knows it: its Node object (the node IP, the pod CIDR, whether
    load balancers may send it traffic) and its addresses as the kernel holds them.

    ``refresh()`` brings the dataplane's node facts and rules settings up to date; whenever the
    facts change, the Services that read them are marked in ``changes`` and re-planned by the
    sync that called it. A deleted Node keeps its last addresses."""

    def __init__(
        self,
        cfg: ProxyConfig,
        dataplane: Dataplane,
        health: HealthState,
        changes: ChangeTracker,
        stop: threading.Event,
        failed: Callable[[str], object] = lambda _helper: None,
    ) -> None:
        self.cfg = cfg
        self.dp = dataplane
        self.health = health
        self.changes = changes
        self.stop = stop
        self.failed = failed  # a helper thread's failure, counted
        self.last_seen: Kept | None = None  # this node's Node object, once seen
        self._lock = threading.Lock()  # guards last_seen
        self.addresses_stale = threading.Event()  # the kernel said the node's addresses changed
        self._addresses_read = time.monotonic()  # when refresh last read them
        self._addresses_error: str | None = None  # why the last read failed, if it did

    def update(self, new: Kept | None) -> None:
        """The Node informer's object for this node is now ``new`` (None: deleted). /healthz
        fails while this node is going away, so load balancers drain it first. A changed node
        IP re-plans the Services that read it at the next sync; a changed zone label those
        with zone hints."""
        meta = (new or {}).get("metadata") or {}
        taints = ((new or {}).get("spec") or {}).get("taints") or []
        deleting = new is None or bool(meta.get("deletionTimestamp"))
        autoscaled = any(t.get("key") == "ToBeDeletedByClusterAutoscaler" for t in taints)
        with self.health.lock:
            self.health.node_eligible = not (deleting or autoscaled)
        with self._lock:
            before, zone_before = (self.ip(), self.ip6()), zone_of(self.last_seen)
            if new is not None:
                self.last_seen = new
            changed, zone = (self.ip(), self.ip6()) != before, zone_of(self.last_seen)
        if changed:
            log.info("node IP is now %s", self.ips_text())
            self.changes.mark_where(uses_node_addresses)
        if zone != zone_before:
            log.info("node zone (label %s) is now %r", ZONE_LABEL, zone)
            self.changes.mark_where_slices(reads_zone)

    def ip(self) -> str:
        """Upstream's detectNodeIPs: bindAddress, else the Node's, else 127.0.0.1."""
        return node_ip(self.cfg.bind_address, self.last_seen) or FALLBACK_NODE_IP

    def ip6(self) -> str | None:
        """The IPv6 node IP when the proxy serves IPv6: bindAddress, else the Node's."""
        if 6 not in self.dp.plan_config.families:
            return None
        return node_ip(self.cfg.bind_address, self.last_seen, 6)

    def ips_text(self) -> str:
        """The node IPs as the logs name them: those bindAddress or the Node gives, IPv4 first;
        upstream's 127.0.0.1 only when neither gives one (an IPv6-only node's node IP is its
        IPv6 one: its IPv4 fallback is no node IP to name)."""
        given = (node_ip(self.cfg.bind_address, self.last_seen), self.ip6())
        return " and ".join(ip for ip in given if ip) or FALLBACK_NODE_IP

    def wait(self, informer: Informer | None, pod_cidr_timeout: float = POD_CIDR_WAIT) -> bool:
        """Until the Node ``informer``'s first list is done, so the first sync uses the Node's
        IP (upstream waits for the Node too). A node IP neither bindAddress nor the Node gives
        is upstream's 127.0.0.1, with its warning; a Node that appears later is followed.
        With detectLocalMode NodeCIDR, also until the Node has a pod CIDR, as upstream: False
        when it has none within ``pod_cidr_timeout`` (the daemon exits)."""
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
        with self._lock:
            found = node_ip(self.cfg.bind_address, self.last_seen) or self.ip6()
        if found is None:  # (an IPv6-only node has its IPv6 node IP: no warning)
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
            with self._lock:
                if pod_cidr(self.last_seen) or pod_cidr(self.last_seen, 6):
                    return True
            if self.stop.is_set() or time.monotonic() >= deadline:
                return self.stop.is_set()
            self.stop.wait(min(1.0, max(0.0, deadline - time.monotonic())))

    def refresh(self) -> None:
        """Bring the dataplane's node facts up to date: the node IP, and the node's addresses
        read again from the kernel when a notice said they changed or a sync period has passed
        since the last read (notices can be lost). When the facts changed, the Services that
        read them are marked. Called with the sync lock held, before the marks are taken."""
        self._refresh_facts()
        self._report_node_port_families()

    def _report_node_port_families(self) -> None:
        """A served family whose NodePorts no address of this node carries is logged when that
        begins and ends, and named by /healthz while it lasts."""
        missing = {
            f"IPv{family}": f"no IPv{family} address of this node carries NodePorts (link-local "
            "ones never do; nodePortAddresses may exclude the others): its Services are served "
            "on their cluster IPs, external IPs and load-balancer VIPs, their NodePorts on no "
            "address until one is added"
            for family in self.dp.plan_config.families
            if not self.dp.node.node_ips_of(family)
        }
        with self.health.lock:
            before = dict(self.health.no_node_ports)
            self.health.no_node_ports = missing
        for name in sorted(missing.keys() - before.keys()):
            log.info("%s", missing[name])
        for name in sorted(before.keys() - missing.keys()):
            log.info("%s NodePorts are on this node's addresses again", name)

    def _refresh_facts(self) -> None:
        self._refresh_local_detector()
        ip = self.ip()
        with self._lock:
            zone = zone_of(self.last_seen)
        if zone != self.dp.node.zone:  # (update() marked the Services that read it)
            self.dp.node = replace(self.dp.node, zone=zone)
        now = time.monotonic()
        stale = self.addresses_stale.is_set() or now - self._addresses_read >= self.cfg.sync_period
        ip6 = self.ip6()
        if not stale and (ip, ip6) == (self.dp.node.primary_ip, self.dp.node.primary_ip6):
            return
        self.addresses_stale.clear()  # a notice from now on is for the next sync
        try:
            facts = node_facts(
                self.dp.node.name,
                self.dp.backends,
                self.cfg,
                ip,
                zone,
                self.dp.plan_config.families,
                ip6,
            )
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
            self.ips_text(),
            ", ".join(facts.node_ips) or "no address",
        )
        self.dp.node = facts
        self.changes.mark_where(uses_node_addresses)

    def _refresh_local_detector(self) -> None:
        """detectLocalMode NodeCIDR: the rules follow the Node's pod CIDR (re-rendered at this
        sync when it changed). Upstream exits to be restarted instead."""
        with self._lock:
            wanted = rules_config(self.cfg, pod_cidr(self.last_seen), pod_cidr(self.last_seen, 6))
        if wanted != self.dp.rules_config:
            log.info("local traffic detector: %s", wanted.if_not_local() or "none")
            self.dp.rules_config = wanted

    def watch_addresses(self, events: AddressEvents) -> None:
        """Until stopped: an address added to or removed from any interface but kube-ipvs0
        has the node's addresses read again at the next sync, which re-plans the Services that
        read them only if they changed (pods' veths and DHCP renewals come and go often). A
        failure is logged and counted; after a pause that doubles while failures repeat, the
        notices' socket is opened again and the addresses re-read (notices were lost meanwhile;
        the addresses are re-read every sync period anyway)."""
        failures, broken = 0, False
        while not self.stop.is_set():
            try:
                if broken:
                    events.reopen()
                    broken, changed = False, None  # notices lost meanwhile: any may have changed
                else:
                    changed = events.wait(1.0)
                    failures = 0
            except Exception as exc:
                failures, broken = failures + 1, True
                pause = min(NOTICE_RETRY_MAX, NOTICE_RETRY * 2 ** (failures - 1))
                log.warning(
                    "address notices: %s (%d in a row); addresses are re-read every sync "
                    "period, notices tried again in %g s",
                    exc,
                    failures,
                    pause,
                    exc_info=not isinstance(exc, OSError),
                )
                self.failed("addresses")
                self.stop.wait(pause)
                continue
            if changed is not None:
                changed.discard(self.dp.backends.addresses.device_index())  # our own binds
                if not changed:
                    continue
            self.addresses_stale.set()
            self.changes.request_sync()
