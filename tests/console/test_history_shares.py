"""Issue 31, per-agent bounds on a shared queue, on the real broker and the memory bus, with a real PostgreSQL:
`console.history` is every agent's, so while the database is slow one agent's flood of history requests holds its
own share of the console (`HISTORY_PER_AGENT` at once, the rest refused at once), never another agent's turn."""

from __future__ import annotations

import contextlib
import uuid

from prometheus_client import CollectorRegistry
from sqlalchemy import text

from rockbot.bus import CONSOLE, Delivery, Principal
from rockbot.bus.topology import CONSOLE_HISTORY, agent_replies
from rockbot.console.recording import HISTORY_PER_AGENT, HistoryAnswerer, RecorderMetrics
from rockbot.console.store import Store
from rockbot.contracts.recording import HistoryReply, HistoryRequest
from tests.console.conftest import Login
from tests.waiting import eventually

FLOODER = Principal.agent(namespace="team-a", name="flooder")
FAIR = Principal.agent(namespace="team-b", name="fair")
FLOOD = 20


async def test_one_agents_flood_of_history_requests_holds_only_its_own_share_of_the_console(
        bus_login: Login, postgres_url: str) -> None:
    store = await Store.open(url=postgres_url, pool_size=10)
    async with contextlib.AsyncExitStack() as warming:  # every pooled connection made before the lock is taken
        for _ in range(10):
            await warming.enter_async_context(store.engine.connect())
    answerer = HistoryAnswerer(store=store, bus=await bus_login(CONSOLE), metrics=RecorderMetrics(CollectorRegistry()))
    await answerer.start()
    answered: dict[str, list[str]] = {"flooder": [], "fair": []}
    senders = {}
    for name, principal in (("flooder", FLOODER), ("fair", FAIR)):
        bus = senders[name] = await bus_login(principal)
        slot = agent_replies(namespace=principal.namespace, name=principal.name, slot=0)

        async def take(delivery: Delivery, *, into: list[str] = answered[name]) -> None:
            into.append(delivery.decode(HistoryReply).session_id)

        await bus.consume(queue=slot, handler=take, exclusive=True)

    async def ask(name: str, principal: Principal, n: int) -> None:
        slot = agent_replies(namespace=principal.namespace, name=principal.name, slot=0)
        await senders[name].publish(queue=CONSOLE_HISTORY, body=HistoryRequest(session_id=f"{name}-{n}"),
                                    correlation_id=uuid.uuid4().hex, reply_to=slot.name)

    try:
        async with store.engine.connect() as blocker, store.engine.connect() as watcher:
            await blocker.execute(text("BEGIN"))
            await blocker.execute(text("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE"))  # every history read waits
            for n in range(FLOOD):
                await ask("flooder", FLOODER, n)
            await ask("fair", FAIR, 0)

            async def the_fair_one_and_the_flooders_share_wait() -> None:
                waiting = await watcher.scalar(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = "
                    "current_database()"))
                assert waiting == HISTORY_PER_AGENT + 1

            await eventually(the_fair_one_and_the_flooders_share_wait, within=60)
            await blocker.execute(text("ROLLBACK"))

        async def all_answered() -> None:
            assert (len(answered["flooder"]), answered["fair"]) == (HISTORY_PER_AGENT, ["fair-0"])

        await eventually(all_answered, within=60)  # the rest of the flood was refused, not held
    finally:
        await answerer.stop()
        await store.close()
