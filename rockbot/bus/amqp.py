"""The RabbitMQ bus (production), on aio-pika's robust connection.

`connect_robust` reconnects after a broker restart and restores queues, prefetch and consumers.
Publishing waits for the broker's confirm and, while the connection is being re-established,
retries until `publish_timeout` before giving up with `BusUnavailable`; `mandatory` publishing
turns a message to a missing queue into `NoRoute` instead of silence. Each subscription has its
own channel, so closing it returns that consumer's unacked messages to the queue at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import aio_pika
import aiormq.exceptions
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, AbstractRobustChannel, AbstractRobustConnection
from yarl import URL

from rockbot.bus.errors import BusError, BusUnavailable, NoRoute
from rockbot.bus.interface import Bus, Handler, Subscription, run_handler
from rockbot.bus.messages import CONTENT_TYPE, SCHEMA_VERSION_HEADER, Delivery, Outgoing
from rockbot.bus.topology import Queue

log = logging.getLogger(__name__)

#: What a broker going away looks like from aio-pika/aiormq while the robust connection recovers.
_TRANSIENT = (aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError, RuntimeError)
_RETRY_PAUSE = 0.2
#: How long closing a consumer waits for the broker: a broker that is gone must not hold a shutdown.
_CLOSE_STEP_SECONDS = 2.0


def redact(url: str) -> str:
    """The URL with its password hidden, for logs and error messages."""
    parsed = URL(url)
    return str(parsed.with_password("***")) if parsed.password else url


class AmqpBus(Bus):
    def __init__(
        self, *, connection: AbstractRobustConnection, channel: AbstractRobustChannel, publish_timeout: float
    ) -> None:
        super().__init__()
        self._connection = connection
        self._channel = channel
        self._publish_timeout = publish_timeout
        self._declared: set[tuple[str, str]] = set()

    @classmethod
    async def connect(
        cls, *, url: str, connect_timeout: float = 10.0, publish_timeout: float = 15.0, reconnect_interval: float = 1.0
    ) -> AmqpBus:
        """Connect (robustly) to the broker at `url`; `BusUnavailable` if it cannot be reached in `connect_timeout`."""
        try:
            connection = await aio_pika.connect_robust(
                url, timeout=connect_timeout, reconnect_interval=reconnect_interval
            )
        except (*_TRANSIENT, aio_pika.exceptions.AMQPConnectionError) as exc:
            raise BusUnavailable(f"cannot reach the broker at {redact(url)}: {exc}") from exc
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        return cls(connection=connection, channel=channel, publish_timeout=publish_timeout)  # type: ignore[arg-type]

    async def _put(self, *, queue: Queue, message: Outgoing) -> None:
        await self._send(routing_key=queue.name, message=message, declare=queue)

    async def _put_reply(self, *, queue_name: str, message: Outgoing) -> None:
        await self._send(routing_key=queue_name, message=message, declare=None)

    async def consume(self, *, queue: Queue, handler: Handler, prefetch: int = 1) -> Subscription:
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch} must be at least 1")
        channel = await self._connection.channel(publisher_confirms=False)
        await channel.set_qos(prefetch_count=prefetch)
        amqp_queue = await channel.declare_queue(queue.name, durable=True, arguments=queue.arguments)
        subscription = _AmqpSubscription(channel=channel, queue=amqp_queue, handler=handler)  # type: ignore[arg-type]
        await subscription.start()
        return subscription

    async def _close_transport(self) -> None:
        await self._connection.close()

    async def _send(self, *, routing_key: str, message: Outgoing, declare: Queue | None) -> None:
        last_error: BaseException | None = None
        try:
            async with asyncio.timeout(self._publish_timeout):
                while True:
                    try:
                        if declare is not None:
                            await self._declare(declare)
                        await self._channel.default_exchange.publish(
                            _to_amqp(message), routing_key=routing_key, mandatory=True
                        )
                        return
                    except aio_pika.exceptions.PublishError as exc:
                        raise NoRoute(f"no queue named {routing_key!r}") from exc
                    except aio_pika.exceptions.DeliveryError as exc:
                        raise BusError(f"the broker refused a message for {routing_key!r}: {exc}") from exc
                    except aiormq.exceptions.ChannelPreconditionFailed as exc:
                        raise BusError(f"queue {routing_key!r} exists with other arguments: {exc}") from exc
                    except _TRANSIENT as exc:
                        last_error = exc
                        log.info("publishing to %s failed (%r); retrying while the connection recovers",
                                 routing_key, exc)
                        await asyncio.sleep(_RETRY_PAUSE)
        except TimeoutError as exc:
            raise BusUnavailable(
                f"could not publish to {routing_key!r} within {self._publish_timeout:g} s"
                + (f": {last_error!r}" if last_error else "")
            ) from exc

    async def _declare(self, queue: Queue) -> None:
        key = (queue.name, json.dumps(queue.arguments, sort_keys=True))
        if key not in self._declared:
            await self._channel.declare_queue(queue.name, durable=True, arguments=queue.arguments)
            self._declared.add(key)


def _to_amqp(message: Outgoing) -> aio_pika.Message:
    return aio_pika.Message(
        message.body,
        content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        type=message.message_type,
        headers={SCHEMA_VERSION_HEADER: message.schema_version},
        expiration=message.expires_after_seconds,
    )


class _AmqpSubscription(Subscription):
    def __init__(self, *, channel: AbstractRobustChannel, queue: AbstractQueue, handler: Handler) -> None:
        self._channel = channel
        self._queue = queue
        self._handler = handler
        self._in_flight: set[asyncio.Task[object]] = set()
        self._tag: str | None = None
        self._closing = False

    async def start(self) -> None:
        self._tag = await self._queue.consume(self._on_message, no_ack=False)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        try:
            version = (message.headers or {}).get(SCHEMA_VERSION_HEADER)
            delivery = Delivery(
                queue=self._queue.name,
                body=message.body,
                content_type=message.content_type,
                message_type=message.type,
                schema_version=version if isinstance(version, int) else None,
                message_id=message.message_id,
                correlation_id=message.correlation_id,
                reply_to=message.reply_to,
                redelivered=bool(message.redelivered),
            )
            try:
                outcome = await run_handler(handler=self._handler, delivery=delivery)
            except asyncio.CancelledError:
                if not self._closing:  # cancelled from elsewhere: hand the message back now
                    with contextlib.suppress(*_TRANSIENT):
                        await message.nack(requeue=True)
                raise
            try:
                if outcome == "ack":
                    await message.ack()
                else:
                    await message.nack(requeue=outcome == "requeue")
            except _TRANSIENT as exc:
                log.warning("could not settle message %s on %s (%r); the broker will redeliver it",
                            message.message_id, self._queue.name, exc)
        finally:
            self._in_flight.discard(task)

    async def close(self, *, drain_seconds: float = 0.0) -> None:
        self._closing = True
        if self._tag is not None:
            try:
                async with asyncio.timeout(_CLOSE_STEP_SECONDS):
                    await self._queue.cancel(self._tag)
            except _TRANSIENT as exc:
                log.info("cancelling the consumer on %s failed (%r)", self._queue.name, exc)
            self._tag = None
        if self._in_flight and drain_seconds > 0:
            await asyncio.wait(self._in_flight, timeout=drain_seconds)
        for task in list(self._in_flight):
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
        try:
            async with asyncio.timeout(_CLOSE_STEP_SECONDS):
                await self._channel.close()
        except _TRANSIENT as exc:
            log.info("closing the channel of %s failed (%r)", self._queue.name, exc)
