"""Issue 31 §3 and §6 on the real broker and the memory bus: what an agent sends to the console's chat replies can
take neither the console's memory (a stalled page holds a bounded amount per turn and per agent) nor a person's
answer (an unreadable message is dropped alone)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pydantic import BaseModel

from rockbot.agent.progress import ProgressRelay
from rockbot.bus import CONSOLE, Bus, Delivery, Principal
from rockbot.bus.topology import Queue, agent_inbox
from rockbot.console.chat import AGENT_BUFFER_BYTES, TURN_BUFFER_BYTES, ChatRelay
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.contracts.progress import MAX_PROGRESS_BYTES, MAX_PROGRESS_CHARS, TextDelta, ToolStarted, TurnProgress
from tests.console.conftest import Login
from tests.waiting import bounded

FLOODER = Principal.agent(namespace="team-a", name="flooder")
HELPER = Principal.agent(namespace="team-a", name="helper")
#: A progress message just within what the console reads.
LARGE_TEXT = "x" * (MAX_PROGRESS_BYTES - 4096)


class FakeAgent:
    """An agent's process as far as the console sees it: it takes turns from its inbox and answers as it likes."""

    def __init__(self, bus: Bus, principal: Principal) -> None:
        self.bus = bus
        self.principal = principal
        self.turns: asyncio.Queue[InboxRequest] = asyncio.Queue()

    async def start(self) -> None:
        async def take(delivery: Delivery) -> None:
            await self.turns.put(delivery.decode(InboxRequest))

        inbox = agent_inbox(namespace=self.principal.namespace, name=self.principal.name)
        await self.bus.consume(queue=inbox, handler=take, prefetch=16)

    async def next_turn(self) -> InboxRequest:
        return await bounded(self.turns.get(), within=30, what=f"a turn in {self.principal}'s inbox")

    async def progress(self, turn: InboxRequest, text: str, *, count: int = 1) -> None:
        for seq in range(count):
            await self.bus.publish(queue=_replies(turn), correlation_id=turn.request_id,
                                   body=TurnProgress(request_id=turn.request_id, seq=seq, event=TextDelta(text=text)))

    async def answer(self, turn: InboxRequest, answer: str) -> None:
        await self.bus.publish(queue=_replies(turn), correlation_id=turn.request_id,
                               body=InboxReply(request_id=turn.request_id, session_id=turn.session_id, answer=answer))


def _replies(turn: InboxRequest) -> Queue:
    return Queue(name=str(turn.reply_to))


@contextlib.asynccontextmanager
async def console_and(bus_login: Login, *principals: Principal,
                      timeout_seconds: float = 60) -> AsyncIterator[tuple[ChatRelay, list[FakeAgent]]]:
    relay = ChatRelay(timeout_seconds=timeout_seconds)
    await relay.start(bus=await bus_login(CONSOLE))
    agents = [FakeAgent(await bus_login(principal), principal) for principal in principals]
    for agent in agents:
        await agent.start()
    try:
        yield relay, agents
    finally:
        await relay.stop()


def _turn(relay: ChatRelay, agent: Principal, session: str) -> AsyncIterator[object]:
    return relay.turn(namespace=agent.namespace, agent=agent.name, user="alice", session_id=session, content="hi")


class Garbage(BaseModel):
    """Neither progress nor a reply: what the console cannot read."""

    nonsense: str = "?"


async def test_an_unreadable_message_is_dropped_and_the_turns_answer_still_reaches_the_person(
        bus_login: Login) -> None:
    async with console_and(bus_login, HELPER, timeout_seconds=15) as (relay, (helper,)):
        steps = _turn(relay, HELPER, "s1")
        first = asyncio.ensure_future(anext(steps))
        turn = await helper.next_turn()
        await helper.bus.publish(queue=_replies(turn), correlation_id=turn.request_id, body=Garbage())
        await helper.progress(turn, "thinking")
        await helper.answer(turn, "the real answer")
        taken = [await bounded(first, within=15, what="the first step"), *[step async for step in steps]]
    assert taken == [TextDelta(text="thinking"),
                     InboxReply(request_id=turn.request_id, session_id=turn.session_id, answer="the real answer")]


async def test_a_stalled_page_holds_a_bounded_part_of_an_agents_flood_and_still_gets_the_answer(
        bus_login: Login) -> None:
    """The person's page stops reading; the agent sends 12 progress messages of almost 1 MiB to each of its five
    turns: the console holds at most 4 MiB of a turn and 16 MiB of the agent's turns, each turn's answer comes
    after what was held, and another agent's turn, flooded after, has a buffer of its own."""
    async with console_and(bus_login, FLOODER, HELPER) as (relay, (flooder, helper)):
        flooded = [_turn(relay, FLOODER, f"s{n}") for n in range(5)]
        firsts = [asyncio.ensure_future(anext(steps)) for steps in flooded]
        turns = [await flooder.next_turn() for _ in flooded]
        for turn in turns:
            await flooder.progress(turn, "started")
        for first in firsts:  # each page has read its first step, then stalls
            assert await bounded(first, within=30, what="the first step") == TextDelta(text="started")
        for turn in turns:
            await flooder.progress(turn, LARGE_TEXT, count=12)
            await flooder.answer(turn, f"answer of {turn.session_id}")
        others = _turn(relay, HELPER, "h1")
        other_first = asyncio.ensure_future(anext(others))
        other = await helper.next_turn()
        await helper.progress(other, LARGE_TEXT, count=3)
        await helper.answer(other, "helper's answer")
        helper_steps = [await bounded(other_first, within=30, what="the helper's first step"),
                        *[step async for step in others]]
        assert helper_steps[:-1] == [TextDelta(text=LARGE_TEXT)] * 3  # its own buffer: nothing of it dropped
        assert relay.buffered(FLOODER) <= AGENT_BUFFER_BYTES
        held = []
        for turn, steps in zip(turns, flooded, strict=True):  # the pages read again
            taken = [step async for step in steps]
            assert taken[-1] == InboxReply(request_id=turn.request_id, session_id=turn.session_id,
                                           answer=f"answer of {turn.session_id}")
            held.append(len(taken) - 1)
    per_turn = TURN_BUFFER_BYTES // len(LARGE_TEXT)
    assert all(count <= per_turn for count in held), held
    assert sum(held) * len(LARGE_TEXT) <= AGENT_BUFFER_BYTES and sum(held) >= AGENT_BUFFER_BYTES // (
        2 * len(LARGE_TEXT)), held
    assert relay.buffered(FLOODER) == relay.buffered(HELPER) == 0


async def test_an_agent_relays_long_text_in_pieces_the_console_reads_and_cuts_long_arguments(bus_login: Login) -> None:
    async with console_and(bus_login, HELPER) as (relay, (helper,)):
        steps = _turn(relay, HELPER, "s1")
        first = asyncio.ensure_future(anext(steps))
        turn = await helper.next_turn()
        progress = ProgressRelay(bus=helper.bus, reply_to=str(turn.reply_to), request_id=turn.request_id)
        progress(TextDelta(text="a" * (2 * MAX_PROGRESS_BYTES)))
        progress(ToolStarted(call_id="c1", name="execute_python_script", arguments="b" * (2 * MAX_PROGRESS_CHARS)))
        await progress.close()
        await helper.answer(turn, "done")
        taken = [await bounded(first, within=30, what="the first step"), *[step async for step in steps]]
    texts = [step for step in taken if isinstance(step, TextDelta)]
    assert "".join(step.text for step in texts) == "a" * (2 * MAX_PROGRESS_BYTES)
    assert max(len(step.text) for step in texts) == MAX_PROGRESS_CHARS
    (started,) = [step for step in taken if isinstance(step, ToolStarted)]
    assert started.arguments == "b" * MAX_PROGRESS_CHARS
