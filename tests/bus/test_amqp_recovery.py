"""RabbitMQ specifics: an unreachable broker is a clear error; a restarted broker loses nothing."""

from __future__ import annotations

import asyncio
import socket
import uuid
from typing import Literal

import pytest
from pydantic import BaseModel

from rockbot.bus import AmqpBus, BusUnavailable, Delivery, Principal, Queue
from tests.bus.conftest import TEST_PERMISSIONS
from tests.fixtures.rabbitmq import RabbitBroker, provisioned

WAIT = 30.0


class Ping(BaseModel):
    schema_version: Literal[1] = 1
    n: int


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_unreachable_broker_is_unavailable_and_the_password_is_not_shown() -> None:
    url = f"amqp://rockbot:s3cret-pw@127.0.0.1:{closed_port()}/"
    with pytest.raises(BusUnavailable) as caught:
        await AmqpBus.connect(url=url, connect_timeout=2)
    assert "cannot reach the broker at amqp://rockbot:***@127.0.0.1" in str(caught.value)
    assert "s3cret-pw" not in str(caught.value)


async def test_broker_restart_keeps_queued_messages_and_restores_consumers(
    private_rabbitmq: RabbitBroker,
) -> None:
    parked, served, replies = (Queue(name=f"test.{kind}.{uuid.uuid4().hex}") for kind in ("parked", "served", "r"))
    async with provisioned(private_rabbitmq, "/") as vhost:
        server = await AmqpBus.connect(url=await vhost.login("service.server", TEST_PERMISSIONS))
        client = await AmqpBus.connect(url=await vhost.login("service.client", TEST_PERMISSIONS))
    responder = Principal.service("server")
    try:
        async def echo(delivery: Delivery) -> None:
            await server.reply(to=delivery, body=delivery.decode(Ping))

        await server.consume(queue=served, handler=echo)
        before = await client.request(
            queue=served, body=Ping(n=1), reply_queue=replies, correlation_id="before", timeout_seconds=WAIT,
            responder=responder,
        )
        assert before.decode(Ping).n == 1
        await server.declare(parked)
        await client.publish(queue=parked, body=Ping(n=99))

        await asyncio.to_thread(private_rabbitmq.restart)

        # The same connections recover: the consumer and the reply queue's consumer come back by themselves.
        after = await client.request(
            queue=served, body=Ping(n=2), reply_queue=replies, correlation_id="after", timeout_seconds=WAIT,
            responder=responder,
        )
        assert after.decode(Ping).n == 2
        # The persistent message on the durable queue survived the restart.
        received: asyncio.Queue[Delivery] = asyncio.Queue()
        await server.consume(queue=parked, handler=received.put)
        assert (await asyncio.wait_for(received.get(), WAIT)).decode(Ping).n == 99
    finally:
        await client.close()
        await server.close()


async def test_publishing_while_the_broker_is_down_fails_as_unavailable(private_rabbitmq: RabbitBroker) -> None:
    async with provisioned(private_rabbitmq, "/") as vhost:
        url = await vhost.login("service.test", TEST_PERMISSIONS)
    bus = await AmqpBus.connect(url=url, publish_timeout=1.5)
    try:
        await asyncio.to_thread(private_rabbitmq.stop_server)
        with pytest.raises(BusUnavailable, match=r"could not publish to 'test.down' within 1\.5 s"):
            await bus.publish(queue=Queue(name="test.down"), body=Ping(n=1))
    finally:
        await bus.close()
