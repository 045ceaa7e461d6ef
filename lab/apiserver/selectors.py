"""Label and field selectors with the grammar and semantics of apimachinery's parsers.

Both negative forms (``!=``, ``notin``) match objects that lack the key, as on the real server:
that is what lets a kube-proxy select ``!service.kubernetes.io/headless`` and see everything
else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from lab.apiserver import errors, validation

_TOKEN = re.compile(r"\s*(==|!=|=|!|\(|\)|,|>|<|[^\s=!(),<>]+)")
_OPERATORS = {"=", "==", "!=", ">", "<"}


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # in, notin, exists, !exists, gt, lt
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        has = self.key in labels
        if self.op == "in":
            return has and labels[self.key] in self.values
        if self.op == "notin":
            return not has or labels[self.key] not in self.values
        if self.op == "exists":
            return has
        if self.op == "!exists":
            return not has
        if not has:
            return False
        try:
            have, want = int(labels[self.key]), int(next(iter(self.values)))
        except ValueError:
            return False
        return have > want if self.op == "gt" else have < want


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise errors.bad_request(f"unable to parse requirement: invalid selector {text!r}")
        out.append(m.group(1))
        pos = m.end()
    return out


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            self.fail("found '', expected: identifier")
        self.pos += 1
        return tok

    def fail(self, why: str) -> NoReturn:
        raise errors.bad_request(f"unable to parse requirement: {why}")

    def parse(self) -> LabelSelector:
        reqs: list[Requirement] = []
        while self.peek() is not None:
            reqs.append(self.requirement())
            tok = self.peek()
            if tok is None:
                break
            if tok != ",":
                self.fail(f"found '{tok}', expected: ',' or 'end of string'")
            self.pos += 1
            if self.peek() is None:
                self.fail("found '', expected: identifier after ','")
        return LabelSelector(tuple(reqs))

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.pos += 1
            return self.checked(self.take(), "!exists", [])
        key = self.take()
        op = self.peek()
        if op is None or op == ",":
            return self.checked(key, "exists", [])
        self.pos += 1
        if op in ("in", "notin"):
            return self.checked(key, op, self.value_set())
        if op not in _OPERATORS:
            self.fail(f"found '{op}', expected: in, notin, =, ==, !=, gt, lt")
        value = ""
        if self.peek() not in (None, ","):
            value = self.take()
        kind = {"=": "in", "==": "in", "!=": "notin", ">": "gt", "<": "lt"}[op]
        if kind in ("gt", "lt") and not re.fullmatch(r"-?\d+", value):
            self.fail(f"for 'gt', 'lt' operators, exactly one value is required: {value!r}")
        return self.checked(key, kind, [value])

    def value_set(self) -> list[str]:
        if self.take() != "(":
            self.fail("found '', expected: '('")
        values: list[str] = []
        while True:
            tok = self.take()
            if tok == ")":
                break
            if tok == ",":
                continue
            values.append(tok)
        if not values:
            self.fail("for 'in', 'notin' operators, values set can't be empty")
        return values

    def checked(self, key: str, op: str, values: list[str]) -> Requirement:
        msgs = validation.qualified_name(key)
        if msgs:
            self.fail(f"invalid label key {key!r}: {'; '.join(msgs)}")
        for value in values:
            if op in ("gt", "lt"):
                continue
            msgs = validation.label_value(value)
            if msgs:
                self.fail(f"invalid label value: {value!r}: {'; '.join(msgs)}")
        return Requirement(key, op, frozenset(values))


def parse_labels(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return LabelSelector()
    return _LabelParser(text).parse()


@dataclass(frozen=True)
class FieldTerm:
    field: str
    value: str
    negate: bool


@dataclass(frozen=True)
class FieldSelector:
    terms: tuple[FieldTerm, ...] = ()

    def matches(self, values: Mapping[str, str]) -> bool:
        for term in self.terms:
            equal = values.get(term.field, "") == term.value
            if equal == term.negate:
                return False
        return True

    @property
    def empty(self) -> bool:
        return not self.terms


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, cur, escaped = [], "", False
    for ch in text:
        if escaped:
            cur += "\\" + ch
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur + ("\\" if escaped else ""))
    return parts


def _unescape(text: str) -> str:
    out, escaped = "", False
    for ch in text:
        if escaped:
            if ch not in "\\,=":
                raise errors.bad_request(f"invalid field selector: invalid escape sequence \\{ch}")
            out += ch
            escaped = False
        elif ch == "\\":
            escaped = True
        else:
            out += ch
    return out


def _field_term(part: str) -> FieldTerm:
    for op in ("!=", "==", "="):
        idx = _find_unescaped(part, op)
        if idx >= 0:
            key, value = part[:idx], part[idx + len(op) :]
            return FieldTerm(_unescape(key).strip(), _unescape(value), op == "!=")
    raise errors.bad_request(f"invalid field selector: {part!r}: no operator")


def _find_unescaped(text: str, op: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(op, i):
            return i
        i += 1
    return -1


def parse_fields(text: str | None, known: Mapping[str, object], unknown_msg: str) -> FieldSelector:
    """Parse, and refuse fields the kind does not index (the real server's 400)."""
    if not text or not text.strip():
        return FieldSelector()
    terms = [_field_term(p) for p in _split_unescaped(text, ",") if p.strip()]
    for term in terms:
        if term.field not in known:
            raise errors.bad_request(unknown_msg.format(field=term.field))
    return FieldSelector(tuple(terms))
