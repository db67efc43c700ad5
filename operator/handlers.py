"""kopf glue: every trigger resolves to "reconcile these Agents"; the work lives in the reconciler.

Handlers are event handlers (`on.event`) plus a resync timer: level-based, so kopf keeps no
progress or diff-base annotations on our objects and a restart replays nothing but reads.
Tools and Agents are mirrored into in-memory indices from kopf's watches, so a reconcile reads
them without an API call.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from rockbot.kube.client import KubeClient
from rockbot.operator.builders import MANAGED_BY
from rockbot.operator.reconciler import AgentReconciler
from rockbot.operator.settings import OperatorSettings
from rockbot.operator.tool_status import write_tool_status
from rockbot.resources import GROUP, VERSION

logger = logging.getLogger(__name__)
MANAGED = {"app.kubernetes.io/managed-by": MANAGED_BY}
CHILD_KINDS = [
    ("apps", "v1", "deployments"),
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
]
RETRY_DELAYS = [1, 2, 5, 10, 30, 60]


class Runtime:
    """What the handlers share: settings, the API client, the reconciler, and pending retries."""

    def __init__(self, *, settings: OperatorSettings, kube: KubeClient) -> None:
        self.settings = settings
        self.kube = kube
        self.reconciler = AgentReconciler(kube=kube, settings=settings, post_event=_post_event)
        self.retries: dict[tuple[str, str], asyncio.Task[None]] = {}


def _post_event(body: dict[str, Any], event_type: str, reason: str, message: str) -> None:
    kopf.event(body, type=event_type, reason=reason, message=message[:1024])


def _snapshot(body: kopf.Body) -> dict[str, Any]:
    return {"metadata": dict(body.metadata), "spec": dict(body.spec), "status": dict(body.status)}


async def reconcile_agent(
    runtime: Runtime, *, namespace: str, name: str, indices: kopf.Indices, attempt: int = 0
) -> None:
    """Reconcile one Agent now; on failure, try again later with backoff (and log why)."""
    tools_index: kopf.Index = indices["tools_by_namespace"]
    agents_index: kopf.Index = indices["agents_by_namespace"]
    tools = list(tools_index.get(namespace, []))
    agents = {agent["metadata"]["name"]: agent for agent in agents_index.get(namespace, [])}
    try:
        await runtime.reconciler.reconcile(namespace=namespace, name=name, tools=tools, agents=agents)
    except Exception as error:  # any failure: the object stays as it was, and we come back
        delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
        logger.warning("reconcile of Agent %s/%s failed (%s); retrying in %ss", namespace, name, error, delay)
        key = (namespace, name)
        if key not in runtime.retries or runtime.retries[key].done():
            runtime.retries[key] = asyncio.create_task(
                _retry(runtime, namespace=namespace, name=name, indices=indices, attempt=attempt + 1, delay=delay)
            )


async def _retry(
    runtime: Runtime, *, namespace: str, name: str, indices: kopf.Indices, attempt: int, delay: float
) -> None:
    await asyncio.sleep(delay)
    runtime.retries.pop((namespace, name), None)
    await reconcile_agent(runtime, namespace=namespace, name=name, indices=indices, attempt=attempt)


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Declare every handler on `registry` (a fresh one per operator, so tests can run several)."""

    @kopf.index(GROUP, VERSION, "tools", id="tools_by_namespace", registry=registry)
    def tools_by_namespace(namespace: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {namespace: _snapshot(body)}

    @kopf.index(GROUP, VERSION, "agents", id="agents_by_namespace", registry=registry)
    def agents_by_namespace(namespace: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {namespace: _snapshot(body)}

    @kopf.on.event(GROUP, VERSION, "agents", registry=registry)
    async def agent_event(type: str, namespace: str, name: str, **kwargs: Any) -> None:
        if type != "DELETED":
            await reconcile_agent(runtime, namespace=namespace, name=name, indices=_indices(kwargs))

    @kopf.timer(GROUP, VERSION, "agents", interval=runtime.settings.resync_seconds, registry=registry)
    async def agent_resync(namespace: str, name: str, **kwargs: Any) -> None:
        await reconcile_agent(runtime, namespace=namespace, name=name, indices=_indices(kwargs))

    @kopf.on.event(GROUP, VERSION, "tools", registry=registry)
    async def tool_event(type: str, namespace: str, name: str, body: kopf.Body, **kwargs: Any) -> None:
        indices = _indices(kwargs)
        tools = list(indices["tools_by_namespace"].get(namespace, []))
        agents = list(indices["agents_by_namespace"].get(namespace, []))
        if type != "DELETED":
            await write_tool_status(runtime.kube, body=dict(body), tools=tools, agents=agents)
        for agent in agents:
            if _may_use(
                agent, tool_name=name, previously=runtime.reconciler.uses(namespace, agent["metadata"]["name"])
            ):
                await reconcile_agent(runtime, namespace=namespace, name=agent["metadata"]["name"], indices=indices)

    for group, version, plural in CHILD_KINDS:

        @kopf.on.event(group, version, plural, labels=MANAGED, registry=registry)
        async def child_event(body: kopf.Body, namespace: str, **kwargs: Any) -> None:
            for owner in body.metadata.get("ownerReferences", []):
                if owner.get("kind") == "Agent" and owner.get("apiVersion") == f"{GROUP}/{VERSION}":
                    await reconcile_agent(runtime, namespace=namespace, name=owner["name"], indices=_indices(kwargs))


def _indices(kwargs: dict[str, Any]) -> kopf.Indices:
    return {key: kwargs[key] for key in ("tools_by_namespace", "agents_by_namespace")}  # type: ignore[return-value]


def _may_use(agent: dict[str, Any], *, tool_name: str, previously: set[str]) -> bool:
    """Whether a Tool change can matter to this Agent: it names it, selects tools, or used it last time."""
    spec = agent.get("spec") or {}
    return tool_name in (spec.get("tools") or []) or spec.get("toolSelector") is not None or tool_name in previously
