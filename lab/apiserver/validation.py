"""Validation shared by all kinds: names, labels, IPs and ports, with apimachinery's messages.

Messages are copied from ``k8s.io/apimachinery/pkg/util/validation`` so that an error a test
provokes here reads the same as the one a real cluster would give.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Any

from lab.apiserver import errors
from lab.apiserver.errors import FieldError
from lab.apiserver.meta import JSON

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(_LABEL + r"(\." + _LABEL + r")*")
_DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_PORT_NAME_CHARS = re.compile(r"[-a-z0-9]+")

DNS1123_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', "
    "regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1123_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
DNS1035_LABEL_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with "
    "an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
QUALIFIED_NAME_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
IP_MSG = "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"
PORT_RANGE_MSG = "must be between 1 and 65535, inclusive"
PROTOCOLS = ["SCTP", "TCP", "UDP"]

NameCheck = Callable[[str], list[str]]


def _max_len(value: str, limit: int) -> list[str]:
    return [f"must be no more than {limit} characters"] if len(value) > limit else []


def dns1123_label(value: str) -> list[str]:
    msgs = _max_len(value, 63)
    if not _DNS1123_LABEL.fullmatch(value):
        msgs.append(DNS1123_LABEL_MSG)
    return msgs


def dns1123_subdomain(value: str) -> list[str]:
    msgs = _max_len(value, 253)
    if not _DNS1123_SUBDOMAIN.fullmatch(value):
        msgs.append(DNS1123_SUBDOMAIN_MSG)
    return msgs


def dns1035_label(value: str) -> list[str]:
    msgs = _max_len(value, 63)
    if not _DNS1035_LABEL.fullmatch(value):
        msgs.append(DNS1035_LABEL_MSG)
    return msgs


def path_segment(value: str) -> list[str]:
    """The only rule the real server applies to names of kinds without their own (core Events)."""
    if value in (".", ".."):
        return [f"may not be '{value}'"]
    return [f"may not contain '{c}'" for c in "/%" if c in value]


def qualified_name(value: str) -> list[str]:
    """Label and annotation keys: an optional DNS-subdomain prefix, then a short name."""
    prefix, _, name = value.rpartition("/")
    msgs: list[str] = []
    if "/" in value:
        if not prefix:
            msgs.append("prefix part must be non-empty")
        else:
            msgs.extend("prefix part " + m for m in dns1123_subdomain(prefix))
    if not name:
        return [*msgs, "name part must be non-empty"]
    if len(name) > 63:
        msgs.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        msgs.append(QUALIFIED_NAME_MSG)
    return msgs


def label_value(value: str) -> list[str]:
    msgs = _max_len(value, 63)
    if not _LABEL_VALUE.fullmatch(value):
        msgs.append(LABEL_VALUE_MSG)
    return msgs


def port_name(value: str) -> list[str]:
    """IANA service names, which a named targetPort must be."""
    msgs = _max_len(value, 15)
    if not _PORT_NAME_CHARS.fullmatch(value):
        msgs.append("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)")
    if not re.search(r"[a-z]", value):
        msgs.append("must contain at least one letter (a-z)")
    if "--" in value:
        msgs.append("must not contain consecutive hyphens")
    if value.startswith("-") or value.endswith("-"):
        msgs.append("must not begin or end with a hyphen")
    return msgs


def parse_ip(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(value, str):
        return None
    try:
        return ipaddress.ip_address(value)
    except ValueError:
        return None


def valid_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def object_meta(obj: JSON, check_name: NameCheck) -> list[FieldError]:
    """ValidateObjectMeta: the name by the kind's rule, label keys/values, annotation keys."""
    md = obj.get("metadata") or {}
    out: list[FieldError] = []
    name = md.get("name") or ""
    if not name:
        out.append(errors.required("metadata.name", "name or generateName is required"))
    else:
        out.extend(errors.invalid("metadata.name", name, m) for m in check_name(name))
    for key, value in (md.get("labels") or {}).items():
        out.extend(errors.invalid("metadata.labels", key, m) for m in qualified_name(key))
        out.extend(errors.invalid("metadata.labels", value, m) for m in label_value(value))
    for key in md.get("annotations") or {}:
        out.extend(errors.invalid("metadata.annotations", key, m) for m in qualified_name(key))
    return out


def check_meta_types(obj: JSON) -> str | None:
    """What Go's JSON decoding would refuse in metadata (a 400, not a 422), or None."""
    md = obj.get("metadata")
    if md is None:
        return None
    if not isinstance(md, dict):
        return "metadata: expected an object"
    for key in ("name", "generateName", "namespace", "resourceVersion", "uid"):
        if md.get(key) is not None and not isinstance(md[key], str):
            return f"metadata.{key}: expected a string"
    for key in ("labels", "annotations"):
        value = md.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            return f"metadata.{key}: expected a map of strings"
    return None
