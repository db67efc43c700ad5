"""The inbox and agents calling agents, over the in-memory bus, with the scripted LLM as every model."""

from __future__ import annotations

import asyncio
import json

import pytest

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import MemoryBus, Queue
from rockbot.bus.topology import agent_inbox, agent_replies
from rockbot.contracts.agent_config import AgentBackend, FunctionDefinition, ResolvedTool, ToolDefinition
from rockbot.contracts.inbox import MAX_CALL_DEPTH, InboxReply, InboxRequest
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn

PARAMS = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
CALLER = Queue(name="test.caller.replies")


def calls(name: str, target: str) -> ResolvedTool:
    return ResolvedTool(
        definition=ToolDefinition(
            function=FunctionDefinition(name=name, description=f"Ask {target}.", parameters=PARAMS)
        ),
        source=f"agent:{target}",
        backend=AgentBackend(namespace="team-a", name=target),
        timeout_seconds=10,
    )


@pytest.fixture
async def bus():
    async with MemoryBus() as bus:
        yield bus


async def started(llm, bus, name, tools=()):
    runtime = AgentRuntime.from_config(
        agent_config(llm_url=llm.url, name=name, tools=list(tools)), bus=bus, env={API_KEY_ENV: "k"}
    )
    await runtime.start()
    subscription = await serve_inbox(runtime=runtime, bus=bus)
    return runtime, subscription


async def ask(bus, *, name, request: InboxRequest) -> InboxReply:
    delivery = await bus.request(
        queue=agent_inbox(namespace="team-a", name=name), body=request, reply_queue=CALLER,
        correlation_id=request.request_id, timeout_seconds=10,
    )
    return delivery.decode(InboxReply)


async def test_a_user_message_on_the_inbox_is_answered(scripted_llm, bus):
    scripted_llm.play(Turn(text="Hello, user."), Turn(text="Still here."))
    runtime, subscription = await started(scripted_llm, bus, "solo")
    try:
        first = await ask(bus, name="solo", request=InboxRequest(
            kind="user_message", request_id="r1", session_id="chat-1", content="hi", reply_to=CALLER.name))
        second = await ask(bus, name="solo", request=InboxRequest(
            kind="scheduled_task", request_id="r2", session_id="chat-1", content="ping", reply_to=CALLER.name))
    finally:
        await subscription.close()
        await runtime.close()
    assert (first.request_id, first.answer, first.error) == ("r1", "Hello, user.", None)
    assert second.answer == "Still here."
    assert [m["content"] for m in scripted_llm.requests[1].messages[1:]] == ["hi", "Hello, user.", "ping"]


async def test_an_agent_calls_another_agent_as_a_tool(scripted_llm, bus):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="ask_researcher", arguments={"message": "Find the capital of France."})]),
        Turn(text="Paris."),  # the researcher's answer
        Turn(text="The researcher says: Paris."),
    )
    researcher, sub_r = await started(scripted_llm, bus, "researcher")
    lead, sub_l = await started(scripted_llm, bus, "lead", [calls("ask_researcher", "researcher")])
    try:
        reply = await ask(bus, name="lead", request=InboxRequest(
            kind="user_message", request_id="r1", session_id="u1", content="Capital of France?", reply_to=CALLER.name))
    finally:
        for s in (sub_l, sub_r):
            await s.close()
        for r in (lead, researcher):
            await r.close()
    assert reply.answer == "The researcher says: Paris." and reply.tools_called == ("ask_researcher",)
    researcher_request = scripted_llm.requests[1]
    assert researcher_request.messages[-1] == {"role": "user", "content": "Find the capital of France."}
    tool_answer = scripted_llm.requests[2].messages[-1]
    assert tool_answer == {"role": "tool", "tool_call_id": "call_0_0", "content": "Paris."}
    assert researcher.conversations.history("team-a/lead:u1")[-1]["content"] == "Paris."


async def test_a_call_that_would_loop_back_is_refused(scripted_llm, bus):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="ask_b", arguments={"message": "help"})]),  # a -> b
        Turn(tool_calls=[ScriptedCall(name="ask_a", arguments={"message": "help back"})]),  # b -> a: refused
        Turn(text="b gives up"),
        Turn(text="a is done"),
    )
    a, sub_a = await started(scripted_llm, bus, "a", [calls("ask_b", "b")])
    b, sub_b = await started(scripted_llm, bus, "b", [calls("ask_a", "a")])
    try:
        reply = await ask(bus, name="a", request=InboxRequest(
            kind="user_message", request_id="r1", session_id="u", content="go", reply_to=CALLER.name))
    finally:
        for s in (sub_a, sub_b):
            await s.close()
        for r in (a, b):
            await r.close()
    assert reply.answer == "a is done"
    refusal = json.loads(scripted_llm.requests[2].messages[-1]["content"])["error"]
    assert refusal["code"] == "Rejected" and "team-a/a -> team-a/b -> team-a/a" in refusal["message"]
    assert len(scripted_llm.requests) == 4


async def test_the_callee_refuses_cycles_and_depth_itself(scripted_llm, bus):
    runtime, subscription = await started(scripted_llm, bus, "deep")
    chain = tuple(f"team-a/hop{n}" for n in range(MAX_CALL_DEPTH + 1))
    try:
        too_deep = await ask(bus, name="deep", request=InboxRequest(
            kind="agent_call", request_id="r1", session_id="s", content="x", reply_to=CALLER.name, call_chain=chain))
        looped = await ask(bus, name="deep", request=InboxRequest(
            kind="agent_call", request_id="r2", session_id="s", content="x", reply_to=CALLER.name,
            call_chain=("team-a/deep", "team-a/other")))
    finally:
        await subscription.close()
        await runtime.close()
    assert too_deep.error.code == "Rejected" and f"the limit is {MAX_CALL_DEPTH}" in too_deep.error.message
    assert looped.error.code == "Rejected" and "loop back" in looped.error.message
    assert scripted_llm.requests == []


async def test_an_unreadable_message_is_answered_with_an_error(scripted_llm, bus):
    runtime, subscription = await started(scripted_llm, bus, "strict")
    try:
        delivery = await bus.request(
            queue=agent_inbox(namespace="team-a", name="strict"), body=Queue(name="not-a-request"),
            reply_queue=CALLER, correlation_id="bad-1", timeout_seconds=10)
    finally:
        await subscription.close()
        await runtime.close()
    reply = delivery.decode(InboxReply)
    assert reply.request_id == "bad-1" and reply.error.code == "InvalidArguments"


async def test_a_model_failure_is_replied_as_unavailable(scripted_llm, bus):
    scripted_llm.play(Turn(status=401, error="bad key"))
    runtime, subscription = await started(scripted_llm, bus, "broken")
    try:
        reply = await ask(bus, name="broken", request=InboxRequest(
            kind="user_message", request_id="r1", session_id="s", content="hi", reply_to=CALLER.name))
    finally:
        await subscription.close()
        await runtime.close()
    assert reply.error.code == "Unavailable"
    assert "HTTP 401" in reply.error.message and API_KEY_ENV in reply.error.message


async def test_a_duplicated_request_asks_the_model_once_and_every_copy_gets_the_same_reply(scripted_llm, bus):
    scripted_llm.play(Turn(text="Only once.", delay_seconds=0.3), Turn(text="A second run!"))
    runtime, subscription = await started(scripted_llm, bus, "careful")
    replies: asyncio.Queue = asyncio.Queue()
    answers = await bus.consume(queue=CALLER, handler=replies.put)
    inbox = agent_inbox(namespace="team-a", name="careful")
    request = InboxRequest(kind="user_message", request_id="dup-1", session_id="s", content="hi", reply_to=CALLER.name)
    try:
        for _ in range(2):  # the second copy arrives while the first is with the model
            await bus.publish(queue=inbox, body=request, correlation_id=request.request_id, reply_to=CALLER.name)
        copies = [(await asyncio.wait_for(replies.get(), 10)).decode(InboxReply) for _ in range(2)]
        # A redelivery after the answer went out gets the remembered reply.
        await bus.publish(queue=inbox, body=request, correlation_id=request.request_id, reply_to=CALLER.name)
        copies.append((await asyncio.wait_for(replies.get(), 10)).decode(InboxReply))
    finally:
        await answers.close()
        await subscription.close()
        await runtime.close()
    assert len(scripted_llm.requests) == 1
    assert copies[0].answer == "Only once." and copies[0] == copies[1] == copies[2]
    assert [m["content"] for m in runtime.conversations.history("s")] == ["hi", "Only once."]


class FaultyRuntime(AgentRuntime):
    """An agent with a bug: its turn fails with an error that is not the model endpoint's."""

    async def chat(self, session_id, text, **kwargs):
        raise RuntimeError(f"the conversation store broke on {text!r}")


async def test_an_unexpected_failure_is_replied_as_execution_failed_not_left_to_time_out(scripted_llm, bus):
    runtime = FaultyRuntime.from_config(agent_config(llm_url=scripted_llm.url, name="faulty"), bus=bus, env={})
    await runtime.start()
    subscription = await serve_inbox(runtime=runtime, bus=bus)
    try:
        reply = await ask(bus, name="faulty", request=InboxRequest(
            kind="user_message", request_id="r1", session_id="s", content="hi", reply_to=CALLER.name))
    finally:
        await subscription.close()
        await runtime.close()
    assert (reply.request_id, reply.error.code, reply.error.retryable) == ("r1", "ExecutionFailed", False)
    assert "RuntimeError: the conversation store broke on 'hi'" in reply.error.message


async def test_a_retryable_failure_is_not_remembered_so_a_copy_runs_again(scripted_llm, bus):
    scripted_llm.play(Turn(status=503, error="overloaded"), Turn(text="Back again."))
    runtime = AgentRuntime.from_config(
        agent_config(llm_url=scripted_llm.url, name="flaky"), bus=bus, env={API_KEY_ENV: "k"}, llm_max_attempts=1)
    await runtime.start()
    subscription = await serve_inbox(runtime=runtime, bus=bus)
    request = InboxRequest(kind="user_message", request_id="r1", session_id="s", content="hi", reply_to=CALLER.name)
    try:
        first = await ask(bus, name="flaky", request=request)
        second = await ask(bus, name="flaky", request=request)
        third = await ask(bus, name="flaky", request=request)
    finally:
        await subscription.close()
        await runtime.close()
    assert (first.error.code, first.error.retryable) == ("Unavailable", True) and "HTTP 503" in first.error.message
    assert second.answer == third.answer == "Back again." and len(scripted_llm.requests) == 2


def test_reply_queues_are_per_process():
    queue = agent_replies(namespace="team-a", name="lead", instance="ab12")
    assert queue.name == "agent.team-a.lead.replies.ab12" and queue.arguments == {"x-expires": 3_600_000}


def test_an_agent_call_must_name_its_caller():
    with pytest.raises(ValueError, match="call_chain"):
        InboxRequest(kind="agent_call", request_id="r", session_id="s", content="x")


def test_a_reply_has_an_answer_or_an_error():
    with pytest.raises(ValueError, match="exactly one"):
        InboxReply(request_id="r", session_id="s")
