"""What the API server would refuse in a manifest, found without one (`rockbot local`, the operator's checks).

The resource models carry the CRD's every rule (schema constraints, and each CEL rule in its Python
form), so validating a body against its model refuses what `kubectl apply` would, with the same words.
"""

from __future__ import annotations

from typing import Any

import pydantic

from rockbot.resources.agent import Agent
from rockbot.resources.common import Resource
from rockbot.resources.evaluation import Evaluation
from rockbot.resources.scheduledtask import ScheduledTask
from rockbot.resources.tool import Tool
from rockbot.resources.trigger import Trigger

MODELS: dict[str, type[Resource]] = {"Agent": Agent, "Tool": Tool, "ScheduledTask": ScheduledTask, "Trigger": Trigger,
                                       "Evaluation": Evaluation}


def validate(body: dict[str, Any]) -> list[str]:
    """Each problem as `field: message`; empty when the object is admissible. `kind` picks the model."""
    model = MODELS.get(body.get("kind") or "")
    if model is None:
        return [f"kind: {body.get('kind')!r} is not one of {', '.join(MODELS)}"]
    try:
        model.model_validate(body)
    except pydantic.ValidationError as error:
        return describe(error)
    return []


def describe(error: pydantic.ValidationError) -> list[str]:
    """pydantic's errors as `spec.tools[0]: message` lines (a rule on the whole object names its field itself)."""
    problems = []
    for entry in error.errors():
        message = entry["msg"].removeprefix("Value error, ")
        problems.append(f"{location(entry['loc'])}: {message}" if entry["loc"] else message)
    return problems


def location(loc: tuple[int | str, ...]) -> str:
    """`("spec", "rest", "url")` -> `spec.rest.url`, `("spec", "tools", 0)` -> `spec.tools[0]`."""
    path = str(loc[0]) if loc else ""
    for part in loc[1:]:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path
