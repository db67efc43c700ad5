"""kopf glue: every event only says which Agents and Tools to look at again; a work queue does the work.

kopf watches Agents and Tools and keeps them in indices (an Agent's body by name, and per namespace
the little of each Agent that others depend on, see `references`); its handlers run only once every
index is filled, so nothing is judged on a half-listed namespace. The children are watched by the
operator itself (`rockbot.kube.mirroring`, by label): cheaper per event than a kopf handler, and only what
a comparison needs is kept (`children`). Handlers never call the API: they add keys to the work
queue, which coalesces a burst of events for one Agent into one reconcile and bounds how many run
at once. Level-based: kopf keeps no progress, diff-base annotations or finalizers on our objects, and
a restart replays nothing but reads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import Any

import kopf

from rockbot.kube import CONFIGMAPS, DEPLOYMENTS, SERVICEACCOUNTS, SERVICES, KubeClient, Resource
from rockbot.kube.events import EventPoster
from rockbot.kube.mirroring import mirror
from rockbot.operator import builders
from rockbot.operator.children import Child, Children
from rockbot.operator.egress_canary import EgressCanaries
from rockbot.operator.reconciler import AgentInputs, AgentReconciler
from rockbot.operator.references import AgentRef, AgentsByName, tools_calling, used_by
from rockbot.operator.secret_keys import SecretKeys
from rockbot.operator.settings import OperatorSettings
from rockbot.operator.tool_status import ToolStatusWriter
from rockbot.operator.workqueue import WorkQueue
from rockbot.resources import GROUP, VERSION

logger = logging.getLogger(__name__)
MANAGED = f"app.kubernetes.io/managed-by={builders.MANAGED_BY}"
CHILD_KINDS = (DEPLOYMENTS, CONFIGMAPS, SERVICES, SERVICEACCOUNTS)
#: Reconciles at once: enough to keep requests in flight while others wait on the API server's
#: latency, few enough that the event loop and the connection pool never queue them.
WORKERS = 8
Key = tuple[str, str, str]  # ("agent" | "tool", namespace, name)


class Runtime:
    """What the handlers share: settings, the API client, what the watches show, and the work queue."""

    def __init__(self, *, settings: OperatorSettings, kube: KubeClient) -> None:
        self.settings = settings
        self.kube = kube
        self.children = Children()
        self.children.on_news = self._add_owner_of
        self.secret_keys = SecretKeys(kube)
        self.egress = EgressCanaries(
            kube=kube, image=settings.agent_image, targets=settings.egress_canary_targets,
            interval_seconds=settings.egress_canary_interval_seconds, on_proof=self._add_agents_of,
        ) if settings.egress_canary else None  # fmt: skip
        self.reconciler = AgentReconciler(
            kube=kube, settings=settings, post_event=EventPoster(kube, component=builders.MANAGED_BY),
            children=self.children, secret_keys=self.secret_keys, egress=self.egress,
        )  # fmt: skip
        self.tool_statuses = ToolStatusWriter(kube)
        self.queue = WorkQueue(self._work, workers=WORKERS)
        #: kopf's indices, from the first handler call on (they are complete by then).
        self.indices: kopf.Indices | None = None
        self.indexed = asyncio.Event()
        #: What made each Agent and Tool worth a reconcile when last seen (generation, labels...).
        self._versions: dict[Key, tuple[Any, ...]] = {}
        #: Tools as last seen: a change reaches the Agents that used it before, too.
        self._tools: dict[Key, dict[str, Any]] = {}
        #: When each Agent last changed (loop time): Secrets read before that are not good enough for it.
        self._news: dict[Key, float] = {}
        self._resync_mark = 0.0
        self._tasks: list[asyncio.Task[None]] = []

    # ---- what the handlers call

    def agent_changed(self, event: str | None, body: kopf.Body, indices: kopf.Indices) -> None:
        namespace, name = body.metadata["namespace"], body.metadata["name"]
        key = ("agent", namespace, name)
        self._seen_indices(indices)
        metadata = body.metadata
        version = None if event == "DELETED" else (
            metadata.get("generation"), _items(metadata.get("labels")), _items(metadata.get("annotations")),
            metadata.get("deletionTimestamp"),
        )  # fmt: skip
        previous = self._versions.get(key)
        if version == previous:
            return  # a status change: only the operator writes it
        if version is None:
            self._versions.pop(key, None)
            self._news.pop(key, None)
        else:
            self._versions[key] = version
            self._news[key] = asyncio.get_running_loop().time()
        self.queue.add(key)  # a deleted Agent's work is to forget it
        if previous is not None and version is not None and previous[0] == version[0]:
            return  # labels or annotations: nothing the other Agents or the Tools read
        tools = list(indices["tools"].get(namespace, []))
        ref = AgentRef.of(dict(body))
        for tool in tools:  # their usedBy
            if ref.uses(tool):
                self.queue.add(("tool", namespace, tool["metadata"]["name"]))
        via = tools_calling(name, tools)
        for other in indices["agent_refs"].get(namespace, []):  # Agents offering this one as a tool
            if other.name != name and other.calls(name, via):
                self.queue.add(("agent", namespace, other.name))

    def tool_changed(self, event: str | None, body: kopf.Body, indices: kopf.Indices) -> None:
        namespace, name = body.metadata["namespace"], body.metadata["name"]
        key = ("tool", namespace, name)
        self._seen_indices(indices)
        version = None if event == "DELETED" else (body.metadata.get("generation"), _items(body.metadata.get("labels")))
        if version == self._versions.get(key):
            return  # a status change: only the operator writes it
        versions = [tool for tool in (self._tools.pop(key, None),) if tool is not None]
        if version is None:
            self._versions.pop(key, None)
            self.tool_statuses.forget(namespace, name)
        else:
            self._versions[key] = version
            self._tools[key] = _snapshot(body)
            versions.append(self._tools[key])
            self.queue.add(key)
        for agent in indices["agent_refs"].get(namespace, []):  # those that use it now, or used it before
            if name in agent.tools or any(agent.uses(tool) for tool in versions):
                self.queue.add(("agent", namespace, agent.name))

    def child_changed(self, resource: Resource, body: dict[str, Any], *, listed: bool = False) -> None:
        if self.children.seen(resource, body, listed=listed):
            self._add_owner(resource, body["metadata"]["namespace"], body["metadata"]["name"])

    def child_deleted(self, resource: Resource, namespace: str, name: str) -> None:
        self._add_owner(resource, namespace, name)
        self.children.forget(resource, namespace, name)

    # ---- the work

    async def start(self) -> None:
        """Watch the children; once they and kopf's indices are listed, reconcile everything once."""
        namespaces: list[str | None] = list(self.settings.namespaces) or [None]
        synced = []
        for resource in CHILD_KINDS:
            for namespace in namespaces:
                listed = asyncio.Event()
                synced.append(listed)
                self._tasks.append(asyncio.create_task(self._mirror(resource, namespace, listed),
                                                       name=f"watch {resource.plural} in {namespace or 'all'}"))
        self._tasks.append(asyncio.create_task(self._run(synced), name="reconcile"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.egress is not None:
            await self.egress.stop()
        await self.queue.stop()

    async def _mirror(self, resource: Resource, namespace: str | None, listed: asyncio.Event) -> None:
        def on_listed(items: list[dict[str, Any]]) -> None:
            for body in items:
                self.child_changed(resource, body, listed=True)

        await mirror(
            kube=self.kube, resource=resource, namespace=namespace, label_selector=MANAGED,
            on_upsert=lambda body: self.child_changed(resource, body),
            on_delete=lambda ns, name: self.child_deleted(resource, ns, name), on_listed=on_listed,
            on_synced=listed.set,
        )  # fmt: skip

    async def _run(self, synced: list[asyncio.Event]) -> None:
        for event in (*synced, self.indexed):
            await event.wait()
        self.queue.start()
        count = self._add_everything()
        await self.queue.idle()
        logger.info("reconciled every Agent once since start (%d Agents)", count)
        while True:
            await asyncio.sleep(self.settings.resync_seconds)
            self._resync_mark = asyncio.get_running_loop().time()  # Secrets are read again
            count = self._add_everything()
            await self.queue.idle()
            logger.info("resync: compared %d Agents and their Tools", count)

    def _add_everything(self) -> int:
        """Add every Agent and Tool to the queue; the number of Agents."""
        assert self.indices is not None
        count = 0
        for namespace, tools in list(self.indices["tools"].items()):
            for tool in list(tools):
                self.queue.add(("tool", namespace, tool["metadata"]["name"]))
        for namespace, refs in list(self.indices["agent_refs"].items()):
            for ref in list(refs):
                self.queue.add(("agent", namespace, ref.name))
                count += 1
        return count

    async def _work(self, key: Hashable) -> None:
        assert self.indices is not None and isinstance(key, tuple)
        kind, namespace, name = key
        tools = list(self.indices["tools"].get(namespace, []))
        refs = list(self.indices["agent_refs"].get(namespace, []))
        if kind == "tool":
            tool = next((t for t in tools if t["metadata"]["name"] == name), None)
            if tool is not None:
                await self.tool_statuses.write(tool, used_by=used_by(tool, refs))
            return
        found = list(self.indices["agents"].get((namespace, name), []))
        if not found:  # deleted: its children go with it (owner references), its broker user with this
            await self.reconciler.forget(namespace, name)
            return
        inputs = AgentInputs(
            body=found[0],
            tools=tools,
            agents=AgentsByName(refs),
            fresh_after=max(self._news.get(key, 0.0), self._resync_mark),  # type: ignore[arg-type]
        )
        await self.reconciler.reconcile(inputs)

    def _add_agents_of(self, namespace: str) -> None:
        """An egress canary proved something in `namespace`: its Agents' EgressRestricted may change."""
        if self.indices is not None:
            for ref in list(self.indices["agent_refs"].get(namespace, [])):
                self.queue.add(("agent", namespace, ref.name))

    def _add_owner(self, resource: Resource, namespace: str, name: str) -> None:
        child = self.children.get(resource, namespace, name)
        if child is not None:
            self._add_owner_of(child)

    def _add_owner_of(self, child: Child) -> None:
        if child.owner is not None:
            self.queue.add(("agent", child.namespace, child.owner))

    def _seen_indices(self, indices: kopf.Indices) -> None:
        if self.indices is None:
            self.indices = indices
            self.indexed.set()


def _snapshot(body: kopf.Body) -> dict[str, Any]:
    """What a reconcile reads of an object: its kind (Events name it), metadata (without managedFields),
    spec and status."""
    raw = dict(body)  # the plain dicts under kopf's views, which are dear to read through
    metadata = {key: value for key, value in raw["metadata"].items() if key != "managedFields"}
    return {"apiVersion": raw["apiVersion"], "kind": raw["kind"], "metadata": metadata,
            "spec": raw.get("spec") or {}, "status": raw.get("status") or {}}  # fmt: skip


def _items(mapping: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((mapping or {}).items()))


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Declare every handler on `registry` (a fresh one per operator, so tests can run several)."""

    # Every handler is a coroutine: kopf runs plain functions in a thread pool, a hop per event.
    @kopf.index(GROUP, VERSION, "tools", id="tools", registry=registry)
    async def tools(namespace: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
        return {namespace: _snapshot(body)}

    @kopf.index(GROUP, VERSION, "agents", id="agents", registry=registry)
    async def agents(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
        return {(namespace, name): _snapshot(body)}

    @kopf.index(GROUP, VERSION, "agents", id="agent_refs", registry=registry)
    async def agent_refs(namespace: str, body: kopf.Body, **_: Any) -> dict[str, AgentRef]:
        return {namespace: AgentRef.of(dict(body))}

    @kopf.on.event(GROUP, VERSION, "agents", id="agent", registry=registry)
    async def agent_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
        runtime.agent_changed(type, body, _indices(kwargs))

    @kopf.on.event(GROUP, VERSION, "tools", id="tool", registry=registry)
    async def tool_event(type: str | None, body: kopf.Body, **kwargs: Any) -> None:
        runtime.tool_changed(type, body, _indices(kwargs))

    @kopf.on.startup(registry=registry)
    async def start_reconciling(**_: Any) -> None:
        await runtime.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_reconciling(**_: Any) -> None:
        await runtime.stop()


def _indices(kwargs: dict[str, Any]) -> kopf.Indices:
    return {key: kwargs[key] for key in ("tools", "agents", "agent_refs")}  # type: ignore[return-value]
