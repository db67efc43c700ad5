"""The operator's watches: every event only says which Agents and Tools to look at again; a work queue does the work.

The operator watches Agents, Tools and (by label) the children itself (`rockbot.kube.mirroring`) and
keeps what it needs: each Agent's and Tool's body without managedFields, per namespace the little of
each Agent that others depend on (see `references`), and what a comparison needs of each child
(`children`). Nothing is reconciled until every one of those lists is complete, so nothing is judged
on a half-listed namespace. kopf only runs the operator's start-up and clean-up: its per-event
machinery (a diff-base built and diffed, three index functions and a handler invoked through its
invocation layer for every event) cost a third of the operator's CPU at 500 Agents, for events most
of which are the operator's own status writes coming back. Watch callbacks never call the API: they
add keys to the work queue, which coalesces a burst of events for one Agent into one reconcile and
bounds how many run at once. Level-based: nothing is written on our objects but their status
(no progress, diff-base annotations or finalizers), and a restart replays nothing but reads.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Hashable
from typing import Any

import kopf
from prometheus_client import CollectorRegistry, Counter

from rockbot.kube import AGENTS, CONFIGMAPS, DEPLOYMENTS, SERVICEACCOUNTS, SERVICES, TOOLS, KubeClient, Resource
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
from rockbot.tasks import cancel_and_wait

logger = logging.getLogger(__name__)
MANAGED = f"app.kubernetes.io/managed-by={builders.MANAGED_BY}"
CHILD_KINDS = (DEPLOYMENTS, CONFIGMAPS, SERVICES, SERVICEACCOUNTS)
#: Reconciles at once: enough to keep requests in flight while others wait on the API server's
#: latency, few enough that the event loop and the connection pool never queue them.
WORKERS = 8
Key = tuple[str, str, str]  # ("agent" | "tool", namespace, name)
K8sObject = dict[str, Any]


class Runtime:
    """What the callbacks share: settings, the API client, what the watches show, and the work queue."""

    def __init__(
        self, *, settings: OperatorSettings, kube: KubeClient, registry: CollectorRegistry | None = None
    ) -> None:
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
        self.tool_statuses = ToolStatusWriter(kube, private_networks=settings.private_networks)
        self.queue = WorkQueue(self._work, workers=WORKERS)
        #: On the operator's /metrics (`registry`): how much work the Agents' events made, and of which kind.
        self.reconciles = Counter(
            "rockbot_operator_agent_reconciles", "Agent reconciles begun, by work: complete (children, Secrets "
            "and broker compared) or status (only the Deployment's rollout or an egress proof changed).",
            ["work"], registry=CollectorRegistry() if registry is None else registry,
        )  # fmt: skip
        #: Each namespace's Tools by name, as last seen (`_snapshot`).
        self.tools: dict[str, dict[str, K8sObject]] = {}
        #: Each Agent as last seen (`_snapshot`), by (namespace, name).
        self.agents: dict[tuple[str, str], K8sObject] = {}
        #: Each namespace's Agents by name, the little of them that others depend on.
        self.agent_refs: dict[str, dict[str, AgentRef]] = {}
        #: Set once every watch has listed what exists: from then on the above is complete.
        self.listed = asyncio.Event()
        #: What made each Agent and Tool worth a reconcile when last seen (generation, labels...).
        self._versions: dict[Key, tuple[Any, ...]] = {}
        #: When each Agent last changed (loop time): Secrets read before that are not good enough for it.
        self._news: dict[Key, float] = {}
        #: Agents queued for only their status: nothing changed for them since their last reconcile but their
        #: Deployment's rollout or an egress proof (a third of a new Agent's reconciles; see `_add`).
        self._only_status: set[Key] = set()
        self._resync_mark = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        #: Others following every Agent event (the scheduler): one watch of Agents for the whole operator.
        self._followers: list[tuple[Callable[[K8sObject], None], Callable[[str, str], None]]] = []

    def follow_agents(
        self, on_upsert: Callable[[K8sObject], None], on_delete: Callable[[str, str], None]
    ) -> Callable[[], None]:
        """Call these for every Agent known now and every change from now on (see `scheduling.firing.AgentFeed`)."""
        follower = (on_upsert, on_delete)
        self._followers.append(follower)
        for body in list(self.agents.values()):
            on_upsert(body)
        return lambda: self._followers.remove(follower)

    # ---- what the watches call

    def agent_seen(self, body: K8sObject) -> None:
        metadata = body["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        key = ("agent", namespace, name)
        snapshot = self.agents[(namespace, name)] = _snapshot(body, kind="Agent")
        for on_upsert, _ in self._followers:
            on_upsert(snapshot)
        version = (
            metadata.get("generation"), _items(metadata.get("labels")), _items(metadata.get("annotations")),
            metadata.get("deletionTimestamp"),
        )  # fmt: skip
        previous = self._versions.get(key)
        if version == previous:
            return  # a status change: only the operator writes it
        ref = self.agent_refs.setdefault(namespace, {})[name] = AgentRef.of(body)
        self._versions[key] = version
        self._news[key] = asyncio.get_running_loop().time()
        self._add(key)
        if previous is None or previous[0] != version[0]:  # not only labels or annotations: others may read it
            self._agent_concerns(namespace, ref)

    def agent_deleted(self, namespace: str, name: str) -> None:
        key = ("agent", namespace, name)
        self.agents.pop((namespace, name), None)
        for _, on_delete in self._followers:
            on_delete(namespace, name)
        ref = self.agent_refs.get(namespace, {}).pop(name, None)
        self._versions.pop(key, None)
        self._news.pop(key, None)
        self._add(key)  # a deleted Agent's work is to forget it
        if ref is not None:
            self._agent_concerns(namespace, ref)

    def tool_seen(self, body: K8sObject) -> None:
        metadata = body["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        key = ("tool", namespace, name)
        tools = self.tools.setdefault(namespace, {})
        before = tools.get(name)
        tools[name] = _snapshot(body, kind="Tool")
        version = (metadata.get("generation"), _items(metadata.get("labels")))
        if version == self._versions.get(key):
            return  # a status change: only the operator writes it
        self._versions[key] = version
        self.queue.add(key)
        self._tool_concerns(namespace, name, [tool for tool in (before, tools[name]) if tool is not None])

    def tool_deleted(self, namespace: str, name: str) -> None:
        before = self.tools.get(namespace, {}).pop(name, None)
        self._versions.pop(("tool", namespace, name), None)
        self.tool_statuses.forget(namespace, name)
        self._tool_concerns(namespace, name, [before] if before is not None else [])

    def child_changed(self, resource: Resource, body: dict[str, Any], *, listed: bool = False) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        before = self.children.get(resource, namespace, name)
        if self.children.seen(resource, body, listed=listed):
            after = self.children.get(resource, namespace, name)
            rollout_only = before is not None and after is not None and (before.content, before.controller) == (
                after.content, after.controller)  # fmt: skip
            self._add_owner(resource, namespace, name, only_status=rollout_only)

    def child_deleted(self, resource: Resource, namespace: str, name: str) -> None:
        self._add_owner(resource, namespace, name)
        self.children.forget(resource, namespace, name)

    def _agent_concerns(self, namespace: str, ref: AgentRef) -> None:
        """The Tools whose usedBy and the Agents whose tools an Agent's change (or deletion) may change."""
        tools = list(self.tools.get(namespace, {}).values())
        for tool in tools:
            if ref.uses(tool):
                self.queue.add(("tool", namespace, tool["metadata"]["name"]))
        via = tools_calling(ref.name, tools)
        for other in self.agent_refs.get(namespace, {}).values():  # Agents offering this one as a tool
            if other.name != ref.name and other.calls(ref.name, via):
                self._add(("agent", namespace, other.name))

    def _tool_concerns(self, namespace: str, name: str, versions: list[K8sObject]) -> None:
        """The Agents that use a Tool now, or used it before its change."""
        for agent in self.agent_refs.get(namespace, {}).values():
            if name in agent.tools or any(agent.uses(tool) for tool in versions):
                self._add(("agent", namespace, agent.name))

    # ---- the work

    async def start(self) -> None:
        """Watch Agents, Tools and children; once all are listed, reconcile everything once."""
        namespaces: list[str | None] = list(self.settings.namespaces) or [None]
        synced = []
        watches: list[tuple[Resource, Any, Any, str | None]] = [
            (AGENTS, self.agent_seen, self.agent_deleted, None), (TOOLS, self.tool_seen, self.tool_deleted, None),
        ]  # fmt: skip
        for resource in CHILD_KINDS:
            watches.append((resource, functools.partial(self.child_changed, resource),
                            functools.partial(self.child_deleted, resource), MANAGED))  # fmt: skip
        for resource, on_upsert, on_delete, selector in watches:
            for namespace in namespaces:
                listed = asyncio.Event()
                synced.append(listed)
                on_listed = None if selector is None else functools.partial(self._children_listed, resource)
                watching = mirror(
                    kube=self.kube, resource=resource, namespace=namespace, label_selector=selector,
                    on_upsert=on_upsert, on_delete=on_delete, on_listed=on_listed, on_synced=listed.set,
                )  # fmt: skip
                name = f"watch {resource.plural} in {namespace or 'all'}"
                self._tasks.append(asyncio.create_task(watching, name=name))
        self._tasks.append(asyncio.create_task(self._run(synced), name="reconcile"))

    async def stop(self) -> None:
        await cancel_and_wait(*self._tasks)
        self._tasks.clear()
        if self.egress is not None:
            await self.egress.stop()
        await self.queue.stop()

    def _children_listed(self, resource: Resource, items: list[dict[str, Any]]) -> None:
        for body in items:
            self.child_changed(resource, body, listed=True)

    async def _run(self, synced: list[asyncio.Event]) -> None:
        for event in synced:
            await event.wait()
        self.listed.set()
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
        count = 0
        for namespace, tools in self.tools.items():
            for name in tools:
                self.queue.add(("tool", namespace, name))
        for namespace, refs in self.agent_refs.items():
            for name in refs:
                self._add(("agent", namespace, name))
                count += 1
        return count

    async def _work(self, key: Hashable) -> None:
        assert isinstance(key, tuple)
        kind, namespace, name = key
        refs = self.agent_refs.get(namespace, {})
        if kind == "tool":
            tool = self.tools.get(namespace, {}).get(name)
            if tool is not None:
                await self.tool_statuses.write(tool, used_by=used_by(tool, list(refs.values())))
            return
        body = self.agents.get((namespace, name))
        if body is None:  # deleted: its children go with it (owner references), its broker user with this
            await self.reconciler.forget(namespace, name)
            return
        only_status = key in self._only_status
        self._only_status.discard(key)  # news from now on is for the next reconcile
        self.reconciles.labels(work="status" if only_status else "complete").inc()
        inputs = AgentInputs(
            body=body,
            tools=list(self.tools.get(namespace, {}).values()),
            agents=AgentsByName(list(refs.values())),
            fresh_after=max(self._news.get(key, 0.0), self._resync_mark),  # type: ignore[arg-type]
            only_status=only_status,
        )
        await self.reconciler.reconcile(inputs)

    def _add_agents_of(self, namespace: str, names: list[str]) -> None:
        """An egress canary proved something in `namespace`: these Agents' EgressRestricted may change."""
        refs = self.agent_refs.get(namespace, {})
        for name in names:
            if name in refs:
                self._add(("agent", namespace, name), only_status=True)

    def _add_owner(self, resource: Resource, namespace: str, name: str, *, only_status: bool = False) -> None:
        child = self.children.get(resource, namespace, name)
        if child is not None:
            self._add_owner_of(child, only_status=only_status)

    def _add_owner_of(self, child: Child, only_status: bool = False) -> None:
        if child.owner is not None:
            self._add(("agent", child.namespace, child.owner), only_status=only_status)

    def _add(self, key: Key, *, only_status: bool = False) -> None:
        """Queue an Agent: for a complete reconcile, unless only its status may change and nothing else is pending."""
        if only_status and (key in self._only_status or key not in self.queue):
            self._only_status.add(key)
        else:
            self._only_status.discard(key)
        self.queue.add(key)


def _snapshot(body: K8sObject, *, kind: str) -> K8sObject:
    """What a reconcile reads of an object: its kind (Events name it), metadata (without managedFields),
    spec and status. Given, not read: the items of a list carry no kind."""
    metadata = {key: value for key, value in body["metadata"].items() if key != "managedFields"}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": metadata,
            "spec": body.get("spec") or {}, "status": body.get("status") or {}}  # fmt: skip


def _items(mapping: Any) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((mapping or {}).items()))


def register(registry: kopf.OperatorRegistry, runtime: Runtime) -> None:
    """Start and stop the watches and the work with kopf (a fresh registry per operator, so tests can run several)."""

    @kopf.on.startup(registry=registry)
    async def start_reconciling(**_: Any) -> None:
        await runtime.start()

    @kopf.on.cleanup(registry=registry)
    async def stop_reconciling(**_: Any) -> None:
        await runtime.stop()
