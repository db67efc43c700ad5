"""Whose limits a script runs with: its Agent's `spec.scriptLimits`, looked up by the request's sender.

The sender is the broker-validated `user_id` (`agent.<namespace>.<name>`), never a field of the
body, so a compromised agent cannot raise its own limits by asking for more (issue 18 P3): the
request's `cpu`, `memory` and `timeout_seconds` may only lower them (see `policy.check`). Where the
limits come from is the deployment's choice (`ROCKBOT_SCRIPTS_AGENT_LIMITS`):
- `agents` (the chart): the manager mirrors the Agents of `ROCKBOT_NAMESPACES` (all when empty) from
  the Kubernetes API, with `list` and `watch` on `agents` there and nothing more (it never reads
  Secrets or the agents' configs), and takes each one's `spec.scriptLimits` with the CRD's defaults,
  as the operator resolves them. An agent whose Agent it does not know gets no script run at all.
- `defaults` (a manager run by hand outside a cluster): every agent gets `ROCKBOT_SCRIPTS_CPU`,
  `ROCKBOT_SCRIPTS_MEMORY` and `ROCKBOT_SCRIPTS_MAX_TIMEOUT_SECONDS`.
`rockbot local` gives the limits of the Agents it loaded (`FixedLimits`), keyed the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any, Protocol

from pydantic import ValidationError

from rockbot.bus import Principal
from rockbot.contracts.agent_config import ScriptLimits, ScriptSessions
from rockbot.kube import AGENTS, KubeClient
from rockbot.kube.mirroring import mirror
from rockbot.resources import Agent
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)


class AgentLimits(Protocol):
    def of(self, agent: Principal) -> ScriptLimits | None:
        """The limits of `agent`'s scripts; None when it has no Agent the manager knows (its scripts are refused)."""


class FixedLimits:
    """Limits known when the manager starts (`rockbot local`'s Agents); `default` for any other agent."""

    def __init__(self, known: dict[Principal, ScriptLimits], *, default: ScriptLimits | None = None) -> None:
        self._known = dict(known)
        self._default = default

    @classmethod
    def defaults(cls, settings: ScriptsManagerSettings) -> FixedLimits:
        """Every agent gets the manager's defaults (ROCKBOT_SCRIPTS_AGENT_LIMITS=defaults)."""
        return cls({}, default=ScriptLimits(cpu=settings.scripts_cpu, memory=settings.scripts_memory,
                                            timeout_seconds=math.floor(settings.scripts_max_timeout_seconds)))

    def of(self, agent: Principal) -> ScriptLimits | None:
        return self._known.get(agent, self._default)


class MirroredAgents:
    """The `spec.scriptLimits` of every Agent in `namespaces` (all when empty), kept current by a watch."""

    def __init__(self, *, kube: KubeClient, namespaces: list[str]) -> None:
        self.kube = kube
        self._namespaces = namespaces or [None]
        self._limits: dict[Principal, ScriptLimits] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def of(self, agent: Principal) -> ScriptLimits | None:
        return self._limits.get(agent)

    async def start(self) -> None:
        """Mirror the Agents; returns once each namespace has been listed (before any request is taken)."""
        synced = [asyncio.Event() for _ in self._namespaces]
        for namespace, listed in zip(self._namespaces, synced, strict=True):
            watching = mirror(kube=self.kube, resource=AGENTS, namespace=namespace, on_upsert=self._upsert,
                              on_delete=self._delete, on_synced=listed.set)  # fmt: skip
            self._tasks.append(asyncio.create_task(watching, name=f"mirror Agents of {namespace or 'all namespaces'}"))
        await asyncio.gather(*(event.wait() for event in synced))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()

    def _upsert(self, body: dict[str, Any]) -> None:
        metadata = body.get("metadata") or {}
        try:
            principal = Principal.agent(namespace=metadata.get("namespace", ""), name=metadata.get("name", ""))
            spec = Agent.model_validate(body).spec
        except (ValidationError, ValueError) as exc:
            log.warning("Agent %s/%s does not parse (%s): its scripts are refused until it does",
                        metadata.get("namespace"), metadata.get("name"), exc)
            self._delete(metadata.get("namespace", ""), metadata.get("name", ""))
            return
        self._limits[principal] = ScriptLimits(**spec.script_limits.model_dump(),
                                               sessions=ScriptSessions(**spec.script_sessions.model_dump()))

    def _delete(self, namespace: str, name: str) -> None:
        with contextlib.suppress(ValueError):  # a name no principal can have was never kept
            self._limits.pop(Principal.agent(namespace=namespace, name=name), None)
