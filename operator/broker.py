"""Each Agent's own identity on the bus, provisioned by the operator (see `rockbot.bus.identity`).

Per Agent: a Secret `rockbot-<agent>-bus` owned by the Agent (the password generated once; key
`amqp-url`, the broker's address for agents with the agent's own login), wired into that agent's
pods only; the broker user `agent.<namespace>.<name>` with the permissions `permissions_for` derives
from the agents it calls (its resolved config) and the principals that call it (the operator, the
gateway, the console, the Agents whose resolved configs call it); and its queues, with fixed arguments (agents
declare nothing themselves): its inbox, declared before the agent starts so nothing sent to it is
lost, and the reply slots its replicas claim (`topology.reply_slots`). Everything is compared before
it is written: a settled Agent costs reads only, no Kubernetes write and no broker write.

An Agent's calls are remembered from its last reconcile: when they change, the agents it started or
stopped calling get their permissions updated at once (they may now answer it, or no longer), without
a reconcile of their own. After a restart every Agent's first reconcile does the same, so the
permissions settle within the first pass.

A deleted Agent's user and inbox go with it; users of Agents deleted while the operator was down are
swept at start-up and at every resync (the operator keeps no finalizers, so nothing else would tell).
It also files every dead letter into its sender's own record (`rockbot.bus.deadletters`).
At start-up the operator also makes the exchange, the fixed work queues, the dead-letter queue and
the users of the operator, the scripts-manager, the gateway and the console (passwords from the Secrets the chart
generates).
The admin login is used for these management calls only.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import secrets
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

import aio_pika
import kopf
from yarl import URL

from rockbot.bus import CONSOLE, GATEWAY, OPERATOR, SCRIPTS_MANAGER, BusError, Principal
from rockbot.bus.admin import AGENT_TAG, BrokerAdmin, callees, ensure_principal, forget_principal
from rockbot.bus.deadletters import DeadLetterKeeper
from rockbot.bus.management import RabbitAdmin
from rockbot.bus.permissions import permissions_for
from rockbot.contracts.agent_config import AgentConfig
from rockbot.health import Readiness, wait_for_dependency
from rockbot.kube import SECRETS, ApiError, KubeClient
from rockbot.operator import builders
from rockbot.operator.children import ensure_created
from rockbot.operator.settings import OperatorSettings
from rockbot.resources import Agent
from rockbot.resources.common import SecretKeyRef
from rockbot.tasks import cancel_and_wait

K8sObject = dict[str, Any]
log = logging.getLogger(__name__)

BUS_SUFFIX = "-bus"
BUS_KEY = "amqp-url"


def bus_secret_ref(agent: Agent) -> SecretKeyRef:
    return SecretKeyRef(name=builders.child_name(agent, BUS_SUFFIX), key=BUS_KEY)


def build_bus_secret(agent: Agent, url: str) -> K8sObject:
    """The agent's own broker login, as the URL its pods connect with."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(agent),
        "type": "Opaque",
        "data": {BUS_KEY: base64.b64encode(url.encode()).decode()},
    }


def _metadata(agent: Agent) -> K8sObject:
    return {
        "name": bus_secret_ref(agent).name,
        "namespace": agent.metadata["namespace"],
        "labels": builders.labels(agent),
        "ownerReferences": [builders.owner_reference(agent)],
    }


def principal_of(agent: Agent) -> Principal:
    return Principal.agent(namespace=agent.metadata["namespace"], name=agent.metadata["name"])


class BusIdentities:
    """Provisions the broker for the Agents one operator watches; `None` from `from_settings` when it is not set up."""

    def __init__(self, *, kube: KubeClient, admin: BrokerAdmin, agent_url: URL, settings: OperatorSettings) -> None:
        self._kube = kube
        self._admin = admin
        self._keeper: DeadLetterKeeper | None = None
        self._agent_url = agent_url
        self._settings = settings
        #: Each reconciled Agent's calls (from its resolved config), so its callees' permissions follow.
        self._calls: dict[Principal, frozenset[Principal]] = {}
        #: The same, the other way round: who calls each agent (an Agent's reconcile needs its callers, not a scan of
        #: every Agent's calls, which made N Agents' reconciles cost N x N).
        self._called_by: dict[Principal, set[Principal]] = {}
        self._locks: dict[Principal, asyncio.Lock] = {}

    @classmethod
    def from_settings(cls, *, kube: KubeClient, settings: OperatorSettings) -> BusIdentities | None:
        if not settings.broker_management_url:
            return None
        address = settings.broker_agent_url or settings.amqp_url
        if not address:
            raise ValueError(
                "ROCKBOT_BROKER_MANAGEMENT_URL is set but the agents' broker address is not: set "
                "ROCKBOT_BROKER_AGENT_URL (amqp://host:5672/vhost) or ROCKBOT_AMQP_URL"
            )
        agent_url = URL(address).with_user(None)
        password = settings.broker_admin_password.get_secret_value() if settings.broker_admin_password else ""
        admin = RabbitAdmin(
            url=settings.broker_management_url, username=settings.broker_admin_username, password=password,
            vhost=agent_url.path[1:] or "/",
        )  # fmt: skip
        return cls(kube=kube, admin=admin, agent_url=agent_url, settings=settings)

    async def close(self) -> None:
        if self._keeper is not None:
            await self._keeper.close()
        if isinstance(self._admin, RabbitAdmin):
            await self._admin.close()

    async def keep_dead_letters(self) -> None:
        """File every dead letter into its sender's record (RabbitMQ only; the memory broker files its own)."""
        url = self._settings.amqp_url
        if url and isinstance(self._admin, RabbitAdmin) and self._keeper is None:
            keeper = DeadLetterKeeper(url=url, user=OPERATOR.user, admin=self._admin)
            await keeper.start()
            self._keeper = keeper

    async def start(self) -> None:
        """The topology and the service users (the operator's own, the scripts-manager's)."""
        await self._admin.ensure_topology()
        logins = [(OPERATOR, self._settings.amqp_url)]
        for service, url in ((SCRIPTS_MANAGER, self._settings.scripts_manager_amqp_url),
                             (GATEWAY, self._settings.gateway_amqp_url), (CONSOLE, self._settings.console_amqp_url)):
            if url is not None:
                logins.append((service, url.get_secret_value()))
        for principal, url in logins:
            if not url:
                continue
            login = URL(url)
            if login.user != principal.user:
                raise ValueError(
                    f"the {principal.name} logs in as {login.user!r}: its AMQP URL must log in as {principal.user}"
                )
            await ensure_principal(self._admin, principal, password=login.password or "")
        log.info("broker provisioned: exchange, work queues, dead letters, service users")

    async def secret(self, agent: Agent, *, likely_new: bool = False) -> K8sObject:
        """The agent's bus Secret, made once with a new password and never rewritten.

        Its URL keeps the broker's address of that moment: after moving the broker, delete the Agents'
        `rockbot-<agent>-bus` Secrets and each is made anew (a new password too) at its next reconcile.
        """
        principal = principal_of(agent)
        return await ensure_created(
            self._kube, SECRETS, metadata=_metadata(agent),
            build=lambda: build_bus_secret(agent, self._login(principal, secrets.token_urlsafe(32))),
            likely_new=likely_new,
        )  # fmt: skip

    async def ensure(self, agent: Agent, *, config: AgentConfig, secret: K8sObject) -> None:
        """The agent's user (password from `secret`), its permissions, its inbox; then its callees' permissions."""
        principal = principal_of(agent)
        calls = frozenset(callees(config))
        previous = self._calls.get(principal)
        self._set_calls(principal, calls)
        async with self._lock(principal):
            if await ensure_principal(
                self._admin, principal, password=_password(secret), calls=calls, called_by=self._callers(principal),
                replicas=agent.spec.replicas,
            ):
                log.info("provisioned the broker user and inbox of Agent %s", principal.agent_id)
        for callee in calls if previous is None else calls ^ previous:
            await self._update_permissions(callee)

    async def forget(self, *, namespace: str, name: str) -> None:
        """The Agent is gone: so are its user and inbox, and its callees stop answering it."""
        principal = Principal.agent(namespace=namespace, name=name)
        calls = self._calls.get(principal, frozenset())
        self._set_calls(principal, None)
        async with self._lock(principal):
            if await forget_principal(self._admin, principal):
                log.info("deleted the broker user and inbox of Agent %s/%s", namespace, name)
        self._locks.pop(principal, None)
        for callee in calls:
            await self._update_permissions(callee)

    async def sweep(self, existing: Callable[[], Collection[tuple[str, str]]]) -> None:
        """Forget the users of Agents that no longer exist (deleted while the operator was down).

        `existing()`: the (namespace, name) of every Agent the operator's complete watch shows, asked
        after the users are listed (a user made after that list is not swept); no list of every Agent
        from the API server, which cost a twentieth of the operator's CPU at 500 Agents.
        """
        users = await self._admin.users(tag=AGENT_TAG)
        watched = self._settings.namespaces
        agents = set(existing())
        for user in sorted(users):
            principal = Principal.parse(user)
            if principal is None or principal.kind != "agent" or (watched and principal.namespace not in watched):
                continue
            if (principal.namespace, principal.name) not in agents:
                await self.forget(namespace=principal.namespace, name=principal.name)

    def _callers(self, principal: Principal) -> list[Principal]:
        calling = sorted(self._called_by.get(principal, ()))
        return [OPERATOR, GATEWAY, CONSOLE, *calling]  # the console: people's chats, answered on its own queues

    async def _update_permissions(self, principal: Principal) -> None:
        """Recompute a reconciled agent's permissions from what is known now (its callers changed)."""
        if principal not in self._calls:
            return  # not reconciled yet: its own reconcile will see its callers
        async with self._lock(principal):
            permissions = permissions_for(
                principal, calls=self._calls[principal], called_by=self._callers(principal)
            )
            if await self._admin.ensure_permissions(user=principal.user, permissions=permissions):
                log.info("provisioned the broker permissions of Agent %s (its callers changed)", principal.agent_id)

    def _set_calls(self, principal: Principal, calls: frozenset[Principal] | None) -> None:
        """What `principal` calls now (None: it is gone), in both directions."""
        previous = self._calls.pop(principal, frozenset())
        for callee in previous - (calls or frozenset()):
            callers = self._called_by.get(callee)
            if callers is not None:
                callers.discard(principal)
                if not callers:
                    del self._called_by[callee]
        if calls is not None:
            self._calls[principal] = calls
            for callee in calls:
                self._called_by.setdefault(callee, set()).add(principal)

    def _lock(self, principal: Principal) -> asyncio.Lock:
        return self._locks.setdefault(principal, asyncio.Lock())

    def _login(self, principal: Principal, password: str) -> str:
        return str(self._agent_url.with_user(principal.user).with_password(password))


def _password(secret: K8sObject) -> str:
    encoded = (secret.get("data") or {}).get(BUS_KEY, "")
    return URL(base64.b64decode(encoded).decode()).password or ""


class _RuntimeLike(Protocol):
    settings: OperatorSettings
    reconciler: Any
    #: Every Agent the watch shows, by (namespace, name), once `listed` is set.
    agents: Mapping[tuple[str, str], Any]
    listed: asyncio.Event


def register_broker(registry: kopf.OperatorRegistry, runtime: _RuntimeLike, *, readiness: Readiness) -> None:
    """Provision the broker at start-up (retrying until its management API answers), then sweep every resync."""
    identities: BusIdentities | None = runtime.reconciler.bus
    running: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def provision_broker(**_: Any) -> None:
        if identities is None:
            log.warning("no ROCKBOT_BROKER_MANAGEMENT_URL: Agents get no broker login, so their pods run without a "
                        "bus (no inbox, scripts or sub-agents); set it and ROCKBOT_BROKER_ADMIN_PASSWORD")
            return
        keeping = _keep_provisioned(identities, readiness=readiness, every=runtime.settings.resync_seconds,
                                    runtime=runtime)
        running.append(asyncio.create_task(keeping, name="provision the broker"))

    @kopf.on.cleanup(registry=registry)
    async def stop_provisioning(**_: Any) -> None:
        await cancel_and_wait(*running)
        if identities is not None:
            await identities.close()


async def _keep_provisioned(
    identities: BusIdentities, *, readiness: Readiness, every: float, runtime: _RuntimeLike
) -> None:
    await wait_for_dependency(
        identities.start, readiness=readiness, dependency="broker provisioning", retry_on=(BusError, ValueError)
    )
    await wait_for_dependency(identities.keep_dead_letters, readiness=readiness, dependency="dead-letter records",
                              retry_on=(BusError, OSError, aio_pika.exceptions.AMQPError))  # fmt: skip
    await runtime.listed.wait()
    while True:
        try:
            await identities.sweep(lambda: list(runtime.agents))
        except (BusError, ApiError) as exc:
            log.warning("sweeping the broker users of deleted Agents failed (%s); trying again at the next resync", exc)
        await asyncio.sleep(every)
