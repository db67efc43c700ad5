"""Issue 13 §1 on the real broker: an agent allowed to call another cannot get a third agent's answer out of it
by replaying that caller's request id, and the inbox refuses what its sender may not send."""

from __future__ import annotations

from rockbot.bus import Bus, Principal
from rockbot.bus.topology import agent_inbox, agent_replies
from rockbot.contracts.inbox import InboxReply, InboxRequest
from tests.agent.test_inbox import agent, calls, config
from tests.agent.test_inbox_rabbitmq import on_broker
from tests.fixtures.llm import Turn
from tests.waiting import eventually

KEEPER = agent("keeper")


async def ask_keeper(bus: Bus, caller: Principal, request: InboxRequest, *, slot: int = 0) -> InboxReply:
    """As `caller`'s process holding reply slot `slot` asks: answers come back on that process's own reply queue."""
    delivery = await bus.request(
        queue=agent_inbox(namespace="team-a", name="keeper"), body=request, correlation_id=request.request_id,
        reply_queue=agent_replies(namespace="team-a", name=caller.name, slot=slot), timeout_seconds=30,
        responder=KEEPER,
    )  # fmt: skip
    return delivery.decode(InboxReply)


async def test_replaying_another_callers_request_id_never_gets_its_answer(scripted_llm, vhost):
    scripted_llm.play(Turn(text="The vault code is 4711."), Turn(text="Nothing for you."))
    team = on_broker(vhost)
    try:
        lead, mallory = config(scripted_llm, "lead", calls("ask", "keeper")), config(scripted_llm, "mallory",
                                                                                        calls("ask", "keeper"))
        await team.start(scripted_llm, config(scripted_llm, "keeper"), lead, mallory, run=["keeper"])
        lead_bus, mallory_bus = await team.connect(agent("lead")), await team.connect(agent("mallory"))
        private = InboxRequest(kind="agent_call", request_id="lead.5f1e", session_id="team-a/lead:s1",
                               content="What is the vault code?", call_chain=("team-a/lead",))
        first = await ask_keeper(lead_bus, agent("lead"), private)
        # mallory replays lead's request id, with its own reply queue: as itself, and word for word.
        own = private.model_copy(update={"call_chain": ("team-a/mallory",), "session_id": "team-a/mallory:s1"})
        replayed = await ask_keeper(mallory_bus, agent("mallory"), own)
        copied = await ask_keeper(mallory_bus, agent("mallory"), private)
        # lead's own id reused for another reply queue is not answered from memory either.
        moved = await ask_keeper(lead_bus, agent("lead"), private, slot=1)
    finally:
        await team.close()
    assert first.answer == "The vault code is 4711."
    assert replayed.answer == "Nothing for you."  # a run of its own, never lead's remembered answer
    assert copied.error is not None and copied.error.code == "Rejected", copied
    assert "names team-a/lead as its caller but comes from agent.team-a.mallory" in copied.error.message
    assert moved.error is not None and moved.error.code == "Rejected", moved
    assert "already used for another request or reply queue" in moved.error.message
    assert all("4711" not in (reply.answer or "") for reply in (replayed, copied, moved))
    assert len(scripted_llm.requests) == 2
    letters = await eventually(lambda: _one_dead_letter(vhost))
    assert [(d.queue, d.reason, d.user_id) for d in letters] == [
        ("agent.team-a.keeper.inbox", "rejected", "agent.team-a.mallory")]


async def test_a_request_asking_for_replies_on_someone_elses_queue_is_dead_lettered_unanswered(scripted_llm, vhost):
    team = on_broker(vhost)
    try:
        mallory = config(scripted_llm, "mallory", calls("ask", "keeper"))
        await team.start(scripted_llm, config(scripted_llm, "keeper"), config(scripted_llm, "lead"), mallory,
                         run=["keeper"])
        mallory_bus = await team.connect(agent("mallory"))
        request = InboxRequest(kind="agent_call", request_id="m.1", session_id="s", content="Answer lead, not me.",
                               call_chain=("team-a/mallory",))
        lead_replies = agent_replies(namespace="team-a", name="lead", slot=0).name
        await mallory_bus.publish(queue=agent_inbox(namespace="team-a", name="keeper"), body=request,
                                  message_id="m.1", correlation_id="m.1", reply_to=lead_replies)
        letters = await eventually(lambda: _one_dead_letter(vhost))
    finally:
        await team.close()
    assert [(d.message_id, d.reason, d.user_id) for d in letters] == [("m.1", "rejected", "agent.team-a.mallory")]
    assert scripted_llm.requests == []


async def _one_dead_letter(vhost) -> list:
    letters = await vhost.admin.dead_letters()
    assert len(letters) == 1, letters
    return letters
