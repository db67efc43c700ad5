"""The console's long-term memory on the bus: agents' `Remember`, `Recall` and `Forget` on `console.memory`.

Which agent asks is the broker-validated sender, and the answer goes only to one of its own reply
queues; the store holds every request to that agent's rows (see `memory_store`). A request the console
cannot read is refused (dead-lettered), and so is one past the agent's `MEMORY_PER_AGENT` being answered; a
database that does not answer gets no reply, so the agent's wait ends in its timeout and the turn goes on
without memory, saying so.
"""

from __future__ import annotations

import logging

from pydantic import TypeAdapter

from rockbot.bus import Bus, Delivery, Refused, Subscription
from rockbot.bus.shares import InFlight
from rockbot.bus.topology import CONSOLE_MEMORY, agent_replies_prefix
from rockbot.console.memory_store import MemoryStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.memories import MAX_REQUEST_BYTES, MemoryRequest

log = logging.getLogger(__name__)

_REQUEST: TypeAdapter[MemoryRequest] = TypeAdapter(MemoryRequest)
#: Memory requests of one agent answered at once (`InFlight`); its others are refused meanwhile, so one agent's flood
#: of them never stands before another agent's.
MEMORY_PER_AGENT = 4


class MemoryAnswerer:
    """Answers `console.memory` from the asking agent's own memories; `start()`, then `stop()`."""

    def __init__(self, *, memories: MemoryStore, bus: Bus) -> None:
        self._memories = memories
        self._bus = bus
        self._in_flight = InFlight(per_sender=MEMORY_PER_AGENT)
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._subscription = await self._bus.consume(queue=CONSOLE_MEMORY, handler=self._on_request, prefetch=32)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close(drain_seconds=1.0)
            self._subscription = None

    async def _on_request(self, delivery: Delivery) -> None:
        agent = delivery.agent_answered_on_own(lambda p: agent_replies_prefix(namespace=p.namespace, name=p.name))
        if agent is None:
            raise Refused(
                f"a memory request from {delivery.user_id!r} must come from an agent and be answered on one of its "
                f"own reply queues, not {delivery.reply_to!r}"
            )
        request = delivery.decode(_REQUEST, max_bytes=MAX_REQUEST_BYTES)
        with self._in_flight.slot(agent.user) as admitted:
            if not admitted:
                raise Refused(f"{agent} already has {MEMORY_PER_AGENT} memory requests being answered")
            try:
                reply = await self._memories.answer(namespace=agent.namespace, agent=agent.name, request=request)
            except StoreUnavailable as exc:  # the agent's wait ends in its timeout: no memory this turn, said so
                log.warning("cannot answer %s's memory request: %s", agent, exc)
                return
        await self._bus.reply(to=delivery, body=reply)
