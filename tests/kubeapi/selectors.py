"""Label and field selectors, parsed the way the API server parses `?labelSelector=` and `?fieldSelector=`."""

import re
from collections.abc import Callable
from typing import Any

from tests.kubeapi.errors import bad_request

Requirement = Callable[[dict[str, str]], bool]

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQUALITY = re.compile(rf"^\s*({_KEY})\s*(==|=|!=)\s*({_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")


class LabelSelector:
    """A parsed label selector: every requirement must hold (`a=b,c in (d,e),!f,g`)."""

    def __init__(self, text: str | None) -> None:
        self._requirements: list[Requirement] = [self._parse(part) for part in _split(text or "")]

    def matches(self, labels: dict[str, str] | None) -> bool:
        labels = labels or {}
        return all(requirement(labels) for requirement in self._requirements)

    @staticmethod
    def _parse(part: str) -> Requirement:
        if match := _SET.match(part):
            key, op, values = match.group(1), match.group(3), {v.strip() for v in match.group(4).split(",")}
            if not all(re.fullmatch(_VALUE, value) for value in values) or values == {""}:
                raise bad_request(f"unable to parse requirement: invalid values in {part.strip()!r}")
            if op == "in":
                return lambda labels: labels.get(key) in values
            return lambda labels: labels.get(key) not in values
        if match := _EQUALITY.match(part):
            key, op, value = match.group(1), match.group(3), match.group(4)
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: key in labels and labels[key] == value
        if match := _EXISTS.match(part):
            negated, key = match.group(1), match.group(2)
            if negated:
                return lambda labels: key not in labels
            return lambda labels: key in labels
        raise bad_request(f"unable to parse requirement: found {part.strip()!r} in the label selector")


# Fields the emulator can select on, by resource; the real server allows a few more per kind and
# refuses all others, as the emulator does.
_FIELDS: dict[tuple[str, str], set[str]] = {
    ("", "pods"): {"status.phase", "spec.nodeName", "spec.restartPolicy", "spec.serviceAccountName"},
    ("", "events"): {"involvedObject.kind", "involvedObject.name", "involvedObject.namespace",
                     "involvedObject.uid", "reason", "type"},
    ("", "secrets"): {"type"},
    ("", "namespaces"): {"status.phase"},
}


class FieldSelector:
    """A parsed field selector: `metadata.name=x,metadata.namespace!=y` plus a few per-kind fields."""

    def __init__(self, text: str | None, *, key: tuple[str, str]) -> None:
        self._requirements: list[tuple[str, bool, str]] = []
        allowed = {"metadata.name", "metadata.namespace"} | _FIELDS.get(key, set())
        for part in _split(text or ""):
            match = re.fullmatch(r"\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*", part)
            if match is None:
                raise bad_request(f"invalid selector: {part!r}; can't understand it")
            field, op, value = match.groups()
            if field not in allowed:
                raise bad_request(f'field label not supported: {field} (the emulator supports {sorted(allowed)})')
            self._requirements.append((field, op != "!=", value))

    def matches(self, obj: dict[str, Any]) -> bool:
        for field, equal, value in self._requirements:
            actual: Any = obj
            for step in field.split("."):
                actual = actual.get(step) if isinstance(actual, dict) else None
            if ((actual or "") == value) != equal:
                return False
        return True


def _split(text: str) -> list[str]:
    """Split on commas that are not inside `in (...)` value lists."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return [part for part in parts if part.strip()]
