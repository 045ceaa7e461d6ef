"""Go durations (``time.ParseDuration``), as KubeProxyConfiguration files and kube-proxy's flags
spell them."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NoReturn

from ipvsproxy.config.proxy_config import ConfigError

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
    ns = go_duration_ns(text, field)
    if ns < 0:
        raise ConfigError(f"{field}: must be greater than or equal to 0 (got {text!r})")
    return ns / 1e9


def go_duration_ns(orig: str, field: str) -> int:
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


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's time.Duration.String writes it ("30s", "1m30s", "24h0m0s", "250ms",
    "0s"), to the nanosecond."""
    ns = round(seconds * 1e9)
    sign, ns = ("-" if ns < 0 else ""), abs(ns)
    if ns == 0:
        return "0s"
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("\u00b5s", 1_000), ("ns", 1)):
            if ns >= size:
                return f"{sign}{_decimal(ns, size)}{unit}"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    text = f"{_decimal(rest, 1_000_000_000)}s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    return f"{sign}{minutes}m{text}" if minutes else f"{sign}{text}"


def _decimal(n: int, unit: int) -> str:
    """``n / unit`` (``unit`` a power of ten) without trailing zeros."""
    whole, frac = divmod(n, unit)
    digits = str(frac).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)
