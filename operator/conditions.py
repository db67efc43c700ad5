"""Status conditions of the operator's objects; the merging itself is the core's (`rockbot.conditions`)."""

from __future__ import annotations

from typing import Any

from rockbot.conditions import ConditionUpdate, merge_conditions

__all__ = ["ConditionUpdate", "condition_status", "merge_conditions"]


def condition_status(conditions: list[dict[str, Any]], type_: str) -> str | None:
    return next((condition.get("status") for condition in conditions if condition.get("type") == type_), None)
