"""Issue 13 §1 and §2 as an attacker tries them on the real broker: one compromised agent, logged in with its
own credentials (exactly what the operator gives its pods), against the scripts-manager and another agent."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from urllib.parse import quote

import aio_pika
import aiormq
import pytest

from agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, AccessRefused, AmqpBus, Delivery, Principal, TooLarge
from rockbot.bus.topology import EXCHANGE, SCRIPT_INVOKE, agent_replies
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, ScriptInvokeError, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import ALICE
from tests.fixtures.rabbitmq import Vhost
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually

MALLORY = Principal.agent(namespace="default", name="mallory")
WAIT = 30.0


@pytest.fixture
async def manager(vhost: Vhost, make_settings: MakeSettings) -> AsyncIterator[ScriptsManager]:
    manager = ScriptsManager(settings=make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER)))
    await manager.start()
    yield manager
    await manager.stop()


@pytest.fixture
async def alice(vhost: Vhost) -> AsyncIterator[AmqpBus]:
    async with await AmqpBus.connect(url=await vhost.url(ALICE)) as bus:
        yield bus


@pytest.fixture
async def mallory_url(vhost: Vhost) -> str:
    return await vhost.url(MALLORY)


async def test_an_agent_cannot_take_script_requests_in_the_managers_place(
    manager: ScriptsManager, alice: AmqpBus, mallory_url: str
) -> None:
    async with await AmqpBus.connect(url=mallory_url) as mallory:
        taken: list[Delivery] = []

        async def forge(delivery: Delivery) -> None:  # would read input_data and answer with a forged result
            taken.append(delivery)

        with pytest.raises(AccessRefused, match=r"agent\.default\.mallory' may not read 'script\.invoke'"):
            await mallory.consume(queue=SCRIPT_INVOKE, handler=forge)
        sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=WAIT)
        answers = await asyncio.gather(*(
            sandbox.execute_python_script(script=f"print({n} + 1)", input_data={"secret": n}) for n in range(5)
        ))  # fmt: skip
    assert [a.stdout for a in answers] == [f"{n + 1}\n" for n in range(5)], answers  # type: ignore[union-attr]
    assert taken == []


async def test_an_agent_cannot_attach_to_another_agents_reply_queue(
    manager: ScriptsManager, alice: AmqpBus, mallory_url: str
) -> None:
    sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=WAIT)
    await sandbox.execute_python_script(script="pass")  # alice's reply queue exists; its name is in every reply_to
    victim = (await alice.own_replies()).name
    connection = await aio_pika.connect(mallory_url)
    try:
        channel = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            queue = await channel.declare_queue(victim, passive=True)
            await queue.consume(_never)
        # Nor can it bind a queue of its own to the victim's name (or to '#') and listen in: it declares none.
        for key in (victim, "#"):
            channel = await connection.channel()
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                own = await channel.declare_queue(f"agent.default.mallory.replies.{uuid.uuid4().hex[:8]}")
                await own.bind(EXCHANGE, routing_key=key)
    finally:
        await connection.close()
    answers = await asyncio.gather(*(sandbox.execute_python_script(script=f"print({n})") for n in range(5)))
    assert [a.stdout for a in answers] == [f"{n}\n" for n in range(5)], answers  # type: ignore[union-attr]


async def test_a_request_claiming_another_agent_is_rejected_and_dead_lettered(
    manager: ScriptsManager, vhost: Vhost, mallory_url: str
) -> None:
    async with await AmqpBus.connect(url=mallory_url) as mallory:
        reply = await mallory.request(
            queue=SCRIPT_INVOKE, body=ScriptInvokeRequest(request_id="r1", agent="alice", script="print(1)"),
            reply_queue=agent_replies(namespace="default", name="mallory", slot=0), correlation_id="r1",
            timeout_seconds=WAIT, responder=SCRIPTS_MANAGER,
        )  # fmt: skip
    answer = reply.decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(answer, ScriptInvokeError) and answer.error.code == ErrorCode.REJECTED, answer
    assert "comes from agent default/mallory, not alice" in answer.error.message
    letters = await eventually(lambda: _dead_letters(vhost, 1))
    assert [(d.queue, d.reason, d.user_id) for d in letters] == [("script.invoke", "rejected", MALLORY.user)]


async def test_requests_without_a_reply_queue_are_dead_lettered_and_never_hold_a_slot(
    manager: ScriptsManager, alice: AmqpBus, vhost: Vhost
) -> None:
    for n in range(manager.settings.scripts_concurrency):  # as many as the manager has slots
        request = ScriptInvokeRequest(request_id=f"poison-{n}", agent="alice", script="print('never')")
        await alice.publish(queue=SCRIPT_INVOKE, body=request, message_id=request.request_id)
    sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=WAIT)
    answer = await sandbox.execute_python_script(script="print('good')")
    assert isinstance(answer, ScriptInvokeResponse) and answer.stdout == "good\n", answer
    letters = await eventually(lambda: _dead_letters(vhost, 4))
    assert sorted(d.message_id or "" for d in letters) == [f"poison-{n}" for n in range(4)]
    assert {(d.queue, d.reason) for d in letters} == {("script.invoke", "rejected")}

    async def nothing_held() -> None:  # nothing requeued, nothing held (the last ack follows its answer)
        assert (await asyncio.to_thread(vhost.queues))[SCRIPT_INVOKE.name] == (0, 0)

    await eventually(nothing_held, within=WAIT)


async def test_the_broker_refuses_a_message_over_its_size_limit(alice: AmqpBus, mallory_url: str) -> None:
    huge = ScriptInvokeRequest(request_id="huge", agent="alice", script="x" * 50 * 2**20)
    with pytest.raises(TooLarge, match="over the bus's limit"):  # the client does not even send it
        await alice.publish(queue=SCRIPT_INVOKE, body=huge)
    connection = await aio_pika.connect(mallory_url)  # a client that skips that check meets the broker's
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="larger than configured max size"):
            await exchange.publish(
                aio_pika.Message(huge.model_dump_json().encode(), user_id=MALLORY.user), routing_key=SCRIPT_INVOKE.name
            )
    finally:
        await connection.close()


async def test_a_request_over_the_managers_size_limit_is_refused_unread_and_dead_lettered(
    manager: ScriptsManager, alice: AmqpBus, vhost: Vhost
) -> None:
    limit = manager.settings.max_request_bytes
    replies = agent_replies(namespace="default", name="alice", slot=1)
    oversized = ScriptInvokeRequest(request_id="big-1", agent="alice", script="print(1)", input_data="x" * limit)
    reply = await alice.request(
        queue=SCRIPT_INVOKE, body=oversized, reply_queue=replies, correlation_id="big-1", timeout_seconds=WAIT,
        responder=SCRIPTS_MANAGER,
    )
    answer = reply.decode(SCRIPT_INVOKE_REPLY)
    assert isinstance(answer, ScriptInvokeError) and answer.error.code == ErrorCode.INVALID_ARGUMENTS, answer
    assert f"over the {limit} its reader accepts" in answer.error.message  # refused before it was parsed
    letters = await eventually(lambda: _dead_letters(vhost, 1))
    assert [(d.message_id, d.reason) for d in letters] == [("big-1", "rejected")]


async def _never(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    raise AssertionError("the broker delivered another agent's reply")


async def _dead_letters(vhost: Vhost, count: int) -> list:
    letters = await vhost.admin.dead_letters()
    assert len(letters) >= count, letters
    return letters


async def test_a_script_answer_relayed_by_dead_lettering_never_reaches_another_agents_call(
    vhost: Vhost, make_settings: MakeSettings
) -> None:
    """Issue 18 L3: mallory's own queue dead-letters the scripts-manager's answer to mallory into alice's result
    queue, under the correlation id of alice's pending call; alice gets her own script's output, never mallory's."""
    manager = ScriptsManager(settings=make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER), scripts_concurrency=2))
    await manager.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(ALICE)) as alice_bus:
            sandbox = ScriptSandbox(bus=alice_bus, namespace="default", agent="alice", start_ceiling_seconds=WAIT)
            pending = asyncio.create_task(sandbox.execute_python_script(
                script="import time\ntime.sleep(8)\nprint('my own answer')", request_id="alice-1"))
            alices_queue = await eventually(lambda: _reply_queue_consumed_by(vhost, ALICE), within=WAIT)
            outcome = await _relay_into(vhost, queue=alices_queue, correlation_id="alice-1")
            result = await pending
    finally:
        await manager.stop()
    assert isinstance(result, ScriptInvokeResponse), (result, outcome)
    assert (result.request_id, result.stdout) == ("alice-1", "my own answer\n"), outcome


async def _reply_queue_consumed_by(vhost: Vhost, principal: Principal) -> str:
    """The queue where `principal`'s process takes its answers: the one of its queues with a consumer."""
    own = (f"script.result.{principal.namespace}.{principal.name}.", f"agent.{principal.namespace}.{principal.name}.")
    listed = await vhost.admin._get(f"queues/{quote(vhost.name, safe='')}") or []
    consumed = [item["name"] for item in listed if item.get("consumers") and item["name"].startswith(own)
                and not item["name"].endswith(".inbox")]
    assert consumed, f"{principal}'s sandbox client consumes no reply queue yet"
    return consumed[0]


async def _relay_into(vhost: Vhost, *, queue: str, correlation_id: str) -> str:
    """As mallory: a queue of its own that dead-letters at once into `queue`, as `reply_to` of mallory's script.

    'sent', or what the broker refused."""
    relay = "script.result.default.mallory.relay"  # a name mallory's configure permission covered
    request = ScriptInvokeRequest(request_id=correlation_id, agent="mallory", script="print('2 + 2 = 5')")
    message = aio_pika.Message(
        request.model_dump_json().encode(), content_type="application/json", type="ScriptInvokeRequest",
        headers={"x-schema-version": 1}, user_id=MALLORY.user, correlation_id=correlation_id,
        message_id=correlation_id, reply_to=relay,
    )  # fmt: skip
    connection = await aio_pika.connect(await vhost.url(MALLORY))
    try:
        channel = await connection.channel()
        declared = await channel.declare_queue(relay, arguments={
            "x-message-ttl": 0, "x-dead-letter-exchange": EXCHANGE, "x-dead-letter-routing-key": queue})
        await declared.bind(EXCHANGE, routing_key=relay)
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)
        await exchange.publish(message, routing_key=SCRIPT_INVOKE.name)
        return "sent"
    except aiormq.exceptions.ChannelAccessRefused as exc:
        return f"refused: {exc}"
    finally:
        await connection.close()


async def test_answers_a_reply_queue_refuses_are_dropped_and_never_rerun_their_request(
    manager: ScriptsManager, alice: AmqpBus, mallory_url: str, vhost: Vhost
) -> None:
    """Issue 18 P2: a reply queue that refuses every message (max length 0, reject-publish; agents can no longer
    declare one, so the test makes it as an older rockbot would have) costs one run per request, not six."""
    slot = agent_replies(namespace="default", name="mallory", slot=0)
    vhost_path = quote(vhost.name, safe="")
    await vhost.admin._call("DELETE", f"queues/{vhost_path}/{slot.name}")
    await vhost.admin._call("PUT", f"queues/{vhost_path}/{slot.name}", {
        "durable": True, "arguments": {"x-max-length": 0, "x-overflow": "reject-publish"}})
    await vhost.admin._call("POST", f"bindings/{vhost_path}/e/{EXCHANGE}/q/{slot.name}", {"routing_key": slot.name})
    requests = 12
    async with await AmqpBus.connect(url=mallory_url) as mallory:
        for n in range(requests):
            request = ScriptInvokeRequest(request_id=f"cheap-{n}", agent="mallory", script="pass")
            await mallory.publish(queue=SCRIPT_INVOKE, body=request, message_id=request.request_id,
                                  correlation_id=request.request_id, reply_to=slot.name)

    def counted(name: str, **labels: str) -> float:
        return manager.metrics.registry.get_sample_value(name, labels) or 0.0

    async def all_dropped() -> None:
        assert counted("rockbot_scripts_replies_dropped_total", reason="refused") == requests

    await eventually(all_dropped, within=WAIT)
    sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=WAIT)
    answer = await sandbox.execute_python_script(script="print('still served')")
    assert isinstance(answer, ScriptInvokeResponse) and answer.stdout == "still served\n", answer
    runs = counted("rockbot_scripts_runs_total", backend="local", outcome="succeeded")
    assert runs == requests + 1  # each request ran once: none was requeued for its refused answer

    async def all_acked() -> None:  # the manager acks a request after sending its answer, so a moment after
        assert (await asyncio.to_thread(vhost.queues))[SCRIPT_INVOKE.name] == (0, 0)

    await eventually(all_acked, within=WAIT)


async def test_an_agent_queueing_many_long_scripts_does_not_hold_up_another_agents_script(
    vhost: Vhost, make_settings: MakeSettings, alice: AmqpBus, mallory_url: str
) -> None:
    """Issue 18 P1: mallory queues more long scripts than there are sandboxes; alice's short one still runs
    within its own timeout, because one agent runs at most ROCKBOT_SCRIPTS_PER_AGENT scripts at once."""
    settings = make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER), scripts_concurrency=2, scripts_per_agent=1)
    manager = ScriptsManager(settings=settings)
    await manager.start()
    try:
        async with await AmqpBus.connect(url=mallory_url) as mallory:
            flooding = ScriptSandbox(bus=mallory, namespace="default", agent="mallory", start_ceiling_seconds=WAIT)
            flood = [asyncio.create_task(flooding.execute_python_script(
                script="import time\ntime.sleep(10)", timeout_seconds=15, request_id=f"long-{n}")) for n in range(6)]

            async def flooding_runs() -> None:
                in_flight = manager.metrics.registry.get_sample_value("rockbot_scripts_in_flight", {"backend": "local"})
                assert in_flight, "none of mallory's scripts runs yet"

            await eventually(flooding_runs, within=WAIT)
            sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=6)
            answer = await sandbox.execute_python_script(script="print('mine')", timeout_seconds=2)
            running = manager.metrics.registry.get_sample_value("rockbot_scripts_in_flight", {"backend": "local"})
            for task in flood:
                task.cancel()
            await asyncio.gather(*flood, return_exceptions=True)
    finally:
        await manager.stop()
    assert isinstance(answer, ScriptInvokeResponse) and answer.stdout == "mine\n", answer
    assert running == 1  # mallory's one script: its share, while the rest of its backlog waits


async def test_an_agent_queueing_far_more_than_the_prefetch_does_not_hold_up_another_agents_script(
    vhost: Vhost, make_settings: MakeSettings, alice: AmqpBus, mallory_url: str
) -> None:
    """Issue 18 P1 beyond the prefetch: mallory puts five times the requests the manager takes ahead on
    `script.invoke` before alice asks; the manager holds at most ROCKBOT_SCRIPTS_QUEUED_PER_AGENT of one agent's
    and answers the rest of mallory's at once (Unavailable, retryable), so alice's request is reached and run
    within its own timeout instead of after mallory's backlog."""
    prefetch, flood = 8, 40
    settings = make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER), scripts_concurrency=2, scripts_per_agent=1,
                             scripts_prefetch=prefetch, scripts_queued_per_agent=2)  # fmt: skip
    manager = ScriptsManager(settings=settings)
    await manager.start()
    try:
        async with await AmqpBus.connect(url=mallory_url) as mallory:
            replies = await mallory.own_replies()
            for n in range(flood):
                request = ScriptInvokeRequest(request_id=f"long-{n}", agent="mallory", timeout_seconds=30,
                                              script="import time\ntime.sleep(20)")  # fmt: skip
                await mallory.publish(queue=SCRIPT_INVOKE, body=request, message_id=request.request_id,
                                      correlation_id=request.request_id, reply_to=replies.name)  # fmt: skip
            sandbox = ScriptSandbox(bus=alice, namespace="default", agent="alice", start_ceiling_seconds=3)
            answer = await sandbox.execute_python_script(script="print('mine')", timeout_seconds=5)
    finally:
        await manager.stop()
    assert isinstance(answer, ScriptInvokeResponse) and answer.stdout == "mine\n", answer
    refused = manager.metrics.registry.get_sample_value(
        "rockbot_scripts_runs_total", {"backend": "local", "outcome": "Unavailable"}) or 0.0
    assert refused >= flood - prefetch - 2  # mallory's backlog was answered, not left ahead of alice
