"""Status conditions as Kubernetes conventions want them: a transition time that only moves on change.

Shared by every process that writes a status (the operator, the gateway)."""

from __future__ import annotations

import datetime
from typing import Any, Literal

from pydantic import BaseModel

from rockbot.resources.common import Condition


class ConditionUpdate(BaseModel):
    """What a reconcile concluded about one condition type."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""


def merge_conditions(
    current: list[dict[str, Any]],
    updates: list[ConditionUpdate],
    *,
    generation: int | None,
    now: datetime.datetime,
) -> list[dict[str, Any]]:
    """New conditions list: `lastTransitionTime` is kept unless the status itself changed."""
    by_type = {condition.get("type"): condition for condition in current}
    merged = []
    for update in updates:
        previous = by_type.get(update.type)
        changed = previous is None or previous.get("status") != update.status
        transition = now.strftime("%Y-%m-%dT%H:%M:%SZ") if changed else previous["lastTransitionTime"]
        entry: dict[str, Any] = {
            "type": update.type,
            "status": update.status,
            "reason": update.reason,
            "message": update.message,
            "lastTransitionTime": transition,
        }
        if generation is not None:
            entry["observedGeneration"] = generation
        merged.append(entry)
    return merged


def merge_condition_models(
    current: list[Condition], updates: list[ConditionUpdate], *, generation: int | None, now: datetime.datetime
) -> list[Condition]:
    """`merge_conditions` over a status model's conditions."""
    merged = merge_conditions([condition.to_wire() for condition in current], updates, generation=generation, now=now)
    return [Condition.model_validate(condition) for condition in merged]
