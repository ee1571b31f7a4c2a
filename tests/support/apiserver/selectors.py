"""Label and field selectors as the API server reads them from a query."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tests.support.apiserver.errors import ApiError

_SET = re.compile(r"^\s*(!?)([\w./-]+)\s*(?:(notin|in)\s*\(([^)]*)\))?\s*$")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return value in self.values
        if self.op in ("!=", "notin"):
            return value not in self.values
        if self.op == "exists":
            return value is not None
        return value is None


def _terms(text: str) -> list[str]:
    """Split at the commas outside parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def labels(text: str) -> tuple[Requirement, ...]:
    found = []
    for term in _terms(text):
        for op in ("!=", "==", "="):
            if op in term and "(" not in term:
                key, _, value = term.partition(op)
                found.append(
                    Requirement(key.strip(), "!=" if op == "!=" else "=", (value.strip(),))
                )
                break
        else:
            match = _SET.match(term)
            if match is None:
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
            negated, key, op, values = match.groups()
            if op:
                found.append(Requirement(key, op, tuple(v.strip() for v in values.split(","))))
            else:
                found.append(Requirement(key, "!" if negated else "exists"))
    return tuple(found)


def fields(text: str, allowed: tuple[str, ...]) -> tuple[tuple[str, bool, str], ...]:
    """(path, equal, value) terms; a field the kind does not index is a 400, as upstream."""
    found = []
    for term in _terms(text):
        negated = "!=" in term
        key, _, value = term.partition("!=" if negated else "=")
        key, value = key.strip(), value.lstrip("=").strip()
        if key not in ("metadata.name", "metadata.namespace", *allowed):
            raise ApiError(400, "BadRequest", f"field label not supported: {key}")
        found.append((key, not negated, value))
    return tuple(found)


def field_value(obj: dict[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, bool):
        return "true" if node else "false"
    return "" if node is None else str(node)


@dataclass(frozen=True)
class Selector:
    labels: tuple[Requirement, ...] = ()
    fields: tuple[tuple[str, bool, str], ...] = ()

    def matches(self, obj: dict[str, Any]) -> bool:
        own = obj.get("metadata", {}).get("labels") or {}
        if not all(r.matches(own) for r in self.labels):
            return False
        return all((field_value(obj, path) == value) == equal for path, equal, value in self.fields)
