"""What only a raw AMQP client can try: a message without a sender, or claiming another."""

from __future__ import annotations

import aio_pika
import aiormq
import pytest

from rockbot.bus import AmqpBus, Delivery
from rockbot.bus.topology import EXCHANGE, work_queue
from tests.bus.conftest import TEST_PERMISSIONS
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually


async def test_a_message_without_a_sender_never_reaches_a_handler_and_is_dead_lettered(vhost: Vhost) -> None:
    queue = work_queue("test.work.anonymous")
    await vhost.admin.ensure_queue(queue)
    handled: list[Delivery] = []

    async def handle(delivery: Delivery) -> None:
        handled.append(delivery)

    url = await vhost.login("service.test", TEST_PERMISSIONS)
    async with await AmqpBus.connect(url=url) as bus:
        await bus.consume(queue=queue, handler=handle)
        connection = await aio_pika.connect(url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.get_exchange(EXCHANGE, ensure=False)
            await exchange.publish(aio_pika.Message(b"{}", message_id="anonymous"), routing_key=queue.name)

            async def dead_lettered() -> list:
                letters = await vhost.admin.dead_letters()
                assert letters, "not dead-lettered yet"
                return letters

            letters = await eventually(dead_lettered)
        finally:
            await connection.close()
    assert [(d.message_id, d.user_id, d.reason) for d in letters] == [("anonymous", None, "rejected")]
    assert handled == []


async def test_the_broker_refuses_a_message_claiming_another_sender(vhost: Vhost) -> None:
    connection = await aio_pika.connect(await vhost.login("service.test", TEST_PERMISSIONS))
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)
        with pytest.raises(aiormq.exceptions.ChannelPreconditionFailed, match="user_id property set to"):
            await exchange.publish(aio_pika.Message(b"{}", user_id="service.operator"), routing_key="test.x")
    finally:
        await connection.close()
