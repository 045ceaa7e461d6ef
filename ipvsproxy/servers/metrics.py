"""Prometheus metrics: upstream kube-proxy's in IPVS mode (pkg/proxy/metrics/metrics.go:
names, types, label names and values, buckets and help), the process's, and ipvsproxy's own
(``ipvsproxy_*``). The README's "Metrics" section lists every series.

Invariants: no ``*_created`` series (upstream's Go client has none); a histogram's ``le``
values are written as Go writes them (``le="1"``, not ``le="1.0"``)."""

from __future__ import annotations

import json
import platform
import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric

from ipvsproxy import __version__
from ipvsproxy.servers.healthz import Route, serve_routes
from ipvsproxy.servers.httpserver import HTTPServer
from ipvsproxy.servers.process_metrics import ProcessExtras

disable_created_metrics()  # type: ignore[no-untyped-call]  # process-wide: every registry

# Upstream's ip_family label values (v1.IPFamily)
FAMILY_LABELS = {4: "IPv4", 6: "IPv6"}
TRAFFIC_POLICIES = ("internal", "external")  # upstream's traffic_policy label values

# metrics.ExponentialBuckets(0.001, 2, 15)
SYNC_BUCKETS = tuple(0.001 * 2**i for i in range(15))
# metrics.MergeBuckets(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59),
# LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7)); MergeBuckets starts with a 0 bucket.
PROGRAMMING_BUCKETS = tuple(
    float(b) for b in (0, 0.25, 0.5, *range(1, 60), *range(60, 120, 5), *range(120, 301, 30))
)


def _alpha(text: str) -> str:
    """Help as component-base writes it for an ALPHA metric."""
    return f"[ALPHA] {text}"


class Metrics:
    """The daemon's registry and its metrics. Upstream's series that carry ``ip_family`` are
    filled by ``daemon.telemetry`` for every family the one proxier serves."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._sync_metrics(self.registry)
        self._change_metrics(self.registry)
        self._health_metrics(self.registry)
        self._ipvs_mode_metrics(self.registry)
        self._own_metrics(self.registry)
        self._process_metrics(self.registry)

    def _sync_metrics(self, r: CollectorRegistry) -> None:
        family = ["ip_family"]
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            _alpha("SyncProxyRules latency in seconds"),
            family,
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.programming_duration = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            _alpha("In Cluster Network Programming Latency in seconds"),
            family,
            buckets=PROGRAMMING_BUCKETS,
            registry=r,
        )
        self.last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            _alpha("The last time proxy rules were successfully synced"),
            family,
            registry=r,
        )
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            _alpha("The last time a sync of proxy rules was queued"),
            family,
            registry=r,
        )
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            _alpha("Number of services with a Local traffic policy and no endpoints"),
            ["traffic_policy", "ip_family"],
            registry=r,
        )

    def _change_metrics(self, r: CollectorRegistry) -> None:
        self.endpoint_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            _alpha("Pending proxy rules Endpoint changes"),
            registry=r,
        )
        self.endpoint_total = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            _alpha("Cumulative proxy rules Endpoint changes"),
            registry=r,
        )
        self.service_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            _alpha("Pending proxy rules Service changes"),
            registry=r,
        )
        self.service_total = Counter(
            "kubeproxy_sync_proxy_rules_service_changes",
            _alpha("Cumulative proxy rules Service changes"),
            registry=r,
        )

    def _ipvs_mode_metrics(self, r: CollectorRegistry) -> None:
        """What RegisterMetrics adds for IPVS mode."""
        self.restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            _alpha("Cumulative proxy iptables restore failures"),
            ["ip_family"],
            registry=r,
        )
        self.conntrack_duration = Histogram(
            "kubeproxy_conntrack_reconciler_sync_duration_seconds",
            _alpha("ReconcileConntrackFlowsLatency latency in seconds"),
            ["ip_family"],
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.conntrack_deleted = Counter(
            "kubeproxy_conntrack_reconciler_deleted_entries",
            _alpha("Cumulative conntrack flows deleted by conntrack reconciler"),
            ["ip_family"],
            registry=r,
        )

    def _health_metrics(self, r: CollectorRegistry) -> None:
        self.healthz_total = Counter(
            "kubeproxy_proxy_healthz",
            _alpha("Cumulative proxy healthz HTTP status"),
            ["code"],
            registry=r,
        )
        self.livez_total = Counter(
            "kubeproxy_proxy_livez",
            _alpha("Cumulative proxy livez HTTP status"),
            ["code"],
            registry=r,
        )

    def health_answered(self, probe: str, code: int) -> None:
        """/healthz or /livez (``probe``) answered ``code``."""
        counter = self.healthz_total if probe == "healthz" else self.livez_total
        counter.labels(str(code)).inc()

    def _own_metrics(self, r: CollectorRegistry) -> None:
        self.netlink_ops = Counter(
            "ipvsproxy_netlink_operations",
            "Kernel write operations by kind and outcome",
            ["kind", "outcome"],
            registry=r,
        )
        self.sync_errors = Counter(
            "ipvsproxy_sync_errors", "Syncs that ended with errors", registry=r
        )
        self.state_write_failures = Counter(
            "ipvsproxy_state_file_write_failures",
            "State file writes that failed (disk full, read-only); syncs go on",
            registry=r,
        )
        self.informer_handler_errors = Counter(
            "ipvsproxy_informer_handler_errors",
            "Changes seen by an informer whose handling raised; each is handed over again",
            ["informer"],
            registry=r,
        )
        self.failed_services = Gauge(
            "ipvsproxy_failed_services",
            "Services with an operation that failed, each retried on its own backoff",
            registry=r,
        )
        self.kernel_problems = Gauge(
            "ipvsproxy_kernel_problems",
            "Kernel settings that could not be set and kernel reads that fail now",
            registry=r,
        )
        self.draining = Gauge(
            "ipvsproxy_graceful_termination_real_servers",
            "Real servers at weight 0 waiting for their connections to end",
            registry=r,
        )
        self.helper_failures = Counter(
            "ipvsproxy_helper_failures",
            "Failures of a helper thread (address notices, config watch, a server's start), "
            "each logged; the helper goes on after a pause",
            ["helper"],
            registry=r,
        )

    def helper_failed(self, helper: str) -> None:
        self.helper_failures.labels(helper).inc()

    def _process_metrics(self, r: CollectorRegistry) -> None:
        """The process_* series of upstream's Go client (prometheus_client's and the rest),
        python_* where upstream has go_*, and upstream's kubernetes_build_info, ipvsproxy's."""
        ProcessCollector(registry=r)
        r.register(ProcessExtras())
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        info = build_info()
        Gauge(
            "kubernetes_build_info",
            "[BETA] A metric with a constant '1' value labeled by major, minor, git version, git "
            "commit, git tree state, build date, Go version, and compiler from which Kubernetes "
            "was built, and platform on which it is running.",
            list(info),
            registry=r,
        ).labels(**info).set(1)

    def exposition(self) -> bytes:
        """The registry in Prometheus' text format as Go's client writes it: no family without
        a series, ``le`` values as Go writes them."""
        return go_bucket_bounds(generate_latest(_WithSeries(self.registry)))

    def serve(self, address: str, extra: Mapping[str, Route]) -> HTTPServer:
        """/metrics, and ``extra`` routes (``upstream_routes``, the daemon's /status) on the
        same local address. The routes run on two workers: an exposition or a /status
        answer takes a while at thousands of Services, and probes must not wait for it."""

        def metrics() -> tuple[int, str, bytes]:
            return 200, CONTENT_TYPE_LATEST, self.exposition()

        return serve_routes(address, {"/metrics": metrics, **extra}, "metrics", workers=2)


CONFIGZ_NAME = "kubeproxy.config.k8s.io"  # upstream's configz.New(kubeproxyconfig.GroupName)
_TEXT = "text/plain; charset=utf-8"


def upstream_routes(mode: str, config: Mapping[str, Any]) -> dict[str, Route]:
    """What upstream's metrics server serves beside /metrics: /proxyMode (the mode),
    /configz (every registered component configuration as JSON, by its name: upstream's
    one, the KubeProxyConfiguration ``config``) and /healthz (its mux's ping: "ok")."""
    configs = json.dumps({CONFIGZ_NAME: config}).encode()
    return {
        "/proxyMode": lambda: (200, _TEXT, mode.encode()),
        "/configz": lambda: (200, "application/json", configs),
        "/healthz": lambda: (200, _TEXT, b"ok"),
    }


_GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}


def build_info() -> dict[str, str]:
    """kubernetes_build_info's labels, filled with ipvsproxy's version (git_version
    ``v<version>``) and runtime: no Go (go_version empty), the Python implementation as the
    compiler, ``GOOS/GOARCH`` as Go names them. Commit, tree state and build date are not
    recorded in the package: empty."""
    major, minor = ([*__version__.split("."), ""])[:2]
    machine = platform.machine()
    return {
        "major": major,
        "minor": minor,
        "git_version": f"v{__version__}",
        "git_commit": "",
        "git_tree_state": "",
        "build_date": "",
        "go_version": "",
        "compiler": platform.python_implementation().lower(),
        "platform": f"{sys.platform}/{_GO_ARCH.get(machine, machine)}",
    }


class _WithSeries(CollectorRegistry):
    """``source``'s families that have a series (a labelled one has none until its first
    label values are used)."""

    def __init__(self, source: CollectorRegistry) -> None:
        super().__init__(auto_describe=False)
        self.source = source

    def collect(self) -> Iterator[Metric]:
        return (family for family in self.source.collect() if family.samples)


_INTEGRAL_LE = re.compile(rb'le="(-?[0-9]+)\.0"')


def go_bucket_bounds(text: bytes) -> bytes:
    """``le="1.0"`` as Go's strconv writes it, ``le="1"`` (the only bounds prometheus_client
    writes otherwise than Go: an integral value; its exponents already match Go's)."""
    return _INTEGRAL_LE.sub(rb'le="\1"', text)
