"""kopf glue: every trigger resolves to "reconcile these Agents"; the work lives in the reconciler.

Handlers are event handlers (`on.event`) plus a periodic resync loop: level-based, so kopf keeps
no progress, diff-base annotations or finalizers on our objects and a restart replays nothing but
reads.
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
        #: The live kopf indices, once a handler has seen them; the resync loop reads them.
        self.indices: kopf.Indices | None = None
        self.resync: asyncio.Task[None] | None = None
        #: (generation, labels) of each Tool as last seen: a status-only change concerns no Agent.
        self.tool_versions: dict[tuple[str, str], tuple[Any, ...]] = {}
        #: The generation of each Agent as last seen: only a spec change (or its coming and going)
        #: concerns the Agents that use it as a sub-agent.
        self.agent_versions: dict[tuple[str, str], Any] = {}


def _post_event(body: dict[str, Any], event_type: str, reason: str, message: str) -> None:
    kopf.event(body, type=event_type, reason=reason, message=message[:1024])


def _snapshot(body: kopf.Body) -> dict[str, Any]:
    return {"metadata": dict(body.metadata), "spec": dict(body.spec), "status": dict(body.status)}


async def reconcile_agent(
    runtime: Runtime, *, namespace: str, name: str, indices: kopf.Indices, attempt: int = 0
) -> None:
    """Reconcile one Agent now; on failure (reported on the Agent), try again later with backoff."""
    tools_index: kopf.Index = indices["tools_by_namespace"]
    agents_index: kopf.Index = indices["agents_by_namespace"]
    tools = list(tools_index.get(namespace, []))
    agents = {agent["metadata"]["name"]: agent for agent in agents_index.get(namespace, [])}
    try:
        used_before = runtime.reconciler.uses(namespace, name)
        exists = await runtime.reconciler.reconcile(namespace=namespace, name=name, tools=tools, agents=agents)
        if not exists:  # the index may not have seen the deletion yet: it uses nothing any more
            agents.pop(name, None)
        changed = used_before ^ runtime.reconciler.uses(namespace, name)
        for tool in tools:  # their `usedBy` gained or lost this Agent
            if tool["metadata"]["name"] in changed:
                await write_tool_status(runtime.kube, body=tool, tools=tools, agents=list(agents.values()))
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


async def _resync_forever(runtime: Runtime) -> None:
    """Reconcile every Agent now and then: catches what no event announces (a Secret created later).

    A loop rather than a kopf timer, because kopf puts a finalizer on objects with timers, and an
    Agent should stay deletable while the operator is down.
    """
    while True:
        await asyncio.sleep(runtime.settings.resync_seconds)
        if runtime.indices is None:
            continue
        for namespace, agents in list(runtime.indices["agents_by_namespace"].items()):
            for agent in list(agents):
                await reconcile_agent(
                    runtime, namespace=namespace, name=agent["metadata"]["name"], indices=runtime.indices
                )


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Declare every handler on `registry` (a fresh one per operator, so tests can run several)."""

    @kopf.index(GROUP, VERSION, "tools", id="tools_by_namespace", registry=registry)
    def tools_by_namespace(namespace: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {namespace: _snapshot(body)}

    @kopf.index(GROUP, VERSION, "agents", id="agents_by_namespace", registry=registry)
    def agents_by_namespace(namespace: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {namespace: _snapshot(body)}

    @kopf.on.event(GROUP, VERSION, "agents", registry=registry)
    async def agent_event(type: str, namespace: str, name: str, body: kopf.Body, **kwargs: Any) -> None:
        indices = runtime.indices = _indices(kwargs)
        # Also when deleted: the reconcile then forgets it and drops it from its Tools' `usedBy`.
        await reconcile_agent(runtime, namespace=namespace, name=name, indices=indices)
        version = None if type == "DELETED" else body.metadata.get("generation")
        if runtime.agent_versions.get((namespace, name)) == version:
            return  # a status-only change: nothing the Agents referring to it read
        if version is None:
            runtime.agent_versions.pop((namespace, name), None)
        else:
            runtime.agent_versions[(namespace, name)] = version
        tools = list(indices["tools_by_namespace"].get(namespace, []))
        for agent in list(indices["agents_by_namespace"].get(namespace, [])):
            other = agent["metadata"]["name"]
            if other != name and _refers_to(
                agent, target=name, tools=tools, previously=runtime.reconciler.uses(namespace, other)
            ):
                await reconcile_agent(runtime, namespace=namespace, name=other, indices=indices)

    @kopf.on.startup(registry=registry)
    async def start_resync(**_: Any) -> None:
        runtime.resync = asyncio.create_task(_resync_forever(runtime))

    @kopf.on.cleanup(registry=registry)
    async def stop_resync(**_: Any) -> None:
        pending = [*runtime.retries.values(), *([runtime.resync] if runtime.resync is not None else [])]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    @kopf.on.event(GROUP, VERSION, "tools", registry=registry)
    async def tool_event(type: str, namespace: str, name: str, body: kopf.Body, **kwargs: Any) -> None:
        indices = _indices(kwargs)
        tools = list(indices["tools_by_namespace"].get(namespace, []))
        agents = list(indices["agents_by_namespace"].get(namespace, []))
        version = (body.metadata.get("generation"), tuple(sorted(body.metadata.labels.items())))
        if type == "DELETED":
            runtime.tool_versions.pop((namespace, name), None)
        else:
            await write_tool_status(runtime.kube, body=dict(body), tools=tools, agents=agents)
            if runtime.tool_versions.get((namespace, name)) == version:
                return
            runtime.tool_versions[(namespace, name)] = version
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


def _refers_to(agent: dict[str, Any], *, target: str, tools: list[dict[str, Any]], previously: set[str]) -> bool:
    """Whether an Agent offers `target` as a tool: as a sub-agent, or through an `agent`-backed Tool."""
    spec = agent.get("spec") or {}
    if any(ref.get("name") == target for ref in spec.get("subAgents") or []):
        return True
    return any(
        ((tool.get("spec") or {}).get("agent") or {}).get("name") == target
        and _may_use(agent, tool_name=tool["metadata"]["name"], previously=previously)
        for tool in tools
    )


def _may_use(agent: dict[str, Any], *, tool_name: str, previously: set[str]) -> bool:
    """Whether a Tool change can matter to this Agent: it names it, selects tools, or used it last time."""
    spec = agent.get("spec") or {}
    return tool_name in (spec.get("tools") or []) or spec.get("toolSelector") is not None or tool_name in previously
