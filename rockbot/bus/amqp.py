"""The RabbitMQ bus (production), on aio-pika's robust connection.

The connection's user is the principal (see `identity`): it comes from the URL, and every message
is published with it as `user_id` to the topic exchange `rockbot`, routed by the queue's name.
`connect_robust` reconnects after a broker restart and restores queues, bindings, prefetch and
consumers. Publishing waits for the broker's confirm and, while the connection is being
re-established, retries until `publish_timeout` before giving up with `BusUnavailable`;
`mandatory` publishing turns a message to a missing queue into `NoRoute` instead of silence, and
what the user's permissions forbid is `AccessRefused`. Each subscription has its own channel, so
closing it returns that consumer's unacked messages to the queue at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aio_pika
import aiormq.exceptions
from aio_pika.abc import (
    AbstractChannel,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustChannel,
    AbstractRobustConnection,
)
from yarl import URL

from rockbot.bus.errors import AccessRefused, BusError, BusUnavailable, InUse, Nacked, NoRoute, TooLarge
from rockbot.bus.interface import Bus, DeadLetterShare, Handler, Subscription, run_handler
from rockbot.bus.messages import (
    ACCEPT_WITHIN_HEADER,
    CONTENT_TYPE,
    PUBLISHED_AT_HEADER,
    ROUTING_HEADERS,
    SCHEMA_VERSION_HEADER,
    Delivery,
    Outgoing,
)
from rockbot.bus.topology import EXCHANGE, Queue
from rockbot.health import Readiness, wait_for_dependency
from rockbot.telemetry import TRACE_HEADERS

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


def user_of(url: str) -> str:
    """The broker user an AMQP URL logs in as (RabbitMQ's default, `guest`, when it names none)."""
    return URL(url).user or "guest"


class AmqpBus(Bus):
    def __init__(
        self,
        *,
        connection: AbstractRobustConnection,
        channel: AbstractRobustChannel,
        exchange: AbstractExchange,
        user: str,
        publish_timeout: float,
    ) -> None:
        super().__init__(user=user)
        self._connection = connection
        self._channel = channel
        self._exchange = exchange
        self._publish_timeout = publish_timeout

    @classmethod
    async def connect(
        cls, *, url: str, connect_timeout: float = 10.0, publish_timeout: float = 15.0, reconnect_interval: float = 1.0
    ) -> AmqpBus:
        """Connect (robustly) to the broker at `url`; `BusUnavailable` if it cannot be reached in `connect_timeout`."""
        try:
            connection = await aio_pika.connect_robust(
                url, timeout=connect_timeout, reconnect_interval=reconnect_interval
            )
        except aiormq.exceptions.ProbableAuthenticationError as exc:
            raise AccessRefused(
                f"the broker at {redact(url)} refused the login of user {user_of(url)!r}: wrong password, or no such "
                "user (the operator creates each principal's user)"
            ) from exc
        except (*_TRANSIENT, aio_pika.exceptions.AMQPConnectionError) as exc:
            raise BusUnavailable(f"cannot reach the broker at {redact(url)}: {exc}") from exc
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)
        return cls(
            connection=connection, channel=channel, exchange=exchange, user=user_of(url),  # type: ignore[arg-type]
            publish_timeout=publish_timeout,
        )  # fmt: skip

    @classmethod
    async def connect_when_ready(cls, *, url: str, readiness: Readiness) -> AmqpBus:
        """Connect, trying again while the broker cannot be reached or refuses the login (the operator may be
        making it right now); meanwhile `readiness` says why the process is not ready, and it stays live."""
        return await wait_for_dependency(
            lambda: cls.connect(url=url), readiness=readiness, dependency="broker",
            retry_on=(BusUnavailable, AccessRefused),
        )  # fmt: skip

    async def declare(self, queue: Queue) -> None:
        channel = await self._connection.channel(publisher_confirms=False)
        try:
            await self._declare_on(channel, queue)
        finally:
            with contextlib.suppress(*_TRANSIENT):
                await channel.close()

    async def consume(
        self, *, queue: Queue, handler: Handler, prefetch: int = 1, exclusive: bool = False
    ) -> Subscription:
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch} must be at least 1")
        try:
            channel = await self._connection.channel(publisher_confirms=False)
            try:
                await channel.set_qos(prefetch_count=prefetch)
                amqp_queue = await self._declare_on(channel, queue)
                subscription = _AmqpSubscription(
                    channel=channel, queue=amqp_queue, handler=handler, share=self.dead_letter_share  # type: ignore[arg-type]
                )
                try:
                    await subscription.start(exclusive=exclusive)
                except aiormq.exceptions.ChannelAccessRefused as exc:
                    if "exclusive use" in str(exc):
                        raise InUse(f"another connection consumes {queue.name!r} exclusively") from exc
                    raise AccessRefused(f"user {self.user!r} may not read {queue.name!r}: {exc}") from exc
            except BaseException:
                with contextlib.suppress(*_TRANSIENT):
                    await channel.close()
                raise
        except _TRANSIENT as exc:  # the connection went down meanwhile: the caller may try again once it is back
            raise BusUnavailable(f"cannot consume {queue.name!r}: the broker connection is down ({exc!r})") from exc
        return subscription

    async def _declare_on(self, channel: AbstractChannel, queue: Queue) -> AbstractQueue:
        try:
            if queue.provisioned:
                return await channel.declare_queue(queue.name, passive=True)
            declared = await channel.declare_queue(queue.name, durable=True, arguments=queue.arguments)
            await declared.bind(EXCHANGE, routing_key=queue.name)
            return declared
        except aiormq.exceptions.ChannelNotFoundEntity as exc:
            if queue.provisioned:
                raise NoRoute(
                    f"no queue named {queue.name!r}: the operator declares it (see rockbot.bus.topology)"
                ) from exc
            raise BusError(f"cannot bind {queue.name!r}: {exc} (the operator declares the exchange)") from exc
        except aiormq.exceptions.ChannelAccessRefused as exc:
            raise AccessRefused(f"user {self.user!r} may not declare, bind or read {queue.name!r}: {exc}") from exc
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            raise BusError(f"queue {queue.name!r} exists with other arguments: {exc}") from exc

    async def _put(self, *, queue_name: str, message: Outgoing) -> None:
        await self._send(routing_key=queue_name, message=message)

    async def _close_transport(self) -> None:
        await self._connection.close()

    async def _send(self, *, routing_key: str, message: Outgoing) -> None:
        last_error: BaseException | None = None
        try:
            async with asyncio.timeout(self._publish_timeout):
                while True:
                    try:
                        await self._exchange.publish(
                            _to_amqp(message, user_id=self.user), routing_key=routing_key, mandatory=True
                        )
                        return
                    except aio_pika.exceptions.PublishError as exc:
                        raise NoRoute(f"no queue named {routing_key!r}") from exc
                    except aio_pika.exceptions.DeliveryError as exc:
                        raise Nacked(f"the broker refused a message for {routing_key!r}: {exc}") from exc
                    except aiormq.exceptions.ChannelAccessRefused as exc:
                        raise AccessRefused(f"user {self.user!r} may not publish to {routing_key!r}: {exc}") from exc
                    except aiormq.exceptions.ChannelPreconditionFailed as exc:
                        if "max size" in str(exc):
                            raise TooLarge(f"the broker refused a message for {routing_key!r}: {exc}") from exc
                        raise BusError(f"the broker refused a message for {routing_key!r}: {exc}") from exc
                    except aiormq.exceptions.ChannelNotFoundEntity as exc:
                        raise BusError(
                            f"cannot publish to {routing_key!r}: {exc} (the operator declares the exchange)"
                        ) from exc
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


def _to_amqp(message: Outgoing, *, user_id: str) -> aio_pika.Message:
    return aio_pika.Message(
        message.body,
        content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=message.message_id,
        correlation_id=message.correlation_id,
        reply_to=message.reply_to,
        type=message.message_type,
        headers={
            SCHEMA_VERSION_HEADER: message.schema_version, PUBLISHED_AT_HEADER: round(message.published_at * 1000),
            **message.trace_context,
            **({} if message.accept_within_seconds is None
               else {ACCEPT_WITHIN_HEADER: round(message.accept_within_seconds * 1000)}),
        },
        expiration=message.expires_after_seconds,
        user_id=user_id,
    )


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _AmqpSubscription(Subscription):
    def __init__(
        self, *, channel: AbstractRobustChannel, queue: AbstractQueue, handler: Handler, share: DeadLetterShare
    ) -> None:
        self._channel = channel
        self._queue = queue
        self._handler = handler
        self._share = share
        self._in_flight: set[asyncio.Task[object]] = set()
        self._tag: str | None = None
        self._closing = False

    async def start(self, *, exclusive: bool) -> None:
        self._tag = await self._queue.consume(self._on_message, no_ack=False, exclusive=exclusive)

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        try:
            headers = message.headers or {}
            version = headers.get(SCHEMA_VERSION_HEADER)
            published_at = headers.get(PUBLISHED_AT_HEADER)
            accept_within = headers.get(ACCEPT_WITHIN_HEADER)
            delivery = Delivery(
                queue=self._queue.name,
                body=message.body,
                content_type=message.content_type,
                message_type=message.type,
                schema_version=version if isinstance(version, int) else None,
                message_id=message.message_id,
                correlation_id=message.correlation_id,
                reply_to=message.reply_to,
                accept_within_seconds=accept_within / 1000 if isinstance(accept_within, int) else None,
                redelivered=bool(message.redelivered),
                user_id=message.user_id,
                trace_context={k: _text(v) for k, v in headers.items() if k in TRACE_HEADERS},
                published_at=published_at / 1000 if isinstance(published_at, int) else None,
                exchange=message.exchange,
                routing_key=message.routing_key,
                routing_headers=tuple(name for name in ROUTING_HEADERS if name in headers),
            )
            try:
                outcome = await run_handler(handler=self._handler, delivery=delivery, share=self._share)
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
        if self._tag is not None and self._channel.is_closed:  # the connection is down: so is the consumer
            self._tag = None
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
