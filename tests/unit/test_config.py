"""ipvsproxy.config: a kube-proxy KubeProxyConfiguration file plus flags, as upstream reads them."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ipvsproxy import config
from ipvsproxy.config import (
    ConfigError,
    ProxyConfig,
    add_flags,
    build,
    load,
    parse_config_text,
    parse_duration,
)
from ipvsproxy.config.settings import SETTINGS

HEAD = {"apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration"}

# config.conf of the kube-proxy ConfigMap as kubeadm writes it (v1.29-v1.31), switched to IPVS
# mode with strictARP, as MetalLB's docs tell operators to. kubeadm writes every field, mostly
# empty, zero or null: those take upstream's defaults and are no cause for a warning.
KUBEADM_CONFIG_CONF = """\
apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: 14
  minSyncPeriod: 1s
  syncPeriod: 30s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: true
  syncPeriod: 30s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ipvs
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
"""


def kubeadm() -> dict[str, Any]:
    return parse_config_text(KUBEADM_CONFIG_CONF, "config.conf")


def conf(**fields: Any) -> dict[str, Any]:
    """A minimal file: apiVersion, kind and ``fields``."""
    return {**HEAD, **fields}


# -- defaults ----------------------------------------------------------------------------------


def test_no_file_and_no_flags_give_upstreams_defaults() -> None:
    cfg = build(None, [])
    assert cfg == ProxyConfig()
    assert cfg.bind_address == "0.0.0.0"
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.metrics_bind_address == "127.0.0.1:10249"
    assert cfg.scheduler == "rr"
    assert (cfg.sync_period, cfg.min_sync_period) == (30.0, 1.0)
    assert cfg.detect_local_mode == "ClusterCIDR"
    assert cfg.cluster_cidr is None
    assert cfg.node_port_addresses == ()
    assert cfg.masquerade_bit == 14
    assert (cfg.conntrack_max_per_core, cfg.conntrack_min) == (32768, 131072)
    assert cfg.conntrack_tcp_established_timeout == 86400.0
    assert cfg.conntrack_tcp_close_wait_timeout == 3600.0
    assert cfg.state_path == "/var/lib/ipvsproxy/state.json"
    assert (cfg.log_format, cfg.verbosity) == ("text", 0)
    assert cfg.warnings == ()


def test_the_config_is_frozen() -> None:
    cfg = build(None, [])
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.scheduler = "lc"  # type: ignore[misc]


# -- kubeadm's ConfigMap -----------------------------------------------------------------------


def test_kubeadm_configmap_loads_with_upstreams_defaults_for_empty_fields() -> None:
    cfg = build(kubeadm(), [])
    assert cfg.kubeconfig == "/var/lib/kube-proxy/kubeconfig.conf"
    assert cfg.bind_address == "0.0.0.0"
    assert cfg.cluster_cidr == "10.244.0.0/16"
    assert cfg.strict_arp is True
    # Empty means the default, as upstream's v1alpha1 defaulting has it:
    assert cfg.scheduler == "rr"
    assert cfg.healthz_bind_address == "0.0.0.0:10256"
    assert cfg.metrics_bind_address == "127.0.0.1:10249"
    assert cfg.detect_local_mode == "ClusterCIDR"
    assert cfg.node_port_addresses == ()
    assert cfg.exclude_cidrs == ()
    # Null pointers take their defaults; the explicit 0s timeouts stay 0 (leave the kernel's).
    assert cfg.masquerade_bit == 14
    assert (cfg.conntrack_max_per_core, cfg.conntrack_min) == (32768, 131072)
    assert cfg.conntrack_tcp_established_timeout == 86400.0
    assert cfg.conntrack_tcp_close_wait_timeout == 3600.0
    assert (cfg.conntrack_udp_timeout, cfg.conntrack_udp_stream_timeout) == (0.0, 0.0)
    assert (cfg.tcp_timeout, cfg.tcp_fin_timeout, cfg.udp_timeout) == (0.0, 0.0, 0.0)
    # Upstream defaults ipvs.syncPeriod but not ipvs.minSyncPeriod: "0s" stays 0.
    assert (cfg.sync_period, cfg.min_sync_period) == (30.0, 0.0)
    assert cfg.masquerade_all is False
    assert cfg.hostname_override is None
    assert (cfg.log_format, cfg.verbosity) == ("text", 0)
    # Every unsupported field is at its zero value or upstream's default: nothing to warn about.
    assert cfg.warnings == ()


def test_kubeadm_configmap_as_json_reads_the_same() -> None:
    as_json = json.dumps(kubeadm(), indent=2)
    assert build(parse_config_text(as_json, "config.json"), []) == build(kubeadm(), [])


def test_zero_sync_period_in_the_file_is_the_default() -> None:
    # Older kubeadm versions write "syncPeriod: 0s"; upstream defaults it to 30s.
    data = kubeadm()
    data["ipvs"]["syncPeriod"] = "0s"
    assert build(data, []).sync_period == 30.0


def test_iptables_timing_fields_warn_only_when_set_to_something_but_the_default() -> None:
    data = kubeadm()
    data["iptables"]["syncPeriod"] = "10s"
    data["iptables"]["minSyncPeriod"] = "1s"  # upstream's default: no warning
    assert build(data, []).warnings == ("iptables.syncPeriod is not used by ipvsproxy (ignored)",)


def test_unsupported_fields_warn_once_each() -> None:
    data = kubeadm()
    data["featureGates"] = {"SomeGate": True}
    data["iptables"]["minSyncPeriod"] = "5s"
    data["iptables"]["localhostNodePorts"] = False
    data["nftables"]["masqueradeAll"] = True
    data["winkernel"]["enableDSR"] = True
    data["configSyncPeriod"] = "1m"
    data["portRange"] = "30000-32767"
    data["showHiddenMetricsForVersion"] = "1.29"
    data["clientConnection"]["qps"] = 50
    data["udpIdleTimeout"] = "1s"  # removed upstream, still in old ConfigMaps
    cfg = build(data, [])
    expected = {
        f"{name} is not used by ipvsproxy (ignored)"
        for name in (
            "featureGates",
            "iptables.minSyncPeriod",
            "iptables.localhostNodePorts",
            "nftables.masqueradeAll",
            "winkernel.enableDSR",
            "configSyncPeriod",
            "portRange",
            "showHiddenMetricsForVersion",
            "clientConnection.qps",
            "udpIdleTimeout",
        )
    }
    assert set(cfg.warnings) == expected
    assert len(cfg.warnings) == len(expected)
    # Nothing it ignores changes what it does use.
    assert dataclasses.replace(cfg, warnings=()) == build(kubeadm(), [])


def test_upstream_defaults_of_unsupported_fields_are_no_warning() -> None:
    data = conf(
        oomScoreAdj=-999,
        configSyncPeriod="15m0s",
        iptables={"localhostNodePorts": True, "syncPeriod": "30s", "minSyncPeriod": "1s"},
        nftables={"masqueradeBit": 14, "syncPeriod": "30s"},
        clientConnection={"contentType": "application/vnd.kubernetes.protobuf", "qps": 5},
        logging={"flushFrequency": "5s", "options": {"json": {"splitStream": False}}},
        featureGates={},
    )
    assert build(data, []).warnings == ()


def test_unknown_fields_are_warnings_with_a_hint_for_a_case_slip() -> None:
    data = conf(fooBar=1, ipvs={"syncperiod": "5s", "scheduler": "wrr"})
    cfg = build(data, [])
    assert cfg.scheduler == "wrr"
    assert cfg.sync_period == 30.0  # the misspelt field is not read
    assert cfg.warnings == (
        "unknown field fooBar (ignored)",
        "unknown field ipvs.syncperiod (ignored; did you mean ipvs.syncPeriod?)",
    )


# -- flags over the file -----------------------------------------------------------------------


def test_flags_override_the_file_and_flags_not_given_leave_it() -> None:
    data = kubeadm()
    data["ipvs"]["scheduler"] = "wrr"
    data["ipvs"]["syncPeriod"] = "45s"
    cfg = build(data, ["--config=/etc/kube-proxy/config.conf", "--ipvs-scheduler", "lc"])
    assert cfg.scheduler == "lc"
    assert cfg.sync_period == 45.0  # no flag: the file's value
    assert cfg.strict_arp is True
    assert cfg.cluster_cidr == "10.244.0.0/16"
    # Upstream ignores --ipvs-scheduler once --config is given; say that it is used here.
    assert cfg.warnings == (
        "--ipvs-scheduler overrides ipvs.scheduler from the config file "
        "(upstream kube-proxy ignores --ipvs-scheduler when --config is given)",
    )


def test_a_flag_giving_the_files_value_warns_about_nothing() -> None:
    data = conf(ipvs={"scheduler": "wrr"})
    assert build(data, ["--ipvs-scheduler=wrr"]).warnings == ()


def test_flags_upstream_also_lets_win_do_not_warn() -> None:
    # kubeadm's DaemonSet passes --hostname-override=$(NODE_NAME) next to --config; upstream
    # applies it, and its logging flags, over the file.
    data = conf(hostnameOverride="ignored", logging={"verbosity": 1, "format": "text"})
    cfg = build(data, ["--hostname-override=Node-1", "-v=4", "--logging-format=json"])
    assert cfg.hostname_override == "node-1"  # lowercased, as upstream
    assert (cfg.verbosity, cfg.log_format) == (4, "json")
    assert cfg.warnings == ()


def test_bool_flags_alone_or_with_a_value() -> None:
    data = conf(ipvs={"strictARP": True}, iptables={"masqueradeAll": False})
    cfg = build(data, ["--ipvs-strict-arp=false", "--masquerade-all"])
    assert (cfg.strict_arp, cfg.masquerade_all) == (False, True)


def test_list_flags_split_on_commas_and_repeat() -> None:
    argv = ["--nodeport-addresses=10.0.0.0/8,192.168.1.7/24", "--nodeport-addresses", "1.2.3.0/24"]
    cfg = build(None, [*argv, "--ipvs-exclude-cidrs=10.96.0.0/12"])
    assert cfg.node_port_addresses == ("10.0.0.0/8", "192.168.1.0/24", "1.2.3.0/24")
    assert cfg.exclude_cidrs == ("10.96.0.0/12",)
    assert build(None, ["--nodeport-addresses=primary"]).node_port_addresses == ("primary",)


@pytest.mark.parametrize("argv", [["-v", "3"], ["-v=3"], ["-v3"], ["--v=3"], ["--v", "3"]])
def test_verbosity_flag_spellings(argv: list[str]) -> None:
    assert build(None, argv).verbosity == 3


def test_every_flag_maps_to_its_field() -> None:
    argv = [
        "--kubeconfig=/k", "--master=https://10.0.0.1:6443", "--hostname-override=n1",
        "--bind-address=192.168.56.11", "--healthz-bind-address=127.0.0.1:1234",
        "--metrics-bind-address=0.0.0.0:9999", "--cluster-cidr=10.244.0.0/16",
        "--detect-local-mode=InterfaceNamePrefix", "--pod-bridge-interface=cni0",
        "--pod-interface-name-prefix=veth", "--proxy-mode=ipvs", "--ipvs-scheduler=sh",
        "--ipvs-sync-period=1m", "--ipvs-min-sync-period=500ms", "--ipvs-strict-arp",
        "--ipvs-tcp-timeout=15m", "--ipvs-tcpfin-timeout=2m", "--ipvs-udp-timeout=5m",
        "--masquerade-all=true", "--iptables-masquerade-bit=13", "--conntrack-max-per-core=0",
        "--conntrack-min=1", "--conntrack-tcp-timeout-established=1h",
        "--conntrack-tcp-timeout-close-wait=30s", "--conntrack-udp-timeout=30s",
        "--conntrack-udp-timeout-stream=2m", "--log-format=json", "--v=2",
        "--service-proxy-name=ipvsproxy", "--state-file=/run/ipvsproxy.json",
        "--ipvs-drain-timeout=1m30s",
    ]  # fmt: skip
    assert build(None, argv) == ProxyConfig(
        kubeconfig="/k",
        master="https://10.0.0.1:6443",
        hostname_override="n1",
        bind_address="192.168.56.11",
        healthz_bind_address="127.0.0.1:1234",
        metrics_bind_address="0.0.0.0:9999",
        cluster_cidr="10.244.0.0/16",
        detect_local_mode="InterfaceNamePrefix",
        bridge_interface="cni0",
        interface_name_prefix="veth",
        scheduler="sh",
        sync_period=60.0,
        min_sync_period=0.5,
        strict_arp=True,
        tcp_timeout=900.0,
        tcp_fin_timeout=120.0,
        udp_timeout=300.0,
        masquerade_all=True,
        masquerade_bit=13,
        conntrack_max_per_core=0,
        conntrack_min=1,
        conntrack_tcp_established_timeout=3600.0,
        conntrack_tcp_close_wait_timeout=30.0,
        conntrack_udp_timeout=30.0,
        conntrack_udp_stream_timeout=120.0,
        log_format="json",
        verbosity=2,
        service_proxy_name="ipvsproxy",
        state_path="/run/ipvsproxy.json",
        ipvs_drain_timeout=90.0,
    )


def test_every_field_but_warnings_is_one_setting() -> None:
    keys = [s.key for s in SETTINGS]
    assert len(keys) == len(set(keys))
    fields = {f.name for f in dataclasses.fields(ProxyConfig)}
    # cluster_cidr6: clusterCIDR's IPv6 half; config_*: the --config file as read
    derived = {"warnings", "cluster_cidr6", "config_file", "config_content"}
    assert set(keys) == fields - derived | {"config", "mode"}


def test_upstream_only_flags_are_accepted_with_a_warning() -> None:
    cfg = build(None, ["--config-sync-period=1m", "--profiling", "--feature-gates=A=true"])
    assert cfg.warnings == (
        "--feature-gates is not used by ipvsproxy (ignored)",
        "--config-sync-period is not used by ipvsproxy (ignored)",
        "--profiling is not used by ipvsproxy (ignored)",
    )
    assert dataclasses.replace(cfg, warnings=()) == ProxyConfig()


# -- values upstream's way ---------------------------------------------------------------------


def test_bind_addresses_take_a_bare_ip_and_get_the_default_port() -> None:
    cfg = build(conf(healthzBindAddress="10.0.0.5", metricsBindAddress="::1"), [])
    assert cfg.healthz_bind_address == "10.0.0.5:10256"
    assert cfg.metrics_bind_address == "[::1]:10249"
    assert build(None, ["--healthz-bind-address=127.0.0.1"]).healthz_bind_address == (
        "127.0.0.1:10256"
    )


def test_an_ipv6_bind_address_makes_the_server_defaults_ipv6() -> None:
    cfg = build(conf(bindAddress="fd00::10"), [])
    assert cfg.healthz_bind_address == "[::]:10256"
    assert cfg.metrics_bind_address == "[::1]:10249"


def test_an_empty_server_address_flag_disables_the_server() -> None:
    cfg = build(kubeadm(), ["--healthz-bind-address=", "--metrics-bind-address="])
    assert (cfg.healthz_bind_address, cfg.metrics_bind_address) == ("", "")


def test_cluster_cidr_keeps_each_family_of_a_dual_stack_pair() -> None:
    cfg = build(conf(clusterCIDR="fd00:10:244::/56,10.244.1.7/16"), [])
    assert (cfg.cluster_cidr, cfg.cluster_cidr6) == ("10.244.0.0/16", "fd00:10:244::/56")
    assert cfg.warnings == ()
    cfg = build(conf(clusterCIDR="fd00:10:244::/56"), [])
    assert (cfg.cluster_cidr, cfg.cluster_cidr6) == (None, "fd00:10:244::/56")


def test_cluster_cidr_is_only_validated_in_cluster_cidr_mode_as_upstream() -> None:
    data = conf(
        clusterCIDR="not-a-cidr",
        detectLocalMode="BridgeInterface",
        detectLocal={"bridgeInterface": "cni0"},
    )
    cfg = build(data, [])
    assert (cfg.detect_local_mode, cfg.bridge_interface) == ("BridgeInterface", "cni0")
    assert cfg.cluster_cidr is None


def test_null_sections_and_null_fields_are_defaults() -> None:
    data = conf(ipvs=None, conntrack={"min": None}, nodePortAddresses=None, mode=None)
    assert build(data, []) == dataclasses.replace(ProxyConfig(), min_sync_period=0.0)


def test_min_sync_period_defaults_to_one_second_only_without_a_file() -> None:
    # Upstream: flags alone copy iptables' 1s default; a file's ipvs.minSyncPeriod has none.
    assert build(None, ["--proxy-mode=ipvs"]).min_sync_period == 1.0
    assert build(conf(mode="ipvs"), []).min_sync_period == 0.0
    assert build(conf(ipvs={"minSyncPeriod": "2s"}), []).min_sync_period == 2.0


def test_numbers_for_durations_are_seconds() -> None:
    cfg = build(conf(ipvs={"syncPeriod": 60, "minSyncPeriod": 0.5, "tcpTimeout": 900}), [])
    assert (cfg.sync_period, cfg.min_sync_period, cfg.tcp_timeout) == (60.0, 0.5, 900.0)


def test_node_port_addresses_primary_from_the_file() -> None:
    assert build(conf(nodePortAddresses=["primary"]), []).node_port_addresses == ("primary",)


# -- invalid configurations --------------------------------------------------------------------

INVALID: list[tuple[str, dict[str, Any] | None, list[str], str]] = [
    # (id, file, flags, a fragment of the message: the field and why)
    ("mode iptables", conf(mode="iptables"), [],
     "mode: ipvsproxy only implements mode ipvs (got 'iptables')"),
    ("flag mode nftables", None, ["--proxy-mode=nftables"],
     "--proxy-mode: ipvsproxy only implements mode ipvs"),
    ("apiVersion", {**HEAD, "apiVersion": "kubeproxy.config.k8s.io/v1beta1"}, [],
     "apiVersion: must be kubeproxy.config.k8s.io/v1alpha1"),
    ("kind", {**HEAD, "kind": "KubeletConfiguration"}, [],
     "kind: must be KubeProxyConfiguration (got 'KubeletConfiguration')"),
    ("no apiVersion", {"kind": "KubeProxyConfiguration"}, [],
     "apiVersion: must be kubeproxy.config.k8s.io/v1alpha1 (got None)"),
    ("clusterCIDR no prefix", conf(clusterCIDR="10.244.0.0"), [],
     "clusterCIDR: '10.244.0.0' must be a valid CIDR block"),
    ("cluster-cidr same family", None, ["--cluster-cidr=10.0.0.0/8,10.1.0.0/16"],
     "--cluster-cidr: a pair of CIDRs must be dual-stack"),
    ("clusterCIDR three", conf(clusterCIDR="10.0.0.0/8,fd00::/64,10.1.0.0/16"), [],
     "clusterCIDR: must be either a single CIDR or a dual-stack pair"),
    ("excludeCIDRs", conf(ipvs={"excludeCIDRs": ["10.0.0.0/8", "nope"]}), [],
     "ipvs.excludeCIDRs[1]: 'nope' must be a valid CIDR"),
    ("exclude flag", None, ["--ipvs-exclude-cidrs=10.0.0.0/33"],
     "--ipvs-exclude-cidrs: '10.0.0.0/33' must be a valid CIDR"),
    ("nodePortAddresses", conf(nodePortAddresses=["300.1.1.0/24"]), [],
     "nodePortAddresses[0]: '300.1.1.0/24' must be a valid CIDR or 'primary'"),
    ("nodePortAddresses bare ip", conf(nodePortAddresses=["10.0.0.1"]), [],
     "nodePortAddresses[0]: '10.0.0.1' must be a valid CIDR"),
    ("primary with cidrs", conf(nodePortAddresses=["10.0.0.0/8", "primary"]), [],
     "nodePortAddresses[1]: can't use both 'primary' and CIDRs"),
    ("negative tcpTimeout", conf(ipvs={"tcpTimeout": "-5s"}), [],
     "ipvs.tcpTimeout: must be greater than or equal to 0 (got '-5s')"),
    ("duration no unit", conf(ipvs={"syncPeriod": "30"}), [],
     "ipvs.syncPeriod: missing unit in duration '30'"),
    ("duration bad unit", None, ["--ipvs-tcp-timeout=5x"],
     "--ipvs-tcp-timeout: unknown unit 'x' in duration '5x'"),
    ("duration not a string", conf(ipvs={"udpTimeout": ["1s"]}), [],
     "ipvs.udpTimeout: must be a duration"),
    ("min over sync", conf(ipvs={"syncPeriod": "10s", "minSyncPeriod": "20s"}), [],
     "ipvs.syncPeriod: must be greater than or equal to ipvs.minSyncPeriod"),
    ("min flag over sync", conf(ipvs={"syncPeriod": "10s"}), ["--ipvs-min-sync-period=1m"],
     "ipvs.syncPeriod: must be greater than or equal to --ipvs-min-sync-period"),
    ("sync period 0", None, ["--ipvs-sync-period=0"],
     "--ipvs-sync-period: must be greater than 0"),
    ("scheduler", conf(ipvs={"scheduler": "random"}), [],
     "ipvs.scheduler: unsupported value 'random'; must be one of rr, wrr"),
    ("scheduler flag", None, ["--ipvs-scheduler=RR"], "--ipvs-scheduler: unsupported value 'RR'"),
    ("bindAddress", conf(bindAddress="10.0.0.1:80"), [],
     "bindAddress: '10.0.0.1:80' is not a valid textual representation of an IP address"),
    ("healthz port", conf(healthzBindAddress="0.0.0.0:70000"), [],
     "healthzBindAddress: '70000' must be a valid port"),
    ("healthz port 0", conf(healthzBindAddress="0.0.0.0:0"), [],
     "healthzBindAddress: '0' must be a valid port"),
    ("metrics host", conf(metricsBindAddress="localhost:10249"), [],
     "metricsBindAddress: 'localhost' must be a valid IP"),
    ("healthz flag", None, ["--healthz-bind-address=::1:10256"],
     "--healthz-bind-address: '::1:10256' must be IP:port"),
    ("masqueradeBit", conf(iptables={"masqueradeBit": 32}), [],
     "iptables.masqueradeBit: must be within the range [0, 31] (got 32)"),
    ("masquerade bit flag", None, ["--iptables-masquerade-bit=-1"],
     "--iptables-masquerade-bit: must be within the range [0, 31]"),
    ("masqueradeBit string", conf(iptables={"masqueradeBit": "14"}), [],
     "iptables.masqueradeBit: must be an integer"),
    ("detectLocalMode", conf(detectLocalMode="Magic"), [],
     "detectLocalMode: unsupported value 'Magic'"),
    ("bridge missing", conf(detectLocalMode="BridgeInterface"), [],
     "detectLocal.bridgeInterface: must not be empty when detectLocalMode is BridgeInterface"),
    ("prefix missing", None, ["--detect-local-mode=InterfaceNamePrefix"],
     "--pod-interface-name-prefix: must not be empty when --detect-local-mode is "
     "InterfaceNamePrefix"),
    ("maxPerCore", conf(conntrack={"maxPerCore": -1}), [],
     "conntrack.maxPerCore: must be greater than or equal to 0"),
    ("conntrack min flag", None, ["--conntrack-min=-5"],
     "--conntrack-min: must be greater than or equal to 0"),
    ("close wait", conf(conntrack={"tcpCloseWaitTimeout": "-1h"}), [],
     "conntrack.tcpCloseWaitTimeout: must be greater than or equal to 0"),
    ("udp stream flag", None, ["--conntrack-udp-timeout-stream=-1s"],
     "--conntrack-udp-timeout-stream: must be greater than or equal to 0"),
    ("logging.format", conf(logging={"format": "xml"}), [],
     "logging.format: unsupported value 'xml'; must be one of text, json"),
    ("log-format flag", None, ["--log-format=yaml"], "--log-format: unsupported value 'yaml'"),
    ("verbosity flag", None, ["-v", "11"], "--v: must be within the range [0, 10] (got 11)"),
    ("verbosity file", conf(logging={"verbosity": -1}), [],
     "logging.verbosity: must be within the range [0, 10]"),
    ("section not a mapping", conf(ipvs="fast"), [], "ipvs: must be a mapping"),
    ("bool as string", conf(ipvs={"strictARP": "yes"}), [],
     "ipvs.strictARP: must be true or false (got 'yes')"),
    ("bool flag", None, ["--masquerade-all=maybe"],
     "--masquerade-all: must be true or false (got 'maybe')"),
    ("list as string", conf(nodePortAddresses="10.0.0.0/8"), [],
     "nodePortAddresses: must be a list of strings"),
    ("blank hostname", None, ["--hostname-override=  "], "--hostname-override: must not be blank"),
    ("service proxy name", None, ["--service-proxy-name=not valid!"],
     "--service-proxy-name: 'not valid!' is not a valid label value"),
    ("state file", None, ["--state-file="], "--state-file: must not be empty"),
    ("cleanup flag", None, ["--cleanup"], "--cleanup: run `ipvsproxy cleanup` instead"),
    ("unknown flag", None, ["--no-such-flag"],
     "command line: unrecognized arguments: --no-such-flag"),
    ("no abbreviations", None, ["--ipvs-sched=lc"], "unrecognized arguments: --ipvs-sched=lc"),
    ("flag without value", None, ["--ipvs-scheduler"],
     "command line: argument --ipvs-scheduler: expected one argument"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("file_data", "argv", "fragment"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_configurations_name_the_field_and_why(
    file_data: dict[str, Any] | None, argv: list[str], fragment: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        build(file_data, argv)
    assert fragment in str(exc.value)


def test_every_problem_is_reported_at_once() -> None:
    data = conf(mode="iptables", ipvs={"scheduler": "nope"}, iptables={"masqueradeBit": 40})
    with pytest.raises(ConfigError) as exc:
        build(data, ["--conntrack-min=-1"])
    assert len(exc.value.problems) == 4
    assert [p.split(":")[0] for p in exc.value.problems] == [
        "mode",
        "ipvs.scheduler",
        "iptables.masqueradeBit",
        "--conntrack-min",
    ]
    assert isinstance(exc.value, ValueError)


def test_a_bad_value_is_one_problem_not_two() -> None:
    with pytest.raises(ConfigError) as exc:
        build(None, ["--ipvs-sync-period=500ms", "--ipvs-min-sync-period=soon"])
    assert exc.value.problems == (
        "--ipvs-min-sync-period: invalid duration 'soon' "
        "(expected a Go duration such as 30s, 1m0s, 2h45m or 500ms)",
    )


def test_a_flag_that_replaces_an_invalid_file_value_wins() -> None:
    cfg = build(conf(ipvs={"scheduler": "nope"}), ["--ipvs-scheduler=wlc"])
    assert cfg.scheduler == "wlc"


# -- the file ----------------------------------------------------------------------------------


def test_parse_config_text_takes_yaml_or_json() -> None:
    assert parse_config_text("mode: ipvs\n", "a.yaml") == {"mode": "ipvs"}
    assert parse_config_text('{"mode": "ipvs"}', "a.json") == {"mode": "ipvs"}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("- a\n- b\n", "/etc/kp.yaml: must contain a KubeProxyConfiguration mapping, not a list"),
        ("just a string\n", "/etc/kp.yaml: must contain a KubeProxyConfiguration mapping"),
        ("", "/etc/kp.yaml: is empty"),
        ("mode: [ipvs\n", "/etc/kp.yaml: cannot parse as YAML or JSON"),
        ('{"mode": ', "/etc/kp.yaml: cannot parse as YAML or JSON"),
    ],
)
def test_parse_config_text_errors_name_the_source(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_config_text(text, "/etc/kp.yaml")
    assert fragment in str(exc.value)


def test_load_reads_the_config_file_then_applies_flags(tmp_path: Path) -> None:
    path = tmp_path / "config.conf"
    path.write_text(KUBEADM_CONFIG_CONF)
    cfg = load(["--config", str(path), "--hostname-override=worker-1", "--ipvs-scheduler=lc"])
    assert cfg == dataclasses.replace(
        build(kubeadm(), []),
        hostname_override="worker-1",
        scheduler="lc",
        warnings=cfg.warnings,
        config_file=str(path),
        config_content=KUBEADM_CONFIG_CONF.encode(),
    )
    assert cfg.warnings == (
        "--ipvs-scheduler overrides ipvs.scheduler from the config file "
        "(upstream kube-proxy ignores --ipvs-scheduler when --config is given)",
    )


def test_load_without_config_is_build_from_flags() -> None:
    assert load(["--ipvs-scheduler=sh"]) == build(None, ["--ipvs-scheduler=sh"])
    assert load(["--config="]) == ProxyConfig()


def test_load_names_a_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=re.escape(f"--config: {missing} does not exist")):
        load([f"--config={missing}"])


def test_load_names_an_unreadable_or_unparsable_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"--config: cannot read {tmp_path}")):
        load([f"--config={tmp_path}"])  # a directory
    bad = tmp_path / "bad.yaml"
    bad.write_text("ipvs: {scheduler: [\n")
    with pytest.raises(ConfigError, match=re.escape(f"{bad}: cannot parse as YAML or JSON")):
        load(["--config", str(bad)])
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(
        ConfigError, match=re.escape("apiVersion: must be kubeproxy.config.k8s.io/v1alpha1")
    ):
        load(["--config", str(wrong)])


# -- add_flags ---------------------------------------------------------------------------------


def test_add_flags_lists_upstreams_flags_and_defaults_to_none() -> None:
    parser = argparse.ArgumentParser(prog="ipvsproxy run")
    add_flags(parser)
    text = parser.format_help()
    for flag in (
        "--config", "--kubeconfig", "--master", "--hostname-override", "--bind-address",
        "--healthz-bind-address", "--metrics-bind-address", "--cluster-cidr",
        "--detect-local-mode", "--pod-bridge-interface", "--pod-interface-name-prefix",
        "--nodeport-addresses", "--proxy-mode", "--ipvs-scheduler", "--ipvs-sync-period",
        "--ipvs-min-sync-period", "--ipvs-exclude-cidrs", "--ipvs-strict-arp",
        "--ipvs-tcp-timeout", "--ipvs-tcpfin-timeout", "--ipvs-udp-timeout", "--masquerade-all",
        "--iptables-masquerade-bit", "--conntrack-max-per-core", "--conntrack-min",
        "--conntrack-tcp-timeout-established", "--conntrack-tcp-timeout-close-wait",
        "--conntrack-udp-timeout", "--conntrack-udp-timeout-stream", "--log-format", "--v",
        "--service-proxy-name", "--state-file", "--oom-score-adj", "--conntrack-tcp-be-liberal",
        "--bind-address-hard-fail",
    ):  # fmt: skip
        assert flag in text, flag
    assert "--config-sync-period" not in text  # accepted, but hidden: it does nothing here
    ns = parser.parse_args([])
    assert all(value is None for value in vars(ns).values())


# -- Go durations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1m0s", 60.0),
        ("2h45m", 9900.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("0", 0.0),
        ("0s", 0.0),
        ("1h2m3.5s", 3723.5),
        (".5s", 0.5),
        ("5.s", 5.0),
        ("+2s", 2.0),
        ("-0", 0.0),
        ("1500us", 0.0015),
        ("1\u00b5s", 1e-06),
        ("250ns", 2.5e-07),
        ("24h0m0s", 86400.0),
        (45, 45.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration(text: str | int | float, seconds: float) -> None:
    assert parse_duration(text, "f") == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "f: invalid duration ''"),
        ("s", "f: invalid duration 's'"),
        ("30", "f: missing unit in duration '30'"),
        ("1d", "f: unknown unit 'd' in duration '1d'"),
        ("1 s", "f: unknown unit ' s'"),
        ("-1s", "f: must be greater than or equal to 0 (got '-1s')"),
        ("9999999999s", "f: overflow in duration"),
        (-1, "f: must be greater than or equal to 0"),
        (float("nan"), "f: invalid duration nan"),
        (True, "f: must be a duration"),
    ],
)
def test_parse_duration_errors(text: Any, fragment: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_duration(text, "f")
    assert fragment in str(exc.value)


def go_string(seconds: int) -> str:
    """Go's time.Duration.String() for whole seconds: 0s, 45s, 1m0s, 2h45m0s."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


@given(st.integers(min_value=0, max_value=10**9))
def test_seconds_formatted_as_n_s_parse_back(n: int) -> None:
    assert parse_duration(f"{n}s", "f") == n


@given(st.integers(min_value=0, max_value=10**9))
def test_go_formatted_durations_parse_back(n: int) -> None:
    assert parse_duration(go_string(n), "f") == n


@given(st.integers(min_value=0, max_value=10**9))
def test_milliseconds_parse_to_their_seconds(n: int) -> None:
    assert parse_duration(f"{n}ms", "f") == pytest.approx(n / 1000)


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(["ns", "ms", "s", "m", "h"]))
def test_negative_durations_are_errors(n: int, unit: str) -> None:
    with pytest.raises(ConfigError, match="f: must be greater than or equal to 0"):
        parse_duration(f"-{n}{unit}", "f")


# -- purity ------------------------------------------------------------------------------------


def test_the_package_imports_nothing_that_does_io_and_reads_only_in_load() -> None:
    package = Path(config.__file__).parent
    modules = sorted(package.rglob("*.py"))
    assert {"__init__", "assemble", "settings"} <= {m.stem for m in modules}
    imported = set()
    readers = []
    for module in modules:
        tree = ast.parse(module.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{module.name}: a relative import"
                imported.add(node.module or "")
        readers += [
            f"{module.stem}.{fn.name}"
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef)
            and any(
                (isinstance(n, ast.Attribute) and n.attr in ("read_text", "read_bytes", "open"))
                or (isinstance(n, ast.Name) and n.id == "open")
                for n in ast.walk(fn)
            )
        ]
    forbidden = {"socket", "subprocess", "pyroute2", "kubernetes", "os", "io"}
    assert not {m for m in imported if m.split(".")[0] in forbidden}
    own = {m for m in imported if m == "ipvsproxy" or m.startswith("ipvsproxy.")}
    assert own and all(m.startswith("ipvsproxy.config.") for m in own), own
    assert readers == ["assemble.load"]
