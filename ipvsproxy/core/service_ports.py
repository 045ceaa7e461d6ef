"""Kubernetes Services and EndpointSlices reduced to what the dataplane needs.

Accepts the objects as the API returns them: plain dicts (camelCase, as JSON) or the official
client's model classes, which are converted without importing the client (it is slow to
import, and the pure layers must not depend on it).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

from ipvsproxy.config.settings import SCHEDULERS
from ipvsproxy.core.topology import Hints, hints_of
from ipvsproxy.core.virtual_servers import Protocol, canonical_ip

LABEL_SERVICE_NAME = "kubernetes.io/service-name"
LABEL_HEADLESS = "service.kubernetes.io/headless"
LABEL_PROXY_NAME = "service.kubernetes.io/service-proxy-name"
DEFAULT_AFFINITY_TIMEOUT = 10800
# A Service's own IPVS scheduler, over ipvs.scheduler (kube-router.io/service.scheduler).
SCHEDULER_ANNOTATION = "ipvsproxy.io/scheduler"


def to_plain(obj: Any) -> Any:
    """A client model (``attribute_map``/``openapi_types``) as the JSON-shaped dict the API sent."""
    if obj is None or isinstance(obj, str | int | float | bool):
        return obj
    if isinstance(obj, datetime.datetime | datetime.date):
        return obj.isoformat()
    if isinstance(obj, list | tuple):
        return [to_plain(x) for x in obj]
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    attribute_map = getattr(obj, "attribute_map", None)
    if isinstance(attribute_map, Mapping):
        return {
            attribute_map[attr]: to_plain(getattr(obj, attr))
            for attr in attribute_map
            if getattr(obj, attr, None) is not None
        }
    raise TypeError(f"cannot convert {type(obj).__name__} to a Kubernetes object")


def _get(d: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = d
    for key in path:
        if type(cur) is not dict and not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


class InvalidObject(ValueError):
    """An object the dataplane cannot program; the message names the object and the field."""


SHOWN = 64  # characters of a user's value that a message quotes


def shown(value: Any) -> str:
    """``value`` as a message quotes it: its repr, of at most ``SHOWN`` characters of it (a
    user's value can be as long as an annotation's 256 KiB, and messages go into Events, the
    status and the logs, once per node)."""
    if isinstance(value, str) and len(value) > SHOWN:
        return f"{value[:SHOWN]!r}... ({len(value)} characters)"
    return cut(repr(value), SHOWN + 2)


def cut(text: str, limit: int = 4 * SHOWN) -> str:
    """``text`` (an exception's, which may quote a user's value) cut to ``limit`` characters."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One port of a Service, with everything that decides how it is programmed."""

    service: str  # namespace/name
    name: str
    protocol: Protocol
    port: int
    node_port: int
    cluster_ips: tuple[str, ...]
    external_ips: tuple[str, ...]
    lb_vips: tuple[str, ...]
    lb_source_ranges: tuple[str, ...]
    affinity_timeout: int  # 0: no session affinity
    external_local: bool  # externalTrafficPolicy Local applies
    internal_local: bool
    health_check_node_port: int
    type: str
    scheduler: str | None = None  # the SCHEDULER_ANNOTATION's; None: the configuration's
    # Source ranges were given and none parsed: the load-balancer IPs admit no source.
    lb_closed: bool = False

    def of_family(self, family: int) -> ServicePort:
        """This port as the proxier of ``family`` (4 or 6) sees it: its addresses and source
        ranges of that family only (upstream's per-family service info)."""
        v6 = family == 6
        everything = (self.cluster_ips, self.external_ips, self.lb_vips, self.lb_source_ranges)
        if all((":" in a) == v6 for f in everything for a in f) and (
            ("::/0" if v6 else "0.0.0.0/0") not in self.lb_source_ranges
        ):
            return self  # (most Services: of one family, no /0)
        return replace(
            self,
            cluster_ips=tuple(ip for ip in self.cluster_ips if (":" in ip) == v6),
            external_ips=tuple(ip for ip in self.external_ips if (":" in ip) == v6),
            lb_vips=tuple(ip for ip in self.lb_vips if (":" in ip) == v6),
            lb_source_ranges=_family_ranges(self.lb_source_ranges, v6),
        )


def _family_ranges(ranges: tuple[str, ...], v6: bool) -> tuple[str, ...]:
    """The source ranges of one family; none at all when one of them is that family's /0,
    which admits everyone (as upstream, kubernetes #132722: the kernel refuses a /0 in a
    hash:ip,port,net set)."""
    mine = tuple(r for r in ranges if (":" in r) == v6)
    return () if ("::/0" if v6 else "0.0.0.0/0") in mine else mine


class Endpoint(NamedTuple):
    """One endpoint of one service port. A named tuple: the planner makes one per endpoint and
    port (100,000s at a cold sync), and a frozen dataclass's __init__ sets each of its eight
    fields through object.__setattr__."""

    address: str
    port: int
    ready: bool
    serving: bool
    terminating: bool
    node: str | None
    zone: str | None
    pod: str | None = None  # namespace/name of the Pod behind it (targetRef), for status
    hints: Hints | None = None  # the zones and nodes it is meant for (topology)


# An Endpoint from the tuple of its fields, built in C: the named tuple's own __new__ is a
# Python function, and the planner makes an Endpoint per endpoint and port.
new_endpoint = partial(tuple.__new__, Endpoint)


def service_id(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def creation_time(obj: Mapping[str, Any]) -> str:
    """``metadata.creationTimestamp`` as UTC ``YYYY-MM-DDTHH:MM:SS.ffffff``, so that two compare
    as strings in time order whichever spelling the API or client used ("" when absent or
    unreadable)."""
    value = _get(obj, "metadata", "creationTimestamp")
    if isinstance(value, datetime.datetime):
        when = value
    else:
        try:
            when = datetime.datetime.fromisoformat(str(value))
        except ValueError:
            return ""
    offset = when.utcoffset()
    if offset is not None:  # to UTC, as astimezone(UTC) would
        when = when.replace(tzinfo=None) - offset
    if when.year < 1000:  # (isoformat pads the year to 4 digits, strftime's %Y does not)
        return when.strftime("%Y-%m-%dT%H:%M:%S.%f")
    return when.isoformat(timespec="microseconds")


def is_proxied(svc: Mapping[str, Any], proxy_name: str | None = None) -> bool:
    """Whether this proxy programs the Service at all (upstream's label and type rules)."""
    labels = _get(svc, "metadata", "labels") or {}
    if proxy_name is None and LABEL_PROXY_NAME in labels:
        return False  # another proxy's Service
    if proxy_name is not None and labels.get(LABEL_PROXY_NAME) != proxy_name:
        return False
    if LABEL_HEADLESS in labels:
        return False
    spec = svc.get("spec") or {}
    if spec.get("type") == "ExternalName":
        return False
    cluster_ip = spec.get("clusterIP")
    return bool(cluster_ip) and cluster_ip != "None"


def _cluster_ips(values: Iterable[Any], sid: str) -> tuple[str, ...]:
    """The cluster IPs (the API server allocates them: one that does not parse is an invalid
    Service, never skipped)."""
    out = []
    for v in values or ():
        try:
            out.append(canonical_ip(str(v)))
        except ValueError:
            raise InvalidObject(
                f"service {sid}: clusterIP {shown(v)} is not an IP address"
            ) from None
    return tuple(dict.fromkeys(out))


_THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")


def special_address(ip: str) -> str | None:
    """Why the canonical address ``ip`` must not be an externalIP or load-balancer IP, by its
    class alone; None when it may. Bound on kube-ipvs0, loopback makes the filter reject the
    node's other localhost ports, link-local hijacks the metadata service."""
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return "an IPv4-mapped IPv6 address"
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id is not None:
        return "an address with a zone"
    if addr.is_loopback:
        return "loopback"
    if addr.is_link_local:
        return "link-local"
    if addr.is_multicast:
        return "multicast"
    if addr.is_unspecified or (addr.version == 4 and addr in _THIS_NETWORK):
        return "unspecified"
    if ip == "255.255.255.255":
        return "broadcast"
    return None


def _ips(values: Iterable[Any], what: str, skipped: dict[str, str]) -> tuple[str, ...]:
    """The entries that are addresses a Service may take, canonical; each other one goes to
    ``skipped`` with the reason (upstream's MapIPsByIPFamily skips what does not parse; an
    empty entry is no entry)."""
    out = []
    for v in values or ():
        if v is None or not str(v).strip():
            continue
        try:
            ip = canonical_ip(str(v))
        except ValueError:
            skipped[f"{what} {shown(v)}"] = "not an IP address in canonical form"
            continue
        why = special_address(ip)
        if why is not None:
            skipped[f"{what} {shown(v)}"] = why
            continue
        out.append(ip)
    return tuple(dict.fromkeys(out))


SOURCE_RANGES = "loadBalancerSourceRanges"


def _cidrs(values: Iterable[Any], skipped: dict[str, str]) -> tuple[tuple[str, ...], bool]:
    """The source ranges of both families, each in canonical form (``of_family`` splits them,
    and drops a family's ranges when one is its /0), and whether the load-balancer IPs admit
    no source: there were ranges, and none of them parsed (upstream's MapCIDRsByIPFamily skips
    each unparsable one, and so admits everyone when none is left: a firewall whose every rule
    is unreadable is closed here instead). Each unparsable range goes to ``skipped``."""
    out, given = [], False
    for v in values or ():
        text = str(v).strip() if v is not None else ""
        if not text:
            continue
        given = True
        try:
            out.append(str(ipaddress.ip_network(text, strict=False)))
        except ValueError:
            skipped[f"{SOURCE_RANGES} entry {shown(v)}"] = "not a CIDR"
    closed = given and not out
    if closed:
        skipped[SOURCE_RANGES] = (
            "none is a CIDR: the load-balancer IPs admit no source until one is"
        )
    return tuple(dict.fromkeys(out)), closed


def service_ports(
    svc: Mapping[str, Any], skipped: dict[str, str] | None = None
) -> list[ServicePort]:
    """Every port of a proxied Service; raises InvalidObject naming the bad field. An
    externalIP, load-balancer IP or source range that cannot be programmed is left out, and
    ``skipped`` (if given) gets it with the reason: the rest of the Service is programmed."""
    skipped = {} if skipped is None else skipped
    sid = service_id(svc)
    spec = svc.get("spec") or {}
    stype = spec.get("type") or "ClusterIP"
    cluster_ips = _cluster_ips(spec.get("clusterIPs") or [spec.get("clusterIP")], sid)
    # Whatever the type, as upstream's newBaseServiceInfo.
    ingress = _get(svc, "status", "loadBalancer", "ingress") or []
    vips = [i.get("ip") for i in ingress if i.get("ip") and i.get("ipMode") in (None, "VIP")]
    lb_vips = _ips(vips, "load-balancer ingress IP", skipped)
    external_ips = _ips(spec.get("externalIPs") or [], "externalIP", skipped)
    affinity = 0
    if spec.get("sessionAffinity") == "ClientIP":
        affinity = int(
            _get(spec, "sessionAffinityConfig", "clientIP", "timeoutSeconds")
            or DEFAULT_AFFINITY_TIMEOUT
        )
    externally = stype in ("NodePort", "LoadBalancer") or bool(external_ips)
    source_ranges, closed = _cidrs(spec.get("loadBalancerSourceRanges") or [], skipped)
    scheduler = _scheduler(svc, sid)
    ports = []
    for p in spec.get("ports") or []:
        try:
            proto = Protocol(p.get("protocol") or "TCP")
        except ValueError:
            raise InvalidObject(f"service {sid}: protocol {shown(p.get('protocol'))}") from None
        port = int(p.get("port") or 0)
        if not 1 <= port <= 65535:
            raise InvalidObject(f"service {sid}: port {port} out of range")
        ports.append(
            ServicePort(
                service=sid,
                name=p.get("name") or "",
                protocol=proto,
                port=port,
                node_port=int(p.get("nodePort") or 0) if stype != "ClusterIP" else 0,
                cluster_ips=cluster_ips,
                external_ips=external_ips,
                lb_vips=lb_vips,
                lb_source_ranges=source_ranges,
                affinity_timeout=affinity,
                external_local=externally and spec.get("externalTrafficPolicy") == "Local",
                internal_local=spec.get("internalTrafficPolicy") == "Local",
                health_check_node_port=int(spec.get("healthCheckNodePort") or 0),
                type=stype,
                scheduler=scheduler,
                lb_closed=closed,
            )
        )
    return ports


def _scheduler(svc: Mapping[str, Any], sid: str) -> str | None:
    """The Service's SCHEDULER_ANNOTATION, checked against the IPVS schedulers."""
    value = (_get(svc, "metadata", "annotations") or {}).get(SCHEDULER_ANNOTATION)
    if value is None:
        return None
    if value not in SCHEDULERS:
        raise InvalidObject(
            f"service {sid}: annotation {SCHEDULER_ANNOTATION}: {shown(value)} is not an IPVS "
            f"scheduler ({', '.join(SCHEDULERS)})"
        )
    return str(value)


def _pod_of(ref: Any, sl: Mapping[str, Any]) -> str | None:
    """The Pod's path from a targetRef as the API sends it (a slim endpoint carries its own:
    see ``_endpoint_fields``)."""
    # (type(...) is dict first: the Mapping check is an ABC's, far slower, at every endpoint)
    if type(ref) is not dict and not isinstance(ref, Mapping):
        return None
    if ref.get("kind", "Pod") != "Pod" or not ref.get("name"):
        return None
    namespace = ref.get("namespace") or (sl.get("metadata") or {}).get("namespace") or "default"
    return f"{namespace}/{ref['name']}"


def _endpoint_fields(ep: Any, sl: Mapping[str, Any]) -> tuple[Any, Any, Any, Any, str | None, Any]:
    """addresses, conditions, nodeName, zone, the Pod's ``namespace/name`` and hints. A slim
    endpoint (ipvsproxy.kube.slim) holds them as attributes (None: absent), read here directly
    rather than through its get(), a Python call per field."""
    if not isinstance(ep, dict) and hasattr(ep, "nodeName"):
        return ep.addresses, ep.conditions, ep.nodeName, ep.zone, ep.pod, ep.hints
    get = ep.get
    pod = _pod_of(get("targetRef"), sl)
    return get("addresses"), get("conditions"), get("nodeName"), get("zone"), pod, get("hints")


def slice_endpoints(
    slices: Iterable[Mapping[str, Any]], port_name: str, protocol: Protocol, family: int = 4
) -> list[Endpoint]:
    """Endpoints of one service port merged across slices, one per address:port."""
    return endpoints_by_port(slices, [(port_name, protocol)], family=family)[0]


# Canonical IPv4 addresses the kernel refuses as a real server ("address not unicast"):
# 0.0.0.0/8, multicast (224.0.0.0/4) and the limited broadcast.
_REFUSED_IPV4 = re.compile(r"0\.|22[4-9]\.|23[0-9]\.|255\.255\.255\.255$").match


def refused_address(ip: str, family: int = 4) -> str | None:
    """Why the kernel would refuse the canonical address ``ip`` as a real server of
    ``family``; None when it takes it."""
    if family == 6:
        return _refused_ipv6(ip)
    if ":" in ip:
        return "an IPv6 address in an IPv4 slice"
    if _REFUSED_IPV4(ip) is None:
        return None
    if ip == "255.255.255.255":
        return "broadcast"
    return "unspecified" if ip.startswith("0.") else "multicast"


def _refused_ipv6(ip: str) -> str | None:
    """IPVS takes a unicast IPv6 real server that is not link-local (ip_vs_new_dest)."""
    if ":" not in ip:
        return "an IPv4 address in an IPv6 slice"
    addr = ipaddress.IPv6Address(ip)
    if addr.is_unspecified:
        return "unspecified"
    if addr.is_multicast:
        return "multicast"
    if addr.is_link_local:
        return "link-local"
    return None


# A canonical IPv4 address that ``refused_address`` takes, but for the limited broadcast:
# first octet 1-223 or 240-255, no leading zeros. Most of what the API sends; one test of it
# spares the canonical form's and the refusal's (an address per endpoint).
_TAKEN_IPV4 = re.compile(
    r"(?:[1-9][0-9]?|1[0-9][0-9]|2[01][0-9]|22[0-3]|24[0-9]|25[0-5])"
    r"(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}"
).fullmatch


def _real_server_ip(addr: Any, skipped: dict[str, str], family: int = 4) -> str | None:
    """An endpoint's address in canonical form if the kernel takes it as a real server of
    ``family``; else None, and ``skipped`` says why."""
    if family == 4 and type(addr) is str and _TAKEN_IPV4(addr) and addr != "255.255.255.255":
        return addr
    try:
        ip = canonical_ip(addr)
    except ValueError:
        skipped[f"address {shown(addr)}"] = "not an IP address in canonical form"
        return None
    why = refused_address(ip, family)
    if why is not None:
        skipped[f"address {shown(addr)}"] = why
        return None
    return ip


def _port_number(port: Any) -> int | None:
    """A slice port's number when it is one IPVS can take (1..65535), else None."""
    try:
        number = int(port)
    except (TypeError, ValueError):
        return None
    return number if 1 <= number <= 65535 else None


def endpoints_by_port(
    slices: Iterable[Mapping[str, Any]],
    ports: Sequence[tuple[str, Protocol]],
    skipped: dict[str, str] | None = None,
    family: int = 4,
) -> list[list[Endpoint]]:
    """``slice_endpoints`` for each (port name, protocol) of ``ports``, reading every endpoint
    of the slices of ``family`` once rather than once per port. Addresses and ports the kernel
    would refuse are left out; ``skipped`` (if given) gets each of them with the reason."""
    skipped = {} if skipped is None else skipped
    seen: list[dict[tuple[str, int], Endpoint]] = [{} for _ in ports]
    address_type = "IPv6" if family == 6 else "IPv4"
    for sl in slices:
        if sl.get("addressType", "IPv4") != address_type:
            continue
        # The slice's port numbers by (name, protocol), the last one of a pair winning: one
        # look-up per Service port, so matching is linear in ports, never in pairs of them.
        numbers = {
            (p.get("name") or "", p.get("protocol") or "TCP"): p.get("port")
            for p in sl.get("ports") or []
        }
        matched = []  # (which of ports, its number in this slice)
        for i, (port_name, protocol) in enumerate(ports):
            port = numbers.get((port_name, protocol.value))
            if not port:
                continue  # not in this slice, or no number: not for this proxy
            number = _port_number(port)
            if number is None:
                skipped[f"port {shown(port)}"] = "out of range 1..65535"
                continue
            matched.append((seen[i], number))
        if not matched:
            continue
        for ep in sl.get("endpoints") or []:
            addresses, cond, node, zone, pod, hints = _endpoint_fields(ep, sl)
            cond = cond or {}
            ready = cond.get("ready")
            ready = True if ready is None else bool(ready)
            serving = cond.get("serving")  # absent: serving, whatever ready says (the API's)
            serving = True if serving is None else bool(serving)
            terminating = bool(cond.get("terminating"))
            hinted = hints_of(hints) if hints else None
            for addr in (addresses or [])[:1]:  # the first address is the one used
                ip = _real_server_ip(addr, skipped, family)
                if ip is None:
                    continue
                for found, number in matched:
                    key = (ip, number)
                    old = found.get(key)
                    if old is not None and old.ready:
                        continue
                    found[key] = new_endpoint(
                        (ip, number, ready, serving, terminating, node, zone, pod, hinted)
                    )
    return [[found[k] for k in sorted(found)] for found in seen]
