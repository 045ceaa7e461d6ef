"""Services: the defaulting, validation and IP/port allocation a kube-proxy depends on.

What a kube-proxy programs comes from these fields, so they are filled in as the real server
does (``pkg/apis/core/v1/defaults.go``, ``pkg/registry/core/service/storage``): a clusterIP
from the service CIDR, nodePorts from 30000-32767, a healthCheckNodePort for LoadBalancer with
externalTrafficPolicy Local, and the allocated values carried over when an update omits them.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from lab.apiserver import errors, schema, validation
from lab.apiserver.errors import FieldError
from lab.apiserver.meta import JSON
from lab.apiserver.strategy import Allocation, Strategy

SERVICE_CIDR = ipaddress.ip_network("10.96.0.0/12")
FIRST_DYNAMIC_IP = ipaddress.ip_address("10.96.0.10")
NODE_PORT_RANGE = range(30000, 32768)
# Like the real allocator, dynamic node ports come from above a low band kept for static picks.
NODE_PORT_STATIC_BAND = min(max(16, len(NODE_PORT_RANGE) // 32), 128)
TYPES = ["ClusterIP", "ExternalName", "LoadBalancer", "NodePort"]
DEFAULT_AFFINITY_TIMEOUT = 10800

SCHEMA: schema.Schema = {
    "spec": schema.OBJ,
    "spec.type": schema.STR,
    "spec.clusterIP": schema.STR,
    "spec.clusterIPs": schema.LIST,
    "spec.clusterIPs[]": schema.STR,
    "spec.externalIPs": schema.LIST,
    "spec.externalIPs[]": schema.STR,
    "spec.externalName": schema.STR,
    "spec.selector": schema.OBJ,
    "spec.selector.*": schema.STR,
    "spec.ports": schema.LIST,
    "spec.ports[]": schema.OBJ,
    "spec.ports[].name": schema.STR,
    "spec.ports[].protocol": schema.STR,
    "spec.ports[].port": schema.INT,
    "spec.ports[].nodePort": schema.INT,
    "spec.ports[].targetPort": schema.INT_OR_STR,
    "spec.healthCheckNodePort": schema.INT,
    "spec.sessionAffinity": schema.STR,
    "spec.sessionAffinityConfig": schema.OBJ,
    "spec.sessionAffinityConfig.clientIP": schema.OBJ,
    "spec.sessionAffinityConfig.clientIP.timeoutSeconds": schema.INT,
    "spec.externalTrafficPolicy": schema.STR,
    "spec.internalTrafficPolicy": schema.STR,
    "spec.ipFamilies": schema.LIST,
    "spec.ipFamilies[]": schema.STR,
    "spec.ipFamilyPolicy": schema.STR,
    "spec.allocateLoadBalancerNodePorts": schema.BOOL,
    "spec.loadBalancerSourceRanges": schema.LIST,
    "spec.loadBalancerSourceRanges[]": schema.STR,
    "status": schema.OBJ,
    "status.loadBalancer": schema.OBJ,
    "status.loadBalancer.ingress": schema.LIST,
    "status.loadBalancer.ingress[]": schema.OBJ,
    "status.loadBalancer.ingress[].ip": schema.STR,
    "status.loadBalancer.ingress[].hostname": schema.STR,
    "status.loadBalancer.ingress[].ipMode": schema.STR,
}


def spec(svc: JSON) -> JSON:
    value = svc.get("spec")
    if not isinstance(value, dict):
        value = {}
        svc["spec"] = value
    return value


def ports(svc: JSON) -> list[JSON]:
    return [p for p in spec(svc).get("ports") or [] if isinstance(p, dict)]


def svc_type(svc: JSON) -> str:
    return str(spec(svc).get("type") or "ClusterIP")


def externally_accessible(svc: JSON) -> bool:
    t = svc_type(svc)
    return t in ("LoadBalancer", "NodePort") or (
        t == "ClusterIP" and bool(spec(svc).get("externalIPs"))
    )


def needs_cluster_ip(svc: JSON) -> bool:
    return svc_type(svc) != "ExternalName" and spec(svc).get("clusterIP") != "None"


def needs_node_ports(svc: JSON) -> bool:
    t = svc_type(svc)
    if t == "NodePort":
        return True
    return t == "LoadBalancer" and spec(svc).get("allocateLoadBalancerNodePorts") is not False


def needs_health_check_port(svc: JSON) -> bool:
    return svc_type(svc) == "LoadBalancer" and spec(svc).get("externalTrafficPolicy") == "Local"


def used_ips(alloc: Allocation) -> set[str]:
    used: set[str] = set()
    for other in alloc.others:
        s = spec(other)
        used.update(ip for ip in s.get("clusterIPs") or [] if isinstance(ip, str))
        if isinstance(s.get("clusterIP"), str):
            used.add(s["clusterIP"])
    return used


def used_ports(alloc: Allocation) -> set[int]:
    used: set[int] = set()
    for other in alloc.others:
        used.update(p["nodePort"] for p in ports(other) if p.get("nodePort"))
        hc = spec(other).get("healthCheckNodePort")
        if hc:
            used.add(hc)
    return used


class ServiceStrategy(Strategy):
    def check_name(self, name: str) -> list[str]:
        return validation.dns1035_label(name)

    def prepare_create(self, obj: JSON) -> None:
        obj["status"] = {"loadBalancer": {}}

    def prepare_update(self, new: JSON, old: JSON) -> None:
        super().prepare_update(new, old)
        _normalize_cluster_ips(new, old)
        _patch_allocated_values(new, old)
        _drop_type_dependent_fields(new, old)

    def default(self, obj: JSON) -> None:
        s = spec(obj)
        s.setdefault("type", "ClusterIP")
        s.setdefault("sessionAffinity", "None")
        if s["sessionAffinity"] == "None":
            s.pop("sessionAffinityConfig", None)
        elif s["sessionAffinity"] == "ClientIP":
            cfg = s.setdefault("sessionAffinityConfig", {}).setdefault("clientIP", {})
            cfg.setdefault("timeoutSeconds", DEFAULT_AFFINITY_TIMEOUT)
        for port in ports(obj):
            port.setdefault("protocol", "TCP")
            if port.get("targetPort") in (None, 0, ""):
                port["targetPort"] = port.get("port")
        if externally_accessible(obj):
            s.setdefault("externalTrafficPolicy", "Cluster")
        if s["type"] != "ExternalName":
            s.setdefault("internalTrafficPolicy", "Cluster")
        if s["type"] == "LoadBalancer":
            s.setdefault("allocateLoadBalancerNodePorts", True)
        _normalize_cluster_ips(obj, None)
        if s["type"] != "ExternalName":
            s.setdefault("ipFamilies", ["IPv4"])
            s.setdefault("ipFamilyPolicy", "SingleStack")
        self.default_status(obj)

    def default_status(self, obj: JSON) -> None:
        if svc_type(obj) != "LoadBalancer":
            return
        lb = (obj.get("status") or {}).get("loadBalancer") or {}
        for ingress in lb.get("ingress") or []:
            if isinstance(ingress, dict) and ingress.get("ip") and "ipMode" not in ingress:
                ingress["ipMode"] = "VIP"

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        out = _validate_spec(obj)
        if old is not None:
            out.extend(_validate_update(obj, old))
        return out

    def validate_status(self, obj: JSON, old: JSON) -> list[FieldError]:
        return _validate_status(obj)

    def allocate(self, obj: JSON, old: JSON | None, alloc: Allocation) -> None:
        """Assign clusterIP, nodePorts and healthCheckNodePort; 422 on a clash or bad value."""
        name = str((obj.get("metadata") or {}).get("name", ""))
        _allocate_cluster_ip(obj, alloc, name)
        _allocate_node_ports(obj, alloc, name)
        _allocate_health_check_port(obj, alloc, name)


def _normalize_cluster_ips(svc: JSON, old: JSON | None) -> None:
    """Keep clusterIP and clusterIPs[0] in step, as the registry does before validation."""
    s = spec(svc)
    ip, ips = s.get("clusterIP") or "", list(s.get("clusterIPs") or [])
    if old is not None:
        o = spec(old)
        if ip != (o.get("clusterIP") or "") and ips == list(o.get("clusterIPs") or []):
            ips = [ip, *ips[1:]] if ip else []
    if ip and not ips:
        ips = [ip]
    elif ips and not ip:
        ip = ips[0]
    if ip:
        s["clusterIP"] = ip
        s["clusterIPs"] = ips


def _patch_allocated_values(new: JSON, old: JSON) -> None:
    """An update that omits allocated values keeps them (patchAllocatedValues)."""
    n, o = spec(new), spec(old)
    if needs_cluster_ip(old) and needs_cluster_ip(new):
        if not n.get("clusterIP") and o.get("clusterIP"):
            n["clusterIP"] = o["clusterIP"]
        if not n.get("clusterIPs") and o.get("clusterIPs"):
            n["clusterIPs"] = list(o["clusterIPs"])
        if not n.get("ipFamilies") and o.get("ipFamilies"):
            n["ipFamilies"] = list(o["ipFamilies"])
    if needs_node_ports(old) and needs_node_ports(new):
        used = {p.get("nodePort") for p in ports(new) if p.get("nodePort")}
        by_name = {p.get("name", ""): p.get("nodePort") for p in ports(old)}
        for port in ports(new):
            previous = by_name.get(port.get("name", ""))
            if not port.get("nodePort") and previous and previous not in used:
                port["nodePort"] = previous
                used.add(previous)
    keep_hc = needs_health_check_port(old) and needs_health_check_port(new)
    if keep_hc and not n.get("healthCheckNodePort") and o.get("healthCheckNodePort"):
        n["healthCheckNodePort"] = o["healthCheckNodePort"]


def _drop_type_dependent_fields(new: JSON, old: JSON) -> None:
    """A type change clears what the new type cannot have, when the client left it unchanged."""
    n, o = spec(new), spec(old)

    def unchanged(key: str) -> bool:
        return n.get(key) == o.get(key)

    if needs_cluster_ip(old) and svc_type(new) == "ExternalName" and unchanged("clusterIP"):
        for key in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            n.pop(key, None)
    if needs_node_ports(old) and not needs_node_ports(new):
        old_ports = {p.get("nodePort") for p in ports(old)}
        for port in ports(new):
            if port.get("nodePort") in old_ports:
                port.pop("nodePort", None)
    dropped = [
        (needs_health_check_port(old) and not needs_health_check_port(new), "healthCheckNodePort"),
        (externally_accessible(old) and not externally_accessible(new), "externalTrafficPolicy"),
        (
            svc_type(old) == "LoadBalancer" and svc_type(new) != "LoadBalancer",
            "allocateLoadBalancerNodePorts",
        ),
    ]
    for changed, key in dropped:
        if changed and unchanged(key):
            n.pop(key, None)
    if svc_type(new) == "ExternalName":
        n.pop("internalTrafficPolicy", None)


def _one_of(path: str, value: Any, allowed: list[str]) -> list[FieldError]:
    if value is None or value in allowed:
        return []
    return [errors.not_supported(path, value, allowed)]


def _validate_spec(svc: JSON) -> list[FieldError]:
    s = spec(svc)
    out: list[FieldError] = []
    out += _one_of("spec.type", s.get("type"), TYPES)
    out += _one_of("spec.sessionAffinity", s.get("sessionAffinity"), ["ClientIP", "None"])
    out += _one_of(
        "spec.externalTrafficPolicy", s.get("externalTrafficPolicy"), ["Cluster", "Local"]
    )
    out += _one_of(
        "spec.internalTrafficPolicy", s.get("internalTrafficPolicy"), ["Cluster", "Local"]
    )
    out += _validate_ports(svc)
    out += _validate_cluster_ips(svc)
    out += _validate_external(svc)
    out += _validate_affinity(s)
    for key, value in (s.get("selector") or {}).items():
        out += [errors.invalid("spec.selector", key, m) for m in validation.qualified_name(key)]
        out += [errors.invalid("spec.selector", value, m) for m in validation.label_value(value)]
    return out


def _validate_ports(svc: JSON) -> list[FieldError]:
    s = spec(svc)
    items = ports(svc)
    out: list[FieldError] = []
    if not items and svc_type(svc) != "ExternalName" and s.get("clusterIP") != "None":
        out.append(errors.required("spec.ports"))
    names: set[str] = set()
    seen: set[tuple[Any, Any]] = set()
    node_ports: set[tuple[Any, Any]] = set()
    for i, port in enumerate(items):
        path = f"spec.ports[{i}]"
        name = port.get("name") or ""
        if len(items) > 1 and not name:
            out.append(errors.required(f"{path}.name"))
        elif name:
            out += [errors.invalid(f"{path}.name", name, m) for m in validation.dns1123_label(name)]
            if name in names:
                out.append(errors.duplicate(f"{path}.name", name))
            names.add(name)
        out += _validate_port_numbers(svc, port, path)
        key = (port.get("port"), port.get("protocol"))
        if key in seen:
            out.append(errors.duplicate(path, {"port": key[0], "protocol": key[1]}))
        seen.add(key)
        node_key = (port.get("nodePort"), port.get("protocol"))
        if port.get("nodePort") and node_key in node_ports:
            out.append(errors.duplicate(f"{path}.nodePort", port["nodePort"]))
        node_ports.add(node_key)
    return out


def _validate_port_numbers(svc: JSON, port: JSON, path: str) -> list[FieldError]:
    out: list[FieldError] = []
    if not validation.valid_port(port.get("port")):
        out.append(errors.invalid(f"{path}.port", port.get("port"), validation.PORT_RANGE_MSG))
    out += _one_of(f"{path}.protocol", port.get("protocol"), validation.PROTOCOLS)
    target = port.get("targetPort")
    if isinstance(target, str):
        out += [
            errors.invalid(f"{path}.targetPort", target, m) for m in validation.port_name(target)
        ]
    elif target is not None and not validation.valid_port(target):
        out.append(errors.invalid(f"{path}.targetPort", target, validation.PORT_RANGE_MSG))
    node_port = port.get("nodePort")
    if node_port:
        if svc_type(svc) == "ClusterIP":
            detail = "may not be used when `type` is 'ClusterIP'"
            out.append(errors.forbidden(f"{path}.nodePort", detail))
        elif not validation.valid_port(node_port):
            out.append(errors.invalid(f"{path}.nodePort", node_port, validation.PORT_RANGE_MSG))
    return out


def _validate_cluster_ips(svc: JSON) -> list[FieldError]:
    s = spec(svc)
    ips = list(s.get("clusterIPs") or [])
    t = svc_type(svc)
    if t == "ExternalName":
        detail = "may not be set for ExternalName services"
        return [errors.forbidden(f"spec.{k}", detail) for k in _IP_FIELDS if s.get(k)]
    out = _validate_families(s)
    if s.get("clusterIP") and ips and s["clusterIP"] != ips[0]:
        out.append(errors.invalid("spec.clusterIPs", ips, "first value must match `clusterIP`"))
    for i, ip in enumerate(ips):
        path = f"spec.clusterIPs[{i}]"
        if i == 0 and ip == "None":
            if t in ("NodePort", "LoadBalancer"):
                out.append(errors.invalid(path, ip, f"may not be set to 'None' for {t} services"))
        elif i > 0:
            detail = "may only hold up to 1 values in a single-stack cluster"
            out.append(errors.invalid("spec.clusterIPs", ips, detail))
        elif validation.parse_ip(ip) is None:
            out.append(errors.invalid(path, ip, validation.IP_MSG))
    return out


_IP_FIELDS = ("clusterIPs", "ipFamilies", "ipFamilyPolicy")


def _validate_families(s: JSON) -> list[FieldError]:
    """This cluster is single-stack IPv4: dual-stack requests and IPv6 are refused as such."""
    policies = ["PreferDualStack", "RequireDualStack", "SingleStack"]
    out = _one_of("spec.ipFamilyPolicy", s.get("ipFamilyPolicy"), policies)
    if s.get("ipFamilyPolicy") == "RequireDualStack":
        detail = "this cluster is not configured for dual-stack services"
        out.append(errors.invalid("spec.ipFamilyPolicy", "RequireDualStack", detail))
    for i, family in enumerate(s.get("ipFamilies") or []):
        if family == "IPv6":
            detail = "not configured on this cluster"
            out.append(errors.invalid(f"spec.ipFamilies[{i}]", family, detail))
        else:
            out += _one_of(f"spec.ipFamilies[{i}]", family, ["IPv4", "IPv6"])
    return out


def _validate_external(svc: JSON) -> list[FieldError]:
    s = spec(svc)
    out: list[FieldError] = []
    if svc_type(svc) == "ExternalName":
        name = s.get("externalName") or ""
        if not name:
            out.append(errors.required("spec.externalName"))
        else:
            msgs = validation.dns1123_subdomain(name.rstrip("."))
            out += [errors.invalid("spec.externalName", name, m) for m in msgs]
    for i, ip in enumerate(s.get("externalIPs") or []):
        if validation.parse_ip(ip) is None:
            out.append(errors.invalid(f"spec.externalIPs[{i}]", ip, validation.IP_MSG))
    if not externally_accessible(svc) and s.get("externalTrafficPolicy"):
        detail = "may only be set for externally-accessible services"
        out.append(errors.invalid("spec.externalTrafficPolicy", s["externalTrafficPolicy"], detail))
    hc = s.get("healthCheckNodePort")
    if hc and not needs_health_check_port(svc):
        detail = (
            "may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"
        )
        out.append(errors.invalid("spec.healthCheckNodePort", hc, detail))
    if svc_type(svc) != "LoadBalancer":
        if s.get("allocateLoadBalancerNodePorts") is not None:
            detail = "may only be used when `type` is 'LoadBalancer'"
            out.append(errors.forbidden("spec.allocateLoadBalancerNodePorts", detail))
        if s.get("loadBalancerSourceRanges"):
            detail = "may only be used when `type` is 'LoadBalancer'"
            out.append(errors.forbidden("spec.loadBalancerSourceRanges", detail))
    for i, cidr in enumerate(s.get("loadBalancerSourceRanges") or []):
        try:
            ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError:
            detail = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
            out.append(errors.invalid(f"spec.loadBalancerSourceRanges[{i}]", cidr, detail))
    return out


def _validate_affinity(s: JSON) -> list[FieldError]:
    if s.get("sessionAffinity") != "ClientIP":
        return []
    path = "spec.sessionAffinityConfig.clientIP.timeoutSeconds"
    timeout = ((s.get("sessionAffinityConfig") or {}).get("clientIP") or {}).get("timeoutSeconds")
    if not isinstance(timeout, int) or not 0 < timeout <= 86400:
        return [errors.invalid(path, timeout, "must be greater than 0 and less than 86400")]
    return []


def _validate_update(new: JSON, old: JSON) -> list[FieldError]:
    """The primary clusterIP is immutable, except when moving to or from ExternalName."""
    if svc_type(new) == "ExternalName" or svc_type(old) == "ExternalName":
        return []
    old_ips = list(spec(old).get("clusterIPs") or [])
    new_ips = list(spec(new).get("clusterIPs") or [])
    if old_ips and not new_ips:
        return [errors.invalid("spec.clusterIPs[0]", new_ips, "primary clusterIP can not be unset")]
    if old_ips and new_ips and old_ips[0] != new_ips[0]:
        return [errors.invalid("spec.clusterIPs[0]", new_ips, "may not change once set")]
    return []


def _validate_status(svc: JSON) -> list[FieldError]:
    lb = (svc.get("status") or {}).get("loadBalancer") or {}
    out: list[FieldError] = []
    for i, ingress in enumerate(lb.get("ingress") or []):
        path = f"status.loadBalancer.ingress[{i}]"
        ip, host = ingress.get("ip"), ingress.get("hostname")
        if ip and validation.parse_ip(ip) is None:
            out.append(errors.invalid(f"{path}.ip", ip, validation.IP_MSG))
        if host:
            out += [
                errors.invalid(f"{path}.hostname", host, m)
                for m in validation.dns1123_subdomain(host)
            ]
            if validation.parse_ip(host) is not None:
                out.append(
                    errors.invalid(
                        f"{path}.hostname", host, "must be a DNS name, not an IP address"
                    )
                )
        mode = ingress.get("ipMode")
        if mode is not None:
            out += _one_of(f"{path}.ipMode", mode, ["Proxy", "VIP"])
            if not ip:
                out.append(
                    errors.forbidden(f"{path}.ipMode", "may not be specified when `ip` is not")
                )
    return out


def _ip_error(svc: JSON, ip: str, why: str, name: str) -> errors.APIError:
    ips = list(spec(svc).get("clusterIPs") or [ip])
    err = errors.invalid("spec.clusterIPs", ips, f"failed to allocate IP {ip}: {why}")
    return errors.invalid_object("Service", "", name, [err])


def _allocate_cluster_ip(svc: JSON, alloc: Allocation, name: str) -> None:
    s = spec(svc)
    if not needs_cluster_ip(svc):
        return
    used = used_ips(alloc)
    wanted = s.get("clusterIP")
    if wanted:
        ip = ipaddress.ip_address(wanted)
        if ip not in SERVICE_CIDR or ip in (
            SERVICE_CIDR.network_address,
            SERVICE_CIDR.broadcast_address,
        ):
            why = (
                f"the provided IP ({wanted}) is not in the valid range. "
                f"The range of valid IPs is {SERVICE_CIDR}"
            )
            raise _ip_error(svc, wanted, why, name)
        if wanted in used:
            raise _ip_error(svc, wanted, "provided IP is already allocated", name)
        return
    s["clusterIP"] = _next_ip(used, alloc.cursors)
    s["clusterIPs"] = [s["clusterIP"]]


def _next_ip(used: set[str], cursors: dict[str, int]) -> str:
    first = int(FIRST_DYNAMIC_IP)
    last = int(SERVICE_CIDR.broadcast_address) - 1
    start = cursors.get("clusterIP", first)
    size = last - first + 1
    for step in range(size):
        candidate = first + (start - first + step) % size
        text = str(ipaddress.ip_address(candidate))
        if text not in used:
            cursors["clusterIP"] = candidate + 1 if candidate < last else first
            return text
    raise errors.internal("range is full: no more IPs in the service CIDR 10.96.0.0/12")


def _next_port(used: set[int], cursors: dict[str, int]) -> int:
    first, last = NODE_PORT_RANGE.start, NODE_PORT_RANGE.stop - 1
    dynamic = first + NODE_PORT_STATIC_BAND
    start = cursors.get("nodePort", dynamic)
    size = last - first + 1
    for step in range(size):
        candidate = first + (start - first + step) % size
        if candidate not in used:
            cursors["nodePort"] = candidate + 1 if candidate < last else first
            return candidate
    raise errors.internal("range is full: no more node ports in 30000-32767")


def _port_error(path: str, port: int, why: str, name: str) -> errors.APIError:
    return errors.invalid_object("Service", "", name, [errors.invalid(path, port, why)])


def _check_port(path: str, port: int, used: set[int], name: str, prefix: str = "") -> None:
    if port not in NODE_PORT_RANGE:
        why = (
            "provided port is not in the valid range. The range of valid ports is "
            f"{NODE_PORT_RANGE.start}-{NODE_PORT_RANGE.stop - 1}"
        )
        raise _port_error(path, port, prefix + why, name)
    if port in used:
        raise _port_error(path, port, prefix + "provided port is already allocated", name)


def _allocate_node_ports(svc: JSON, alloc: Allocation, name: str) -> None:
    """One node port per service port number (TCP and UDP 53 share one), as the registry does."""
    if svc_type(svc) not in ("NodePort", "LoadBalancer"):
        return
    used = used_ports(alloc)
    by_port: dict[Any, int] = {}
    for i, port in enumerate(ports(svc)):
        wanted = port.get("nodePort")
        if wanted:
            if wanted not in by_port.values():
                _check_port(f"spec.ports[{i}].nodePort", wanted, used, name)
            by_port.setdefault(port.get("port"), wanted)
            continue
        if not needs_node_ports(svc):
            continue
        if port.get("port") not in by_port:
            by_port[port.get("port")] = _next_port(used | set(by_port.values()), alloc.cursors)
        port["nodePort"] = by_port[port.get("port")]


def _allocate_health_check_port(svc: JSON, alloc: Allocation, name: str) -> None:
    if not needs_health_check_port(svc):
        return
    s = spec(svc)
    used = used_ports(alloc) | {p["nodePort"] for p in ports(svc) if p.get("nodePort")}
    wanted = s.get("healthCheckNodePort")
    if wanted:
        prefix = f"failed to allocate requested HealthCheck NodePort {wanted}: "
        _check_port("spec.healthCheckNodePort", wanted, used, name, prefix)
        return
    s["healthCheckNodePort"] = _next_port(used, alloc.cursors)


STRATEGY = ServiceStrategy()
