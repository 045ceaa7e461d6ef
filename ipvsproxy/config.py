"""Configuration, read as upstream kube-proxy reads it: a ``KubeProxyConfiguration`` file and flags.

An operator's kube-proxy ConfigMap (``kubeproxy.config.k8s.io/v1alpha1``, YAML or JSON, given by
``--config``) and kube-proxy's flag names work unchanged. Empty and null fields in the file get
upstream's defaults (pkg/proxy/apis/config/v1alpha1/defaults.go), and values are validated as
upstream's pkg/proxy/apis/config/validation does; every error names the field as the file
spells it (``ipvs.minSyncPeriod``, ``nodePortAddresses[1]``) or the flag (``--cluster-cidr``).

Where ipvsproxy differs from upstream, on purpose:

- A flag that is given overrides the file. Upstream ignores most flags once ``--config`` is given
  (its help says so); when a flag here changes a value the file sets, ``warnings`` says so.
- Fields upstream defines that ipvsproxy does not use (``iptables.syncPeriod``, ``nftables.*``,
  ``winkernel.*``, ``featureGates``, ``configSyncPeriod``, ...) are a warning when set to
  anything but their zero value or upstream's default; kubeadm writes every field, mostly
  zero, so a stock ConfigMap warns about nothing. Unknown fields are a warning too (upstream
  decodes v1alpha1 leniently and logs them). Upstream-only flags are accepted and warned about,
  except those whose meaning ipvsproxy cannot honour (``--cleanup``, ``--init-only``,
  ``--write-config-to``). tests/unit/test_config_audit.py holds every upstream field and flag
  to this.
- The IPVS scheduler must be one the kernel has (rr, wrr, lc, wlc, lblc, lblcr, dh, sh, sed, nq,
  mh, fo, ovf, twos; empty means rr).
- ``--healthz-bind-address=`` and ``--metrics-bind-address=`` (empty) disable that server. In the
  file an empty address means the default, as upstream. ``--status-bind-address`` (ipvsproxy's
  own) moves ``/status`` off the metrics address; empty disables it.
- ``cluster_cidr`` is the first IPv4 CIDR of ``clusterCIDR``; an IPv6 one is a warning.

``build`` is pure; ``load`` is the only function that reads a file.
"""

from __future__ import annotations

import argparse
import importlib
import ipaddress
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, NoReturn

API_VERSION = "kubeproxy.config.k8s.io/v1alpha1"
KIND = "KubeProxyConfiguration"
SCHEDULERS = (
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh", "fo", "ovf", "twos",
)  # fmt: skip
DETECT_LOCAL_MODES = ("ClusterCIDR", "NodeCIDR", "BridgeInterface", "InterfaceNamePrefix")
LOG_FORMATS = ("text", "json")
MAX_VERBOSITY = 10
HEALTHZ_PORT = 10256
METRICS_PORT = 10249
_INT32_MAX = 2**31 - 1


class ConfigError(ValueError):
    """The configuration is invalid; each problem names the field or flag and the reason."""

    def __init__(self, *problems: str) -> None:
        self.problems: tuple[str, ...] = problems
        super().__init__("; ".join(problems))


@dataclass(frozen=True)
class ProxyConfig:
    hostname_override: str | None = None
    bind_address: str = "0.0.0.0"
    healthz_bind_address: str = f"0.0.0.0:{HEALTHZ_PORT}"  # "" disables the server
    metrics_bind_address: str = f"127.0.0.1:{METRICS_PORT}"  # "" disables the server
    # /status: None serves it next to /metrics, "" turns it off, else its own address.
    status_bind_address: str | None = None
    cluster_cidr: str | None = None
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
    log_format: str = "text"
    verbosity: int = 0
    # One line per field or flag ipvsproxy ignores, or reads otherwise than upstream.
    warnings: tuple[str, ...] = ()


# -- Go durations --------------------------------------------------------------------------------

_NS_PER_UNIT = {
    "ns": 1,
    "us": 1_000,
    "\u00b5s": 1_000,  # MICRO SIGN, as Go accepts
    "\u03bcs": 1_000,  # GREEK SMALL LETTER MU
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
    "h": 3_600_000_000_000,
}
_NUMBER = re.compile(r"([0-9]*)(?:\.([0-9]*))?")
_MAX_NS = 2**63 - 1


def parse_duration(text: str | int | float, field: str) -> float:
    """Seconds in a Go duration (``time.ParseDuration``: "30s", "1m0s", "2h45m", "500ms", "1.5s",
    "0"); an int or float is seconds. Negative or unparsable is a ConfigError naming ``field``."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ConfigError(f"{field}: must be a duration such as 30s, 1m0s or 500ms (got {text!r})")
    if not isinstance(text, str):
        if not math.isfinite(text):
            raise ConfigError(f"{field}: invalid duration {text!r}")
        if text < 0:
            raise ConfigError(f"{field}: must be greater than or equal to 0 (got {text!r})")
        return float(text)
    ns = _go_duration_ns(text, field)
    if ns < 0:
        raise ConfigError(f"{field}: must be greater than or equal to 0 (got {text!r})")
    return ns / 1e9


def _go_duration_ns(orig: str, field: str) -> int:
    """Go's time.ParseDuration, in integer nanoseconds (each component's fraction truncated)."""

    def invalid(why: str = "invalid duration") -> NoReturn:
        raise ConfigError(
            f"{field}: {why} {orig!r} (expected a Go duration such as 30s, 1m0s, 2h45m or 500ms)"
        )

    s = orig
    negative = False
    if s[:1] in ("-", "+"):
        negative = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        invalid()
    total = 0
    while s:
        m = _NUMBER.match(s)
        assert m is not None  # the pattern matches the empty string
        whole, frac = m.group(1), m.group(2)
        if not whole and not frac:
            invalid()
        s = s[m.end() :]
        i = 0
        while i < len(s) and s[i] != "." and not ("0" <= s[i] <= "9"):
            i += 1
        if i == 0:
            invalid("missing unit in duration")
        unit, s = s[:i], s[i:]
        scale = _NS_PER_UNIT.get(unit)
        if scale is None:
            invalid(f"unknown unit {unit!r} in duration")
        value = Fraction(int(whole or "0"))
        if frac:
            value += Fraction(int(frac), 10 ** len(frac))
        total += int(value * scale)
        if total > _MAX_NS + (1 if negative else 0):
            invalid("overflow in duration")
    return -total if negative else total


# -- reading the file ----------------------------------------------------------------------------


def parse_config_text(text: str, source: str) -> dict[str, Any]:
    """The mapping in a KubeProxyConfiguration file's text (YAML, or JSON which is YAML too);
    errors name ``source``."""
    data: Any
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = _yaml_load(text, source)
    else:
        data = _yaml_load(text, source)
    if data is None:
        raise ConfigError(f"{source}: is empty; expected a {KIND} mapping")
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: must contain a {KIND} mapping, not a {type(data).__name__}")
    return data


def _yaml_load(text: str, source: str) -> Any:
    try:
        # importlib keeps mypy from needing PyYAML's stubs; the kubernetes package requires it.
        yaml: Any = importlib.import_module("yaml")
    except ImportError:
        raise ConfigError(f"{source}: cannot parse as JSON, and PyYAML is not installed") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: cannot parse as YAML or JSON: {exc}") from None


# -- the settings --------------------------------------------------------------------------------


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


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if "%" in text:  # Go's ParseIP takes no IPv6 zone
        return None
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _cidr(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    """Go's ParseCIDR (host bits allowed, as ParseCIDRSloppy): an address, "/", a prefix length."""
    address, slash, prefix = text.partition("/")
    if not slash or not re.fullmatch(r"[0-9]{1,3}", prefix) or _ip(address) is None:
        return None
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _cidrs(raw: Any, name: str, file: bool) -> tuple[str, ...]:
    out = []
    for entry_name, entry in _strings(raw, name, file):
        net = _cidr(entry)
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
        net = _cidr(entry)
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
    if _ip(text) is None:
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
        ip = _ip(text)  # upstream appends the default port to a bare IP (AppendPortIfNeeded)
        if ip is not None:
            text = f"{text}:{default_port}" if ip.version == 4 else f"[{text}]:{default_port}"
        parts = _split_host_port(text)
        if parts is None:
            raise ConfigError(f"{name}: {text!r} must be IP:port")
        host, port = parts
        if _ip(host) is None:
            raise ConfigError(f"{name}: {host!r} must be a valid IP")
        if not re.fullmatch(r"[+-]?[0-9]+", port) or not 1 <= int(port) <= 65535:
            raise ConfigError(f"{name}: {port!r} must be a valid port (1-65535)")
        return text

    return convert


def _status_address(raw: Any, name: str, file: bool) -> str | _Default:
    """IP:port (no default port: the metrics server has it); empty disables /status."""
    text = _want_str(raw, name)
    if text and _ip(text) is not None:
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
class _Setting:
    key: str  # a ProxyConfig field, or "mode"
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


_SETTINGS = (
    _Setting("config", None, ("--config",), _str_or_none,
             "the path to a KubeProxyConfiguration file (YAML or JSON); flags given override it",
             "FILE"),
    _Setting("kubeconfig", ("clientConnection", "kubeconfig"), ("--kubeconfig",), _str_or_none,
             "path to a kubeconfig file (default: in-cluster service account)", "FILE"),
    _Setting("master", None, ("--master",), _str_or_none,
             "the address of the API server (overrides the kubeconfig's)", "URL"),
    _Setting("hostname_override", ("hostnameOverride",), ("--hostname-override",), _hostname,
             "the name of this node (default: the hostname)", "NAME", flag_wins_upstream=True),
    _Setting("bind_address", ("bindAddress",), ("--bind-address",), _bind_address,
             "this node's primary IP as kube-proxy understands it (default 0.0.0.0)", "IP"),
    _Setting("healthz_bind_address", ("healthzBindAddress",), ("--healthz-bind-address",),
             _host_port(HEALTHZ_PORT),
             f"IP:port of the health server (default 0.0.0.0:{HEALTHZ_PORT}; empty disables)",
             "IP:PORT"),
    _Setting("metrics_bind_address", ("metricsBindAddress",), ("--metrics-bind-address",),
             _host_port(METRICS_PORT),
             f"IP:port of the metrics server (default 127.0.0.1:{METRICS_PORT}; empty disables)",
             "IP:PORT"),
    _Setting("cluster_cidr", ("clusterCIDR",), ("--cluster-cidr",), _cluster_cidrs,
             "the pods' CIDR (a dual-stack pair may be comma-separated)", "CIDR"),
    _Setting("detect_local_mode", ("detectLocalMode",), ("--detect-local-mode",),
             _one_of(DETECT_LOCAL_MODES, "ClusterCIDR"),
             f"how to tell traffic from local pods: {', '.join(DETECT_LOCAL_MODES)}", "MODE"),
    _Setting("bridge_interface", ("detectLocal", "bridgeInterface"), ("--pod-bridge-interface",),
             _str_or_none, "the pods' bridge (with --detect-local-mode=BridgeInterface)", "NAME"),
    _Setting("interface_name_prefix", ("detectLocal", "interfaceNamePrefix"),
             ("--pod-interface-name-prefix",), _str_or_none,
             "the prefix of pod interfaces (with --detect-local-mode=InterfaceNamePrefix)",
             "PREFIX"),
    _Setting("node_port_addresses", ("nodePortAddresses",), ("--nodeport-addresses",),
             _node_port_addresses,
             "comma-separated CIDRs of the node addresses that take NodePorts, or 'primary' "
             "(default: every local address)", "CIDRS", kind="list"),
    _Setting("mode", ("mode",), ("--proxy-mode",), _mode, "must be ipvs (or empty)", "MODE"),
    _Setting("scheduler", ("ipvs", "scheduler"), ("--ipvs-scheduler",),
             _one_of(SCHEDULERS, "rr"), "the IPVS scheduler (default rr)", "NAME"),
    _Setting("sync_period", ("ipvs", "syncPeriod"), ("--ipvs-sync-period",),
             _duration_zero_is_default,
             "how often a full reconcile runs (default 30s; must be greater than 0)", "DURATION"),
    _Setting("min_sync_period", ("ipvs", "minSyncPeriod"), ("--ipvs-min-sync-period",), _duration,
             "the least time between two syncs of changes (default 1s; with --config, "
             "ipvs.minSyncPeriod, whose default is 0)", "DURATION"),
    _Setting("exclude_cidrs", ("ipvs", "excludeCIDRs"), ("--ipvs-exclude-cidrs",), _cidrs,
             "comma-separated CIDRs whose virtual servers ipvsproxy never touches", "CIDRS",
             kind="list"),
    _Setting("strict_arp", ("ipvs", "strictARP"), ("--ipvs-strict-arp",), _bool,
             "set arp_ignore=1 and arp_announce=2", "BOOL", kind="bool"),
    _Setting("tcp_timeout", ("ipvs", "tcpTimeout"), ("--ipvs-tcp-timeout",), _duration,
             "the IPVS timeout of idle TCP connections (0 leaves it)", "DURATION"),
    _Setting("tcp_fin_timeout", ("ipvs", "tcpFinTimeout"), ("--ipvs-tcpfin-timeout",), _duration,
             "the IPVS timeout of TCP connections after a FIN (0 leaves it)", "DURATION"),
    _Setting("udp_timeout", ("ipvs", "udpTimeout"), ("--ipvs-udp-timeout",), _duration,
             "the IPVS timeout of UDP flows (0 leaves it)", "DURATION"),
    _Setting("masquerade_all", ("iptables", "masqueradeAll"), ("--masquerade-all",), _bool,
             "SNAT all traffic to Service IPs", "BOOL", kind="bool"),
    _Setting("masquerade_bit", ("iptables", "masqueradeBit"), ("--iptables-masquerade-bit",),
             _masquerade_bit, "the fwmark bit that marks packets for SNAT, 0-31 (default 14)",
             "BIT"),
    _Setting("conntrack_max_per_core", ("conntrack", "maxPerCore"), ("--conntrack-max-per-core",),
             _nonnegative_int32,
             "conntrack entries per CPU core (default 32768; 0 leaves the limit)", "N"),
    _Setting("conntrack_min", ("conntrack", "min"), ("--conntrack-min",), _nonnegative_int32,
             "the least conntrack entries, whatever the per-core value (default 131072)", "N"),
    _Setting("conntrack_tcp_established_timeout", ("conntrack", "tcpEstablishedTimeout"),
             ("--conntrack-tcp-timeout-established",), _duration,
             "idle timeout of established TCP connections (default 24h0m0s; 0 leaves it)",
             "DURATION"),
    _Setting("conntrack_tcp_close_wait_timeout", ("conntrack", "tcpCloseWaitTimeout"),
             ("--conntrack-tcp-timeout-close-wait",), _duration,
             "NAT timeout of TCP connections in CLOSE_WAIT (default 1h0m0s)", "DURATION"),
    _Setting("conntrack_udp_timeout", ("conntrack", "udpTimeout"), ("--conntrack-udp-timeout",),
             _duration, "idle timeout of unreplied UDP flows (0 leaves it)", "DURATION"),
    _Setting("conntrack_udp_stream_timeout", ("conntrack", "udpStreamTimeout"),
             ("--conntrack-udp-timeout-stream",), _duration,
             "idle timeout of assured UDP flows (0 leaves it)", "DURATION"),
    _Setting("conntrack_tcp_be_liberal", ("conntrack", "tcpBeLiberal"),
             ("--conntrack-tcp-be-liberal",), _bool,
             "set nf_conntrack_tcp_be_liberal=1 (out-of-window TCP packets are not INVALID)",
             "BOOL", kind="bool"),
    _Setting("oom_score_adj", ("oomScoreAdj",), ("--oom-score-adj",), _oom_score_adj,
             "the daemon's oom_score_adj, -1000 to 1000 (default -999)", "N"),
    _Setting("bind_address_hard_fail", ("bindAddressHardFail",), ("--bind-address-hard-fail",),
             _bool, "exit when the health or metrics server cannot bind its port "
             "(default: log it and retry every 5s)", "BOOL", kind="bool"),
    _Setting("log_format", ("logging", "format"), ("--log-format", "--logging-format"),
             _one_of(LOG_FORMATS, "text"), "text or json (default text)", "FORMAT",
             flag_wins_upstream=True),
    _Setting("verbosity", ("logging", "verbosity"), ("--v", "-v"), _verbosity,
             f"log verbosity, 0-{MAX_VERBOSITY} (default 0)", "N", flag_wins_upstream=True),
    _Setting("service_proxy_name", None, ("--service-proxy-name",), _label_value,
             "serve only Services labelled service.kubernetes.io/service-proxy-name=NAME "
             "(default: only Services without that label)", "NAME"),
    _Setting("state_path", None, ("--state-file",), _state_path,
             "where ipvsproxy keeps what it programmed "
             f"(default {ProxyConfig.state_path})", "FILE"),
    _Setting("status_bind_address", None, ("--status-bind-address",), _status_address,
             "IP:port of /status (the Services' virtual servers and their Pods; default: next "
             "to /metrics; empty disables)", "IP:PORT"),
    _Setting("watch_timeout", None, ("--watch-timeout",), _duration,
             "how long one watch request lasts before it is renewed (default 5m0s)", "DURATION"),
    _Setting("ipvs_drain_timeout", None, ("--ipvs-drain-timeout",), _duration,
             "how long a removed TCP real server drains at weight 0 before it is deleted with "
             "connections left (default 15m0s; 0: until it has none, as upstream)", "DURATION"),
)  # fmt: skip
_BY_KEY = {s.key: s for s in _SETTINGS}


# -- what upstream defines and ipvsproxy does not use --------------------------------------------


@dataclass(frozen=True)
class _Ignored:
    """An upstream field ipvsproxy ignores. It warns when set to something but its zero value or
    ``default``; ``kind`` says how to compare: "ptr" (only null and the default are unset: 0 is a
    value), "duration", "nested" (set if any leaf is), or "" (plain)."""

    default: Any = None
    kind: str = ""


_Node = dict[str, Any]  # field name -> _Setting | _Ignored | nested _Node


def _schema() -> _Node:
    tree: _Node = {
        "apiVersion": None,
        "kind": None,
        "featureGates": _Ignored({}),
        "clientConnection": {
            "acceptContentTypes": _Ignored(""),
            "contentType": _Ignored("application/vnd.kubernetes.protobuf"),
            "qps": _Ignored(5),
            "burst": _Ignored(10),
        },
        "logging": {
            "flushFrequency": _Ignored("5s", "duration"),
            "vmodule": _Ignored([]),
            "options": _Ignored(None, "nested"),
        },
        "enableProfiling": _Ignored(False),
        "showHiddenMetricsForVersion": _Ignored(""),
        "iptables": {
            "localhostNodePorts": _Ignored(True, "ptr"),
            "snatNodeInternalIP": _Ignored(False, "ptr"),
            "syncPeriod": _Ignored("30s", "duration"),
            "minSyncPeriod": _Ignored("1s", "duration"),
        },
        "ipvs": {},
        "nftables": {
            "masqueradeBit": _Ignored(14, "ptr"),
            "masqueradeAll": _Ignored(False),
            "syncPeriod": _Ignored("30s", "duration"),
            "minSyncPeriod": _Ignored("1s", "duration"),
        },
        "winkernel": {
            "networkName": _Ignored(""),
            "sourceVip": _Ignored(""),
            "enableDSR": _Ignored(False),
            "rootHnsEndpointName": _Ignored(""),
            "forwardHealthCheckVip": _Ignored(False),
        },
        "detectLocal": {},
        "conntrack": {"max": _Ignored(0)},  # removed upstream
        "configSyncPeriod": _Ignored("15m", "duration"),
        "portRange": _Ignored(""),
        "windowsRunAsService": _Ignored(False),
        # Removed upstream; older kubeadm ConfigMaps still carry them.
        "udpIdleTimeout": _Ignored("250ms", "duration"),
        "resourceContainer": _Ignored("/kube-proxy"),
    }
    for s in _SETTINGS:
        if s.path is None:
            continue
        node = tree
        for part in s.path[:-1]:
            node = node.setdefault(part, {})
        node[s.path[-1]] = s
    return tree


_SCHEMA = _schema()


def _zero_duration_or(value: Any, default: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ns = _go_duration_ns(value, "")
        return ns == 0 or (isinstance(default, str) and ns == _go_duration_ns(default, ""))
    except ConfigError:
        return False


def _is_unset(value: Any, spec: _Ignored) -> bool:
    if value is None:
        return True
    if spec.kind == "ptr":
        return _same(value, spec.default)
    if spec.kind == "nested" and isinstance(value, Mapping):
        return all(_is_unset(v, _Ignored(None, "nested")) for v in value.values())
    if isinstance(value, (Mapping, list)):
        return not value or value == spec.default
    if spec.kind == "duration":
        if isinstance(value, int) and not isinstance(value, bool):  # logging.flushFrequency: ns
            return value == 0 or value == _go_duration_ns(str(spec.default), "")
        return _zero_duration_or(value, spec.default)
    return value in ("", "0", 0) or _same(value, spec.default)


def _same(a: Any, b: Any) -> bool:
    """Equal, and a bool only equals a bool (YAML's true is not 1)."""
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


def _walk(
    data: Mapping[Any, Any], node: _Node, prefix: str, warnings: list[str]
) -> Iterator[tuple[_Setting, Any]]:
    """The file's values for settings (nulls left out); warnings for fields ipvsproxy ignores."""
    for raw_key, value in data.items():
        key = str(raw_key)
        name = f"{prefix}{key}"
        spec = node.get(key)
        if not isinstance(raw_key, str) or key not in node:
            hint = [k for k in node if k.lower() == key.lower()]
            did_you_mean = f"; did you mean {prefix}{hint[0]}?" if hint else ""
            warnings.append(f"unknown field {name} (ignored{did_you_mean})")
        elif isinstance(spec, dict):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{name}: must be a mapping (got {value!r})")
            yield from _walk(value, spec, f"{name}.", warnings)
        elif isinstance(spec, _Setting):
            if value is not None:
                yield spec, value
        elif isinstance(spec, _Ignored) and not _is_unset(value, spec):
            warnings.append(f"{name} is not used by ipvsproxy (ignored)")


# -- flags -------------------------------------------------------------------------------------

# Upstream kube-proxy flags ipvsproxy accepts and ignores (with a warning), and those it refuses.
_IGNORED_FLAGS = (
    "--feature-gates", "--kube-api-content-type", "--kube-api-burst", "--kube-api-qps",
    "--show-hidden-metrics-for-version", "--iptables-sync-period", "--iptables-min-sync-period",
    "--config-sync-period", "--healthz-port", "--metrics-port", "--vmodule",
    "--log-flush-frequency", "--log-json-info-buffer-size", "--log-text-info-buffer-size",
)  # fmt: skip
_IGNORED_BOOL_FLAGS = (
    "--profiling", "--iptables-localhost-nodeports", "--log-json-split-stream",
    "--log-text-split-stream",
)  # fmt: skip
_REFUSED_FLAGS = {
    "--cleanup": "run `ipvsproxy cleanup` instead",
    "--init-only": "not supported by ipvsproxy",
    "--write-config-to": "not supported by ipvsproxy",
}


def _dest(flag: str) -> str:
    return "_upstream_" + flag.lstrip("-").replace("-", "_")


def add_flags(parser: argparse.ArgumentParser) -> None:
    """kube-proxy's flags (and ipvsproxy's own). Every default is None: only a flag that is given
    overrides the file."""
    group = parser.add_argument_group("kube-proxy flags (given ones override --config)")
    for s in _SETTINGS:
        if s.kind == "bool":
            group.add_argument(
                *s.flags, dest=s.key, nargs="?", const="true", default=None, metavar=s.metavar,
                help=s.help,
            )  # fmt: skip
        else:
            group.add_argument(
                *s.flags, dest=s.key, default=None, metavar=s.metavar, help=s.help,
                action="append" if s.kind == "list" else "store",
            )  # fmt: skip
    for flag in _IGNORED_FLAGS:
        parser.add_argument(flag, dest=_dest(flag), default=None, help=argparse.SUPPRESS)
    for flag in (*_IGNORED_BOOL_FLAGS, *_REFUSED_FLAGS):
        parser.add_argument(
            flag, dest=_dest(flag), nargs="?", const="true", default=None, help=argparse.SUPPRESS
        )


class _FlagParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"command line: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ConfigError(f"command line: {message or f'exit {status}'}")


def _parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    parser = _FlagParser(prog="ipvsproxy", add_help=False, allow_abbrev=False)
    add_flags(parser)
    return parser.parse_args(list(argv))


# -- putting it together -------------------------------------------------------------------------


def build(file_data: Mapping[str, Any] | None, argv: Sequence[str]) -> ProxyConfig:
    """The configuration from a parsed KubeProxyConfiguration (None: no file) and the flags in
    ``argv`` (``--config`` there is not read: that is ``load``'s job). Pure."""
    warnings: list[str] = []
    problems: list[str] = []
    from_file: dict[str, Any] = {}
    if file_data is not None:
        if not isinstance(file_data, Mapping):
            raise ConfigError(f"the configuration file must contain a {KIND} mapping")
        api_version, kind = file_data.get("apiVersion"), file_data.get("kind")
        if api_version != API_VERSION:
            problems.append(f"apiVersion: must be {API_VERSION} (got {api_version!r})")
        if kind != KIND:
            problems.append(f"kind: must be {KIND} (got {kind!r})")
        if problems:
            raise ConfigError(*problems)
        from_file = {s.key: value for s, value in _walk(file_data, _SCHEMA, "", warnings)}
        # Upstream defaults ipvs.syncPeriod but not ipvs.minSyncPeriod: a file without it means 0.
        from_file.setdefault("min_sync_period", 0)

    ns = _parse_flags(argv)
    for flag, why in _REFUSED_FLAGS.items():
        if getattr(ns, _dest(flag)) is not None:
            problems.append(f"{flag}: {why}")
    for flag in (*_IGNORED_FLAGS, *_IGNORED_BOOL_FLAGS):
        if getattr(ns, _dest(flag)) is not None:
            warnings.append(f"{flag} is not used by ipvsproxy (ignored)")
    from_flags = {s.key: getattr(ns, s.key) for s in _SETTINGS if getattr(ns, s.key) is not None}
    # An empty --bind-address or --hostname-override is no override (upstream's flag types).
    for key in ("bind_address", "hostname_override"):
        if from_flags.get(key) == "":
            del from_flags[key]

    values: dict[str, Any] = {}
    names: dict[str, str] = {}  # key -> the field or flag its value came from
    failed: set[str] = set()  # keys whose value is already a problem
    for s in _SETTINGS:
        if s.key in from_flags:
            raw, name, file = from_flags[s.key], s.flags[0], False
        elif s.key in from_file:
            raw, name, file = from_file[s.key], s.file_name, True
        else:
            continue
        names[s.key] = name
        try:
            value = s.convert(raw, name, file)
        except ConfigError as exc:
            problems.extend(exc.problems)
            failed.add(s.key)
            continue
        if not file and file_data is not None and s.path and not s.flag_wins_upstream:
            warnings.extend(_override_warning(s, from_file.get(s.key), value))
        if value is not DEFAULT:
            values[s.key] = value
    values.pop("config", None)
    values.pop("mode", None)

    _check_together(values, names, failed, problems, warnings)
    if problems:
        raise ConfigError(*problems)
    return ProxyConfig(**values, warnings=tuple(warnings))


def _override_warning(s: _Setting, file_raw: Any, flag_value: Any) -> list[str]:
    """Upstream ignores this flag when --config is given: say so where the value differs from
    what the file (or, where the file is silent, upstream's default) gives."""
    default = getattr(ProxyConfig(), s.key, "")
    try:
        file_value = default if file_raw is None else s.convert(file_raw, s.file_name, True)
    except ConfigError:
        file_value = None
    if (default if file_value is DEFAULT else file_value) == (
        default if flag_value is DEFAULT else flag_value
    ):
        return []
    return [
        f"{s.flags[0]} overrides {s.file_name} from the config file "
        f"(upstream kube-proxy ignores {s.flags[0]} when --config is given)"
    ]


def _check_together(
    values: dict[str, Any],
    names: dict[str, str],
    failed: set[str],
    problems: list[str],
    warnings: list[str],
) -> None:
    """The checks that take more than one field; fills in defaults that depend on others."""
    default = ProxyConfig()

    def name(key: str, like: str = "") -> str:
        """Where the value came from; for one not given, named as ``like``'s source spells it."""
        if key in names:
            return names[key]
        setting = _BY_KEY[key]
        if names.get(like, "").startswith("-") or not setting.file_name:
            return setting.flags[0]
        return setting.file_name

    sync = values.get("sync_period", default.sync_period)
    min_sync = values.get("min_sync_period", default.min_sync_period)
    periods_parsed = not failed & {"sync_period", "min_sync_period"}
    if periods_parsed and "sync_period" in values and sync <= 0:
        problems.append(f"{name('sync_period')}: must be greater than 0")
    elif periods_parsed and min_sync > sync:
        problems.append(
            f"{name('sync_period', 'min_sync_period')}: must be greater than or equal to "
            f"{name('min_sync_period', 'sync_period')} "
            f"({sync:g}s < {min_sync:g}s)"
        )

    mode = values.get("detect_local_mode", default.detect_local_mode)
    for needed_mode, key in (
        ("BridgeInterface", "bridge_interface"),
        ("InterfaceNamePrefix", "interface_name_prefix"),
    ):
        if mode == needed_mode and not values.get(key):
            problems.append(
                f"{name(key, 'detect_local_mode')}: must not be empty when "
                f"{name('detect_local_mode')} is {mode}"
            )

    cidrs: tuple[str, ...] = values.pop("cluster_cidr", ())
    if cidrs:
        values["cluster_cidr"] = _cluster_cidr(
            cidrs, name("cluster_cidr"), mode == "ClusterCIDR", problems, warnings
        )

    bind = _ip(values.get("bind_address", default.bind_address))
    if bind is not None and bind.version == 6 and bind.ipv4_mapped is None:
        values.setdefault("healthz_bind_address", f"[::]:{HEALTHZ_PORT}")
        values.setdefault("metrics_bind_address", f"[::1]:{METRICS_PORT}")


def _cluster_cidr(
    cidrs: tuple[str, ...], name: str, validate: bool, problems: list[str], warnings: list[str]
) -> str | None:
    """The first IPv4 CIDR. Upstream validates clusterCIDR only in detectLocalMode ClusterCIDR:
    one CIDR, or a dual-stack pair."""
    nets = [_cidr(c) for c in cidrs]
    if validate:
        if len(cidrs) > 2:
            problems.append(
                f"{name}: must be either a single CIDR or a dual-stack pair of CIDRs "
                f"(e.g. 10.100.0.0/16,fde4:8dba:82e1::/48; got {len(cidrs)})"
            )
            return None
        bad = [c for c, n in zip(cidrs, nets, strict=True) if n is None]
        if bad:
            problems.append(
                f"{name}: {bad[0]!r} must be a valid CIDR block "
                "(e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"
            )
            return None
        if len(nets) == 2 and {n.version for n in nets if n is not None} != {4, 6}:
            problems.append(
                f"{name}: a pair of CIDRs must be dual-stack, one IPv4 and one IPv6 (got "
                f"{','.join(cidrs)})"
            )
            return None
    first_v4 = None
    for c, n in zip(cidrs, nets, strict=True):
        if n is not None and n.version == 4 and first_v4 is None:
            first_v4 = str(n)
        elif n is not None and n.version == 6 and validate:
            warnings.append(f"{name}: the IPv6 CIDR {c} is not used by ipvsproxy (IPv4 only)")
    return first_v4


def load(argv: Sequence[str]) -> ProxyConfig:
    """The configuration from the command line: reads the ``--config`` file, if any, then
    ``build``. The only function here that does I/O."""
    path = _parse_flags(argv).config
    data = None
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"--config: {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"--config: cannot read {path}: {exc}") from None
        data = parse_config_text(text, path)
    return build(data, argv)
