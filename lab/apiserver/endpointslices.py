"""EndpointSlices (discovery.k8s.io/v1): the backends a kube-proxy turns into real servers.

Validation follows ``pkg/apis/discovery/validation``: an address type, at least one address per
endpoint of that family, sane ports. Defaults follow ``pkg/apis/discovery/v1/defaults.go``
(ports get name "" and protocol TCP), so a kube-proxy sees slices shaped like real ones.
"""

from __future__ import annotations

import ipaddress

from lab.apiserver import errors, schema, validation
from lab.apiserver.errors import FieldError
from lab.apiserver.meta import JSON
from lab.apiserver.strategy import Strategy

ADDRESS_TYPES = ["FQDN", "IPv4", "IPv6"]
MAX_ADDRESSES = 100

SCHEMA: schema.Schema = {
    "addressType": schema.STR,
    "endpoints": schema.LIST,
    "endpoints[]": schema.OBJ,
    "endpoints[].addresses": schema.LIST,
    "endpoints[].addresses[]": schema.STR,
    "endpoints[].conditions": schema.OBJ,
    "endpoints[].conditions.ready": schema.BOOL,
    "endpoints[].conditions.serving": schema.BOOL,
    "endpoints[].conditions.terminating": schema.BOOL,
    "endpoints[].nodeName": schema.STR,
    "endpoints[].hostname": schema.STR,
    "endpoints[].zone": schema.STR,
    "endpoints[].targetRef": schema.OBJ,
    "ports": schema.LIST,
    "ports[]": schema.OBJ,
    "ports[].name": schema.STR,
    "ports[].port": schema.INT,
    "ports[].protocol": schema.STR,
    "ports[].appProtocol": schema.STR,
}


class EndpointSliceStrategy(Strategy):
    has_status = False

    def default(self, obj: JSON) -> None:
        obj.setdefault("endpoints", None)
        obj.setdefault("ports", None)
        for port in obj.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("name", "")
                port.setdefault("protocol", "TCP")

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        out: list[FieldError] = []
        address_type = obj.get("addressType")
        if not address_type:
            out.append(errors.required("addressType"))
        elif address_type not in ADDRESS_TYPES:
            out.append(errors.not_supported("addressType", address_type, ADDRESS_TYPES))
        elif old is not None and old.get("addressType") != address_type:
            out.append(errors.invalid("addressType", address_type, "field is immutable"))
        for i, endpoint in enumerate(obj.get("endpoints") or []):
            out += _validate_endpoint(endpoint, f"endpoints[{i}]", str(address_type or ""))
        out += _validate_ports(obj.get("ports") or [])
        return out


def _validate_address(address: str, path: str, address_type: str) -> list[FieldError]:
    if address_type == "FQDN":
        return [errors.invalid(path, address, m) for m in validation.dns1123_subdomain(address)]
    ip = validation.parse_ip(address)
    want = ipaddress.IPv4Address if address_type == "IPv4" else ipaddress.IPv6Address
    if address_type in ("IPv4", "IPv6") and not isinstance(ip, want):
        return [errors.invalid(path, address, f"must be a valid {address_type} address")]
    return []


def _validate_endpoint(endpoint: JSON, path: str, address_type: str) -> list[FieldError]:
    out: list[FieldError] = []
    addresses = endpoint.get("addresses") or []
    if not addresses:
        out.append(errors.required(f"{path}.addresses", "must contain at least 1 address"))
    elif len(addresses) > MAX_ADDRESSES:
        detail = f"must have at most {MAX_ADDRESSES} items"
        out.append(errors.FieldError(errors.TOO_MANY, f"{path}.addresses", len(addresses), detail))
    for j, address in enumerate(addresses):
        out += _validate_address(address, f"{path}.addresses[{j}]", address_type)
    node = endpoint.get("nodeName")
    if node:
        out += [
            errors.invalid(f"{path}.nodeName", node, m) for m in validation.dns1123_subdomain(node)
        ]
    host = endpoint.get("hostname")
    if host:
        out += [errors.invalid(f"{path}.hostname", host, m) for m in validation.dns1123_label(host)]
    return out


def _validate_ports(ports: list[JSON]) -> list[FieldError]:
    out: list[FieldError] = []
    names: set[str] = set()
    for i, port in enumerate(ports):
        path = f"ports[{i}]"
        name = port.get("name") or ""
        if name:
            out += [errors.invalid(f"{path}.name", name, m) for m in validation.dns1123_label(name)]
        if name in names:
            out.append(errors.duplicate(f"{path}.name", name))
        names.add(name)
        number = port.get("port")
        if number is not None and not validation.valid_port(number):
            out.append(errors.invalid(f"{path}.port", number, validation.PORT_RANGE_MSG))
        protocol = port.get("protocol")
        if protocol is not None and protocol not in validation.PROTOCOLS:
            out.append(errors.not_supported(f"{path}.protocol", protocol, validation.PROTOCOLS))
    return out


STRATEGY = EndpointSliceStrategy()
