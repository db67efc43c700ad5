"""The inbox and agents calling agents, over the in-memory bus, with the scripted LLM as every model."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import (
    GATEWAY,
    LOCAL,
    OPERATOR,
    AccessRefused,
    Bus,
    MemoryBroker,
    NoRoute,
    Principal,
    Queue,
    Subscription,
)
from rockbot.bus.admin import ensure_principal, provision_agents
from rockbot.bus.permissions import Limits
from rockbot.bus.topology import GATEWAY_RUNS, OPERATOR_RUNS, agent_inbox, agent_replies, local_scheduler_replies
from rockbot.contracts.agent_config import (
    AgentBackend,
    AgentConfig,
    FunctionDefinition,
    ResolvedTool,
    ToolDefinition,
)
from rockbot.contracts.inbox import MAX_CALL_DEPTH, InboxReply, InboxRequest
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn

PARAMS = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
#: The test plays `rockbot local`'s scheduler (`service.local`), which may send work to every agent.
CALLER = local_scheduler_replies(instance="t1")


def calls(name: str, target: str) -> ResolvedTool:
    return ResolvedTool(
        definition=ToolDefinition(
            function=FunctionDefinition(name=name, description=f"Ask {target}.", parameters=PARAMS)
        ),
        source=f"agent:{target}",
        backend=AgentBackend(namespace="team-a", name=target),
        timeout_seconds=10,
    )


def agent(name: str) -> Principal:
    return Principal.agent(namespace="team-a", name=name)


Login = Callable[[Principal], Awaitable[Bus]]


class Team:
    """Agents of one namespace, each on its own connection as itself, provisioned from their configs."""

    def __init__(self, *, login: Login, provision: Callable[[list[AgentConfig]], Awaitable[None]]) -> None:
        self._login = login
        self._provision = provision
        self._buses: dict[Principal, Bus] = {}
        self._running: list[tuple[AgentRuntime, Subscription]] = []

    async def connect(self, principal: Principal) -> Bus:
        """The principal's one connection (two would compete for its reply queue)."""
        if principal not in self._buses:
            self._buses[principal] = await self._login(principal)
        return self._buses[principal]

    async def start(
        self, llm, *configs: AgentConfig, run: list[str] | None = None, runtime: type[AgentRuntime] = AgentRuntime,
        **options,
    ) -> list[AgentRuntime]:
        """Provision all `configs` (so callers and callees know each other), then run the agents named in `run`."""
        await self._provision(list(configs))
        started = []
        for config in configs:
            if run is not None and config.name not in run:
                continue
            bus = await self.connect(agent(config.name))
            agent_runtime = runtime.from_config(config, bus=bus, env={API_KEY_ENV: "k"}, **options)
            await agent_runtime.start()
            self._running.append((agent_runtime, await serve_inbox(runtime=agent_runtime, bus=bus)))
            started.append(agent_runtime)
        return started

    async def ask(self, *, name: str, request: InboxRequest, sender: Principal = LOCAL,
                  timeout_seconds: float = 10) -> InboxReply:
        bus = await self.connect(sender)
        replies = {LOCAL: CALLER, GATEWAY: GATEWAY_RUNS, OPERATOR: OPERATOR_RUNS}.get(sender) or await bus.own_replies()
        delivery = await bus.request(
            queue=agent_inbox(namespace="team-a", name=name), body=request, reply_queue=replies,
            correlation_id=request.request_id, timeout_seconds=timeout_seconds, responder=agent(name),
        )  # fmt: skip
        return delivery.decode(InboxReply)

    async def close(self) -> None:
        for agent_runtime, subscription in self._running:
            await subscription.close()
            await agent_runtime.close()
        for bus in self._buses.values():
            await bus.close()


def config(llm, name: str, *tools: ResolvedTool) -> AgentConfig:
    return agent_config(llm_url=llm.url, name=name, tools=list(tools))


@pytest.fixture
async def team() -> AsyncIterator[Team]:
    broker = MemoryBroker()

    async def login(principal: Principal) -> Bus:
        return broker.connect(principal.user)

    async def provision(configs: list[AgentConfig]) -> None:
        await provision_agents(broker, configs, scheduler=LOCAL, password=lambda _: "")

    opened = Team(login=login, provision=provision)
    yield opened
    await opened.close()


async def test_a_user_message_on_the_inbox_is_answered(scripted_llm, team):
    scripted_llm.play(Turn(text="Hello, user."), Turn(text="Still here."))
    await team.start(scripted_llm, config(scripted_llm, "solo"))
    first = await team.ask(name="solo", request=InboxRequest(
        kind="user_message", request_id="r1", session_id="chat-1", content="hi", reply_to=CALLER.name))
    second = await team.ask(name="solo", request=InboxRequest(
        kind="scheduled_task", request_id="r2", session_id="chat-1", content="ping", reply_to=CALLER.name))
    assert (first.request_id, first.answer, first.error) == ("r1", "Hello, user.", None)
    assert second.answer == "Still here."
    assert [m["content"] for m in scripted_llm.requests[1].messages[1:]] == ["hi", "Hello, user.", "ping"]


async def test_an_agent_calls_another_agent_as_a_tool(scripted_llm, team):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="ask_researcher", arguments={"message": "Find the capital of France."})]),
        Turn(text="Paris."),  # the researcher's answer
        Turn(text="The researcher says: Paris."),
    )
    lead = config(scripted_llm, "lead", calls("ask_researcher", "researcher"))
    researcher, _ = await team.start(scripted_llm, config(scripted_llm, "researcher"), lead)
    reply = await team.ask(name="lead", request=InboxRequest(
        kind="user_message", request_id="r1", session_id="u1", content="Capital of France?", reply_to=CALLER.name))
    assert reply.answer == "The researcher says: Paris." and reply.tools_called == ("ask_researcher",)
    researcher_request = scripted_llm.requests[1]
    assert researcher_request.messages[-1] == {"role": "user", "content": "Find the capital of France."}
    tool_answer = scripted_llm.requests[2].messages[-1]
    assert tool_answer == {"role": "tool", "tool_call_id": "call_0_0", "content": "Paris."}
    leads_session = f"team-a/lead:team-a/lead|{LOCAL.user}|u1"  # the lead's own conversation, named by its key
    kept = researcher.conversation(caller=agent("lead").user, session_id=leads_session)
    assert researcher.conversations.history(kept.id)[-1]["content"] == "Paris."


async def test_a_call_that_would_loop_back_is_refused(scripted_llm, team):
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="ask_b", arguments={"message": "help"})]),  # a -> b
        Turn(tool_calls=[ScriptedCall(name="ask_a", arguments={"message": "help back"})]),  # b -> a: refused
        Turn(text="b gives up"),
        Turn(text="a is done"),
    )
    await team.start(
        scripted_llm, config(scripted_llm, "a", calls("ask_b", "b")), config(scripted_llm, "b", calls("ask_a", "a"))
    )
    reply = await team.ask(name="a", request=InboxRequest(
        kind="user_message", request_id="r1", session_id="u", content="go", reply_to=CALLER.name))
    assert reply.answer == "a is done"
    refusal = json.loads(scripted_llm.requests[2].messages[-1]["content"])["error"]
    assert refusal["code"] == "Rejected" and "team-a/a -> team-a/b -> team-a/a" in refusal["message"]
    assert len(scripted_llm.requests) == 4


async def test_the_callee_refuses_cycles_and_depth_itself(scripted_llm, team):
    """Callers that skip their own check (here: the test, as each caller) are refused by the callee."""
    hops = [config(scripted_llm, f"hop{n}", calls("ask_deep", "deep")) for n in range(MAX_CALL_DEPTH + 1)]
    other = config(scripted_llm, "other", calls("ask_deep", "deep"))
    await team.start(scripted_llm, config(scripted_llm, "deep"), other, *hops, run=["deep"])
    chain = tuple(f"team-a/hop{n}" for n in range(MAX_CALL_DEPTH + 1))
    too_deep = await team.ask(name="deep", sender=agent(f"hop{MAX_CALL_DEPTH}"), request=InboxRequest(
        kind="agent_call", request_id="r1", session_id="s", content="x", call_chain=chain))
    looped = await team.ask(name="deep", sender=agent("other"), request=InboxRequest(
        kind="agent_call", request_id="r2", session_id="s", content="x", call_chain=("team-a/deep", "team-a/other")))
    assert too_deep.error.code == "Rejected" and f"the limit is {MAX_CALL_DEPTH}" in too_deep.error.message
    assert looped.error.code == "Rejected" and "loop back" in looped.error.message
    assert scripted_llm.requests == []


async def test_an_unreadable_message_is_answered_with_an_error(scripted_llm, team):
    await team.start(scripted_llm, config(scripted_llm, "strict"))
    bus = await team.connect(LOCAL)
    delivery = await bus.request(
        queue=agent_inbox(namespace="team-a", name="strict"), body=Queue(name="not-a-request"),
        reply_queue=CALLER, correlation_id="bad-1", timeout_seconds=10, responder=agent("strict"))
    reply = delivery.decode(InboxReply)
    assert reply.request_id == "bad-1" and reply.error.code == "InvalidArguments"


async def test_a_model_failure_is_replied_as_unavailable(scripted_llm, team):
    scripted_llm.play(Turn(status=401, error="bad key"))
    await team.start(scripted_llm, config(scripted_llm, "broken"))
    reply = await team.ask(name="broken", request=InboxRequest(
        kind="user_message", request_id="r1", session_id="s", content="hi", reply_to=CALLER.name))
    assert reply.error.code == "Unavailable"
    assert "HTTP 401" in reply.error.message and API_KEY_ENV in reply.error.message


async def test_a_duplicated_request_asks_the_model_once_and_every_copy_gets_the_same_reply(scripted_llm, team):
    scripted_llm.play(Turn(text="Only once.", delay_seconds=0.3), Turn(text="A second run!"))
    (runtime,) = await team.start(scripted_llm, config(scripted_llm, "careful"))
    bus = await team.connect(LOCAL)
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
    assert len(scripted_llm.requests) == 1
    assert copies[0].answer == "Only once." and copies[0] == copies[1] == copies[2]
    kept = runtime.conversation(caller=LOCAL.user, session_id="s")
    assert [m["content"] for m in runtime.conversations.history(kept.id)] == ["hi", "Only once."]


class FaultyRuntime(AgentRuntime):
    """An agent with a bug: its turn fails with an error that is not the model endpoint's."""

    async def chat(self, session_id, text, **kwargs):
        raise RuntimeError(f"the conversation store broke on {text!r}")


async def test_an_unexpected_failure_is_replied_as_execution_failed_not_left_to_time_out(scripted_llm, team):
    await team.start(scripted_llm, config(scripted_llm, "faulty"), runtime=FaultyRuntime)
    reply = await team.ask(name="faulty", request=InboxRequest(
        kind="user_message", request_id="r1", session_id="s", content="hi", reply_to=CALLER.name))
    assert (reply.request_id, reply.error.code, reply.error.retryable) == ("r1", "ExecutionFailed", False)
    assert "RuntimeError: the conversation store broke on 'hi'" in reply.error.message


async def test_a_retryable_failure_is_not_remembered_so_a_copy_runs_again(scripted_llm, team):
    scripted_llm.play(Turn(status=503, error="overloaded"), Turn(text="Back again."))
    await team.start(scripted_llm, config(scripted_llm, "flaky"), llm_max_attempts=1)
    request = InboxRequest(kind="user_message", request_id="r1", session_id="s", content="hi", reply_to=CALLER.name)
    first = await team.ask(name="flaky", request=request)
    second = await team.ask(name="flaky", request=request)
    third = await team.ask(name="flaky", request=request)
    assert (first.error.code, first.error.retryable) == ("Unavailable", True) and "HTTP 503" in first.error.message
    assert second.answer == third.answer == "Back again." and len(scripted_llm.requests) == 2


async def test_trigger_runs_are_taken_from_the_gateway_only(scripted_llm):
    broker = MemoryBroker()

    async def provision(configs: list[AgentConfig]) -> None:
        await broker.ensure_topology()
        for service in (GATEWAY, OPERATOR):
            await ensure_principal(broker, service, password="")
        for each in configs:
            await ensure_principal(broker, agent(each.name), password="", called_by=[GATEWAY, OPERATOR])

    team = Team(login=lambda principal: asyncio.sleep(0, broker.connect(principal.user)), provision=provision)
    scripted_llm.play(Turn(text="Triaged."))
    try:
        await team.start(scripted_llm, config(scripted_llm, "triage"))
        run = InboxRequest(kind="trigger", request_id="trigger/team-a/issues/r1", session_id="trigger/r1",
                           content="Issue #7 was opened.", reply_to=GATEWAY_RUNS.name)
        answered = await team.ask(name="triage", request=run, sender=GATEWAY)
        forged = run.model_copy(update={"request_id": "trigger/team-a/issues/r2", "reply_to": OPERATOR_RUNS.name})
        refused = await team.ask(name="triage", request=forged, sender=OPERATOR)
    finally:
        await team.close()
    assert answered.answer == "Triaged."
    assert refused.error is not None and refused.error.code == "Rejected"
    assert "Trigger runs come from the gateway, not from service.operator" in refused.error.message
    assert len(scripted_llm.requests) == 1


async def test_each_process_of_an_agent_claims_a_reply_slot_of_its_own_until_none_is_free():
    broker = MemoryBroker()
    await ensure_principal(broker, agent("lead"), password="", replicas=1)  # 2 x 1 + 1 slots
    processes = [broker.connect(agent("lead").user) for _ in range(3)]
    with pytest.raises(AccessRefused, match="limit of 3 connections"):  # as many as it has slots
        broker.connect(agent("lead").user)
    await broker.ensure_limits(user=agent("lead").user, limits=Limits(max_connections=9, max_channels=72))
    processes.append(broker.connect(agent("lead").user))  # say, a broker set up by hand with a higher limit
    try:
        claimed = [(await bus.own_replies()).name for bus in processes[:3]]
        assert await processes[0].own_replies() == agent_replies(namespace="team-a", name="lead", slot=0)
        with pytest.raises(NoRoute, match=r"held by another process .3 provisioned.*spec.replicas"):
            await processes[3].own_replies()
        await processes[1].close()  # a process that is gone frees its slot
        assert (await processes[3].own_replies()).name == "agent.team-a.lead.replies.1"
    finally:
        for bus in processes:
            await bus.close()
    assert claimed == [f"agent.team-a.lead.replies.{n}" for n in range(3)]


def test_an_agent_call_must_name_its_caller():
    with pytest.raises(ValueError, match="call_chain"):
        InboxRequest(kind="agent_call", request_id="r", session_id="s", content="x")


def test_a_reply_has_an_answer_or_an_error():
    with pytest.raises(ValueError, match="exactly one"):
        InboxReply(request_id="r", session_id="s")
