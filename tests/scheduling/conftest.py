"""The scheduler against the real API server (each test in its own namespace) and an in-memory bus, on a driven
clock; a scripted agent."""

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
from tests.fixtures.kube_real import KubeCluster
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
    """The API server as seen by a test in its namespace: create agents (with their token Secrets) and tasks, read
    tasks back."""

    def __init__(self, *, kube: KubeClient, namespace: str) -> None:
        self.kube = kube
        self.ns = namespace
        self.tokens: dict[str, str] = {}  # agent name -> its token, as the reconciler would generate it

    async def agent(self, name: str = "helper", *, ready: bool = True, namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or self.ns
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

    async def read_token(self, name: str, *, namespace: str | None = None) -> str:
        """The agent's token as the API stores it now (after the Secret was replaced, too)."""
        namespace = namespace or self.ns
        secret = await self.kube.get(SECRETS, namespace=namespace, name=token_secret_name(agent=name))
        self.tokens[name] = base64.b64decode(secret["data"][TOKEN_KEY]).decode()
        return self.tokens[name]

    async def set_agent_ready(self, name: str, *, ready: bool, namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or self.ns
        condition = {"type": "Ready", "status": "True" if ready else "False",
                     "reason": "DeploymentReady" if ready else "DeploymentProgressing",
                     "message": "1/1 replicas ready" if ready else "0/1 replicas ready",
                     "lastTransitionTime": "2024-05-01T00:00:00Z"}
        return await self.kube.patch(AGENTS, namespace=namespace, name=name, subresource="status",
                                     body={"status": {"conditions": [condition]}})

    async def task(self, name: str = "report", *, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
        namespace = namespace or self.ns
        return await self.kube.create(SCHEDULED_TASKS, namespace=namespace, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask",
            "metadata": {"name": name},
            "spec": {"agentRef": {"name": "helper"}, "schedule": "0 * * * *", "prompt": "Write the report."} | spec,
        })

    async def edit(self, name: str = "report", *, namespace: str | None = None, **spec: Any) -> dict[str, Any]:
        namespace = namespace or self.ns
        return await self.kube.patch(SCHEDULED_TASKS, namespace=namespace, name=name, body={"spec": spec})

    async def get_task(self, name: str) -> dict[str, Any]:
        return await self.kube.get(SCHEDULED_TASKS, namespace=self.ns, name=name)

    async def task_names(self) -> list[str]:
        return [task["metadata"]["name"] for task in (await self.kube.list(SCHEDULED_TASKS, namespace=self.ns)).items]

    async def status(self, name: str = "report", *, namespace: str | None = None) -> dict[str, Any]:
        namespace = namespace or self.ns
        return (await self.kube.get(SCHEDULED_TASKS, namespace=namespace, name=name)).get("status") or {}


@pytest.fixture
def cluster(real_kube_client: KubeClient, kube_namespace: str) -> Cluster:
    return Cluster(kube=real_kube_client, namespace=kube_namespace)


@pytest.fixture
async def faulty_link(kube_cluster: KubeCluster) -> AsyncIterator[FaultyLink]:
    """A relay in front of the real API server that drops connections on demand (see `FaultyLink`)."""
    port = urllib.parse.urlsplit(kube_cluster.server).port
    assert port is not None
    async with FaultyLink(target_port=port, upstream_tls=kube_cluster.admin_tls()).running() as link:
        yield link


@pytest.fixture
async def faulty_kube(faulty_link: FaultyLink) -> AsyncIterator[KubeClient]:
    """A client that reaches the API server through `faulty_link` (as the admin)."""
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
async def bus(broker: MemoryBroker, kube_namespace: str) -> AsyncIterator[MemoryBus]:
    """The connection of agent helper (of the test's namespace), which the operator sends tasks to."""
    helper = Principal.agent(namespace=kube_namespace, name="helper")
    async with await login(broker, helper, called_by=[OPERATOR]) as memory:
        yield memory


@pytest.fixture
async def other_bus(broker: MemoryBroker, kube_namespace: str) -> AsyncIterator[MemoryBus]:
    """The connection of agent other."""
    other = Principal.agent(namespace=kube_namespace, name="other")
    async with await login(broker, other, called_by=[OPERATOR]) as memory:
        yield memory


@pytest.fixture
async def agent(bus: MemoryBus, kube_namespace: str) -> AsyncIterator[FakeAgent]:
    fake = await FakeAgent(bus=bus, namespace=kube_namespace, name="helper").start()
    yield fake
    await fake.stop()


@pytest.fixture
async def start_scheduler(
    cluster: Cluster, operator_bus: MemoryBus, clock: ManualClock
) -> AsyncIterator[Callable[..., Awaitable[Scheduler]]]:
    """Starts schedulers (replicas, or one after another across a 'restart'); all stop at the end."""
    started: list[Scheduler] = []

    async def start(*, kube: KubeClient | None = None) -> Scheduler:
        scheduler = Scheduler(kube=kube or cluster.kube, bus=operator_bus, clock=clock, namespaces=[cluster.ns])
        await scheduler.start()
        started.append(scheduler)
        return scheduler

    yield start
    for scheduler in started:
        await scheduler.stop()
