"""The settings: each ``ProxyConfig`` field with where the file keeps it, its flags, and the
converter that checks a raw value as upstream's validation does.

A converter takes the raw value, the field or flag name errors use, and whether the value comes
from the file (typed YAML) or a flag (text); it returns the value, or ``DEFAULT`` to keep the
default, or raises ``ConfigError`` naming the field or flag.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ipvsproxy.config.durations import parse_duration
from ipvsproxy.config.proxy_config import HEALTHZ_PORT, METRICS_PORT, ConfigError, ProxyConfig

SCHEDULERS = (
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos",
)  # fmt: skip
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
LOG_FORMATS = ("text", "json")
MAX_VERBOSITY = 10
_INT32_MAX = 2**31 - 1


class _Default:
    """A converter's answer for "keep the default": upstream defaults empty and zero fields."""


DEFAULT = _Default()
Converter = Callable[[Any, str, bool], Any]  # (raw value, field or flag name, from the file)


def _want_str(raw: Any, name: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(f"{name}: must be a string (got {raw!r})")
    return raw


def _str_or_none(raw: Any, name: str, _file: bool) -> str | None:
    return _want_str(raw, name) or None


def _bool(raw: Any, name: str, file: bool) -> bool:
    if file:
        if not isinstance(raw, bool):
            raise ConfigError(f"{name}: must be true or false (got {raw!r})")
        return raw
    text = _want_str(raw, name)
    if text in ("1", "t", "T", "true", "TRUE", "True"):
        return True
    if text in ("0", "f", "F", "false", "FALSE", "False"):
        return False
    raise ConfigError(f"{name}: must be true or false (got {text!r})")


def _int(raw: Any, name: str, file: bool) -> int:
    if file:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"{name}: must be an integer (got {raw!r})")
        return raw
    text = _want_str(raw, name)
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        raise ConfigError(f"{name}: must be an integer (got {text!r})")
    return int(text)


def _nonnegative_int32(raw: Any, name: str, file: bool) -> int:
    value = _int(raw, name, file)
    if value < 0:
        raise ConfigError(f"{name}: must be greater than or equal to 0 (got {value})")
    if value > _INT32_MAX:
        raise ConfigError(f"{name}: must be at most {_INT32_MAX} (got {value})")
    return value


def _duration(raw: Any, name: str, _file: bool) -> float:
    return parse_duration(raw, name)


def _duration_zero_is_default(raw: Any, name: str, file: bool) -> float | _Default:
    value = parse_duration(raw, name)
    return DEFAULT if file and value == 0 else value


def _strings(raw: Any, name: str, file: bool) -> list[tuple[str, str]]:
    """(name of the entry, entry): a file list, or comma-separated flag values."""
    if file:
        if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
            raise ConfigError(f"{name}: must be a list of strings (got {raw!r})")
        return [(f"{name}[{i}]", x) for i, x in enumerate(raw)]
    parts = [p.strip() for chunk in raw for p in _want_str(chunk, name).split(",")]
    return [(name, p) for p in parts if p]


def parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Go's ParseIP: an IPv4 or IPv6 address (no IPv6 zone), else None."""
    if "%" in text:
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def parse_cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """Go's ParseCIDR (host bits allowed, as ParseCIDRSloppy): an address, "/", a prefix length."""
    address, slash, prefix = text.partition("/")
    if not slash or not re.fullmatch(r"[0-9]{1,3}", prefix) or parse_ip(address) is None:
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _cidrs(raw: Any, name: str, file: bool) -> tuple[str, ...]:
    out = []
    for entry_name, entry in _strings(raw, name, file):
        net = parse_cidr(entry)
        if net is None:
            raise ConfigError(f"{entry_name}: {entry!r} must be a valid CIDR")
        out.append(str(net))
    return tuple(out)


def _node_port_addresses(raw: Any, name: str, file: bool) -> tuple[str, ...]:
    entries = _strings(raw, name, file)
    out = []
    for entry_name, entry in entries:
        if entry == "primary":
            if len(entries) != 1:
                raise ConfigError(f"{entry_name}: can't use both 'primary' and CIDRs")
            return ("primary",)
        net = parse_cidr(entry)
        if net is None:
            raise ConfigError(f"{entry_name}: {entry!r} must be a valid CIDR or 'primary'")
        out.append(str(net))
    return tuple(out)


def _cluster_cidrs(raw: Any, name: str, _file: bool) -> tuple[str, ...]:
    text = _want_str(raw, name)
    return tuple(text.split(",")) if text else ()


def _hostname(raw: Any, name: str, _file: bool) -> str | None:
    text = _want_str(raw, name)
    if not text:
        return None
    if not text.strip():
        raise ConfigError(f"{name}: must not be blank")
    return text.strip().lower()


def _bind_address(raw: Any, name: str, _file: bool) -> str | _Default:
    text = _want_str(raw, name)
    if not text:
        return DEFAULT
    if parse_ip(text) is None:
        raise ConfigError(
            f"{name}: {text!r} is not a valid textual representation of an IP address"
        )
    return text


def _split_host_port(text: str) -> tuple[str, str] | None:
    """Go's net.SplitHostPort, or None where it fails."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            return None
        host, port = text[1:end], text[end + 2 :]
        if "[" in host or "]" in port or "[" in port:
            return None
        return host, port
    host, colon, port = text.rpartition(":")
    if not colon or ":" in host or "[" in host or "]" in host:
        return None
    return host, port


def _host_port(default_port: int) -> Converter:
    def convert(raw: Any, name: str, file: bool) -> str | _Default:
        text = _want_str(raw, name)
        if not text:
            return DEFAULT if file else ""  # empty flag: the server is disabled
        ip = parse_ip(text)  # upstream appends the default port to a bare IP (AppendPortIfNeeded)
        if ip is not None:
            text = f"{text}:{default_port}" if ip.version == 4 else f"[{text}]:{default_port}"
        parts = _split_host_port(text)
        if parts is None:
            raise ConfigError(f"{name}: {text!r} must be IP:port")
        host, port = parts
        if parse_ip(host) is None:
            raise ConfigError(f"{name}: {host!r} must be a valid IP")
        if not re.fullmatch(r"[+-]?[0-9]+", port) or not 1 <= int(port) <= 65535:
            raise ConfigError(f"{name}: {port!r} must be a valid port (1-65535)")
        return text

    return convert


def _status_address(raw: Any, name: str, file: bool) -> str | _Default:
    """IP:port (no default port: the metrics server has it); empty disables /status."""
    text = _want_str(raw, name)
    if text and parse_ip(text) is not None:
        raise ConfigError(f"{name}: {text!r} must be IP:port")
    address: str | _Default = _host_port(METRICS_PORT)(raw, name, file)
    return address


def _mode(raw: Any, name: str, _file: bool) -> str:
    text = _want_str(raw, name)
    if text not in ("", "ipvs"):
        raise ConfigError(f"{name}: ipvsproxy only implements mode ipvs (got {text!r})")
    return text


def _one_of(choices: Sequence[str], empty: str) -> Converter:
    def convert(raw: Any, name: str, _file: bool) -> str:
        text = _want_str(raw, name) or empty
        if text not in choices:
            raise ConfigError(
                f"{name}: unsupported value {text!r}; must be one of {', '.join(choices)}"
            )
        return text

    return convert


def _oom_score_adj(raw: Any, name: str, file: bool) -> int:
    value = _int(raw, name, file)
    if not -1000 <= value <= 1000:
        raise ConfigError(f"{name}: must be within the range [-1000, 1000] (got {value})")
    return value


def _masquerade_bit(raw: Any, name: str, file: bool) -> int:
    value = _int(raw, name, file)
    if not 0 <= value <= 31:
        raise ConfigError(f"{name}: must be within the range [0, 31] (got {value})")
    return value


_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _label_value(raw: Any, name: str, _file: bool) -> str | None:
    text = _want_str(raw, name)
    if len(text) > 63 or not _LABEL_VALUE.fullmatch(text):
        raise ConfigError(f"{name}: {text!r} is not a valid label value")
    return text or None


def _state_path(raw: Any, name: str, _file: bool) -> str:
    text = _want_str(raw, name)
    if not text:
        raise ConfigError(f"{name}: must not be empty")
    return text


def _verbosity(raw: Any, name: str, file: bool) -> int:
    value = _int(raw, name, file)
    if not 0 <= value <= MAX_VERBOSITY:
        raise ConfigError(f"{name}: must be within the range [0, {MAX_VERBOSITY}] (got {value})")
    return value


@dataclass(frozen=True)
class Setting:
    """One setting: the ``ProxyConfig`` field it fills, where the file and the flags give it,
    and its converter."""

    key: str  # a ProxyConfig field, or "config" or "mode" (checked, then dropped)
    path: tuple[str, ...] | None  # where the file keeps it; None: a flag only
    flags: tuple[str, ...]  # the first is the name errors use
    convert: Converter
    help: str
    metavar: str | None = None
    kind: str = "value"  # value | bool | list
    flag_wins_upstream: bool = False  # upstream too lets this flag override the file

    @property
    def file_name(self) -> str:
        return ".".join(self.path or ())


# One setting for each ProxyConfig field but ``warnings``, and for --config and the mode; the help
# lists their flags in this order.
SETTINGS = (
    Setting("config", None, ("--config",), _str_or_none,
            "the path to a KubeProxyConfiguration file (YAML or JSON); flags given override it",
            "FILE"),
    Setting("kubeconfig", ("clientConnection", "kubeconfig"), ("--kubeconfig",), _str_or_none,
            "path to a kubeconfig file (default: in-cluster service account)", "FILE"),
    Setting("master", None, ("--master",), _str_or_none,
            "the address of the API server (overrides the kubeconfig's)", "URL"),
    Setting("hostname_override", ("hostnameOverride",), ("--hostname-override",), _hostname,
            "the name of this node (default: the hostname)", "NAME", flag_wins_upstream=True),
    Setting("bind_address", ("bindAddress",), ("--bind-address",), _bind_address,
            "this node's primary IP as kube-proxy understands it (default 0.0.0.0)", "IP"),
    Setting("healthz_bind_address", ("healthzBindAddress",), ("--healthz-bind-address",),
            _host_port(HEALTHZ_PORT),
            f"IP:port of the health server (default 0.0.0.0:{HEALTHZ_PORT}; 0.0.0.0 or :: "
            "listens on both families, as upstream's; empty disables)",
            "IP:PORT"),
    Setting("metrics_bind_address", ("metricsBindAddress",), ("--metrics-bind-address",),
            _host_port(METRICS_PORT),
            f"IP:port of the metrics server (default 127.0.0.1:{METRICS_PORT}; empty disables)",
            "IP:PORT"),
    Setting("cluster_cidr", ("clusterCIDR",), ("--cluster-cidr",), _cluster_cidrs,
            "the pods' CIDR (a dual-stack pair may be comma-separated)", "CIDR"),
    Setting("detect_local_mode", ("detectLocalMode",), ("--detect-local-mode",),
            _one_of(DETECT_LOCAL_MODES, "ClusterCIDR"),
            f"how to tell traffic from local pods: {', '.join(DETECT_LOCAL_MODES)}", "MODE"),
    Setting("bridge_interface", ("detectLocal", "bridgeInterface"), ("--pod-bridge-interface",),
            _str_or_none, "the pods' bridge (with --detect-local-mode=BridgeInterface)", "NAME"),
    Setting("interface_name_prefix", ("detectLocal", "interfaceNamePrefix"),
            ("--pod-interface-name-prefix",), _str_or_none,
            "the prefix of pod interfaces (with --detect-local-mode=InterfaceNamePrefix)",
            "PREFIX"),
    Setting("node_port_addresses", ("nodePortAddresses",), ("--nodeport-addresses",),
            _node_port_addresses,
            "comma-separated CIDRs of the node addresses that take NodePorts, or 'primary' "
            "(default: every local address; a family the CIDRs or 'primary' name nothing of "
            "keeps every address of that family)", "CIDRS", kind="list"),
    Setting("mode", ("mode",), ("--proxy-mode",), _mode, "must be ipvs (or empty)", "MODE"),
    Setting("scheduler", ("ipvs", "scheduler"), ("--ipvs-scheduler",),
            _one_of(SCHEDULERS, "rr"), "the IPVS scheduler (default rr)", "NAME"),
    Setting("sync_period", ("ipvs", "syncPeriod"), ("--ipvs-sync-period",),
            _duration_zero_is_default,
            "how often a full reconcile runs (default 30s; must be greater than 0)", "DURATION"),
    Setting("min_sync_period", ("ipvs", "minSyncPeriod"), ("--ipvs-min-sync-period",), _duration,
            "the least time between two syncs of changes (default 1s; with --config, "
            "ipvs.minSyncPeriod, whose default is 0)", "DURATION"),
    Setting("exclude_cidrs", ("ipvs", "excludeCIDRs"), ("--ipvs-exclude-cidrs",), _cidrs,
            "comma-separated CIDRs whose virtual servers ipvsproxy never touches", "CIDRS",
            kind="list"),
    Setting("strict_arp", ("ipvs", "strictARP"), ("--ipvs-strict-arp",), _bool,
            "set arp_ignore=1 and arp_announce=2", "BOOL", kind="bool"),
    Setting("tcp_timeout", ("ipvs", "tcpTimeout"), ("--ipvs-tcp-timeout",), _duration,
            "the IPVS timeout of idle TCP connections (0 leaves it)", "DURATION"),
    Setting("tcp_fin_timeout", ("ipvs", "tcpFinTimeout"), ("--ipvs-tcpfin-timeout",), _duration,
            "the IPVS timeout of TCP connections after a FIN (0 leaves it)", "DURATION"),
    Setting("udp_timeout", ("ipvs", "udpTimeout"), ("--ipvs-udp-timeout",), _duration,
            "the IPVS timeout of UDP flows (0 leaves it)", "DURATION"),
    Setting("masquerade_all", ("iptables", "masqueradeAll"), ("--masquerade-all",), _bool,
            "SNAT all traffic to Service IPs", "BOOL", kind="bool"),
    Setting("masquerade_bit", ("iptables", "masqueradeBit"), ("--iptables-masquerade-bit",),
            _masquerade_bit, "the fwmark bit that marks packets for SNAT, 0-31 (default 14)",
            "BIT"),
    Setting("conntrack_max_per_core", ("conntrack", "maxPerCore"), ("--conntrack-max-per-core",),
            _nonnegative_int32,
            "conntrack entries per CPU core (default 32768; 0 leaves the limit); the node's "
            "limit is raised to it x CPUs (at most 1048576), never lowered", "N"),
    Setting("conntrack_min", ("conntrack", "min"), ("--conntrack-min",), _nonnegative_int32,
            "the least conntrack entries, whatever the per-core value (default 131072)", "N"),
    Setting("conntrack_tcp_established_timeout", ("conntrack", "tcpEstablishedTimeout"),
            ("--conntrack-tcp-timeout-established",), _duration,
            "idle timeout of established TCP connections (default 24h0m0s; 0 leaves it)",
            "DURATION"),
    Setting("conntrack_tcp_close_wait_timeout", ("conntrack", "tcpCloseWaitTimeout"),
            ("--conntrack-tcp-timeout-close-wait",), _duration,
            "NAT timeout of TCP connections in CLOSE_WAIT (default 1h0m0s)", "DURATION"),
    Setting("conntrack_udp_timeout", ("conntrack", "udpTimeout"), ("--conntrack-udp-timeout",),
            _duration, "idle timeout of unreplied UDP flows (0 leaves it)", "DURATION"),
    Setting("conntrack_udp_stream_timeout", ("conntrack", "udpStreamTimeout"),
            ("--conntrack-udp-timeout-stream",), _duration,
            "idle timeout of assured UDP flows (0 leaves it)", "DURATION"),
    Setting("conntrack_tcp_be_liberal", ("conntrack", "tcpBeLiberal"),
            ("--conntrack-tcp-be-liberal",), _bool,
            "set nf_conntrack_tcp_be_liberal=1 (out-of-window TCP packets are not INVALID)",
            "BOOL", kind="bool"),
    Setting("oom_score_adj", ("oomScoreAdj",), ("--oom-score-adj",), _oom_score_adj,
            "the daemon's oom_score_adj, -1000 to 1000 (default -999)", "N"),
    Setting("bind_address_hard_fail", ("bindAddressHardFail",), ("--bind-address-hard-fail",),
            _bool, "exit when the health or metrics server cannot bind its port "
            "(default: log it and retry every 5s)", "BOOL", kind="bool"),
    Setting("log_format", ("logging", "format"), ("--log-format", "--logging-format"),
            _one_of(LOG_FORMATS, "text"), "text or json (default text)", "FORMAT",
            flag_wins_upstream=True),
    Setting("verbosity", ("logging", "verbosity"), ("--v", "-v"), _verbosity,
            f"log verbosity, 0-{MAX_VERBOSITY} (default 0)", "N", flag_wins_upstream=True),
    Setting("service_proxy_name", None, ("--service-proxy-name",), _label_value,
            "serve only Services labelled service.kubernetes.io/service-proxy-name=NAME "
            "(default: only Services without that label)", "NAME"),
    Setting("state_path", None, ("--state-file",), _state_path,
            "where ipvsproxy keeps what it programmed "
            f"(default {ProxyConfig.state_path})", "FILE"),
    Setting("status_bind_address", None, ("--status-bind-address",), _status_address,
            "IP:port of /status (the Services' virtual servers and their Pods; default: next "
            "to /metrics; empty disables)", "IP:PORT"),
    Setting("watch_timeout", None, ("--watch-timeout",), _duration,
            "how long one watch request lasts before it is renewed (default 5m0s)", "DURATION"),
    Setting("ipvs_drain_timeout", None, ("--ipvs-drain-timeout",), _duration,
            "how long a removed TCP real server drains at weight 0 before it is deleted with "
            "connections left (default 15m0s; 0: until it has none, as upstream)", "DURATION"),
    Setting("service_traffic_metrics", None, ("--service-traffic-metrics",), _nonnegative_int32,
            "export IPVS's connection, packet and byte counters per Service port, for at most "
            "N ports (default 0: none)", "N"),
)  # fmt: skip
