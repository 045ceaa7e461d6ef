"""``ipvsproxy run``: the process around the ``Proxy``: the state file lock, the API client,
the kernel backends and settings, the dataplane, the HTTP servers, the informers' threads and
the signals."""

from __future__ import annotations

import logging
import math
import signal
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ipvsproxy.config import ProxyConfig
from ipvsproxy.config.render import configz
from ipvsproxy.core.node_addresses import FALLBACK_NODE_IP, node_ip
from ipvsproxy.core.plan import PlanConfig
from ipvsproxy.core.service_ports import LABEL_SERVICE_NAME
from ipvsproxy.core.virtual_servers import ServiceKey, Traffic
from ipvsproxy.daemon.apiserver import api_server_addresses
from ipvsproxy.daemon.config_watch import start_config_watch
from ipvsproxy.daemon.kernel_settings import KernelSettingsError, apply_kernel_settings
from ipvsproxy.daemon.node import node_facts, rules_config
from ipvsproxy.daemon.proxy import Proxy
from ipvsproxy.dataplane.dataplane import Backends, Dataplane
from ipvsproxy.dataplane.statefile import StateLock
from ipvsproxy.kernel.addresses import AddressEvents
from ipvsproxy.kernel.families import ipv6_unavailable
from ipvsproxy.kernel.ipvs import IPVS
from ipvsproxy.kernel.nftables import NFTables
from ipvsproxy.kube import client as kube_client
from ipvsproxy.kube import slim
from ipvsproxy.kube.credentials import follow_token_file
from ipvsproxy.kube.events import EventRecorder
from ipvsproxy.kube.informer import Informer
from ipvsproxy.servers.healthz import json_route, serve_routes
from ipvsproxy.servers.healthz import serve as serve_health
from ipvsproxy.servers.httpserver import HTTPServer
from ipvsproxy.servers.metrics import Metrics, upstream_routes
from ipvsproxy.servers.traffic_metrics import ServiceTraffic

log = logging.getLogger("ipvsproxy")


def start_server(
    what: str,
    start: Callable[[], object],
    hard_fail: bool,
    stop: threading.Event,
    retry: float = 5.0,
    failed: Callable[[str], object] = lambda _helper: None,
) -> bool:
    """Start a server; when its port cannot be bound, False with bindAddressHardFail (the
    daemon exits), else the server is tried again every ``retry`` seconds until it starts
    (upstream's behaviour either way), each failure logged and counted (``failed``)."""

    def attempt() -> bool:
        try:
            start()
            return True
        except Exception as exc:  # OSError: the port; anything else: a bug, retried too
            then = "bindAddressHardFail: exiting" if hard_fail else f"trying again in {retry:g} s"
            log.error("cannot start the %s server: %s (%s)", what, exc, then)
            failed(f"{what}-server")
            return False

    if attempt():
        return True
    if hard_fail:
        return False

    def again() -> None:
        while not stop.wait(retry):
            if attempt():
                log.info("the %s server started", what)
                return

    threading.Thread(target=again, name=f"start-{what}", daemon=True).start()
    return True


def remove_nftables_leftovers(open_nftables: Callable[[], NFTables] = NFTables) -> None:
    """Delete the tables an nftables-mode kube-proxy left (``ip``/``ip6 kube-proxy``), at
    start, as upstream's platformCleanup; what fails is logged, never fatal (upstream goes on
    too)."""
    try:
        nft = open_nftables()
        try:
            removed, failed = nft.remove_kube_proxy_tables()
        finally:
            nft.close()
    except OSError as exc:
        log.warning("cannot remove kube-proxy's nftables tables: %s", exc)
        return
    for table in removed:
        log.info("removed kube-proxy's nftables table %s (left by its nftables mode)", table)
    for why in failed:
        log.warning("cannot remove kube-proxy's nftables table: %s", why)


def start_servers(
    cfg: ProxyConfig, metrics: Metrics, proxy: Proxy, stop: threading.Event, retry: float = 5.0
) -> list[HTTPServer] | None:
    """The health, metrics and status servers, each started (and tried again) on its own: one
    that cannot bind never holds up, nor rebinds, another. The list holds those started, and
    gets those started later; None: one could not bind with bindAddressHardFail."""
    servers: list[HTTPServer] = []
    starts: list[tuple[str, Callable[[], HTTPServer]]] = []
    if cfg.healthz_bind_address:
        address, answered = cfg.healthz_bind_address, metrics.health_answered
        starts.append(("health", lambda: serve_health(proxy.health, address, answered)))
    starts += [(what, start) for what, start in serve_metrics_starts(cfg, metrics, proxy)]
    for what, start in starts:

        def started(start: Callable[[], HTTPServer] = start) -> None:
            servers.append(start())

        if not start_server(
            what, started, cfg.bind_address_hard_fail, stop, retry, metrics.helper_failed
        ):
            return None
    return servers


def keep_running(
    what: str,
    body: Callable[[], None],
    stop: threading.Event,
    failed: Callable[[str], object] = lambda _helper: None,
    pause: float = 1.0,
    longest: float = 60.0,
) -> None:
    """Run a helper thread's ``body`` until it returns or ``stop``: whatever it raises is
    logged and counted (``failed``), and it runs again after a pause that doubles up to
    ``longest`` while failures repeat: a helper never ends silently."""
    failures = 0
    while not stop.is_set():
        try:
            body()
            return
        except Exception:
            failures += 1
            wait = min(longest, pause * 2 ** (failures - 1))
            log.exception("%s failed (%d in a row); started again in %g s", what, failures, wait)
            failed(what)
        stop.wait(wait)


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
            follow_token_file(api, cfg.kubeconfig)
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


def serve_metrics_starts(
    cfg: ProxyConfig, metrics: Metrics, proxy: Proxy
) -> list[tuple[str, Callable[[], HTTPServer]]]:
    """/metrics with upstream's /proxyMode, /configz and /healthz, and /status (and
    /status/all, for ``status --all``) next to it or on its own address
    (--status-bind-address): each server's name and its start."""
    status = {
        "/status": json_route(lambda: (200, proxy.status_document())),
        "/status/all": json_route(lambda: (200, proxy.status_document(kernel=True))),
    }
    starts: list[tuple[str, Callable[[], HTTPServer]]] = []
    apart = cfg.status_bind_address not in (None, cfg.metrics_bind_address)
    if cfg.metrics_bind_address:
        address = cfg.metrics_bind_address
        routes = {**upstream_routes("ipvs", configz(cfg)), **({} if apart else status)}
        starts.append(("metrics", lambda: metrics.serve(address, routes)))
    if apart and cfg.status_bind_address:
        status_address = cfg.status_bind_address
        starts.append(("status", lambda: serve_routes(status_address, status, "status", workers=2)))
    return starts


def serve_metrics(cfg: ProxyConfig, metrics: Metrics, proxy: Proxy) -> list[HTTPServer]:
    """The servers of ``serve_metrics_starts``, started now."""
    return [start() for _what, start in serve_metrics_starts(cfg, metrics, proxy)]


def service_traffic(limit: int, proxy: Proxy) -> ServiceTraffic:
    """Per-Service traffic series: IPVS's counters through a socket of their own (scrapes run
    beside syncs), named by the daemon's desired state as of the last sync."""
    ipvs = IPVS()

    def read() -> dict[ServiceKey, Traffic]:
        return {key: traffic for key, (_vs, traffic) in ipvs.services_with_traffic().items()}

    return ServiceTraffic(limit, read, proxy.port_names)


def informers(cfg: ProxyConfig, api: Any, proxy: Proxy, node_name: str) -> list[Informer]:
    """Services and EndpointSlices that this proxy serves, and this node's Node object."""
    watch_timeout = max(1, int(cfg.watch_timeout))
    proxied = "!service.kubernetes.io/headless"
    if cfg.service_proxy_name:
        proxied += f",service.kubernetes.io/service-proxy-name={cfg.service_proxy_name}"
    else:
        proxied += ",!service.kubernetes.io/service-proxy-name"

    def counted(informer: str) -> Callable[[str], None]:
        counter = proxy.metrics.informer_handler_errors.labels(informer)
        return lambda _key: counter.inc()

    return [
        Informer(
            "services",
            kube_client.Lister(api, kube_client.SERVICES),
            proxy.on_service,
            stop=proxy.stop,
            resource="services",
            label_selector=proxied,
            watch_timeout=watch_timeout,
            transform=slim.service,
            on_handler_error=counted("services"),
        ),
        Informer(
            "endpointslices",
            kube_client.Lister(api, kube_client.ENDPOINT_SLICES),
            proxy.on_slice,
            stop=proxy.stop,
            resource="endpointslices.discovery.k8s.io",
            label_selector=LABEL_SERVICE_NAME,
            watch_timeout=watch_timeout,
            transform=slim.endpoint_slice,
            on_handler_error=counted("endpointslices"),
        ),
        Informer(
            "node",
            kube_client.Lister(api, kube_client.NODES),
            proxy.on_node,
            stop=proxy.stop,
            resource="nodes",
            field_selector=f"metadata.name={node_name}",
            watch_timeout=watch_timeout,
            on_handler_error=counted("node"),
        ),
    ]


def run(cfg: ProxyConfig, open_backends: Callable[[], Backends] = Backends.open) -> int:
    """The daemon, until a signal stops it; ``open_backends`` gives the kernel backends (the
    real ones; the lab's fault injection wraps them)."""
    for warning in cfg.warnings:
        log.warning("config: %s", warning)
    set_oom_score_adj(cfg.oom_score_adj)
    # Held for the process's life, taken before anything touches the kernel or binds a port:
    # a second instance on the node (a DaemonSet update with maxSurge) waits here for the
    # first to exit; meanwhile the kubelet's probes reach the first one's health port.
    lock = _lock_state(Path(cfg.state_path))
    remove_nftables_leftovers()
    api = api_client(cfg)
    node_name = cfg.hostname_override or socket.gethostname()
    backends = open_backends()
    families, unserved = serving_families()
    backends.serve_families(families)
    try:
        apply_kernel_settings(cfg, backends)
    except KernelSettingsError as exc:
        log.error("%s; exiting", exc)
        backends.close()
        return 1
    # Before the first read, so no change falls in between.
    events = AddressEvents(ipv6=6 in families)
    # The node IP is provisional until the Node object is listed (wait_for_node).
    facts = node_facts(
        node_name,
        backends,
        cfg,
        node_ip(cfg.bind_address, None) or FALLBACK_NODE_IP,
        families=families,
        node_ip6=node_ip(cfg.bind_address, None, 6) if 6 in families else None,
    )
    plan_config = PlanConfig(
        scheduler=cfg.scheduler,
        proxy_name=cfg.service_proxy_name,
        families=families,
        reserved=api_server_addresses(str(api.configuration.host or "")),
    )
    dp = Dataplane(
        facts,
        backends,
        Path(cfg.state_path),
        plan_config=plan_config,
        rules_config=rules_config(cfg),
        exclude_cidrs=cfg.exclude_cidrs,
        grace_seconds=drain_seconds(cfg),
        strict_arp=cfg.strict_arp,
    )
    metrics = Metrics()
    proxy = Proxy(cfg, dp, metrics)
    if cfg.service_traffic_metrics:
        metrics.registry.register(service_traffic(cfg.service_traffic_metrics, proxy))
    proxy.health.unserved = unserved
    if start_servers(cfg, metrics, proxy, proxy.stop) is None:
        return 1
    proxy.informers = informers(cfg, api, proxy, node_name)
    proxy.events = EventRecorder(
        lambda ns, body: kube_client.create_event(api, ns, body), node_name
    )
    proxy.health_checks.node = node_name
    for inf in proxy.informers:
        threading.Thread(target=inf.run, name=f"informer-{inf.name}", daemon=True).start()

    def stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping, leaving the dataplane in place", signum)
        proxy.request_stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watch = start_config_watch(cfg, proxy.stop, proxy.request_stop, failed=metrics.helper_failed)
    if not proxy.wait_for_node():
        return 1
    threading.Thread(
        target=keep_running,
        args=("addresses", lambda: proxy.node.watch_addresses(events), proxy.stop),
        kwargs={"failed": metrics.helper_failed},
        name="addresses",
        daemon=True,
    ).start()
    log.info("ipvsproxy on node %s, node IP %s", node_name, proxy.node.ips_text())
    proxy.run()
    backends.close()
    events.close()
    if lock is not None:
        lock.release()
    return 1 if watch is not None and watch.reason else 0


def serving_families() -> tuple[tuple[int, ...], dict[str, str]]:
    """The IP families this node serves (IPv4 always, IPv6 where the kernel and ip6tables
    have it, as upstream), and why each other one is not served; logged once here, and
    shown by /healthz."""
    why = ipv6_unavailable()
    if why is None:
        log.info("serving IPv4 and IPv6 Services")
        return (4, 6), {}
    log.warning("IPv6 Services are not served on this node: %s", why)
    return (4,), {"IPv6": why}


def drain_seconds(cfg: ProxyConfig) -> float:
    """The bound on a TCP real server's graceful termination; 0 in the config: none."""
    return cfg.ipvs_drain_timeout or math.inf


def _lock_state(path: Path) -> StateLock | None:
    try:
        return StateLock.acquire(path, wait=True, on_wait=log.warning)
    except OSError as exc:  # e.g. a read-only directory: the proxy still runs
        log.warning("cannot lock the state file %s: %s; running without the lock", path, exc)
        return None
