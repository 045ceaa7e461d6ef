"""The configuration reference: every field of upstream's KubeProxyConfiguration and every flag
of kube-proxy, with what ipvsproxy does with it, as Markdown tables (README.md's
"Configuration reference" is this text; tests/unit/test_config_reference.py keeps it so).

A field or flag is *supported* (read, checked as upstream checks it: an invalid value stops
start-up with its name), *warned* (accepted, not used: a warning names it when it is set to
anything but its zero value or upstream's default), or *rejected* (stops start-up)."""

from __future__ import annotations

from ipvsproxy.config.file import API_VERSION, KIND
from ipvsproxy.config.flags import ignored_flags, refused_flags
from ipvsproxy.config.settings import SETTINGS, Setting
from ipvsproxy.config.upstream_fields import fields

_NO_RATE_LIMIT = (
    "no client-side request rate limit: one list and one watch per resource, and Events "
    "limited per Service and reason"
)

# Why each field ipvsproxy ignores is not used, and its upstream flag, if it has one.
IGNORED_FIELDS: dict[str, tuple[str, str]] = {
    "featureGates": ("--feature-gates", "ipvsproxy has no feature gates"),
    "clientConnection.acceptContentTypes": ("", "the API client speaks JSON only"),
    "clientConnection.contentType": ("--kube-api-content-type", "the API client speaks JSON only"),
    "clientConnection.qps": ("--kube-api-qps", _NO_RATE_LIMIT),
    "clientConnection.burst": ("--kube-api-burst", _NO_RATE_LIMIT),
    "logging.flushFrequency": ("--log-flush-frequency", "log lines are written unbuffered"),
    "logging.vmodule": ("--vmodule", "no per-file verbosity"),
    "logging.options": ("", "klog's buffering and split streams; lines go unbuffered to stderr"),
    "enableProfiling": ("--profiling", "no `/debug/pprof` (Go's profiler)"),
    "showHiddenMetricsForVersion": ("--show-hidden-metrics-for-version", "no hidden metrics"),
    "iptables.localhostNodePorts": ("--iptables-localhost-nodeports", "the iptables mode's"),
    "iptables.snatNodeInternalIP": ("", "the iptables mode's"),
    "iptables.syncPeriod": ("--iptables-sync-period", "the iptables mode's; see `ipvs.syncPeriod`"),
    "iptables.minSyncPeriod": ("--iptables-min-sync-period", "the iptables mode's"),
    "nftables.masqueradeBit": ("", "the nftables mode's"),
    "nftables.masqueradeAll": ("", "the nftables mode's"),
    "nftables.syncPeriod": ("", "the nftables mode's"),
    "nftables.minSyncPeriod": ("", "the nftables mode's"),
    "winkernel.networkName": ("", "Windows only"),
    "winkernel.sourceVip": ("", "Windows only"),
    "winkernel.enableDSR": ("", "Windows only"),
    "winkernel.rootHnsEndpointName": ("", "Windows only"),
    "winkernel.forwardHealthCheckVip": ("", "Windows only"),
    "windowsRunAsService": ("", "Windows only"),
    "conntrack.max": ("", "removed upstream; `conntrack.maxPerCore` and `conntrack.min` are used"),
    "configSyncPeriod": ("--config-sync-period", "the informers never resync (\"Differences\")"),
    "portRange": ("", "the userspace mode's, removed upstream"),
    "udpIdleTimeout": ("", "the userspace mode's, removed upstream"),
    "resourceContainer": ("", "removed upstream"),
}  # fmt: skip

# Why each flag ipvsproxy ignores that has no field above is not used.
IGNORED_FLAG_ONLY: dict[str, str] = {
    "--healthz-port": "deprecated upstream; `--healthz-bind-address` is used",
    "--metrics-port": "deprecated upstream; `--metrics-bind-address` is used",
    "--log-json-info-buffer-size": "log lines are written unbuffered",
    "--log-text-info-buffer-size": "log lines are written unbuffered",
    "--log-json-split-stream": "every line goes to stderr",
    "--log-text-split-stream": "every line goes to stderr",
}

# ipvsproxy's own flags, which upstream does not have.
OWN_FLAGS = ("--service-proxy-name", "--state-file", "--status-bind-address", "--watch-timeout",
             "--ipvs-drain-timeout", "--service-traffic-metrics")  # fmt: skip


def _code(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _supported(s: Setting) -> str:
    if s.key == "mode":
        return "supported: `ipvs`, or empty; any other mode is **rejected**"
    return f"supported: {s.help}"


def field_rows() -> list[tuple[str, str, str]]:
    """(field, its flags, what ipvsproxy does) for every field of the file, sorted by field."""
    rows = [("apiVersion", "", f"required: `{API_VERSION}`"), ("kind", "", f"required: `{KIND}`")]
    for name, setting in sorted(fields()):
        if setting is not None:
            rows.append((f"`{name}`", _code(setting.flags), _supported(setting)))
        else:
            flag, why = IGNORED_FIELDS[name]
            rows.append((f"`{name}`", _code([flag] if flag else []), f"warned: {why}"))
    return rows


def flag_rows() -> list[tuple[str, str]]:
    """(flag, what ipvsproxy does) for every flag that has no field in the file."""
    rows = [(_code(s.flags), ("ipvsproxy's own; " if s.flags[0] in OWN_FLAGS else "supported: ")
             + s.help) for s in SETTINGS if s.path is None]  # fmt: skip
    rows += [(f"`{f}`", f"warned: {why}") for f, why in IGNORED_FLAG_ONLY.items()]
    rows += [(f"`{f}`", f"**rejected**: {why}") for f, why in refused_flags().items()]
    return rows


def unexplained() -> list[str]:
    """Ignored fields and flags without a reason above; empty when the reference is whole."""
    in_fields = {flag for flag, _ in IGNORED_FIELDS.values() if flag}
    missing = [name for name, s in fields() if s is None and name not in IGNORED_FIELDS]
    return missing + [f for f in ignored_flags() if f not in in_fields | set(IGNORED_FLAG_ONLY)]


def markdown() -> str:
    """Both tables, as README.md holds them."""
    lines = ["| field | flag | ipvsproxy |", "| --- | --- | --- |"]
    lines += [f"| {f} | {flags} | {what} |" for f, flags, what in field_rows()]
    lines += ["", "Flags with no field in the file:", "", "| flag | ipvsproxy |", "| --- | --- |"]
    lines += [f"| {flag} | {what} |" for flag, what in flag_rows()]
    return "\n".join(lines) + "\n"
