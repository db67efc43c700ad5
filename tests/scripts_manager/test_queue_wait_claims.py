"""Issue 31 §5 on the real broker: a script request's `x-published-at-ms` is its sender's claim; one stamped 1970 or
next year cannot move the scripts-manager's queue-wait histogram (the issue saw one add 1.8e9 s to its sum)."""

from __future__ import annotations

import time

import aio_pika

from rockbot.bus import SCRIPTS_MANAGER, AmqpBus, Delivery
from rockbot.bus.amqp import user_of
from rockbot.bus.messages import PUBLISHED_AT_HEADER, SCHEMA_VERSION_HEADER
from rockbot.bus.topology import EXCHANGE, SCRIPT_INVOKE, agent_replies
from rockbot.bus.tracing import BELIEVED_WAIT_SECONDS
from rockbot.contracts.scripts import ScriptInvokeRequest
from rockbot.scripts_manager.app import ScriptsManager
from tests.buses import ALICE
from tests.fixtures.rabbitmq import Vhost
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually

YEAR_MS = 365 * 24 * 3600 * 1000


async def test_a_senders_stamp_of_when_it_sent_cannot_move_the_queue_wait_histogram(
    vhost: Vhost, make_settings: MakeSettings
) -> None:
    manager = ScriptsManager(settings=make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER)))
    await manager.start()
    alice = await vhost.url(ALICE)
    slot = agent_replies(namespace=ALICE.namespace, name=ALICE.name, slot=0)
    answered: list[str] = []

    async def take(delivery: Delivery) -> None:
        answered.append(str(delivery.correlation_id))

    now_ms = round(time.time() * 1000)
    stamps = {"in-1970": 0, "next-year": now_ms + YEAR_MS, "honest": now_ms}
    try:
        async with await AmqpBus.connect(url=alice) as replies, await aio_pika.connect(alice) as connection:
            await replies.consume(queue=slot, handler=take, exclusive=True)
            exchange = await (await connection.channel()).get_exchange(EXCHANGE, ensure=False)
            for request_id, stamp in stamps.items():
                body = ScriptInvokeRequest(request_id=request_id, agent=ALICE.name, script="print(1)")
                await exchange.publish(aio_pika.Message(
                    body.model_dump_json().encode(), content_type="application/json", type="ScriptInvokeRequest",
                    headers={SCHEMA_VERSION_HEADER: 1, PUBLISHED_AT_HEADER: stamp}, message_id=request_id,
                    correlation_id=request_id, reply_to=slot.name, user_id=user_of(alice),
                ), routing_key=SCRIPT_INVOKE.name)  # fmt: skip

            async def all_answered() -> None:
                assert sorted(answered) == sorted(stamps)

            await eventually(all_answered, within=120)
    finally:
        await manager.stop()
    observed = {name: manager.metrics.registry.get_sample_value(f"rockbot_scripts_queue_wait_seconds_{name}",
                                                                {"backend": "local"}) for name in ("count", "sum")}
    assert observed["count"] == 1  # the honest one; the others say nothing
    assert 0 <= observed["sum"] < BELIEVED_WAIT_SECONDS
