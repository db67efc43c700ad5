"""The Agents a user may see, read with the console's own rights and shown only where RBAC says `get agents`.

The console reads Agents, Tools, ScheduledTasks and Triggers with its ServiceAccount (list, never a
Secret) and asks the cluster, per user and namespace, whether to show them. What a page shows is a
summary built here from the API's objects: no spec field that names a Secret's value is ever copied.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rockbot.console.authentication import Identity
from rockbot.console.authorization import VIEW, Authorizer
from rockbot.kube import AGENTS, SCHEDULED_TASKS, TRIGGERS, KubeClient, NotFound

K8sObject = dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class AgentSummary:
    """One row of the Agents page and the head of an Agent's page."""

    namespace: str
    name: str
    ready: str
    reason: str
    message: str
    model: str
    tools: list[dict[str, str]] = field(default_factory=list)
    replicas: int = 0
    ready_replicas: int = 0
    tokens_today: int = 0
    tokens_per_day: int | None = None
    description: str = ""


def summarize(agent: K8sObject) -> AgentSummary:
    metadata = agent.get("metadata") or {}
    spec = agent.get("spec") or {}
    status = agent.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {})
    usage = status.get("usage") or {}
    limits = spec.get("limits") or {}
    return AgentSummary(
        namespace=str(metadata.get("namespace", "")),
        name=str(metadata.get("name", "")),
        ready=str(ready.get("status", "Unknown")),
        reason=str(ready.get("reason", "")),
        message=str(ready.get("message", "")),
        model=str((spec.get("model") or {}).get("name", "")),
        tools=[{"name": str(t.get("name", "")), "source": str(t.get("source", "")),
                "description": str(t.get("description", ""))} for t in status.get("tools") or []],
        replicas=int(spec.get("replicas", 1)),
        ready_replicas=int(status.get("readyReplicas") or 0),
        tokens_today=int(usage.get("totalTokens") or 0),
        tokens_per_day=limits.get("tokensPerDay"),
        description=str(spec.get("description", "")),
    )


async def visible_namespaces(
    *, namespaces: set[str], identity: Identity, authorizer: Authorizer
) -> list[str]:
    """The namespaces among `namespaces` whose Agents `identity` may see, sorted; asked all at once (when the answers
    kept have expired, a page waits for one SubjectAccessReview's time, not one per namespace in turn)."""
    ordered = sorted(namespaces)
    answers = await asyncio.gather(*(authorizer.allowed(identity=identity, namespace=ns, action=VIEW)
                                     for ns in ordered))  # fmt: skip
    return [ns for ns, allowed in zip(ordered, answers, strict=True) if allowed]


async def agents_for(*, kube: KubeClient, identity: Identity, authorizer: Authorizer) -> list[AgentSummary]:
    """Every Agent of the namespaces the user may see, by namespace and name."""
    everything = (await kube.list(AGENTS)).items
    allowed = set(await visible_namespaces(
        namespaces={str(a["metadata"].get("namespace", "")) for a in everything},
        identity=identity, authorizer=authorizer))
    shown = [summarize(agent) for agent in everything if agent["metadata"].get("namespace") in allowed]
    return sorted(shown, key=lambda a: (a.namespace, a.name))


@dataclass(frozen=True, kw_only=True)
class AgentPage:
    summary: AgentSummary
    spec: K8sObject
    schedules: list[K8sObject]
    triggers: list[K8sObject]


async def agent_page(*, kube: KubeClient, namespace: str, name: str) -> AgentPage | None:
    """An Agent with the ScheduledTasks and Triggers that name it; None when it does not exist."""
    try:
        agent = await kube.get(AGENTS, namespace=namespace, name=name)
    except NotFound:
        return None
    schedules = [t for t in (await kube.list(SCHEDULED_TASKS, namespace=namespace)).items
                 if ((t.get("spec") or {}).get("agentRef") or {}).get("name") == name]
    triggers = [t for t in (await kube.list(TRIGGERS, namespace=namespace)).items
                if ((t.get("spec") or {}).get("agentRef") or {}).get("name") == name]
    return AgentPage(summary=summarize(agent), spec=_without_secret_values(agent.get("spec") or {}),
                     schedules=schedules, triggers=triggers)


def _without_secret_values(spec: K8sObject) -> K8sObject:
    """The spec as shown: an inline `model.apiKey` is masked (references to Secrets name no value and stay)."""
    shown = dict(spec)
    model = dict(shown.get("model") or {})
    if model.get("apiKey"):
        model["apiKey"] = "(hidden)"
    shown["model"] = model
    return shown
