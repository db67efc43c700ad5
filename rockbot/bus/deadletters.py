"""Each principal's own record of its dead letters, so no sender can flush what another did, or its own first acts.

Every dead letter reaches the fanout exchange `rockbot.dead-letters`, which puts it in the shared queue
of that name (the newest 10 000 of everyone's, for a quick look) and in `rockbot.dead-letters.intake`.
The operator's `DeadLetterKeeper` takes each from the intake and files it by its sender, the
broker-validated `user_id` (dead-lettering keeps it), into `rockbot.dead-letters.<principal>`, which keeps
that sender's first `DEAD_LETTERS_PER_PRINCIPAL` of the past `DEAD_LETTER_RECORD_SECONDS` (the broker
refuses more: `reject-publish`); one past that is dropped, counted in one log line per sender and minute.
So 10 050 refused messages of agent A fill A's own record at most: B's record is untouched and A's
earlier dead letters stay. A filed copy carries the sender in `x-rockbot-sender` (the operator's header;
the message's own headers are not copied, so a sender cannot forge it) and where and why it died, from the entry
the broker wrote into its `x-death` at its death (not from headers a sender may have set).
Together with each consumer's `DeadLetterShare` (100 refusals of a sender per minute), a sender fills its
record no faster than that. Agents can neither read nor write any of these queues, and the records are bound only
to an exchange of their own that only the operator may publish to, so no copy of a message (`CC`, which RabbitMQ
before 4.1 lets any sender add) reaches one.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange, AbstractIncomingMessage

from rockbot.bus.admin import SENDER_HEADER, BrokerAdmin, where_and_why
from rockbot.bus.topology import DEAD_LETTER_INTAKE, DEAD_LETTER_RECORDS_EXCHANGE, dead_letter_record

log = logging.getLogger(__name__)

_PREFETCH = 64
RETRY_SECONDS = 1.0


class DeadLetterKeeper:
    """Files the dead letters of `rockbot.dead-letters.intake` into their senders' records (as `user`, over `url`)."""

    def __init__(self, *, url: str, user: str, admin: BrokerAdmin) -> None:
        self._url = url
        self._user = user
        self._admin = admin
        self._declared: set[str] = set()
        self._full: dict[str, float] = {}  # record -> when its last "full" line was logged
        self._connection: AbstractConnection | None = None
        self._exchange: AbstractExchange | None = None
        #: Dead letters filed, and those dropped because their sender's record was full.
        self.filed = 0
        self.dropped = 0

    async def start(self) -> None:
        self._connection = await aio_pika.connect_robust(self._url)
        channel: AbstractChannel = await self._connection.channel(publisher_confirms=True)
        await channel.set_qos(prefetch_count=_PREFETCH)
        self._exchange = await channel.get_exchange(DEAD_LETTER_RECORDS_EXCHANGE, ensure=False)
        intake = await channel.get_queue(DEAD_LETTER_INTAKE.name, ensure=False)
        await intake.consume(self._file)

    async def close(self) -> None:
        if self._connection is not None:
            await self._connection.close()
            self._connection = None

    async def _file(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._filed(message)
        except Exception:  # the management API or the broker failed: the letter stays in the intake for later
            log.exception("filing dead letter %s of %s failed; it stays in %s", message.message_id, message.user_id,
                          DEAD_LETTER_INTAKE.name)
            await asyncio.sleep(RETRY_SECONDS)
            await message.nack(requeue=True)
            return
        await message.ack()

    async def _filed(self, message: AbstractIncomingMessage) -> None:
        assert self._exchange is not None
        record = dead_letter_record(message.user_id)
        if record.name not in self._declared:
            await self._admin.ensure_queue(record)
            self._declared.add(record.name)
        headers = where_and_why(message.headers or {})
        copy = aio_pika.Message(
            message.body, headers={**headers, SENDER_HEADER: message.user_id or ""}, content_type=message.content_type,
            type=message.type, message_id=message.message_id, correlation_id=message.correlation_id,
            timestamp=message.timestamp, user_id=self._user, delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )  # fmt: skip
        try:
            await self._exchange.publish(copy, routing_key=record.name)
            self.filed += 1
        except aio_pika.exceptions.DeliveryError:  # the record is full: its first ones are what it keeps
            self.dropped += 1
            now = time.monotonic()
            if now - self._full.get(record.name, -60.0) >= 60:
                self._full[record.name] = now
                log.warning("the dead-letter record %s is full (its first ones are kept); dropping more of %s",
                            record.name, message.user_id)

