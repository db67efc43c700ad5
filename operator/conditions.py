"""Status conditions of the operator's objects; the merging itself is the core's (`rockbot.conditions`)."""

from __future__ import annotations

from typing import Any

from rockbot.conditions import ConditionUpdate, merge_conditions
from rockbot.resources.agent import SCALED_TO_ZERO

__all__ = ["SCALED_TO_ZERO", "ConditionUpdate", "condition_status", "merge_conditions"]


def condition_status(conditions: list[dict[str, Any]], type_: str) -> str | None:
    return next((condition.get("status") for condition in conditions if condition.get("type") == type_), None)


class StatusMemory:
    """The status the operator last wrote per object, until its watch shows it.

    Only the operator writes these statuses, so what it wrote is the truth even while the watch (and
    the index built from it) still holds the previous one; comparing with that would write again.
    """

    def __init__(self) -> None:
        self._written: dict[tuple[str, str], dict[str, Any]] = {}

    def current(self, body: dict[str, Any]) -> dict[str, Any]:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        seen = body.get("status") or {}
        written = self._written.get(key)
        if written is None:
            return seen
        if all(seen.get(field) == value for field, value in written.items()):
            del self._written[key]  # the watch caught up
            return seen
        return {**seen, **written}

    def wrote(self, body: dict[str, Any], status: dict[str, Any]) -> None:
        self._written[(body["metadata"]["namespace"], body["metadata"]["name"])] = status

    def forget(self, namespace: str, name: str) -> None:
        self._written.pop((namespace, name), None)
