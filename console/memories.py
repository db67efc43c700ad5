"""The console's long-term memory on the bus: agents' `Remember`, `Recall`, `Forget`,
`Embed`, `Pending` and `Usage` on `console.memory`.

Which agent asks is the broker-validated sender, and the answer goes only to one of its own reply
queues; the store holds every request to that agent's rows (see `memory_store`). A request the console
cannot read is refused (dead-lettered), and so is one past the agent's `MEMORY_PER_AGENT` being answered; a
database that does not answer gets no reply, so the agent's wait ends in its timeout and the turn goes on
without memory, saying so. A `Remember` the agent wrote behind (`answered`: the model was told it is kept once the
broker held it) is never dropped that way: a database that does not answer, or the agent's share being in flight,
puts it back on the queue after a pause (at most `HELD_BACK_PER_AGENT` of an agent's at once; the queue's delivery
limit still ends a poison message), and a refusal (a bound reached) is logged here and said in the reply.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel, TypeAdapter

from rockbot.bus import Bus, BusError
from rockbot.bus.identity import Principal
from rockbot.bus.interface import TRANSIENT_PAUSE_SECONDS
from rockbot.bus.topology import CONSOLE_MEMORY
from rockbot.console.agent_requests import AgentRequests
from rockbot.console.memory_store import MemoryStore
from rockbot.console.store import StoreUnavailable
from rockbot.contracts.memories import MAX_REQUEST_BYTES, MemoryRequest, Remember

log = logging.getLogger(__name__)

_REQUEST: TypeAdapter[MemoryRequest] = TypeAdapter(MemoryRequest)
#: Memory requests of one agent answered at once (`InFlight`); its others are refused meanwhile, so one agent's flood
#: of them never stands before another agent's.
MEMORY_PER_AGENT = 4
#: Written-behind `Remember`s of one agent put back at once (each holds a prefetch slot for the bus's pause); past
#: them, one is refused like any other request (dead-lettered, in the agent's record).
HELD_BACK_PER_AGENT = 2


class MemoryAnswerer(AgentRequests):
    """Answers `console.memory` from the asking agent's own memories; `start()`, then `stop()`."""

    what, queue, prefetch, per_agent = "memory", CONSOLE_MEMORY, 32, MEMORY_PER_AGENT
    max_bytes, request_type = MAX_REQUEST_BYTES, _REQUEST

    def __init__(self, *, memories: MemoryStore, bus: Bus) -> None:
        super().__init__(bus=bus)
        self._memories = memories
        self._held_back: dict[str, int] = {}

    async def answer(self, agent: Principal, request: MemoryRequest) -> BaseModel | None:
        try:
            reply = await self._memories.answer(namespace=agent.namespace, agent=agent.name, request=request)
        except StoreUnavailable as exc:
            if _answered(request):
                self._put_back(agent, f"the store did not answer ({exc})")
            log.warning("cannot answer %s's memory request: %s", agent, exc)
            return None  # the agent's wait ends in its timeout: no memory this turn, said so
        if _answered(request) and reply.error is not None:
            log.warning("refused %s's memory %s, written behind: %s", agent, request.memory_id, reply.error.message)
        return reply

    async def busy(self, agent: Principal, request: MemoryRequest) -> None:
        if _answered(request):
            self._put_back(agent, f"{agent} already has {MEMORY_PER_AGENT} memory requests being answered")

    def _put_back(self, agent: Principal, why: str) -> None:
        """Raise to put a written-behind `Remember` back on the queue (the bus pauses first), while fewer than
        `HELD_BACK_PER_AGENT` of the agent's are in that pause."""
        held = self._held_back.get(agent.user, 0)
        if held < HELD_BACK_PER_AGENT:
            self._held_back[agent.user] = held + 1
            asyncio.get_running_loop().call_later(TRANSIENT_PAUSE_SECONDS, self._release, agent.user)
            raise BusError(f"{why}: a remember the agent answered is put back on the queue, to be kept later")

    def _release(self, user: str) -> None:
        self._held_back[user] -= 1
        if not self._held_back[user]:
            del self._held_back[user]


def _answered(request: MemoryRequest) -> bool:
    return isinstance(request, Remember) and request.answered
