"""The shape of each metric family in a Prometheus text exposition (type, label names,
histogram buckets, help), and the checked-in shapes of upstream kube-proxy's
(golden/metrics-kube-proxy-ipvs.txt), for comparing the two.

The parser reads the text format as both Go's client and prometheus_client write it: ``# HELP``
and ``# TYPE`` lines, then samples ``NAME{LABELS} VALUE`` (label values without ``"`` or
``,`` inside, which is so for every series here)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden" / "metrics-kube-proxy-ipvs.txt"

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


@dataclass
class Shape:
    type: str
    help: str = ""
    labels: frozenset[str] = frozenset()
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds, +Inf left out
    values: dict[str, set[str]] = field(default_factory=dict)  # label -> values seen

    def key(self) -> tuple[str, frozenset[str], tuple[float, ...], str]:
        return self.type, self.labels, self.buckets, self.help


def shapes(text: str) -> dict[str, Shape]:
    """Each family of ``text`` by its name (a counter's with ``_total``, as exposed)."""
    found: dict[str, Shape] = {}
    helps: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name, _, text_ = line[7:].partition(" ")
            helps[name] = text_
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            found[name] = Shape(kind, helps.get(name, ""))
        elif line and not line.startswith("#"):
            _sample(found, line)
    return found


def _sample(found: dict[str, Shape], line: str) -> None:
    m = _SAMPLE.match(line)
    assert m, line
    name, labels = m[1], dict(_LABEL.findall(m[2] or ""))
    family = next(
        (f for f, s in found.items() if name in (f, *(f + x for x in _SUFFIXES.get(s.type, ())))),
        None,
    )
    assert family is not None, f"a sample of no family: {line}"
    shape = found[family]
    le = labels.pop("le", None)
    shape.labels = shape.labels | set(labels)
    for label, value in labels.items():
        shape.values.setdefault(label, set()).add(value)
    if le is not None and le != "+Inf" and float(le) not in shape.buckets:
        shape.buckets = (*shape.buckets, float(le))


def golden() -> dict[str, Shape]:
    """Upstream's families, as the golden file lists them."""
    out = {}
    for line in GOLDEN.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        name, kind, labels, buckets, help_ = line.split(" ", 4)
        out[name] = Shape(
            kind,
            help_,
            frozenset() if labels == "-" else frozenset(labels.split(",")),
            () if buckets == "-" else tuple(float(b) for b in buckets.split(",")),
        )
    return out


def upstream_names(all_shapes: dict[str, Shape]) -> set[str]:
    """The families of the kinds the golden file lists: kubeproxy_*, process_* and
    kubernetes_build_info."""
    return {n for n in all_shapes if n.startswith(("kubeproxy_", "process_", "kubernetes_build"))}


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the series ``name`` with exactly ``labels`` (in any order) in ``text``."""
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m[1] == name and dict(_LABEL.findall(m[2] or "")) == labels:
            return float(line.rsplit(" ", 1)[1])
    return None
