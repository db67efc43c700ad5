"""Connecting tests to the in-memory bus as a principal, with the permissions the operator would give it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable

from rockbot.bus import SCRIPTS_MANAGER, MemoryBroker, MemoryBus, Principal
from rockbot.bus.admin import ensure_principal


async def login(
    broker: MemoryBroker, principal: Principal, *, calls: Iterable[Principal] = (), called_by: Iterable[Principal] = ()
) -> MemoryBus:
    await ensure_principal(broker, principal, password="", calls=calls, called_by=called_by)
    return broker.connect(principal.user)


ALICE = Principal.agent(namespace="default", name="alice")


@contextlib.asynccontextmanager
async def manager_and_agent(agent: Principal = ALICE) -> AsyncIterator[tuple[MemoryBus, MemoryBus]]:
    """A new memory broker, and the connections of the scripts-manager and of `agent` to it."""
    broker = MemoryBroker()
    async with await login(broker, SCRIPTS_MANAGER) as manager, await login(broker, agent) as agent_bus:
        yield manager, agent_bus
