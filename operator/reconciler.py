"""Level-based reconciliation of one Agent: resolve, build, write the difference, report.

Every trigger (the Agent, a Tool, a child, the resync pass) lands here, so the outcome depends only
on what exists, never on which event arrived. What exists is what the watches show (the Agent and
its namespace's Tools and Agents from kopf's indices, the children from the operator's own
watches) and what Secrets were read when that could matter (see `secret_keys`): a reconcile that
finds everything in place makes no request at all, and no write.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rockbot.contracts.agent_config import RunPolicy
from rockbot.kube import errors
from rockbot.kube.client import KubeClient
from rockbot.kube.resources import AGENTS, CONFIGMAPS, DEPLOYMENTS, SECRETS, SERVICEACCOUNTS, SERVICES
from rockbot.operator import builders
from rockbot.operator.broker import BUS_SUFFIX, BusIdentities, bus_secret_ref
from rockbot.operator.children import Children, ForeignOwner, Rollout, ensure, ensure_created
from rockbot.operator.conditions import (
    SCALED_TO_ZERO,
    ConditionUpdate,
    StatusMemory,
    condition_status,
    merge_conditions,
)
from rockbot.operator.egress_canary import EgressCanaries
from rockbot.operator.resolving import Resolution, resolve_agent
from rockbot.operator.secret_keys import SecretFacts, SecretKeys
from rockbot.operator.secret_refs import forbidden_references, secret_references
from rockbot.operator.settings import OperatorSettings
from rockbot.reachability import CONDITION
from rockbot.resources import Agent
from rockbot.resources.common import SecretKeyRef
from rockbot.telemetry import tracer

K8sObject = dict[str, Any]
#: Posts a Kubernetes Event on an object: (object, type, reason, message).
EventPoster = Callable[[K8sObject, str, str, str], Awaitable[None]]
logger = logging.getLogger(__name__)
#: Longest condition and event message we write (events are cut at 1024 anyway).
MAX_MESSAGE = 1000
#: The children named as their Agent (`rockbot-<agent>`): an Agent none of which exist is new, or made anew.
CHILD_RESOURCES = (SERVICEACCOUNTS, SERVICES, DEPLOYMENTS)
#: Reasons of a condition not True that are a step on the way (or what a person asked for), not news worth an Event.
UNEVENTFUL = {"DeploymentProgressing", SCALED_TO_ZERO, "CanaryPending"}


@dataclass(frozen=True, kw_only=True)
class AgentInputs:
    """What one reconcile reads, all from memory: the Agent, its namespace's Tools and Agents."""

    body: K8sObject
    tools: list[K8sObject]
    agents: Mapping[str, K8sObject]  # by name; at least metadata.name and spec.description
    #: Secrets read before this (loop time) may be out of date for this Agent: it changed since.
    fresh_after: float
    #: Nothing changed since the last reconcile but the Agent's Deployment's rollout or an egress proof:
    #: only its status is computed again (the children, Secrets and broker were compared then).
    only_status: bool = False


@dataclass(frozen=True, kw_only=True)
class Reconciled:
    """What an Agent's status is made of besides its Deployment's rollout, as a complete reconcile found it.

    Kept per Agent for status-only reconciles, so only the little the status needs (not the Agent's model
    or resolved config, some 25 KB an Agent).
    """

    generation: int | None
    deployment: str
    replicas: int
    labels: dict[str, str]
    owner: K8sObject
    tools: list[K8sObject]  # as the status lists them
    tool_problems: tuple[str, ...]
    blocking: tuple[str, ...]

    @classmethod
    def of(cls, body: K8sObject, agent: Agent, resolution: Resolution, *, blocking: list[str]) -> Reconciled:
        return cls(
            generation=body["metadata"].get("generation"), deployment=builders.child_name(agent),
            replicas=agent.spec.replicas, labels=builders.labels(agent), owner=builders.owner_reference(agent),
            tools=[tool.to_wire() for tool in resolution.tools], tool_problems=tuple(resolution.tool_problems),
            blocking=tuple(blocking),
        )  # fmt: skip


class AgentReconciler:
    """Reconciles Agents one at a time each (the work queue sees to that); remembers what it wrote."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        settings: OperatorSettings,
        post_event: EventPoster,
        children: Children,
        secret_keys: SecretKeys,
        egress: EgressCanaries | None = None,
    ) -> None:
        self._kube = kube
        self._egress = egress
        self._settings = settings
        self._post_event = post_event
        self._children = children
        self._secrets = secret_keys
        self._statuses = StatusMemory()
        #: Each Agent's last complete reconcile, by (namespace, name); gone when one fails.
        self._reconciled: dict[tuple[str, str], Reconciled] = {}
        #: Each Agent's identity on the bus (None: no broker management configured, agents get no bus).
        self.bus = BusIdentities.from_settings(kube=kube, settings=settings)

    async def forget(self, namespace: str, name: str) -> None:
        """The Agent is gone: forget what was kept for it, and its broker user and inbox."""
        self._statuses.forget(namespace, name)
        self._reconciled.pop((namespace, name), None)
        self._forget_credentials(namespace, name)
        if self._egress is not None:
            self._egress.forget(namespace, name)
        if self.bus is not None:
            await self.bus.forget(namespace=namespace, name=name)

    async def reconcile(self, inputs: AgentInputs, *, now: datetime.datetime | None = None) -> None:
        """Bring one Agent's children and status in line with its spec and what it references."""
        body = inputs.body
        if body["metadata"].get("deletionTimestamp"):
            return
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        try:
            with tracer.start_as_current_span("reconcile Agent", attributes={
                "k8s.namespace.name": namespace, "gen_ai.agent.name": name,
                "rockbot.agent.generation": body["metadata"].get("generation", 0),
            }):  # fmt: skip
                await self._reconcile(inputs, now=now or _now())
        except Exception as error:  # said on the Agent before any other reconcile can succeed
            self._reconciled.pop((namespace, name), None)  # the retry is complete
            self._forget_credentials(namespace, name)  # the retry reads them (and the broker) again
            await self._report_failure(body, error)
            raise

    def _forget_credentials(self, namespace: str, name: str) -> None:
        """Forget what is known of the Agent's HTTP token and bus Secrets."""
        for suffix in (builders.HTTP_TOKEN_SUFFIX, BUS_SUFFIX):
            self._secrets.forget(namespace, builders.child_name_of(name, suffix))

    async def _reconcile(self, inputs: AgentInputs, *, now: datetime.datetime) -> None:
        body = inputs.body
        namespace, key = body["metadata"]["namespace"], (body["metadata"]["namespace"], body["metadata"]["name"])
        last = self._reconciled.pop(key, None)
        if inputs.only_status and last is not None and last.generation == body["metadata"].get("generation"):
            deployment = self._children.get(DEPLOYMENTS, namespace, last.deployment)
            if deployment is not None:  # else it is gone: made again below
                await self._write_status(body, last, rollout=deployment.rollout, now=now)
                self._reconciled[key] = last
                return
        agent = Agent.model_validate({"metadata": body["metadata"], "spec": body.get("spec", {})})
        token_ref = SecretKeyRef(
            name=builders.child_name(agent, builders.HTTP_TOKEN_SUFFIX), key=builders.HTTP_TOKEN_KEY
        )
        references = secret_references(agent, tools=inputs.tools)
        new = not self._children.has_any(namespace, builders.child_name(agent), kinds=CHILD_RESOURCES)
        found: dict[str, SecretFacts] = {}
        for name in sorted({name for _, name in references}):
            facts = await self._secrets.facts(namespace, name, fresh_after=inputs.fresh_after)
            if facts.keys is not None:
                found[name] = facts
        forbidden = forbidden_references(agent, references, secrets={n: f.as_found() for n, f in found.items()})
        secret_keys = {name: set(facts.keys or ()) for name, facts in found.items()}
        bus_ref, bus_secret, bus_login = None, None, None
        if self.bus is not None and not forbidden:
            bus_ref = bus_secret_ref(agent)
            bus_secret, bus_login = await self._bus_secret(agent, fresh_after=inputs.fresh_after, likely_new=new)
            secret_keys[bus_ref.name] = set(bus_secret.keys or ())
        resolution = resolve_agent(
            agent=agent,
            tools=inputs.tools,
            agents=inputs.agents,
            secret_keys=secret_keys,
            bus_secret=bus_ref,
            http_token_secret=token_ref,
            default_runs=RunPolicy(record=self._settings.runs_record,
                                   retention_days=self._settings.runs_retention_days),
            private_networks=self._settings.private_networks,
        )
        config_text = builders.render_config(resolution.config)
        blocking = list(resolution.blocking_problems) + forbidden
        if forbidden:  # refused as a whole: nothing is written for it, not even its bus identity
            await self._write_status(body, Reconciled.of(body, agent, resolution, blocking=blocking), rollout=None,
                                     now=now)  # fmt: skip
            return
        children = self._ensure_children(agent, resolution, config_text, inputs=inputs, likely_new=new,
                                         bus_checksum=bus_secret.checksum or "" if bus_secret is not None else "")
        if self.bus is not None and bus_login is not None:
            # The broker's user and queues while the children are written: neither waits for the other (the pods
            # wait for their login), so a new Agent's reconcile takes the longer of the two, not their sum.
            outcomes = await asyncio.gather(children, self._ensure_bus(agent, resolution, login=bus_login),
                                            return_exceptions=True)  # fmt: skip
            for outcome in outcomes:
                if isinstance(outcome, BaseException):
                    raise outcome
            rollout, refused = outcomes[0]  # type: ignore[misc]
        else:
            rollout, refused = await children
        blocking += refused
        found = Reconciled.of(body, agent, resolution, blocking=blocking)
        await self._write_status(body, found, rollout=rollout, now=now)
        if rollout is not None:
            self._reconciled[key] = found

    async def _ensure_children(
        self, agent: Agent, resolution: Resolution, config_text: str, *, inputs: AgentInputs, likely_new: bool,
        bus_checksum: str,
    ) -> tuple[Rollout | None, list[str]]:
        """The children written where they differ: the Deployment's rollout (None if not made) and what blocks it.

        What the pods use (their identity, config, Service and token) at once, then the pods: a request's
        wait is not multiplied by the children, and a pod never runs with a stranger's object of those.
        """
        outcomes = await asyncio.gather(
            self._token_checksum(agent, fresh_after=inputs.fresh_after, likely_new=likely_new),
            ensure(self._kube, self._children, SERVICEACCOUNTS, builders.build_service_account(agent)),
            ensure(self._kube, self._children, CONFIGMAPS, builders.build_config_map(agent, config_text)),
            ensure(self._kube, self._children, SERVICES, builders.build_service(agent, self._settings)),
            return_exceptions=True,
        )
        failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        blocking = [str(failure) for failure in failures if isinstance(failure, ForeignOwner)]
        for failure in failures:
            if not isinstance(failure, ForeignOwner):
                raise failure
        if failures:
            return None, blocking
        checksum = outcomes[0]
        assert isinstance(checksum, str)
        wanted = builders.build_deployment(agent, resolution, self._settings, config_text, token_checksum=checksum,
                                           bus_checksum=bus_checksum)  # fmt: skip
        try:
            return (await ensure(self._kube, self._children, DEPLOYMENTS, wanted)).rollout, blocking
        except ForeignOwner as error:
            return None, [*blocking, str(error)]

    async def _bus_secret(
        self, agent: Agent, *, fresh_after: float, likely_new: bool
    ) -> tuple[SecretFacts, K8sObject | None]:
        """The agent's bus Secret (made once by `BusIdentities`): read, with its login, only when the Agent has
        news (then its broker user is ensured too); else what is known of it."""
        namespace, name = agent.metadata["namespace"], bus_secret_ref(agent).name
        known = self._secrets.known(namespace, name, fresh_after=fresh_after)
        if known is not None and known.keys is not None:
            return known, None
        assert self.bus is not None
        started = asyncio.get_running_loop().time()
        login = await self.bus.secret(agent, likely_new=likely_new)
        return self._secrets.saw(namespace, login, read_at=started), login

    async def _ensure_bus(self, agent: Agent, resolution: Resolution, *, login: K8sObject) -> None:
        """The agent's broker user, permissions and inbox (compared, then written if they differ)."""
        assert self.bus is not None
        await self.bus.ensure(agent, config=resolution.config, secret=login)

    async def _token_checksum(self, agent: Agent, *, fresh_after: float, likely_new: bool) -> str:
        """The checksum of the agent's HTTP token Secret, created first if missing (generated once).

        Read only when the Agent has news (a recreated Secret must roll its pods); else what is known.
        """
        metadata = builders.http_token_metadata(agent)
        namespace, name = metadata["namespace"], metadata["name"]
        known = self._secrets.known(namespace, name, fresh_after=fresh_after)
        if known is not None and known.checksum is not None:
            return known.checksum
        started = asyncio.get_running_loop().time()
        token = await ensure_created(
            self._kube,
            SECRETS,
            metadata=metadata,
            build=lambda: builders.build_http_token_secret(agent, secrets.token_urlsafe(32)),
            likely_new=likely_new,
        )
        return self._secrets.saw(namespace, token, read_at=started).checksum or ""

    async def _report_failure(self, body: K8sObject, error: Exception) -> None:
        """Say on the Agent why a reconcile failed: Ready=False (ReconcileFailed) and a Warning event.

        Written only when that is news, so a lasting failure costs no write per retry (and the
        status write, itself an Agent event, cannot start a loop). A report that fails too (no
        right to write status, the server still refusing) is only logged: the caller retries.
        """
        message = failure_message(error)
        status = self._statuses.current(body)
        conditions = status.get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        if (ready.get("reason"), ready.get("message")) == ("ReconcileFailed", message):
            return
        update = ConditionUpdate(type="Ready", status="False", reason="ReconcileFailed", message=message)
        [merged] = merge_conditions(conditions, [update], generation=body["metadata"].get("generation"), now=_now())
        others = [c for c in conditions if c.get("type") != "Ready"]
        try:
            await self._patch_status(body, {"conditions": [merged, *others]})
        except Exception as report_error:
            logger.warning("could not report the failure on Agent %s: %s", body["metadata"]["name"], report_error)
            return
        await self._tell(body, "Warning", update.reason, message)

    async def _write_status(
        self, body: K8sObject, found: Reconciled, *, rollout: Rollout | None, now: datetime.datetime
    ) -> None:
        generation = body["metadata"].get("generation")
        current = self._statuses.current(body)
        tools_update = (
            ConditionUpdate(
                type="ToolsResolved",
                status="True",
                reason="AllResolved",
                message=f"{len(found.tools)} tools offered to the model",
            )
            if not found.tool_problems
            else ConditionUpdate(
                type="ToolsResolved",
                status="False",
                reason="ToolsUnresolved",
                message="; ".join(found.tool_problems),
            )
        )
        wanted_replicas = found.replicas
        ready_replicas = rollout.ready if rollout is not None else 0
        ready = readiness(wanted_replicas=wanted_replicas, rollout=rollout, blocking=list(found.blocking))
        updates = [ready, tools_update]
        if self._egress is not None:
            shown = next((c for c in current.get("conditions") or [] if c.get("type") == CONDITION), None)
            updates.append(self._egress.condition(
                namespace=body["metadata"]["namespace"], name=body["metadata"]["name"], labels=found.labels,
                owner=found.owner, shown=shown,
            ))  # fmt: skip
        conditions = merge_conditions(current.get("conditions") or [], updates, generation=generation, now=now)
        status = {
            "observedGeneration": generation,
            "conditions": conditions,
            "tools": found.tools,
            "toolCount": len(found.tools),
            "replicas": wanted_replicas,
            "readyReplicas": ready_replicas,
        }
        if all(current.get(key) == value for key, value in status.items()):
            return
        await self._patch_status(body, status)
        for update in updates:
            previous = condition_status(current.get("conditions") or [], update.type)
            if previous == update.status or (update.status != "True" and update.reason in UNEVENTFUL):
                continue
            event_type = "Normal" if update.status == "True" else "Warning"
            await self._tell(body, event_type, update.reason, update.message)

    async def _tell(self, body: K8sObject, event_type: str, reason: str, message: str) -> None:
        """An Event on the Agent, and the same news as a log record naming the Agent (`object` in JSON logs)."""
        metadata = body["metadata"]
        about = {"apiVersion": body["apiVersion"], "kind": body["kind"], "namespace": metadata["namespace"],
                 "name": metadata["name"], "uid": metadata.get("uid")}  # fmt: skip
        logger.info("%s %s: %s", event_type, reason, message, extra={"k8s_ref": about})
        await self._post_event(body, event_type, reason, message)

    async def _patch_status(self, body: K8sObject, status: K8sObject) -> None:
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        await self._kube.patch(AGENTS, namespace=namespace, name=name, body={"status": status}, subresource="status")
        self._statuses.wrote(body, status)


def readiness(*, wanted_replicas: int, rollout: Rollout | None, blocking: list[str]) -> ConditionUpdate:
    """The Ready condition: True when every wanted replica runs the current template.

    An Agent scaled to zero is not Ready: nothing serves it or reads its inbox (its ScheduledTasks
    skip their slots, see the scheduler), and `kubectl get agents` should not say otherwise.
    """
    ready_replicas = rollout.ready if rollout is not None else 0
    counts = f"{ready_replicas}/{wanted_replicas} replicas ready"
    if blocking:
        message = "; ".join(blocking)
        return ConditionUpdate(type="Ready", status="False", reason="ConfigurationIncomplete", message=message)
    if wanted_replicas == 0:
        return ConditionUpdate(
            type="Ready", status="False", reason=SCALED_TO_ZERO,
            message="spec.replicas is 0: no pod serves the agent or reads its inbox, and its ScheduledTasks skip "
            "their slots; set spec.replicas to 1 or more to use it",
        )  # fmt: skip
    rolled_out = (
        rollout is not None
        and rollout.observed_generation >= rollout.generation
        and rollout.updated >= wanted_replicas
        and rollout.ready >= wanted_replicas
    )
    if rolled_out:
        return ConditionUpdate(type="Ready", status="True", reason="DeploymentReady", message=counts)
    return ConditionUpdate(type="Ready", status="False", reason="DeploymentProgressing", message=counts)


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
