"""What the configuration is: ``ProxyConfig``, and ``ConfigError`` for one that is not valid."""

from __future__ import annotations

from dataclasses import dataclass

HEALTHZ_PORT = 10256
METRICS_PORT = 10249


class ConfigError(ValueError):
    """The configuration is invalid; each problem names the field or flag and the reason."""

    def __init__(self, *problems: str) -> None:
        self.problems: tuple[str, ...] = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class ProxyConfig:
    """The daemon's configuration: kube-proxy's settings, named as Python fields, with upstream's
    defaults (and ipvsproxy's, for its own flags) where neither the file nor a flag gives one.

    One that ``build`` returns is valid: each field passed its field's checks and the checks that
    take several fields (``min_sync_period <= sync_period``, an interface with the
    ``detect_local_mode`` that needs one); the daemon uses the values as they are. The constructor
    itself checks nothing. Frozen: nothing changes a configuration once it is built.
    """

    hostname_override: str | None = None
    bind_address: str = "0.0.0.0"
    healthz_bind_address: str = f"0.0.0.0:{HEALTHZ_PORT}"  # "" disables the server
    metrics_bind_address: str = f"127.0.0.1:{METRICS_PORT}"  # "" disables the server
    # /status: None serves it next to /metrics, "" turns it off, else its own address.
    status_bind_address: str | None = None
    cluster_cidr: str | None = None  # clusterCIDR's IPv4 CIDR
    cluster_cidr6: str | None = None  # and its IPv6 one
    detect_local_mode: str = "ClusterCIDR"
    bridge_interface: str | None = None
    interface_name_prefix: str | None = None
    node_port_addresses: tuple[str, ...] = ()
    scheduler: str = "rr"
    sync_period: float = 30.0
    min_sync_period: float = 1.0
    exclude_cidrs: tuple[str, ...] = ()
    strict_arp: bool = False
    tcp_timeout: float = 0.0
    tcp_fin_timeout: float = 0.0
    udp_timeout: float = 0.0
    masquerade_all: bool = False
    masquerade_bit: int = 14
    conntrack_max_per_core: int = 32768
    conntrack_min: int = 131072
    conntrack_tcp_established_timeout: float = 86400.0
    conntrack_tcp_close_wait_timeout: float = 3600.0
    conntrack_udp_timeout: float = 0.0
    conntrack_udp_stream_timeout: float = 0.0
    conntrack_tcp_be_liberal: bool = False
    oom_score_adj: int = -999  # upstream's default (qos.KubeProxyOOMScoreAdj)
    bind_address_hard_fail: bool = False  # a server that cannot bind stops the daemon
    kubeconfig: str | None = None
    master: str | None = None
    service_proxy_name: str | None = None
    state_path: str = "/var/lib/ipvsproxy/state.json"
    watch_timeout: float = 300.0  # ipvsproxy's own --watch-timeout: seconds per watch request
    # ipvsproxy's own --ipvs-drain-timeout: how long a removed TCP real server may drain at
    # weight 0 before it is deleted with connections left; 0: no bound (upstream's behaviour).
    ipvs_drain_timeout: float = 900.0
    # ipvsproxy's own --service-traffic-metrics: per-Service traffic series for at most this
    # many Service ports; 0: none.
    service_traffic_metrics: int = 0
    log_format: str = "text"
    verbosity: int = 0
    # One line per field or flag ipvsproxy ignores, or reads otherwise than upstream.
    warnings: tuple[str, ...] = ()
    # The --config file and the bytes read from it: the daemon exits when they change.
    config_file: str | None = None
    config_content: bytes | None = None
