"""One bus contract, two implementations: every test in test_contract.py runs on both.

A test opens connections as principals; on RabbitMQ each is a broker user in the test's virtual
host, in memory a user of one `MemoryBroker`, with the same permissions either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from rockbot.bus import AmqpBus, Bus, MemoryBroker, Permissions
from rockbot.bus.admin import BrokerAdmin
from rockbot.bus.identity import Principal
from tests.fixtures.rabbitmq import Vhost

#: What the contract tests' users may do: everything with queues named `test.*`, nothing else.
TEST_QUEUES = r"^(rockbot|test\..+)$"
TEST_PERMISSIONS = Permissions(
    configure=TEST_QUEUES, write=TEST_QUEUES, read=TEST_QUEUES, topic_write=r"^test\..+$", topic_read=r"^test\..+$"
)


Login = Callable[[str, Permissions], Awaitable[Bus]]


@dataclass
class Broker:
    """Opens connections to one broker (a vhost of RabbitMQ, or a `MemoryBroker`) and administers it."""

    admin: BrokerAdmin
    login: Login
    opened: list[Bus] = field(default_factory=list)

    async def connect(self, user: str = "service.test", permissions: Permissions = TEST_PERMISSIONS) -> Bus:
        bus = await self.login(user, permissions)
        self.opened.append(bus)
        return bus


@pytest.fixture(params=["memory", "amqp"])
def broker(request: pytest.FixtureRequest) -> Broker:
    return request.getfixturevalue(f"{request.param}_broker")


@pytest.fixture
async def memory_broker() -> AsyncIterator[Broker]:
    memory = MemoryBroker()

    async def login(user: str, permissions: Permissions) -> Bus:
        await memory.ensure_user(user=user, password="")
        await memory.ensure_permissions(user=user, permissions=permissions)
        return memory.connect(user)

    async with _closing(Broker(admin=memory, login=login)) as opened:
        yield opened


@pytest.fixture
async def amqp_broker(vhost: Vhost) -> AsyncIterator[Broker]:
    async def login(user: str, permissions: Permissions) -> Bus:
        return await AmqpBus.connect(url=await vhost.login(user, permissions))

    async with _closing(Broker(admin=vhost.admin, login=login)) as opened:
        yield opened


@contextlib.asynccontextmanager
async def _closing(broker: Broker) -> AsyncIterator[Broker]:
    try:
        yield broker
    finally:
        for bus in broker.opened:
            await bus.close()


@pytest.fixture
async def bus(broker: Broker) -> Bus:
    return await broker.connect()


def principal(bus: Bus) -> Principal:
    assert bus.principal is not None
    return bus.principal
