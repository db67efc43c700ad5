"""The console's long-term memory on the bus: agents' `Remember`, `Recall`, `Forget`,
`Embed` and `Pending` on `console.memory`.

Which agent asks is the broker-validated sender, and the answer goes only to one of its own reply
queues; the store holds every request to that agent's rows (see `memory_store`). A request the console
cannot read is refused (dead-lettered), and so is one past the agent's `MEMORY_PER_AGENT` being answered; a
database that does not answer gets no reply, so the agent's wait ends in its timeout and the turn goes on
without memory, saying so.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, TypeAdapter

from rockbot.bus import Bus
from rockbot.bus.identity import Principal
from rockbot.bus.topology import CONSOLE_MEMORY
from rockbot.console.agent_requests import AgentRequests
from rockbot.console.memory_store import MemoryStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.memories import MAX_REQUEST_BYTES, MemoryRequest

log = logging.getLogger(__name__)

_REQUEST: TypeAdapter[MemoryRequest] = TypeAdapter(MemoryRequest)
#: Memory requests of one agent answered at once (`InFlight`); its others are refused meanwhile, so one agent's flood
#: of them never stands before another agent's.
MEMORY_PER_AGENT = 4


class MemoryAnswerer(AgentRequests):
    """Answers `console.memory` from the asking agent's own memories; `start()`, then `stop()`."""

    what, queue, prefetch, per_agent = "memory", CONSOLE_MEMORY, 32, MEMORY_PER_AGENT
    max_bytes, request_type = MAX_REQUEST_BYTES, _REQUEST

    def __init__(self, *, memories: MemoryStore, bus: Bus) -> None:
        super().__init__(bus=bus)
        self._memories = memories

    async def answer(self, agent: Principal, request: MemoryRequest) -> BaseModel | None:
        try:
            return await self._memories.answer(namespace=agent.namespace, agent=agent.name, request=request)
        except StoreUnavailable as exc:  # the agent's wait ends in its timeout: no memory this turn, said so
            log.warning("cannot answer %s's memory request: %s", agent, exc)
            return None
