"""The agent's scheduling tools end to end: agent runtime -> bus -> operator -> API -> firing -> inbox."""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel, RootModel

from rockbot.agent.inbox import serve_inbox
from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import OPERATOR, AmqpBus, Delivery, MemoryBroker, MemoryBus, Principal
from rockbot.bus.topology import OPERATOR_RUNS, OPERATOR_SCHEDULING, Queue, agent_inbox, agent_replies
from rockbot.clock import ManualClock
from rockbot.contracts.agent_config import HTTP_TOKEN_ENV
from rockbot.contracts.builtin_tools import BUILTIN_TOOLS
from rockbot.contracts.inbox import InboxRequest
from rockbot.contracts.scheduling import CancelTask, ListTasks, Operation, SchedulingReply, SchedulingRequest
from rockbot.kube import SCHEDULED_TASKS, SECRETS, NotFound
from rockbot.operator.builders import HTTP_TOKEN_KEY as TOKEN_KEY
from rockbot.operator.scheduling.agent_requests import SchedulingRequests, token_secret_name
from rockbot.operator.scheduling.firing import Scheduler
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.buses import login
from tests.fixtures.llm import Turn
from tests.fixtures.rabbitmq import Vhost
from tests.scheduling.conftest import Cluster
from tests.waiting import eventually

CONTEXT = ToolContext(session_id="chat-1", tool_call_id="call_1")


class RecordingBus:
    """The bus as an agent process holds it, noting every request the agent sends (to replay them)."""

    def __init__(self, bus: MemoryBus) -> None:
        self._bus = bus
        self.sent: list[dict[str, Any]] = []

    async def request(self, **request: Any) -> Delivery:
        self.sent.append(request)
        return await self._bus.request(**request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bus, name)


@pytest.fixture
async def operator_side(
    cluster: Cluster, operator_bus: MemoryBus, clock: ManualClock, wall_clock: ManualClock, start_scheduler
) -> AsyncIterator[None]:
    await cluster.agent()
    await cluster.agent("other")
    requests = SchedulingRequests(kube=cluster.kube, bus=operator_bus, clock=clock, wall_clock=wall_clock)
    await requests.start()
    await start_scheduler()
    yield
    await requests.stop()


@pytest.fixture
def helper_bus(bus: MemoryBus) -> RecordingBus:
    return RecordingBus(bus)


@pytest.fixture
async def helper(
    scripted_llm, helper_bus: RecordingBus, cluster: Cluster, operator_side: None
) -> AsyncIterator[AgentRuntime]:
    async with _runtime(scripted_llm, bus=helper_bus, token=cluster.tokens["helper"], namespace=cluster.ns) as runtime:
        yield runtime


def _runtime(scripted_llm, *, bus: Any, token: str | None, namespace: str) -> AgentRuntime:
    """The agent runtime of `<namespace>/helper`, holding `token` as its pod would (None: not wired)."""
    config = agent_config(llm_url=scripted_llm.url, name="helper", namespace=namespace, builtin_tools=["scheduling"])
    env = {API_KEY_ENV: "k"} | ({HTTP_TOKEN_ENV: token} if token is not None else {})
    return AgentRuntime.from_config(config, env=env, bus=bus)


async def send(bus: MemoryBus, request: BaseModel, *, reply_to: Queue, correlation_id: str) -> SchedulingReply:
    delivery = await bus.request(queue=OPERATOR_SCHEDULING, body=request, reply_queue=reply_to,
                                 correlation_id=correlation_id, timeout_seconds=5, responder=OPERATOR)
    return delivery.decode(SchedulingReply)


def signed(*, token: str, agent: str, operation: Operation, reply_to: Queue, correlation_id: str,
           issued_at: datetime.datetime | None = None) -> SchedulingRequest:
    return SchedulingRequest.signed(token=token, agent=agent, operation=operation, correlation_id=correlation_id,
                                    reply_to=reply_to.name, issued_at=issued_at or datetime.datetime.now(datetime.UTC))


async def call(runtime: AgentRuntime, tool: str, /, **arguments):
    return await runtime.registry.invoke(tool, arguments, context=CONTEXT)


async def test_the_set_offers_exactly_the_catalogued_tools(helper: AgentRuntime) -> None:
    registered = {tool.name: tool.description for tool in helper.registry.list()}
    assert registered == {t.name: t.description for t in BUILTIN_TOOLS if t.tool_set == "scheduling"}


async def test_a_scheduled_task_is_created_listed_fired_into_the_inbox_and_cancelled(
    helper: AgentRuntime, cluster: Cluster, bus: MemoryBus, clock: ManualClock, scripted_llm
) -> None:
    made = await call(helper, "schedule_task", name="digest", cron="0 18 * * *", prompt="Send the digest.",
                      time_zone="Europe/Berlin")
    assert made.ok, made.error
    assert "next run: 2024-05-01 18:00:00 CEST" in made.content
    task = await cluster.get_task("helper.digest")
    assert task["spec"] == {"agentRef": {"name": "helper"}, "schedule": "0 18 * * *", "timeZone": "Europe/Berlin",
                            "prompt": "Send the digest.", "runOnce": False} | {
                                key: task["spec"][key] for key in task["spec"]
                                if key not in {"agentRef", "schedule", "timeZone", "prompt", "runOnce"}}
    assert task["metadata"]["ownerReferences"][0]["kind"] == "Agent"
    assert task["metadata"]["labels"]["rockbot.dev/agent"] == "helper"

    async def listed() -> str:
        listing = await call(helper, "list_scheduled_tasks")
        assert "2024-05-01 18:00:00 CEST" in listing.content
        return listing.content

    table = await eventually(listed)
    assert table.startswith("Current time: 2024-05-01 10:20:00 UTC (Wednesday).")
    assert "| digest | `0 18 * * *` | Europe/Berlin |" in table and "| 2024-05-01 16:00:00 |" in table

    inbox = await serve_inbox(runtime=helper, bus=bus)
    scripted_llm.play(Turn(text="Digest sent."))
    clock.set(datetime.datetime(2024, 5, 1, 16, 0, tzinfo=datetime.UTC))

    async def succeeded() -> dict:
        status = (await cluster.get_task("helper.digest"))["status"]
        assert [(r["outcome"], r["summary"]) for r in status.get("history", [])] == [("Succeeded", "Digest sent.")]
        return status

    await eventually(succeeded)
    await inbox.close()
    assert scripted_llm.requests[-1].body["messages"][-1]["content"] == "Send the digest."

    cancelled = await call(helper, "cancel_scheduled_task", name="digest")
    assert cancelled.ok and "Cancelled task 'digest'" in cancelled.content
    with pytest.raises(NotFound):
        await cluster.get_task("helper.digest")
    again = await call(helper, "cancel_scheduled_task", name="digest")
    assert again.error.code == "InvalidArguments"
    assert again.error.message == "you have no task named 'digest'; you have no scheduled tasks"


async def test_scheduling_a_name_again_updates_the_task(helper: AgentRuntime, cluster: Cluster) -> None:
    await call(helper, "schedule_task", name="ping", cron="0 9 * * *", prompt="one")
    updated = await call(helper, "schedule_task", name="ping", cron="*/10 * * * *", prompt="two", run_once=True)
    assert updated.ok, updated.error
    spec = (await cluster.get_task("helper.ping"))["spec"]
    assert (spec["schedule"], spec["prompt"], spec["runOnce"]) == ("*/10 * * * *", "two", True)


async def test_scheduling_again_while_the_scheduler_writes_the_tasks_status_still_updates_it(
    helper: AgentRuntime, cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI saw "task 'ping' changed meanwhile" when the scheduler's status write fell between the tool's read of the
    # task and its conditional write: that write is not the agent's business, so the tool reads again.
    await call(helper, "schedule_task", name="ping", cron="0 9 * * *", prompt="one")
    owned, raced = SchedulingRequests._owned, []

    async def owned_then_status_written(self: SchedulingRequests, agent: dict[str, Any], *, name: str):
        task = await owned(self, agent, name=name)
        if not raced:
            raced.append(await cluster.kube.patch(SCHEDULED_TASKS, namespace=cluster.ns, name="helper.ping",
                                                  subresource="status", body={"status": {"observedGeneration": 99}}))
        return task

    monkeypatch.setattr(SchedulingRequests, "_owned", owned_then_status_written)
    updated = await call(helper, "schedule_task", name="ping", cron="*/10 * * * *", prompt="two")
    assert raced and updated.ok, updated.error
    spec = (await cluster.get_task("helper.ping"))["spec"]
    assert (spec["schedule"], spec["prompt"]) == ("*/10 * * * *", "two")


async def test_scheduling_a_completed_run_once_task_again_fires_it_again(
    helper: AgentRuntime, cluster: Cluster, clock: ManualClock
) -> None:
    made = await call(helper, "schedule_task", name="remind", cron="0 11 * * *", prompt="Remind me.", run_once=True)
    assert made.ok, made.error

    async def status_is(**expected: object) -> None:
        task = await cluster.get_task("helper.remind")
        status = task.get("status") or {}
        assert {key: status.get(key) for key in expected} == expected

    await eventually(lambda: status_is(nextScheduleTime="2024-05-01T11:00:00Z"))
    clock.set(datetime.datetime(2024, 5, 1, 11, 0, tzinfo=datetime.UTC))
    await eventually(lambda: status_is(completed=True, lastScheduleTime="2024-05-01T11:00:00Z"))
    again = await call(helper, "schedule_task", name="remind", cron="0 11 * * *", prompt="Remind me.", run_once=True)
    assert again.ok, again.error
    await eventually(lambda: status_is(completed=False, nextScheduleTime="2024-05-02T11:00:00Z"))


@pytest.mark.parametrize(
    ("arguments", "code", "words"),
    [
        ({"cron": "0 25 * * *"}, "InvalidArguments", "cron: '0 25 * * *' is not a valid cron expression"),
        ({"time_zone": "Moon/Base"}, "InvalidArguments", "time_zone: 'Moon/Base' is not an IANA time zone"),
        ({"name": "Bad Name"}, "InvalidArguments", "name"),
    ],
)
async def test_bad_requests_are_answered_with_the_field_to_fix(
    helper: AgentRuntime, cluster: Cluster, arguments: dict, code: str, words: str
) -> None:
    outcome = await call(helper, "schedule_task", **({"name": "x", "cron": "0 9 * * *", "prompt": "p"} | arguments))
    assert outcome.error is not None and outcome.error.code == code
    assert words in outcome.error.message
    assert (await cluster.kube.list(SCHEDULED_TASKS, namespace=cluster.ns)).items == []


async def test_an_agent_cannot_touch_tasks_it_does_not_own(helper: AgentRuntime, cluster: Cluster) -> None:
    await cluster.task("by-a-person")
    await cluster.task("other.mine", agentRef={"name": "other"})
    listing = await call(helper, "list_scheduled_tasks")
    assert "| by-a-person |" in listing.content and "no (set by a person)" in listing.content
    assert "other.mine" not in listing.content
    refused = await call(helper, "cancel_scheduled_task", name="by-a-person")
    assert refused.error.code == "InvalidArguments" and "no task named 'by-a-person'" in refused.error.message
    await cluster.kube.create(SCHEDULED_TASKS, namespace=cluster.ns, body={
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask",
        "metadata": {"name": "helper.sneaky"},
        "spec": {"agentRef": {"name": "helper"}, "schedule": "0 * * * *", "prompt": "p"},
    })
    refused = await call(helper, "cancel_scheduled_task", name="sneaky")
    assert refused.error.code == "Rejected" and "not created by you" in refused.error.message
    overwrite = await call(helper, "schedule_task", name="sneaky", cron="0 9 * * *", prompt="mine now")
    assert overwrite.error.code == "Rejected"
    assert (await cluster.get_task("helper.sneaky"))["spec"]["prompt"] == "p"


async def test_a_request_answered_elsewhere_than_its_own_queue_is_dead_lettered_unanswered(
    bus: MemoryBus, other_bus: MemoryBus, broker: MemoryBroker, cluster: Cluster, operator_side: None
) -> None:
    reply_queue = agent_replies(namespace=cluster.ns, name="other", slot=0)
    answers: list[Delivery] = []
    await other_bus.consume(queue=reply_queue, handler=lambda delivery: _append(answers, delivery))
    request = signed(token=cluster.tokens["helper"], agent=f"{cluster.ns}/helper", operation=ListTasks(),
                     reply_to=reply_queue, correlation_id="c1")
    await bus.publish(queue=OPERATOR_SCHEDULING, body=request, correlation_id="c1", reply_to=reply_queue.name)
    letters = await eventually(lambda: _one(broker.dead_letters()))
    assert [(d.queue, d.reason, d.user_id) for d in letters] == [
        ("operator.scheduling", "rejected", f"agent.{cluster.ns}.helper")]
    assert answers == []


async def test_a_request_for_an_unknown_agent_is_refused(
    broker: MemoryBroker, cluster: Cluster, operator_side: None
) -> None:
    ghost = Principal.agent(namespace=cluster.ns, name="ghost")  # a broker user whose Agent is gone
    reply_queue = agent_replies(namespace=cluster.ns, name="ghost", slot=0)
    request = signed(token="guessed", agent=f"{cluster.ns}/ghost", operation=ListTasks(), reply_to=reply_queue,
                     correlation_id="c2")
    reply = await send(await login(broker, ghost), request, reply_to=reply_queue, correlation_id="c2")
    assert reply.error is not None and reply.error.message == f"there is no Agent {cluster.ns}/ghost"


async def test_another_agent_claiming_to_be_this_one_is_refused_and_changes_nothing(
    helper: AgentRuntime, scripted_llm, bus: MemoryBus, other_bus: MemoryBus, cluster: Cluster
) -> None:
    made = await call(helper, "schedule_task", name="digest", cron="0 18 * * *", prompt="Send the digest.")
    assert made.ok, made.error
    # `other` is compromised: it holds its own bus login and token, and claims to be helper.
    own_queue = agent_replies(namespace=cluster.ns, name="other", slot=1)
    forged = signed(token=cluster.tokens["other"], agent=f"{cluster.ns}/helper", operation=CancelTask(name="digest"),
                    reply_to=own_queue, correlation_id="forged-1")
    reply = await send(other_bus, forged, reply_to=own_queue, correlation_id="forged-1")
    assert reply.error is not None and reply.error.code == "Rejected" and not reply.error.retryable
    assert reply.error.message.startswith(
        f"this request comes from agent {cluster.ns}/other, not {cluster.ns}/helper")
    # The same, as an agent process of helper's name that holds the wrong key: no task is created either.
    async with _runtime(scripted_llm, bus=bus, token=cluster.tokens["other"], namespace=cluster.ns) as impostor:
        refused = await call(impostor, "schedule_task", name="sneaky", cron="0 9 * * *", prompt="p")
    assert refused.error is not None and refused.error.code == "Rejected"
    names = await cluster.task_names()
    assert names == ["helper.digest"]
    task = await cluster.get_task("helper.digest")
    assert task["spec"]["prompt"] == "Send the digest."


async def test_a_request_replayed_after_the_window_is_refused_and_changes_nothing(
    helper: AgentRuntime, helper_bus: RecordingBus, bus: MemoryBus, cluster: Cluster, wall_clock: ManualClock
) -> None:
    assert (await call(helper, "schedule_task", name="digest", cron="0 18 * * *", prompt="p")).ok
    assert (await call(helper, "cancel_scheduled_task", name="digest")).ok
    captured = helper_bus.sent[-1]
    assert isinstance(captured["body"], SchedulingRequest) and captured["body"].operation == CancelTask(name="digest")
    assert (await call(helper, "schedule_task", name="digest", cron="0 18 * * *", prompt="p")).ok
    wall_clock.advance(330)
    reply = (await bus.request(**captured)).decode(SchedulingReply)
    assert reply.error is not None and reply.error.code == "Rejected" and not reply.error.retryable
    assert "off the operator's clock (at most 300 s)" in reply.error.message
    assert (await cluster.get_task("helper.digest"))["spec"]["prompt"] == "p"


async def test_a_request_dated_ahead_of_the_window_is_refused(
    bus: MemoryBus, cluster: Cluster, wall_clock: ManualClock, operator_side: None
) -> None:
    queue = agent_replies(namespace=cluster.ns, name="helper", slot=0)
    request = signed(token=cluster.tokens["helper"], agent=f"{cluster.ns}/helper", operation=ListTasks(),
                     reply_to=queue,
                     correlation_id="ahead-1", issued_at=wall_clock.now() + datetime.timedelta(minutes=6))
    reply = await send(bus, request, reply_to=queue, correlation_id="ahead-1")
    assert reply.error is not None and "is 360 s off the operator's clock" in reply.error.message


async def test_the_signature_covers_the_correlation_id_and_the_operation(
    bus: MemoryBus, cluster: Cluster, operator_side: None
) -> None:
    queue = agent_replies(namespace=cluster.ns, name="helper", slot=1)
    request = signed(token=cluster.tokens["helper"], agent=f"{cluster.ns}/helper", operation=ListTasks(),
                     reply_to=queue,
                     correlation_id="original")
    moved = await send(bus, request, reply_to=queue, correlation_id="another")
    assert moved.error is not None and f"not signed with agent {cluster.ns}/helper's token" in moved.error.message
    swapped = request.model_copy(update={"operation": CancelTask(name="digest")})
    reply = await send(bus, swapped, reply_to=queue, correlation_id="original")
    assert reply.error is not None and f"not signed with agent {cluster.ns}/helper's token" in reply.error.message
    assert (await send(bus, request, reply_to=queue, correlation_id="original")).error is None


async def test_a_replaced_token_secret_counts_at_once(
    helper: AgentRuntime, scripted_llm, bus: MemoryBus, cluster: Cluster
) -> None:
    assert (await call(helper, "list_scheduled_tasks")).ok
    name = token_secret_name(agent="helper")
    await cluster.kube.delete(SECRETS, namespace=cluster.ns, name=name)
    missing = await call(helper, "list_scheduled_tasks")
    assert missing.error is not None and missing.error.code == "Rejected"
    assert missing.error.message.startswith(
        f"agent {cluster.ns}/helper has no token to check its request against (Secret 'rockbot-helper-http-token'")
    await cluster.kube.create(SECRETS, namespace=cluster.ns, body={
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name},
        "stringData": {TOKEN_KEY: secrets.token_urlsafe(32)}})
    stale = await call(helper, "list_scheduled_tasks")
    assert stale.error is not None and f"not signed with agent {cluster.ns}/helper's token" in stale.error.message
    async with _runtime(scripted_llm, bus=bus, token=await cluster.read_token("helper"),
                        namespace=cluster.ns) as restarted:
        assert (await call(restarted, "list_scheduled_tasks")).ok


async def test_an_agent_without_its_token_is_told_what_the_tools_need(
    scripted_llm, helper_bus: RecordingBus, cluster: Cluster, operator_side: None
) -> None:
    async with _runtime(scripted_llm, bus=helper_bus, token=None, namespace=cluster.ns) as runtime:
        outcome = await call(runtime, "list_scheduled_tasks")
    assert outcome.error is not None and outcome.error.code == "Rejected"
    assert outcome.error.message == (
        "the scheduling tools need this agent's token, which the operator provides in env ROCKBOT_HTTP_TOKEN "
        "(from the Secret rockbot-helper-http-token); it is not set in this process")
    assert helper_bus.sent == [], "nothing unsigned was sent"


class RawBody(RootModel[dict[str, Any]]):
    """Any JSON object as a message body."""


class UnsignedRequest(BaseModel):
    """A request as agents sent it before requests were signed (schema version 1)."""

    schema_version: int = 1
    agent: str
    operation: dict[str, str]


async def test_an_unsigned_request_of_the_old_schema_is_refused_clearly(
    bus: MemoryBus, cluster: Cluster, operator_side: None
) -> None:
    queue = agent_replies(namespace=cluster.ns, name="helper", slot=0)
    reply = await send(bus, UnsignedRequest(agent=f"{cluster.ns}/helper", operation={"action": "list"}),
                       reply_to=queue, correlation_id="old-1")
    assert reply.error is not None and reply.error.code == "Rejected"
    assert reply.error.message == (
        "schema_version: this operator reads scheduling requests of version 2 (signed with the agent's token), "
        "not 1: run the agent image of the operator's release")


async def test_neither_the_token_nor_a_signature_reaches_logs_or_replies(
    helper: AgentRuntime, helper_bus: RecordingBus, scripted_llm, bus: MemoryBus, cluster: Cluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    replies: list[bytes] = []
    outcomes = [
        await call(helper, "schedule_task", name="digest", cron="0 18 * * *", prompt="p"),
        await call(helper, "list_scheduled_tasks"),
        await call(helper, "cancel_scheduled_task", name="nothing-here"),
    ]
    async with _runtime(scripted_llm, bus=helper_bus, token=cluster.tokens["other"],
                        namespace=cluster.ns) as impostor:
        outcomes.append(await call(impostor, "list_scheduled_tasks"))
    queue = agent_replies(namespace=cluster.ns, name="helper", slot=0)
    malformed = signed(token=cluster.tokens["helper"], agent=f"{cluster.ns}/helper", operation=ListTasks(),
                       reply_to=queue, correlation_id="bad-1").model_dump() | {"signature": "not hex"}
    for body in [*(sent["body"] for sent in helper_bus.sent), RawBody(malformed)]:
        replies.append((await bus.request(queue=OPERATOR_SCHEDULING, body=body, reply_queue=queue,
                                          correlation_id=secrets.token_hex(4), timeout_seconds=5,
                                          responder=OPERATOR)).body)
    signatures = [sent["body"].signature for sent in helper_bus.sent]
    assert len(signatures) == 4 and [o.ok for o in outcomes] == [True, True, False, False]
    assert b'"error"' in replies[-1] and b"not hex" not in replies[-1]
    seen = caplog.text + "".join(str(o.content) + str(o.error) for o in outcomes) + b"".join(replies).decode()
    assert "refused scheduling request" in caplog.text, "the refusals were logged"
    for secret in [cluster.tokens["helper"], cluster.tokens["other"], *signatures]:
        assert secret not in seen


async def test_a_trigger_redelivered_after_its_consumer_died_runs_the_agent_once(
    helper: AgentRuntime, cluster: Cluster, bus: MemoryBus, operator_bus: MemoryBus, clock: ManualClock, scripted_llm,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The broker redelivers a trigger whose consumer died before acking it; the agent runs it once.

    A copy published again (as a recovering operator does) gets the remembered answer: the inbox
    de-duplicates by request id, in memory, so only within one agent process.
    """
    await cluster.task("nightly", schedule="0 11 * * *", prompt="Write the nightly report.")

    async def planned() -> None:
        task = await cluster.get_task("nightly")
        assert (task.get("status") or {}).get("nextScheduleTime") == "2024-05-01T11:00:00Z"

    await eventually(planned)
    taken: list[Delivery] = []

    async def die_holding(delivery: Delivery) -> None:
        taken.append(delivery)
        await asyncio.Event().wait()  # never acks: the consumer dies first

    dying = await bus.consume(queue=agent_inbox(namespace=cluster.ns, name="helper"), handler=die_holding)
    clock.set(datetime.datetime(2024, 5, 1, 11, 0, tzinfo=datetime.UTC))
    await eventually(lambda: _assert_len(taken, 1))
    inbox = await serve_inbox(runtime=helper, bus=bus)
    scripted_llm.play(Turn(text="Nightly report written."))
    await dying.close()

    async def succeeded() -> None:
        status = (await cluster.get_task("nightly")).get("status") or {}
        assert [(r["outcome"], r["summary"]) for r in status.get("history", [])] == [
            ("Succeeded", "Nightly report written.")
        ]

    await eventually(succeeded)
    caplog.set_level(logging.INFO, logger="rockbot.bus.once")
    copy = taken[0].decode(InboxRequest)
    await operator_bus.publish(
        queue=agent_inbox(namespace=cluster.ns, name="helper"), body=copy, correlation_id=copy.request_id,
        reply_to=OPERATOR_RUNS.name,
    )

    async def answered_from_memory() -> None:
        assert "was handled before; answering with the same result" in caplog.text

    await eventually(answered_from_memory)
    await inbox.close()
    assert len(scripted_llm.requests) == 1, "the model was asked once for the trigger and its copies"


async def _assert_len(items: list, count: int) -> None:
    assert len(items) == count, f"{len(items)} != {count}"


@pytest.mark.slow
async def test_the_tools_schedule_fire_and_cancel_over_rabbitmq(
    cluster: Cluster, clock: ManualClock, scripted_llm, vhost: Vhost
) -> None:
    await cluster.agent()
    config = agent_config(llm_url=scripted_llm.url, name="helper", namespace=cluster.ns, builtin_tools=["scheduling"])
    helper = Principal.agent(namespace=cluster.ns, name="helper")
    async with (
        await AmqpBus.connect(url=await vhost.url(OPERATOR)) as operator_bus,
        await AmqpBus.connect(url=await vhost.url(helper, called_by=[OPERATOR])) as bus,
    ):
        requests = SchedulingRequests(kube=cluster.kube, bus=operator_bus, clock=clock)
        scheduler = Scheduler(kube=cluster.kube, bus=operator_bus, clock=clock, namespaces=[cluster.ns])
        await requests.start()
        await scheduler.start()
        try:
            env = {API_KEY_ENV: "k", HTTP_TOKEN_ENV: cluster.tokens["helper"]}
            async with AgentRuntime.from_config(config, env=env, bus=bus) as runtime:
                made = await call(runtime, "schedule_task", name="standup", cron="0 9 * * 1-5",
                                  prompt="Post the stand-up notes.", time_zone="Europe/Berlin")
                assert made.ok, made.error
                assert "next run: 2024-05-02 09:00:00 CEST" in made.content

                async def planned() -> None:
                    task = await cluster.get_task("helper.standup")
                    assert (task.get("status") or {}).get("nextScheduleTime") == "2024-05-02T07:00:00Z"

                await eventually(planned)
                inbox = await serve_inbox(runtime=runtime, bus=bus)
                scripted_llm.play(Turn(text="Notes posted."))
                clock.set(datetime.datetime(2024, 5, 2, 7, 0, tzinfo=datetime.UTC))

                async def succeeded() -> None:
                    task = await cluster.get_task("helper.standup")
                    history = (task.get("status") or {}).get("history", [])
                    assert [(r["outcome"], r["summary"]) for r in history] == [("Succeeded", "Notes posted.")]

                await eventually(succeeded, within=30)
                await inbox.close()
                cancelled = await call(runtime, "cancel_scheduled_task", name="standup")
                assert cancelled.ok, cancelled.error
        finally:
            await scheduler.stop()
            await requests.stop()
    assert (await cluster.kube.list(SCHEDULED_TASKS, namespace=cluster.ns)).items == []


async def _append(into: list[Delivery], delivery: Delivery) -> None:
    into.append(delivery)


async def _one(letters) -> list:
    found = await letters
    assert len(found) == 1, found
    return found
