"""Level-based reconciliation of one Agent: read, resolve, build, write the difference, report.

Every trigger (the Agent, a Tool, a child, the resync timer) lands here, so the outcome depends only
on what exists, never on which event arrived. A reconcile that finds everything in place writes
nothing: no child patch, no status patch.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from rockbot.kube import errors
from rockbot.kube.client import KubeClient
from rockbot.kube.resources import AGENTS, CONFIGMAPS, DEPLOYMENTS, SECRETS, SERVICEACCOUNTS, SERVICES
from rockbot.operator import builders
from rockbot.operator.broker import BusIdentities, bus_secret_ref
from rockbot.operator.children import ForeignOwner, ensure, ensure_created
from rockbot.operator.conditions import ConditionUpdate, condition_status, merge_conditions
from rockbot.operator.resolving import Resolution, resolve_agent
from rockbot.operator.secret_refs import forbidden_references, secret_references
from rockbot.operator.settings import OperatorSettings
from rockbot.resources import Agent
from rockbot.resources.common import SecretKeyRef

K8sObject = dict[str, Any]
#: Posts a Kubernetes Event on an object: (object, type, reason, message).
EventPoster = Callable[[K8sObject, str, str, str], Awaitable[None] | None]
logger = logging.getLogger(__name__)
#: Longest condition and event message we write (events are cut at 1024 anyway).
MAX_MESSAGE = 1000


class AgentReconciler:
    """Reconciles Agents; serialises work per Agent since many triggers can fire at once."""

    def __init__(self, *, kube: KubeClient, settings: OperatorSettings, post_event: EventPoster) -> None:
        self._kube = kube
        self._settings = settings
        self._post_event = post_event
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._uses: dict[tuple[str, str], set[str]] = {}
        #: Each Agent's identity on the bus (None: no broker management configured, agents get no bus).
        self.bus = BusIdentities.from_settings(kube=kube, settings=settings)

    def uses(self, namespace: str, name: str) -> set[str]:
        """The Tools this Agent used at its last reconcile (a Tool change must reach it, even a removal)."""
        return self._uses.get((namespace, name), set())

    async def reconcile(
        self,
        *,
        namespace: str,
        name: str,
        tools: Iterable[K8sObject],
        agents: Mapping[str, K8sObject],
        now: datetime.datetime | None = None,
    ) -> bool:
        """Bring one Agent's children and status in line with its spec and what it references.

        Returns whether the Agent still exists (a deleted one is forgotten here).
        """
        lock = self._locks.setdefault((namespace, name), asyncio.Lock())
        async with lock:
            try:
                body = await self._kube.get(AGENTS, namespace=namespace, name=name)
            except errors.NotFound:
                if self.bus is not None:
                    await self.bus.forget(namespace=namespace, name=name)
                self._locks.pop((namespace, name), None)
                self._uses.pop((namespace, name), None)
                return False
            if not body["metadata"].get("deletionTimestamp"):
                try:
                    await self._reconcile(body, tools=list(tools), agents=agents, now=now or _now())
                except Exception as error:  # said on the Agent before any other reconcile can succeed
                    await self._report_failure(body, error)
                    raise
            return True

    async def _report_failure(self, body: K8sObject, error: Exception) -> None:
        """Say on the Agent why a reconcile failed: Ready=False (ReconcileFailed) and a Warning event.

        Written only when that is news, so a lasting failure costs no write per retry (and the
        status write, itself an Agent event, cannot start a loop). A report that fails too (no
        right to write status, the server still refusing) is only logged: the caller retries.
        """
        message = failure_message(error)
        conditions = (body.get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        if (ready.get("reason"), ready.get("message")) == ("ReconcileFailed", message):
            return
        update = ConditionUpdate(type="Ready", status="False", reason="ReconcileFailed", message=message)
        [merged] = merge_conditions(conditions, [update], generation=body["metadata"].get("generation"), now=_now())
        others = [c for c in conditions if c.get("type") != "Ready"]
        try:
            await self._kube.patch(
                AGENTS,
                namespace=body["metadata"]["namespace"],
                name=body["metadata"]["name"],
                body={"status": {"conditions": [merged, *others]}},
                subresource="status",
            )
        except Exception as report_error:
            logger.warning("could not report the failure on Agent %s: %s", body["metadata"]["name"], report_error)
            return
        outcome = self._post_event(body, "Warning", update.reason, message)
        if outcome is not None:
            await outcome

    async def _reconcile(
        self, body: K8sObject, *, tools: list[K8sObject], agents: Mapping[str, K8sObject], now: datetime.datetime
    ) -> None:
        agent = Agent.model_validate({"metadata": body["metadata"], "spec": body.get("spec", {})})
        namespace = body["metadata"]["namespace"]
        token_ref = SecretKeyRef(
            name=builders.child_name(agent, builders.HTTP_TOKEN_SUFFIX), key=builders.HTTP_TOKEN_KEY
        )
        references = secret_references(agent, tools=tools)
        found = await self._secrets(namespace, {name for _, name in references})
        forbidden = forbidden_references(agent, references, secrets=found)
        secret_keys = {name: set(secret.get("data") or {}) for name, secret in found.items()}
        bus_ref, bus_secret = None, None
        if self.bus is not None and not forbidden:
            bus_ref, bus_secret = bus_secret_ref(agent), await self.bus.secret(agent)
            secret_keys[bus_ref.name] = set(bus_secret.get("data") or {})
        resolution = resolve_agent(
            agent=agent,
            tools=tools,
            agents=agents,
            secret_keys=secret_keys,
            bus_secret=bus_ref,
            http_token_secret=token_ref,
        )
        self._uses[(namespace, agent.metadata["name"])] = set(resolution.used_tools)
        config_text = builders.render_config(resolution.config)
        blocking = list(resolution.blocking_problems) + forbidden
        deployment: K8sObject | None = None
        if forbidden:  # refused as a whole: nothing is written for it, not even its bus identity
            await self._write_status(body, agent, resolution, blocking=blocking, deployment=None, now=now)
            return
        try:
            token = await ensure_created(
                self._kube,
                SECRETS,
                metadata=builders.http_token_metadata(agent),
                build=lambda: builders.build_http_token_secret(agent, secrets.token_urlsafe(32)),
            )
            await ensure(self._kube, SERVICEACCOUNTS, builders.build_service_account(agent))
            await ensure(self._kube, CONFIGMAPS, builders.build_config_map(agent, config_text))
            await ensure(self._kube, SERVICES, builders.build_service(agent, self._settings))
            wanted = builders.build_deployment(
                agent, resolution, self._settings, config_text, token_checksum=builders.secret_checksum(token),
                bus_checksum=builders.secret_checksum(bus_secret) if bus_secret is not None else "",
            )  # fmt: skip
            deployment = await ensure(self._kube, DEPLOYMENTS, wanted)
        except ForeignOwner as error:
            blocking.append(str(error))
        if self.bus is not None and bus_secret is not None:  # after the pods: they wait for their login
            await self.bus.ensure(agent, config=resolution.config, secret=bus_secret)
        await self._write_status(body, agent, resolution, blocking=blocking, deployment=deployment, now=now)

    async def _secrets(self, namespace: str, names: set[str]) -> dict[str, K8sObject]:
        """The referenced Secrets that exist: their metadata and key names (values are never kept)."""
        found: dict[str, K8sObject] = {}
        for name in sorted(names):
            try:
                secret = await self._kube.get(SECRETS, namespace=namespace, name=name)
            except errors.NotFound:
                continue
            keys = set(secret.get("data") or {}) | set(secret.get("stringData") or {})
            found[name] = {"metadata": secret["metadata"], "data": dict.fromkeys(keys, "")}
        return found

    async def _write_status(
        self,
        body: K8sObject,
        agent: Agent,
        resolution: Resolution,
        *,
        blocking: list[str],
        deployment: K8sObject | None,
        now: datetime.datetime,
    ) -> None:
        generation = body["metadata"].get("generation")
        current = body.get("status") or {}
        wanted_replicas = agent.spec.replicas
        deployed = deployment.get("status", {}) if deployment else {}
        ready_replicas = int(deployed.get("readyReplicas") or 0)
        rolled_out = (
            deployment is not None
            and deployed.get("observedGeneration", 0) >= deployment["metadata"].get("generation", 0)
            and int(deployed.get("updatedReplicas") or 0) >= wanted_replicas
            and ready_replicas >= wanted_replicas
        )
        tools_update = (
            ConditionUpdate(
                type="ToolsResolved",
                status="True",
                reason="AllResolved",
                message=f"{len(resolution.tools)} tools offered to the model",
            )
            if not resolution.tool_problems
            else ConditionUpdate(
                type="ToolsResolved",
                status="False",
                reason="ToolsUnresolved",
                message="; ".join(resolution.tool_problems),
            )
        )
        if blocking:
            ready = ConditionUpdate(
                type="Ready", status="False", reason="ConfigurationIncomplete", message="; ".join(blocking)
            )
        elif rolled_out:
            ready = ConditionUpdate(
                type="Ready",
                status="True",
                reason="DeploymentReady",
                message=f"{ready_replicas}/{wanted_replicas} replicas ready",
            )
        else:
            ready = ConditionUpdate(
                type="Ready",
                status="False",
                reason="DeploymentProgressing",
                message=f"{ready_replicas}/{wanted_replicas} replicas ready",
            )
        conditions = merge_conditions(
            current.get("conditions") or [], [ready, tools_update], generation=generation, now=now
        )
        status = {
            "observedGeneration": generation,
            "conditions": conditions,
            "tools": [tool.to_wire() for tool in resolution.tools],
            "replicas": wanted_replicas,
            "readyReplicas": ready_replicas,
        }
        if all(current.get(key) == value for key, value in status.items()):
            return
        await self._kube.patch(
            AGENTS,
            namespace=body["metadata"]["namespace"],
            name=body["metadata"]["name"],
            body={"status": status},
            subresource="status",
        )
        for update in (ready, tools_update):
            previous = condition_status(current.get("conditions") or [], update.type)
            if previous != update.status:
                event_type = "Normal" if update.status == "True" else "Warning"
                outcome = self._post_event(body, event_type, update.reason, update.message)
                if outcome is not None:
                    await outcome


def failure_message(error: Exception) -> str:
    """What went wrong, for status and events: the API server's answer, never a request body (no secrets)."""
    if isinstance(error, errors.ApiError):
        text = f"the API server answered {error.status} {error.reason}: {error.message}"
    else:
        text = f"{type(error).__name__}: {error}"
    text = f"reconcile failed, retrying with backoff: {text}"
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)
