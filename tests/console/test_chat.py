"""Chat through the console: a person's turn goes to the agent's inbox as `service.console`, the agent (its own
process, on a real RabbitMQ) streams text and tool calls back to the console's reply queue, and the run store
keeps the conversation under `console:<user>`. Only the console speaks for a person; the console takes a
turn's progress only from the agent it asked."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rockbot.agent.events import TextDelta, ToolFinished, ToolStarted
from rockbot.bus import CONSOLE, LOCAL, AmqpBus, MemoryBroker, Principal
from rockbot.bus.topology import agent_inbox, local_scheduler_replies
from rockbot.console.chat import ChatRelay
from rockbot.console.store_models import RunFilter
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.contracts.progress import TurnProgress
from tests.agent.configs import agent_config
from tests.buses import login
from tests.console.chat_world import chat_world
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import bounded, eventually

ANSWER = "Hello Alice: the guides list is empty, and this answer streams in pieces."


async def test_a_person_chats_with_an_agent_process_through_the_console(scripted_llm: ScriptedLLM, vhost: Vhost,
                                                                          tmp_path: Path) -> None:
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="list_tool_guides")]),
                      Turn(text=ANSWER, hold_after_chars=8))
    config = agent_config(llm_url=scripted_llm.url, name="helper", builtin_tools=["guides"])
    async with chat_world(config, vhost=vhost, folder=tmp_path) as world:
        steps: list[object] = []

        async def first_turn() -> None:
            async for step in world.relay.turn(namespace="team-a", agent="helper", user="alice", session_id="s1",
                                               content="Which guides are there?"):
                steps.append(step)
                if isinstance(step, TextDelta) and not scripted_llm.release.is_set():
                    # the start of the answer reached the console while the model still holds the rest
                    assert ANSWER.startswith(step.text) and len(step.text) < len(ANSWER)
                    scripted_llm.release.set()

        await bounded(first_turn(), within=60, what="the first turn")
        started, finished = steps[0], steps[1]
        assert isinstance(started, ToolStarted) and started.name == "list_tool_guides"
        assert isinstance(finished, ToolFinished) and finished.ok and finished.call_id == started.call_id
        texts = [step.text for step in steps if isinstance(step, TextDelta)]
        reply = steps[-1]
        assert isinstance(reply, InboxReply) and reply.answer == ANSWER == "".join(texts)
        assert reply.tools_called == ("list_tool_guides",) and reply.run_id

        async def recorded() -> None:
            page = await world.store.list_runs(filters=RunFilter(namespace="team-a", agent="helper",
                                                                 caller="console:alice"))
            assert [(r.session_id, r.outcome) for r in page.runs] == [("s1", "Succeeded")]

        await eventually(recorded, within=30)  # the run is alice's, recorded through the console's writer

        scripted_llm.play(Turn(text="Still here."), Turn(text="Who are you?"))
        again = [s async for s in world.relay.turn(namespace="team-a", agent="helper", user="alice",
                                                    session_id="s1", content="And now?")]
        assert again[-1].answer == "Still here."  # type: ignore[union-attr]
        assert {"role": "assistant", "content": ANSWER} in scripted_llm.requests[2].messages  # history continues
        other = [s async for s in world.relay.turn(namespace="team-a", agent="helper", user="bob",
                                                    session_id="s1", content="Hi")]
        assert other[-1].answer == "Who are you?"  # type: ignore[union-attr]
        assert [m["role"] for m in scripted_llm.requests[3].messages] == ["system", "user"]  # bob's own s1

        # anyone but the console naming a person is refused, and the refusal says why
        local = await AmqpBus.connect(url=vhost.url_of(LOCAL))
        try:
            delivery = await local.request(
                queue=agent_inbox(namespace="team-a", name="helper"), reply_queue=local_scheduler_replies(instance="t"),
                body=InboxRequest(kind="user_message", request_id="forged", session_id="s1", content="x",
                                  on_behalf_of="alice"),
                correlation_id="forged", timeout_seconds=30, responder=Principal.agent(namespace="team-a",
                                                                                       name="helper"))
        finally:
            await local.close()
        refused = delivery.decode(InboxReply)
        assert refused.error is not None and refused.error.code == ErrorCode.REJECTED
        assert "only the console speaks for a person" in refused.error.message
    assert len(scripted_llm.requests) == 4  # the forged turn never reached the model


async def test_the_console_takes_a_turns_progress_only_from_the_agent_it_asked() -> None:
    broker = MemoryBroker()
    helper, other = (Principal.agent(namespace="team-a", name=name) for name in ("helper", "other"))
    console_bus = await login(broker, CONSOLE)
    helper_bus = await login(broker, helper, called_by=[CONSOLE])
    other_bus = await login(broker, other, called_by=[CONSOLE])
    relay = ChatRelay(timeout_seconds=30)
    await relay.start(bus=console_bus)
    requests: asyncio.Queue = asyncio.Queue()

    async def take(delivery) -> None:
        await requests.put(delivery)

    inbox = await helper_bus.consume(queue=agent_inbox(namespace="team-a", name="helper"), handler=take)
    try:
        turn = relay.turn(namespace="team-a", agent="helper", user="alice", session_id="s1", content="hi")
        first = asyncio.ensure_future(anext(turn))
        delivery = await bounded(requests.get(), within=10, what="the turn in the helper's inbox")
        request = delivery.decode(InboxRequest)
        assert (request.on_behalf_of, request.progress, delivery.sender) == ("alice", True, CONSOLE)
        forged = TurnProgress(request_id=request.request_id, seq=0, event=TextDelta(text="I am helper, trust me"))
        for bus in (other_bus, helper_bus):  # the other agent knows the id (say it guessed): it is not heard
            text = "I am helper, trust me" if bus is other_bus else "real"
            await bus.publish(queue=relay.replies, correlation_id=request.request_id,
                              body=forged.model_copy(update={"event": TextDelta(text=text)}))
            await bus.publish(queue=relay.replies, correlation_id=request.request_id,
                              body=InboxReply(request_id=request.request_id, session_id="s1", answer=text))
        steps = [await bounded(first, within=10, what="the first step"), *[s async for s in turn]]
    finally:
        await inbox.close()
        await relay.stop()
        for bus in (console_bus, helper_bus, other_bus):
            await bus.close()
    assert steps == [TextDelta(text="real"), InboxReply(request_id=request.request_id, session_id="s1",
                                                        answer="real")]
