"""The gateway as deployed: real HTTP, the real broker, the real API server, a real agent on a scripted model.

- `cluster`: the API as a test (or a person with kubectl) sees it in the test's namespace (`cluster.ns`):
  Agents, Secrets, Triggers, Events;
- `triage`: the agent `<ns>/triage` running on the test's virtual host, logged in as itself, allowed
  to answer the gateway, its model the scripted LLM;
- `start_gateway(...)`: gateways (replicas, or one after another across a restart) watching the test's
  namespace, each logged in as `service.gateway`, serving webhooks on 127.0.0.1; all stopped at the end;
- `sign` and `send`: a webhook as GitHub sends one.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import GATEWAY, AmqpBus, Principal
from rockbot.clock import Clock, ManualClock
from rockbot.gateway.app import Gateway
from rockbot.gateway.settings import GatewaySettings
from rockbot.kube import AGENTS, EVENTS, SECRETS, TRIGGERS, KubeClient
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedLLM
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

#: The agents' namespace of tests that run the gateway on the emulator (tests/chart/test_gateway_rbac.py).
NS = "team-a"
KEY = b"it's a secret to everybody"
PUBLIC_URL = "https://hooks.example.com"
ISSUE = {"action": "opened", "issue": {"number": 7, "title": "Login fails on Safari", "body": "Since 2.3 the button "
         "does nothing."}, "repository": {"full_name": "acme/shop"}, "sender": {"login": "octocat"}}  # fmt: skip
PROMPT = "Triage issue #{{ payload.issue.number }} of {{ payload.repository.full_name }}: {{ payload.issue.title }}"


def sign(body: bytes, key: bytes = KEY) -> str:
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


async def send(
    gateway: Gateway,
    payload: Any = ISSUE,
    *,
    trigger: str = "issues",
    delivery: str | None = None,
    key: bytes = KEY,
    headers: dict[str, str] | None = None,
    chunked: bool = False,
) -> Answer:
    """POST a webhook as GitHub does: the JSON body, its signature, a delivery id (a fresh one unless given);
    `chunked`: without Content-Length, the body in pieces."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    sent = {"Content-Type": "application/json", "X-GitHub-Event": "issues", "X-Hub-Signature-256": sign(body, key),
            "X-GitHub-Delivery": delivery or str(uuid.uuid4()), **(headers or {})}  # fmt: skip

    async def pieces() -> AsyncIterator[bytes]:
        for start in range(0, len(body), 1024):
            yield body[start : start + 1024]

    (namespace,) = gateway.settings.namespaces
    url = f"http://127.0.0.1:{gateway.webhook_port}/hooks/{namespace}/{trigger}"
    data = pieces() if chunked else body
    async with aiohttp.ClientSession() as session, session.post(url, data=data, headers=sent) as response:
        return Answer(status=response.status, body=await response.json(), headers=dict(response.headers))


class Cluster:
    def __init__(self, kube: KubeClient, ns: str) -> None:
        self.kube = kube
        self.ns = ns
        self.triage = Principal.agent(namespace=ns, name="triage")

    async def agent(self, name: str = "triage", *, ready: bool = True) -> None:
        await self.kube.create(AGENTS, namespace=self.ns, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name},
            "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m"}},
        })  # fmt: skip
        condition = {"type": "Ready", "status": "True" if ready else "False",
                     "reason": "DeploymentReady" if ready else "DeploymentProgressing",
                     "message": "1/1 replicas ready" if ready else "0/1 replicas ready",
                     "lastTransitionTime": "2024-05-01T00:00:00Z"}  # fmt: skip
        await self.kube.patch(AGENTS, namespace=self.ns, name=name, subresource="status",
                              body={"status": {"conditions": [condition]}})  # fmt: skip

    async def secret(self, name: str = "github-webhook", value: bytes = KEY) -> None:
        await self.kube.create(SECRETS, namespace=self.ns, body={
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"secret": value.decode()},
        })  # fmt: skip

    async def trigger(self, name: str = "issues", **spec: Any) -> dict[str, Any]:
        source = {} if "kubernetesEvents" in spec else {
            "webhook": {"secretKeyRef": {"name": "github-webhook", "key": "secret"}}}
        return await self.kube.create(TRIGGERS, namespace=self.ns, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Trigger", "metadata": {"name": name},
            "spec": {"agentRef": {"name": "triage"}, "prompt": PROMPT, **source, **spec},
        })  # fmt: skip

    async def webhook_trigger(self, name: str = "issues", **spec: Any) -> dict[str, Any]:
        """The Agent triage (Ready), the webhook's Secret, and a webhook Trigger for the agent."""
        await self.agent()
        await self.secret()
        return await self.trigger(name, **spec)

    async def status(self, name: str = "issues") -> dict[str, Any]:
        return (await self.kube.get(TRIGGERS, namespace=self.ns, name=name)).get("status") or {}

    async def ready(self, name: str = "issues") -> dict[str, Any]:
        """The Trigger's status once a gateway serves it."""

        async def served() -> dict[str, Any]:
            status = await self.status(name)
            conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
            assert conditions == {"Ready": "True", "AgentReady": "True"}, status
            return status

        return await eventually(served)

    async def history(self, expected: list[str], name: str = "issues") -> list[dict[str, Any]]:
        """The run history, once its outcomes are `expected`."""

        async def recorded() -> list[dict[str, Any]]:
            history = (await self.status(name)).get("history", [])
            assert [record["outcome"] for record in history] == expected, history
            return history

        return await eventually(recorded)

    async def event(self, name: str, *, count: int, at: datetime.datetime, reason: str = "BackOff") -> None:
        """A Warning event about pod web-1, created or (count > 1) repeated, as the kubelet reports one."""
        stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": name, "namespace": self.ns},
                "involvedObject": {"kind": "Pod", "namespace": self.ns, "name": "web-1"}, "type": "Warning",
                "reason": reason, "message": "Back-off restarting failed container web", "count": count,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "source": {"component": "kubelet"}}  # fmt: skip
        if count == 1:
            await self.kube.create(EVENTS, namespace=self.ns, body=body)
        else:
            await self.kube.patch(EVENTS, namespace=self.ns, name=name, body={"count": count, "lastTimestamp": stamp})


@pytest.fixture
def cluster(real_kube_client: KubeClient, kube_namespace: str) -> Cluster:
    return Cluster(real_kube_client, kube_namespace)


@pytest.fixture
async def triage(cluster: Cluster, vhost: Vhost, scripted_llm: ScriptedLLM) -> AsyncIterator[AgentRuntime]:
    """The agent <ns>/triage, consuming its inbox on the broker, answering with the scripted model."""
    bus = await AmqpBus.connect(url=await vhost.url(cluster.triage, called_by=[GATEWAY]))
    config = agent_config(llm_url=scripted_llm.url, name="triage", namespace=cluster.ns)
    runtime = AgentRuntime.from_config(config, bus=bus, env={API_KEY_ENV: "k"})
    await runtime.start()
    inbox = await serve_inbox(runtime=runtime, bus=bus)
    yield runtime
    await inbox.close()
    await runtime.close()
    await bus.close()


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime.datetime.now(datetime.UTC))


@pytest.fixture
async def start_gateway(cluster: Cluster, vhost: Vhost) -> AsyncIterator[StartGateway]:
    """Start gateways; each stops at the end (or earlier, through `gateway.stop()`)."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(*, clock: Clock | None = None, kube: KubeClient | None = None, **settings: Any) -> Gateway:
            """`kube`: the gateway's own API client (default: its own, from the test's kubeconfig)."""
            kube = kube or await stack.enter_async_context(await KubeClient.from_environment())
            bus = await AmqpBus.connect(url=await vhost.url(GATEWAY))
            stack.push_async_callback(bus.close)
            gateway = Gateway(
                settings=GatewaySettings(webhook_host="127.0.0.1", webhook_port=0, health_host="127.0.0.1",
                                         health_port=0, namespaces=[cluster.ns], public_url=PUBLIC_URL, **settings),
                kube=kube, bus=bus, clock=clock,
            )  # fmt: skip
            await gateway.start()
            stack.push_async_callback(gateway.stop)
            return gateway

        yield start
