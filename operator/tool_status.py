"""A Tool's status: `Accepted` with the validator's message, and which Agents use it."""

from __future__ import annotations

import datetime
from typing import Any

from rockbot.kube.client import KubeClient
from rockbot.kube.resources import TOOLS
from rockbot.operator.conditions import ConditionUpdate, merge_conditions
from rockbot.operator.resolving import agents_using
from rockbot.operator.validation import tool_problems


def tool_status(
    body: dict[str, Any], *, tools: list[dict[str, Any]], agents: list[dict[str, Any]], now: datetime.datetime
) -> dict[str, Any]:
    problems = tool_problems(body)
    accepted = (
        ConditionUpdate(type="Accepted", status="True", reason="Valid", message="the tool can be offered to agents")
        if not problems
        else ConditionUpdate(type="Accepted", status="False", reason="Invalid", message="; ".join(problems))
    )
    current = body.get("status") or {}
    generation = body["metadata"].get("generation")
    return {
        "observedGeneration": generation,
        "conditions": merge_conditions(current.get("conditions") or [], [accepted], generation=generation, now=now),
        "usedBy": agents_using(body["metadata"]["name"], tools=tools, agents=agents),
    }


async def write_tool_status(
    kube: KubeClient,
    *,
    body: dict[str, Any],
    tools: list[dict[str, Any]],
    agents: list[dict[str, Any]],
    now: datetime.datetime | None = None,
) -> None:
    """Patch the Tool's status when, and only when, it changed."""
    status = tool_status(body, tools=tools, agents=agents, now=now or datetime.datetime.now(datetime.UTC))
    current = body.get("status") or {}
    if all(current.get(key) == value for key, value in status.items()):
        return
    await kube.patch(
        TOOLS,
        namespace=body["metadata"]["namespace"],
        name=body["metadata"]["name"],
        body={"status": status},
        subresource="status",
    )
