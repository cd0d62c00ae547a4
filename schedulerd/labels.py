"""Job labels and label selectors, in Kubernetes' syntax and limits.

A label key is an optional DNS-subdomain prefix and a slash, then a name of at most 63
characters: alphanumerics with `-`, `_` or `.` inside (`team`, `example.com/tier`).
A value is empty or a name's like. A selector is requirements joined by commas, all of
which a job's labels must meet:

    team=billing   team==billing   env!=prod   tier in (a,b)   tier notin (c)   owner   !legacy

`!=` and `notin` match a job without the key, as in Kubernetes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from schedulerd.errors import InvalidJob, InvalidRequest

_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9\-]{0,61}[a-z0-9])?)*"
KEY_RE = re.compile(rf"^(?:(?P<prefix>{_PREFIX})/)?{_NAME}\Z")
VALUE_RE = re.compile(rf"^(?:{_NAME})?\Z")
PREFIX_CHARS_MAX = 253
KEY_HELP = ("a name of 1-63 characters (A-Z a-z 0-9, and - _ . inside), optionally after a DNS prefix and a "
            "slash like example.com/")
VALUE_HELP = "empty, or 1-63 characters (A-Z a-z 0-9, and - _ . inside)"
# One requirement: key, then an operator and its values, or a bare (or !-negated) key.
_SET_RE = re.compile(r"^(?P<key>[^\s!=()]+)\s+(?P<op>in|notin)\s+\((?P<values>[^()]*)\)\Z")
_CMP_RE = re.compile(r"^(?P<key>[^\s!=()]+)\s*(?P<op>==|!=|=)\s*(?P<value>[^\s!=(),]*)\Z")
_HAS_RE = re.compile(r"^(?P<neg>!?)\s*(?P<key>[^\s!=(),]+)\Z")


def check_labels(raw: Any, labels_max: int) -> dict[str, str]:
    """A job's labels as given, or InvalidJob saying which one breaks which rule."""
    if not isinstance(raw, dict):
        raise InvalidJob('labels must be an object of string keys and values, like {"team": "billing"}')
    if len(raw) > labels_max:
        raise InvalidJob(f"a job has at most {labels_max} labels (labels_max); got {len(raw)}")
    for key, value in raw.items():
        _check_key(key, InvalidJob)
        if not isinstance(value, str) or not VALUE_RE.match(value):
            raise InvalidJob(f"label {key!r}: value {value!r} must be {VALUE_HELP}")
    return dict(raw)


def _check_key(key: Any, error: type[Exception]) -> None:
    match = KEY_RE.match(key) if isinstance(key, str) else None
    if match is None or len(match.group("prefix") or "") > PREFIX_CHARS_MAX:
        raise error(f"label key {key!r} must be {KEY_HELP}")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!exists" (= and != are in and notin of one value)
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        if self.op == "exists":
            return self.key in labels
        if self.op == "!exists":
            return self.key not in labels
        if self.op == "in":
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values


@dataclass(frozen=True)
class Selector:
    requirements: tuple[Requirement, ...]
    text: str

    def matches(self, labels: dict[str, str] | None) -> bool:
        return all(r.matches(labels or {}) for r in self.requirements)


def parse_selector(text: str) -> Selector:
    """A selector's text, or InvalidRequest naming the requirement it cannot read."""
    if not text.strip():
        raise InvalidRequest("an empty selector would match every job; give at least one requirement like team=billing")
    return Selector(tuple(_requirement(part.strip()) for part in _split(text)), text)


def _split(text: str) -> list[str]:
    """Requirements split on the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _requirement(part: str) -> Requirement:
    if not part:
        raise InvalidRequest("a selector has an empty requirement (two commas, or one at an end)")
    for pattern in (_SET_RE, _CMP_RE, _HAS_RE):
        match = pattern.match(part)
        if match is None:
            continue
        key = match.group("key")
        _check_key(key, InvalidRequest)
        if pattern is _HAS_RE:
            return Requirement(key, "!exists" if match.group("neg") else "exists")
        values = ([v.strip() for v in match.group("values").split(",")] if pattern is _SET_RE
                  else [match.group("value")])
        for value in values:
            if not VALUE_RE.match(value):
                raise InvalidRequest(f"selector {part!r}: value {value!r} must be {VALUE_HELP}")
        op = match.group("op")
        return Requirement(key, "notin" if op in ("!=", "notin") else "in", frozenset(values))
    raise InvalidRequest(f"selector requirement {part!r} is not one of key=value, key!=value, key in (a,b), "
                         "key notin (a,b), key, !key")
