"""One bus contract, two implementations: every test in test_contract.py runs on both."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from rockbot.bus import AmqpBus, Bus, MemoryBus

BusFactory = Callable[[], Awaitable[Bus]]


@pytest.fixture(params=["memory", "amqp"])
async def bus_factory(request: pytest.FixtureRequest) -> AsyncIterator[BusFactory]:
    """Opens buses that reach the same queues: connections to one vhost, or the one in-memory bus."""
    opened: list[Bus] = []
    if request.param == "memory":
        shared = MemoryBus()
        opened.append(shared)

        async def make() -> Bus:
            return shared
    else:
        url = request.getfixturevalue("amqp_url")

        async def make() -> Bus:
            bus = await AmqpBus.connect(url=url)
            opened.append(bus)
            return bus

    yield make
    for bus in opened:
        await bus.close()


@pytest.fixture
async def bus(bus_factory: BusFactory) -> Bus:
    return await bus_factory()
