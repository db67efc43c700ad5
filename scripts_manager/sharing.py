"""Each agent's fair share of the scripts-manager's sandboxes.

The manager takes up to `ROCKBOT_SCRIPTS_PREFETCH` requests off `script.invoke` but runs at most
`ROCKBOT_SCRIPTS_CONCURRENCY` at once, and at most `ROCKBOT_SCRIPTS_PER_AGENT` of one agent. When a
sandbox frees up, it goes to the agent that was served least recently among those waiting (round
robin), so an agent that queues many long scripts delays only itself: another agent's script starts
as soon as a sandbox is free, not after the whole backlog. Beyond the prefetch, the service holds at
most `ROCKBOT_SCRIPTS_QUEUED_PER_AGENT` of one agent's requests and answers the rest at once
(`service.py`), so a backlog never fills the prefetch either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator


class FairShare:
    def __init__(self, *, total: int, per_agent: int) -> None:
        if total < 1 or per_agent < 1:
            raise ValueError(f"total={total} and per_agent={per_agent} must be at least 1")
        self._total = total
        self._per_agent = per_agent
        self._running: Counter[str] = Counter()
        #: Agents with requests waiting (in the order they came), each with its waiting requests in order.
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        #: When each busy agent was last given a sandbox (a count of grants); idle agents are forgotten.
        self._served: dict[str, int] = {}
        self._grants = 0

    def running(self, agent: str) -> int:
        return self._running[agent]

    @contextlib.asynccontextmanager
    async def slot(self, agent: str) -> AsyncIterator[None]:
        """Hold one of the sandboxes for `agent` while the block runs; waits for its turn."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(agent, deque()).append(turn)
        self._grant()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # granted just as it was cancelled: give it back
                self._release(agent)
            else:
                self._forget(agent, turn)
            raise
        try:
            yield
        finally:
            self._release(agent)

    def _release(self, agent: str) -> None:
        self._running[agent] -= 1
        if not self._running[agent]:
            del self._running[agent]
            if agent not in self._waiting:
                self._served.pop(agent, None)
        self._grant()

    def _forget(self, agent: str, turn: asyncio.Future[None]) -> None:
        waiting = self._waiting.get(agent)
        if waiting is not None and turn in waiting:
            waiting.remove(turn)
            if not waiting:
                del self._waiting[agent]
                if not self._running[agent]:
                    self._served.pop(agent, None)

    def _grant(self) -> None:
        while sum(self._running.values()) < self._total:
            eligible = [a for a in self._waiting if self._running[a] < self._per_agent]
            if not eligible:
                return
            agent = min(eligible, key=lambda a: self._served.get(a, -1))  # least recently served; then first come
            waiting = self._waiting[agent]
            turn = waiting.popleft()
            if not waiting:
                del self._waiting[agent]
            self._running[agent] += 1
            self._grants += 1
            self._served[agent] = self._grants
            turn.set_result(None)
