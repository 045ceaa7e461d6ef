"""Prometheus metrics with upstream kube-proxy's names, plus ipvsproxy's own."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ipvsproxy.servers.healthz import Route, serve_routes
from ipvsproxy.servers.httpserver import HTTPServer

# Upstream's ip_family label values (v1.IPFamily)
FAMILY_LABELS = {4: "IPv4", 6: "IPv6"}
TRAFFIC_POLICIES = ("internal", "external")  # upstream's traffic_policy label values

_BUCKETS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
            2.048, 4.096, 8.192, 16.384)  # fmt: skip


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.sync_duration = Histogram(
            "kubeproxy_sync_proxy_rules_duration_seconds",
            "SyncProxyRules latency in seconds",
            buckets=_BUCKETS,
            registry=r,
        )
        self.programming_duration = Histogram(
            "kubeproxy_network_programming_duration_seconds",
            "In Cluster Network Programming Latency in seconds",
            buckets=(0.25, 0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 30, 45, 60, 120, 300),
            registry=r,
        )
        self.last_sync = Gauge(
            "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
            "The last time proxy rules were successfully synced",
            registry=r,
        )
        self.last_queued = Gauge(
            "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
            "The last time a sync of proxy rules was queued",
            registry=r,
        )
        self.endpoint_pending = Gauge(
            "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
            "Pending proxy rules Endpoint changes",
            registry=r,
        )
        self.endpoint_total = Counter(
            "kubeproxy_sync_proxy_rules_endpoint_changes",
            "Cumulative proxy rules Endpoint changes",
            registry=r,
        )
        self.service_pending = Gauge(
            "kubeproxy_sync_proxy_rules_service_changes_pending",
            "Pending proxy rules Service changes",
            registry=r,
        )
        self.service_total = Counter(
            "kubeproxy_sync_proxy_rules_service_changes",
            "Cumulative proxy rules Service changes",
            registry=r,
        )
        self.no_local_endpoints = Gauge(
            "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
            "Number of services with a Local traffic policy and no endpoints",
            ["traffic_policy", "ip_family"],
            registry=r,
        )
        self.restore_failures = Counter(
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Cumulative proxy iptables restore failures",
            registry=r,
        )
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

    def serve(self, address: str, extra: Mapping[str, Route]) -> HTTPServer:
        """/metrics, and ``extra`` routes (the daemon's /status) on the same local address, as
        upstream serves /configz and /proxyMode beside its metrics. The routes run on two
        workers, as /status waits for a running sync."""

        def metrics() -> tuple[int, str, bytes]:
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.registry)

        return serve_routes(address, {"/metrics": metrics, **extra}, "metrics", workers=2)
