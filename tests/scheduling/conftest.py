"""The scheduler against the API emulator and an in-memory bus, on a driven clock; a scripted agent."""

from __future__ import annotations

import base64
import datetime
import secrets
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client as k8s_client

from rockbot.bus import OPERATOR, Bus, Delivery, MemoryBroker, MemoryBus, Principal, Subscription
from rockbot.bus.topology import agent_inbox
from rockbot.clock import ManualClock
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.kube import AGENTS, SCHEDULED_TASKS, SECRETS, KubeClient
from rockbot.operator.builders import HTTP_TOKEN_KEY as TOKEN_KEY
from rockbot.operator.scheduling.agent_requests import token_secret_name
from rockbot.operator.scheduling.firing import Scheduler
from tests.buses import login
from tests.fixtures.kubeapi import client_for
from tests.kubeapi import KubeApiEmulator
from tests.scheduling.faulty_link import FaultyLink

T = TypeVar("T")
START = datetime.datetime(2024, 5, 1, 10, 20, tzinfo=datetime.UTC)


class FakeAgent:
    """Consumes one agent's inbox like the agent runtime does; answers at once unless `hold` is set."""

    def __init__(self, *, bus: Bus, namespace: str, name: str) -> None:
        self.bus = bus
        self.queue = agent_inbox(namespace=namespace, name=name)
        self.received: list[InboxRequest] = []
        self.hold = False
        self.held: list[Delivery] = []
        self._subscription: Subscription | None = None

    async def start(self) -> FakeAgent:
        self._subscription = await self.bus.consume(queue=self.queue, handler=self._handle, prefetch=64)
        return self

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()

    async def _handle(self, delivery: Delivery) -> None:
        request = delivery.decode(InboxRequest)
        self.received.append(request)
        if self.hold:
            self.held.append(delivery)
        else:
            await self.answer(delivery)

    async def answer(self, delivery: Delivery, text: str | None = None) -> None:
        request = delivery.decode(InboxRequest)
        reply = InboxReply(request_id=request.request_id, session_id=request.session_id,
                           answer=text or f"done: {request.content}", run_id="agent-run-1")
        await self.bus.reply(to=delivery, body=reply)


class Cluster:
    """The API emulator as seen by a test: create agents (with their token Secrets) and tasks, read tasks back."""

    def __init__(self, *, kube: KubeClient, emulator: KubeApiEmulator) -> None:
        self.kube = kube
        self.emulator = emulator
        self.tokens: dict[str, str] = {}  # agent name -> its token, as the reconciler would generate it

    async def agent(self, name: str = "helper", *, ready: bool = True, namespace: str = "default") -> dict[str, Any]:
        body = await self.kube.create(AGENTS, namespace=namespace, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent",
            "metadata": {"name": name},
            "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m",
                               "apiKeySecretRef": {"name": "llm", "key": "apiKey"}}},
        })
        await self.kube.create(SECRETS, namespace=namespace, body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": token_secret_name(agent=name)},
            "stringData": {TOKEN_KEY: secrets.token_urlsafe(32)},
        })
        await self.read_token(name, namespace=namespace)
        return await self.set_agent_ready(name, ready=ready, namespace=namespace) if ready else body

    async def read_token(self, name: str, *, namespace: str = "default") -> str:
        """The agent's token as the API stores it now (after the Secret was replaced, too)."""
        secret = await self.kube.get(SECRETS, namespace=namespace, name=token_secret_name(agent=name))
        self.tokens[name] = base64.b64decode(secret["data"][TOKEN_KEY]).decode()
        return self.tokens[name]

    async def set_agent_ready(self, name: str, *, ready: bool, namespace: str = "default") -> dict[str, Any]:
        condition = {"type": "Ready", "status": "True" if ready else "False",
                     "reason": "DeploymentReady" if ready else "DeploymentProgressing",
                     "message": "1/1 replicas ready" if ready else "0/1 replicas ready",
                     "lastTransitionTime": "2024-05-01T00:00:00Z"}
        return await self.kube.patch(AGENTS, namespace=namespace, name=name, subresource="status",
                                     body={"status": {"conditions": [condition]}})

    async def task(self, name: str = "report", *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
        return await self.kube.create(SCHEDULED_TASKS, namespace=namespace, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask",
            "metadata": {"name": name},
            "spec": {"agentRef": {"name": "helper"}, "schedule": "0 * * * *", "prompt": "Write the report."} | spec,
        })

    async def edit(self, name: str = "report", *, namespace: str = "default", **spec: Any) -> dict[str, Any]:
        return await self.kube.patch(SCHEDULED_TASKS, namespace=namespace, name=name, body={"spec": spec})

    async def status(self, name: str = "report", *, namespace: str = "default") -> dict[str, Any]:
        return (await self.kube.get(SCHEDULED_TASKS, namespace=namespace, name=name)).get("status") or {}


@pytest.fixture
async def cluster(kube_api: KubeApiEmulator) -> AsyncIterator[Cluster]:
    async with client_for(kube_api) as kube:
        yield Cluster(kube=kube, emulator=kube_api)


@pytest.fixture
async def faulty_link(kube_api: KubeApiEmulator) -> AsyncIterator[FaultyLink]:
    """A relay in front of the emulator that drops connections on demand (see `FaultyLink`)."""
    async with FaultyLink(target_port=urllib.parse.urlsplit(str(kube_api.url)).port or 80).running() as link:
        yield link


@pytest.fixture
async def faulty_kube(faulty_link: FaultyLink) -> AsyncIterator[KubeClient]:
    """A client that reaches the emulator through `faulty_link`."""
    configuration = k8s_client.Configuration(host=faulty_link.url)
    async with KubeClient(api_client=k8s_client.ApiClient(configuration)) as client:
        yield client


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
def wall_clock() -> ManualClock:
    """The operator's wall clock, which judges a request's `issued_at`: now, until a test moves it."""
    return ManualClock(datetime.datetime.now(datetime.UTC))


@pytest.fixture
def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
async def operator_bus(broker: MemoryBroker) -> AsyncIterator[MemoryBus]:
    """The operator's connection (it fires tasks and answers scheduling requests)."""
    async with await login(broker, OPERATOR) as memory:
        yield memory


@pytest.fixture
async def bus(broker: MemoryBroker) -> AsyncIterator[MemoryBus]:
    """The connection of agent default/helper, which the operator sends tasks to."""
    async with await login(broker, Principal.agent(namespace="default", name="helper"), called_by=[OPERATOR]) as memory:
        yield memory


@pytest.fixture
async def other_bus(broker: MemoryBroker) -> AsyncIterator[MemoryBus]:
    """The connection of agent default/other."""
    async with await login(broker, Principal.agent(namespace="default", name="other"), called_by=[OPERATOR]) as memory:
        yield memory


@pytest.fixture
async def agent(bus: MemoryBus) -> AsyncIterator[FakeAgent]:
    fake = await FakeAgent(bus=bus, namespace="default", name="helper").start()
    yield fake
    await fake.stop()


@pytest.fixture
async def start_scheduler(
    cluster: Cluster, operator_bus: MemoryBus, clock: ManualClock
) -> AsyncIterator[Callable[..., Awaitable[Scheduler]]]:
    """Starts schedulers (replicas, or one after another across a 'restart'); all stop at the end."""
    started: list[Scheduler] = []

    async def start(*, kube: KubeClient | None = None) -> Scheduler:
        scheduler = Scheduler(kube=kube or cluster.kube, bus=operator_bus, clock=clock)
        await scheduler.start()
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        await scheduler.stop()
