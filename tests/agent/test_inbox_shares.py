"""Issue 31, per-agent bounds on a shared queue, on the real broker and the memory bus: an agent's inbox is every
caller's, so one calling agent's flood of calls (each a model turn) cannot keep another caller's call waiting."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from rockbot.agent.inbox import CALLS_PER_AGENT
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.inbox import InboxReply, InboxRequest
from tests.agent.test_inbox import Team, agent, calls, config, team  # noqa: F401 (the memory bus fixture)
from tests.agent.test_inbox_rabbitmq import on_broker
from tests.fixtures.llm import ScriptedLLM, Turn
from tests.waiting import bounded, eventually

FLOOD = 12


class HoldingFlood(ScriptedLLM):
    """Answers every turn "ok", holding the flooder's until the test opens `gate`."""

    def __init__(self) -> None:
        super().__init__(loop=True)
        self.gate = asyncio.Event()
        self.held = 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if "flood" in await request.text():
            self.held += 1
            await self.gate.wait()
        return await super()._chat(request)


@pytest.fixture(params=["memory", "amqp"])
def callers(request: pytest.FixtureRequest) -> Team:
    return request.getfixturevalue("team") if request.param == "memory" else on_broker(request.getfixturevalue(
        "vhost"))


async def test_one_callers_flood_of_calls_cannot_keep_another_callers_call_waiting(callers: Team) -> None:
    llm = await HoldingFlood().start()
    llm.play(Turn(text="ok"))
    try:
        await callers.start(llm, config(llm, "helper"), config(llm, "flooder", calls("ask", "helper")),
                            config(llm, "fair", calls("ask", "helper")), run=["helper"])

        def call(sender: str, n: int) -> InboxRequest:
            return InboxRequest(kind="agent_call", request_id=f"{sender}-{n}", session_id=f"{sender}-{n}",
                                content=f"{'flood' if sender == 'flooder' else 'fair'} {n}",
                                call_chain=(f"team-a/{sender}",))

        await callers.connect(agent("flooder"))  # one connection, before its calls go out side by side
        flood = [asyncio.create_task(callers.ask(name="helper", sender=agent("flooder"), request=call("flooder", n),
                                                 timeout_seconds=120)) for n in range(FLOOD)]

        async def flood_answered_at_once() -> None:
            done = [task.result() for task in flood if task.done()]
            assert len(done) == FLOOD - CALLS_PER_AGENT and llm.held == CALLS_PER_AGENT, (len(done), llm.held)

        await eventually(flood_answered_at_once, within=60)
        busy = [reply for task in flood if task.done() for reply in [task.result()]]
        assert {(reply.error.code, reply.error.retryable) for reply in busy if reply.error} == {
            (ErrorCode.UNAVAILABLE, True)} and all(reply.error for reply in busy)
        fair = await bounded(callers.ask(name="helper", sender=agent("fair"), request=call("fair", 0)),
                             within=60, what="the fair caller's answer while the flooder's calls are held")
        assert fair.answer == "ok"
        waiting = [task for task in flood if not task.done()]
        llm.gate.set()
        held: list[InboxReply] = [await task for task in waiting]
        assert [reply.answer for reply in held] == ["ok"] * CALLS_PER_AGENT
    finally:
        llm.gate.set()
        await callers.close()
        await llm.stop()
