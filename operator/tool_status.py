"""A Tool's status: `Accepted` with the validator's message, and which Agents use it."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from rockbot.addresses import IPNetwork
from rockbot.kube.client import KubeClient
from rockbot.kube.resources import TOOLS
from rockbot.operator.conditions import ConditionUpdate, StatusMemory, merge_conditions
from rockbot.operator.validation import tool_problems


def tool_status(
    body: dict[str, Any], *, current: dict[str, Any], used_by: list[str], now: datetime.datetime,
    private_networks: Sequence[IPNetwork] | None = None,
) -> dict[str, Any]:
    problems = tool_problems(body, private_networks=private_networks)
    accepted = (
        ConditionUpdate(type="Accepted", status="True", reason="Valid", message="the tool can be offered to agents")
        if not problems
        else ConditionUpdate(type="Accepted", status="False", reason="Invalid", message="; ".join(problems))
    )
    generation = body["metadata"].get("generation")
    return {
        "observedGeneration": generation,
        "conditions": merge_conditions(current.get("conditions") or [], [accepted], generation=generation, now=now),
        "usedBy": used_by,
    }


class ToolStatusWriter:
    """Patches a Tool's status when, and only when, it changed (remembering its own writes)."""

    def __init__(self, kube: KubeClient, *, private_networks: Sequence[IPNetwork] | None = None) -> None:
        self._kube = kube
        self._private_networks = private_networks
        self._statuses = StatusMemory()

    async def write(self, body: dict[str, Any], *, used_by: list[str], now: datetime.datetime | None = None) -> None:
        current = self._statuses.current(body)
        status = tool_status(body, current=current, used_by=used_by, now=now or datetime.datetime.now(datetime.UTC),
                             private_networks=self._private_networks)
        if all(current.get(key) == value for key, value in status.items()):
            return
        metadata = body["metadata"]
        await self._kube.patch(
            TOOLS, namespace=metadata["namespace"], name=metadata["name"], body={"status": status}, subresource="status"
        )
        self._statuses.wrote(body, status)

    def forget(self, namespace: str, name: str) -> None:
        self._statuses.forget(namespace, name)
