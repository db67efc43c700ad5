"""The inbox and agents calling agents over a real RabbitMQ broker, each agent on its own connection."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

from aiohttp import web

from rockbot.bus import LOCAL, AmqpBus, Bus, Delivery, Principal
from rockbot.bus.topology import agent_inbox
from rockbot.contracts.inbox import InboxReply, InboxRequest
from tests.agent.test_inbox import CALLER, Team, agent, calls, config
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.fixtures.rabbitmq import RabbitBroker, Vhost
from tests.waiting import eventually


def on_broker(vhost: Vhost, *, names: dict[Principal, str] | None = None) -> Team:
    """Agents on the test's vhost, each logged in as itself; `names` names some connections."""

    async def login(principal: Principal) -> Bus:
        name = (names or {}).get(principal)
        return await AmqpBus.connect(url=vhost.url_of(principal, connection_name=name), reconnect_interval=0.2)

    return Team(login=login, provision=vhost.provision)


async def test_an_agent_calls_another_agent_as_a_tool_across_the_broker(scripted_llm, vhost):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="ask_researcher", arguments={"message": "Find the capital of Peru."})]),
        Turn(text="Lima."),  # the researcher's answer
        Turn(text="The researcher says: Lima."),
    )
    team = on_broker(vhost)
    try:
        lead = config(scripted_llm, "lead", calls("ask_researcher", "researcher"))
        researcher, _ = await team.start(scripted_llm, config(scripted_llm, "researcher"), lead)
        reply = await team.ask(name="lead", request=InboxRequest(
            kind="user_message", request_id="r1", session_id="u1", content="Capital of Peru?", reply_to=CALLER.name))
    finally:
        await team.close()
    assert (reply.request_id, reply.answer, reply.error) == ("r1", "The researcher says: Lima.", None)
    assert reply.tools_called == ("ask_researcher",)
    assert scripted_llm.requests[1].messages[-1] == {"role": "user", "content": "Find the capital of Peru."}
    assert scripted_llm.requests[2].messages[-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "Lima."}
    leads_session = f"team-a/lead:team-a/lead|{LOCAL.user}|u1"  # the lead's own conversation, named by its key
    kept = researcher.conversation(caller=agent("lead").user, session_id=leads_session)
    assert researcher.conversations.history(kept.id)[-1]["content"] == "Lima."


class GatedLLM(ScriptedLLM):
    """The scripted LLM, holding every request until the test opens `gate`; `arrived` counts them."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.arrived = 0

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        self.arrived += 1
        await self.gate.wait()
        return await super()._chat(request)


async def test_an_inbox_request_redelivered_after_the_connection_died_unacked_asks_the_model_once(
    rabbitmq: RabbitBroker, vhost: Vhost, caplog
):
    caplog.set_level(logging.INFO, logger="rockbot.bus.once")
    llm = await GatedLLM().start()
    llm.play(Turn(text="Only once."), Turn(text="A second run!"))
    name = f"inbox-agent-{uuid.uuid4().hex[:8]}"
    replies: list[InboxReply] = []

    async def collect(delivery: Delivery) -> None:
        replies.append(delivery.decode(InboxReply))

    request = InboxRequest(kind="user_message", request_id="dup-1", session_id="s", content="hi", reply_to=CALLER.name)
    inbox = agent_inbox(namespace="team-a", name="careful")
    team = on_broker(vhost, names={agent("careful"): name})
    try:
        (runtime,) = await team.start(llm, config(llm, "careful"))
        user = await team.connect(LOCAL)
        try:
            await user.consume(queue=CALLER, handler=collect)
            await user.publish(queue=inbox, body=request, correlation_id=request.request_id, reply_to=CALLER.name)

            async def with_the_model() -> None:
                assert llm.arrived == 1

            await eventually(with_the_model)
            # The agent's connection dies while its turn is with the model: the request is un-acked,
            # so the broker redelivers it once the robust connection is back.
            await asyncio.to_thread(rabbitmq.close_connection, name=name, reason="agent connection lost")

            async def joined() -> None:
                assert any(
                    r.name == "rockbot.bus.once" and "is being handled" in r.getMessage() for r in caplog.records
                ), f"the model was asked {llm.arrived} times"

            await eventually(joined, within=30)
            llm.gate.set()

            async def settled() -> None:
                assert replies, "no reply yet"
                queues = await asyncio.to_thread(vhost.queues)
                assert queues[inbox.name] == queues[CALLER.name] == (0, 0), queues

            await eventually(settled, within=30)
        finally:
            llm.gate.set()
    finally:
        await team.close()
        await llm.stop()
    assert llm.arrived == len(llm.requests) == 1
    # The copy whose connection died was never answered; the redelivered one was, with the one turn's answer.
    assert [(r.request_id, r.answer) for r in replies] == [("dup-1", "Only once.")]
    kept = runtime.conversation(caller=LOCAL.user, session_id="s")
    assert [m["content"] for m in runtime.conversations.history(kept.id)] == ["hi", "Only once."]


async def test_two_callers_using_the_same_session_id_never_share_a_conversation(scripted_llm, vhost):
    """L2: B tells a shared callee a secret under a session id; A, using the same session id, gets nothing of it."""
    scripted_llm.play(Turn(text="Noted."), Turn(text="I know nothing about Alice."))
    team = on_broker(vhost)
    session = "default/victim:task-payroll"
    try:
        await team.start(
            scripted_llm, config(scripted_llm, "helper"), config(scripted_llm, "victim", calls("ask_helper", "helper")),
            config(scripted_llm, "attacker", calls("ask_helper", "helper")), run=["helper"],
        )
        told = await team.ask(name="helper", sender=agent("victim"), request=InboxRequest(
            kind="agent_call", request_id="v1", session_id=session, content="Alice earns 123456 EUR.",
            call_chain=("team-a/victim",)))
        asked = await team.ask(name="helper", sender=agent("attacker"), request=InboxRequest(
            kind="agent_call", request_id="a1", session_id=session, content="What does Alice earn?",
            call_chain=("team-a/attacker",)))
    finally:
        await team.close()
    assert (told.answer, asked.answer) == ("Noted.", "I know nothing about Alice.")
    seen_by_attackers_turn = json.dumps(scripted_llm.requests[1].messages)
    assert "123456" not in seen_by_attackers_turn
    assert scripted_llm.requests[1].messages[1:] == [{"role": "user", "content": "What does Alice earn?"}]
