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
- ``cluster_cidr`` and ``cluster_cidr6`` are the first IPv4 and the first IPv6 CIDR of
  ``clusterCIDR`` (one CIDR, or a dual-stack pair).

``build`` is pure; ``load`` is the only function that reads a file.

The modules, from the bottom: ``proxy_config`` (``ProxyConfig``, ``ConfigError``), ``durations``
(Go durations), ``file`` (a file's text to a mapping), ``settings`` (each setting's field, flags
and checks), ``upstream_fields`` (every field upstream defines, used or not), ``flags``,
``assemble`` (``build`` and ``load``), and ``render`` (a configuration back in the file's
terms, for ``/configz``).
"""

from ipvsproxy.config.assemble import build, load
from ipvsproxy.config.durations import parse_duration
from ipvsproxy.config.file import API_VERSION, KIND, parse_config_text
from ipvsproxy.config.flags import add_flags
from ipvsproxy.config.proxy_config import HEALTHZ_PORT, METRICS_PORT, ConfigError, ProxyConfig

__all__ = [
    "API_VERSION",
    "HEALTHZ_PORT",
    "KIND",
    "METRICS_PORT",
    "ConfigError",
    "ProxyConfig",
    "add_flags",
    "build",
    "load",
    "parse_config_text",
    "parse_duration",
]
