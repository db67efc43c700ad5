"""The real API server for the console's tests (tests/fixtures/kube_real.py: the shared rig, or a private
control plane), with fresh namespaces, ServiceAccounts and Roles made per test.

The console is asked about RBAC the way a cluster answers it, so these tests need a real API server
(TokenReview and SubjectAccessReview are the real authenticator and authorizer's).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from rockbot.bus import CONSOLE, AmqpBus, Bus, MemoryBroker, Principal
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import TokenReviewer
from rockbot.console.authorization import AccessReviewer
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.kube import SERVICEACCOUNTS, KubeClient
from tests.buses import login
from tests.fixtures.kube_real import KubeCluster, fresh_namespace
from tests.fixtures.rabbitmq import Vhost

REPOSITORY = Path(__file__).resolve().parents[2]


class Rbac:
    """Roles and bindings made as the cluster's admin, for what a test's users may do."""

    def __init__(self, cluster: KubeCluster) -> None:
        self.cluster = cluster

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.cluster.kubectl(*args, input=stdin).stdout

    def grant(self, *, namespace: str, user: str, rules: str, name: str) -> None:
        """A Role of `rules` (YAML list) in `namespace`, bound to `user` (a full username)."""
        self.kubectl("apply", "-f", "-", stdin=f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: {name}, namespace: {namespace}}}
rules: {rules}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: {name}, namespace: {namespace}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: {name}}}
subjects: [{{kind: User, apiGroup: rbac.authorization.k8s.io, name: "{user}"}}]
""")


@pytest.fixture
def rbac(kube_cluster: KubeCluster) -> Rbac:
    return Rbac(kube_cluster)


@pytest.fixture
async def kube_admin(real_kube_client: KubeClient) -> KubeClient:
    """A client with the cluster admin's rights: makes what a test needs, and serves as the console's own client."""
    return real_kube_client


@pytest.fixture
def namespaces(kube_cluster: KubeCluster, kube_namespace: str, request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Two fresh namespaces: the test's own, and another it may not see."""
    with fresh_namespace(kube_cluster, purpose=f"{request.node.name}-other") as other:
        yield [kube_namespace, other]


async def service_account_token(kube: KubeClient, *, namespace: str, name: str) -> str:
    """A fresh ServiceAccount `name` in `namespace` and a 10-minute token of it (as `kubectl create token`)."""
    await kube.create(SERVICEACCOUNTS, namespace=namespace,
                      body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    answer = await kube.create(SERVICEACCOUNTS, namespace=namespace, name=name, subresource="token",
                               body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": 600}})
    return str(answer["status"]["token"])


@dataclass(kw_only=True)
class Console:
    """A console serving on loopback, as `rockbot console` would, with the test's admin client as its own."""

    url: str
    sessions: Sessions
    rbac: AccessReviewer


@pytest.fixture
async def console(kube_admin: KubeClient) -> AsyncIterator[Console]:
    sessions = Sessions()
    rbac = AccessReviewer(kube=kube_admin, ttl=0)  # no caching: each test changes RBAC as it goes
    gate = Gate(tokens=TokenReviewer(kube=kube_admin, ttl=0), sessions=sessions)
    runner = web.AppRunner(build_app(gate=gate, authorizer=rbac, kube=kube_admin))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Console(url=f"http://127.0.0.1:{port}", sessions=sessions, rbac=rbac)
    finally:
        await runner.cleanup()


def agent_body(*, namespace: str, name: str, description: str = "") -> dict[str, object]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"baseUrl": "http://127.0.0.1:9/v1", "name": "test-model"},
                     "description": description}}


Login = Callable[[Principal], Awaitable[Bus]]


@pytest.fixture(params=["memory", "amqp"])
def bus_login(request: pytest.FixtureRequest) -> Login:
    """Log in as a principal (an agent may answer the console, as the operator allows), on a memory broker or the
    test's virtual host: for tests of what the console takes from agents over the bus, on both."""
    return request.getfixturevalue(f"{request.param}_login")


@pytest.fixture
async def memory_login() -> AsyncIterator[Login]:
    broker = MemoryBroker()

    async def open_bus(principal: Principal) -> Bus:
        return await login(broker, principal, called_by=[CONSOLE] if principal != CONSOLE else ())

    async with _closing(open_bus) as connecting:
        yield connecting


@pytest.fixture
async def amqp_login(vhost: Vhost) -> AsyncIterator[Login]:
    async def open_bus(principal: Principal) -> Bus:
        called_by = [CONSOLE] if principal != CONSOLE else ()
        return await AmqpBus.connect(url=await vhost.url(principal, called_by=called_by))

    async with _closing(open_bus) as connecting:
        yield connecting


@contextlib.asynccontextmanager
async def _closing(open_bus: Login) -> AsyncIterator[Login]:
    opened: list[Bus] = []

    async def connecting(principal: Principal) -> Bus:
        opened.append(bus := await open_bus(principal))
        return bus

    try:
        yield connecting
    finally:
        for bus in opened:
            await bus.close()
