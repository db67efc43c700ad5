"""The in-memory bus: one process, no broker; for local mode and fast tests.

A `MemoryBroker` plays RabbitMQ: it holds the queues, the users and their `Permissions`, and each
`MemoryBus` is one principal's connection to it, so identity works as on the broker: every
message carries its sender's user name, and declaring, binding, publishing and consuming are
checked against the same permission expressions RabbitMQ enforces (`AccessRefused` otherwise).
It keeps the broker's delivery rules too: manual ack, prefetch, redelivery with the `redelivered`
flag, no route to a missing queue, conflicting declarations refused, per-message expiry, and work
queues that dead-letter what is dropped, expires or exceeds its delivery limit, each dead letter kept
in the shared queue and in its sender's record (its first ones, as the operator files them on
RabbitMQ, see `deadletters`). Messages do not survive the process.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from rockbot.bus.admin import DeadLetter
from rockbot.bus.errors import AccessRefused, BusError, InUse, NoRoute
from rockbot.bus.interface import Bus, DeadLetterShare, Handler, Subscription, run_handler
from rockbot.bus.messages import CONTENT_TYPE, Delivery, Outgoing
from rockbot.bus.permissions import Action, Limits, Permissions
from rockbot.bus.topology import (
    DEAD_LETTERS,
    DEAD_LETTERS_PER_PRINCIPAL,
    EXCHANGE,
    FIXED_QUEUES,
    MAX_MESSAGE_BYTES,
    Queue,
    dead_letter_record,
)
from rockbot.tasks import cancel_and_wait


class _Stored(BaseModel):
    model_config = ConfigDict(frozen=True)

    message: Outgoing
    user_id: str
    #: How often it went back to its queue (RabbitMQ's `x-delivery-count`).
    returns: int = 0
    #: The event loop's clock reading after which the message is discarded undelivered.
    expires_at: float | None = None

    @classmethod
    def of(cls, message: Outgoing, *, user_id: str) -> _Stored:
        ttl = message.expires_after_seconds
        expires_at = None if ttl is None else asyncio.get_running_loop().time() + ttl
        return cls(message=message, user_id=user_id, expires_at=expires_at)

    def expired(self) -> bool:
        return self.expires_at is not None and asyncio.get_running_loop().time() >= self.expires_at


class _MemoryQueue:
    def __init__(self, spec: Queue, *, broker: MemoryBroker) -> None:
        self.spec = spec
        self.bound = False
        self.ready: asyncio.Queue[_Stored] = asyncio.Queue()
        self.consumers: set[_MemorySubscription] = set()
        self.exclusive = False  # its one consumer said so
        self._broker = broker

    def put_back(self, stored: _Stored) -> None:
        """A delivered message returns (requeued, or its consumer went away): count it, maybe give up on it."""
        returned = stored.model_copy(update={"returns": stored.returns + 1})
        limit = self.spec.arguments.get("x-delivery-limit")
        if limit is not None and returned.returns > limit:
            self.dead_letter(returned, reason="delivery_limit")
        else:
            self.ready.put_nowait(returned)

    def dead_letter(self, stored: _Stored, *, reason: str) -> None:
        if self.spec.arguments.get("x-dead-letter-exchange"):
            self._broker.dead_letter(stored, queue=self.spec.name, reason=reason)

    async def next_live(self) -> _Stored:
        """The next message that has not expired; expired ones are dead-lettered, like the broker does."""
        while True:
            stored = await self.ready.get()
            if not stored.expired():
                return stored
            self.dead_letter(stored, reason="expired")


class MemoryBroker:
    """Queues, users and permissions in one process; `connect(user)` gives that principal's `MemoryBus`.

    It administers itself like `RabbitAdmin` administers RabbitMQ (see `admin.BrokerAdmin`), and is
    born provisioned: the exchange, the fixed work queues and the dead-letter queue exist.
    """

    def __init__(self, *, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._queues: dict[str, _MemoryQueue] = {}
        self._users: dict[str, tuple[str, ...]] = {}  # user -> tags
        self._locked: set[str] = set()  # users made without a password: no login yet
        self._permissions: dict[str, Permissions] = {}
        self._limits: dict[str, Limits] = {}
        self._connections: dict[str, int] = {}  # user -> open connections
        self._dead: deque[DeadLetter] = deque(maxlen=int(DEAD_LETTERS.arguments["x-max-length"]))
        self._records: dict[str, list[DeadLetter]] = {}  # each sender's record: its first dead letters
        for queue in FIXED_QUEUES:
            self._provision(queue)

    def connect(self, user: str) -> MemoryBus:
        """A connection acting as `user`; `AccessRefused` for a user the broker does not know."""
        if user not in self._users or user in self._locked:
            raise AccessRefused(f"the broker refused the login of user {user!r}: provision it first")
        limits = self._limits.get(user)
        if limits is not None and self._connections.get(user, 0) >= limits.max_connections:
            raise AccessRefused(f"user {user!r} has reached its limit of {limits.max_connections} connections")
        self._connections[user] = self._connections.get(user, 0) + 1
        return MemoryBus(broker=self, user=user)

    def disconnected(self, user: str) -> None:
        self._connections[user] = max(0, self._connections.get(user, 0) - 1)

    # ---- administration (the same operations `RabbitAdmin` offers)

    async def ensure_topology(self) -> None:
        for queue in FIXED_QUEUES:
            self._provision(queue)

    async def ensure_queue(self, queue: Queue) -> bool:
        existed = queue.name in self._queues
        self._provision(queue)
        return not existed

    async def create_user(
        self, *, user: str, tags: Sequence[str], permissions: Permissions, limits: Limits, queues: Sequence[Queue]
    ) -> bool:
        if user in self._users:
            return False
        self._users[user] = tuple(tags)
        self._locked.add(user)
        self._permissions[user] = permissions
        self._limits[user] = limits
        for queue in queues:
            self._provision(queue)
        return True

    async def ensure_user(self, *, user: str, password: str, tags: Sequence[str] = ()) -> bool:
        if self._users.get(user) == tuple(tags) and user not in self._locked:
            return False
        self._users[user] = tuple(tags)
        self._locked.discard(user)
        return True

    async def ensure_permissions(self, *, user: str, permissions: Permissions) -> bool:
        if self._permissions.get(user) == permissions:
            return False
        self._permissions[user] = permissions
        return True

    async def ensure_limits(self, *, user: str, limits: Limits) -> bool:
        if self._limits.get(user) == limits:
            return False
        self._limits[user] = limits
        return True

    async def delete_user(self, user: str) -> bool:
        self._permissions.pop(user, None)
        self._limits.pop(user, None)
        self._locked.discard(user)
        return self._users.pop(user, None) is not None

    async def delete_queue(self, queue: Queue) -> bool:
        return self._queues.pop(queue.name, None) is not None

    async def users(self, *, tag: str) -> set[str]:
        return {user for user, tags in self._users.items() if tag in tags}

    async def dead_letters(self, *, count: int = 100, sender: str | None = None) -> list[DeadLetter]:
        if sender is None:
            return list(self._dead)[:count]
        return self._records.get(dead_letter_record(sender).name, [])[:count]

    # ---- what connections use

    def check(self, user: str, action: Action, resource: str) -> None:
        if not self._permissions.get(user, Permissions()).allows(action, resource):
            what = {"topic_write": "publish with routing key", "topic_read": "bind with key"}.get(action, action)
            raise AccessRefused(f"user {user!r} may not {what} {resource!r}")

    def queue(self, name: str) -> _MemoryQueue | None:
        return self._queues.get(name)

    def declare(self, spec: Queue) -> _MemoryQueue:
        existing = self._queues.get(spec.name)
        if existing is None:
            existing = self._queues[spec.name] = _MemoryQueue(spec, broker=self)
        elif existing.spec.arguments != spec.arguments:
            raise BusError(
                f"queue {spec.name!r} exists with arguments {existing.spec.arguments}, not {spec.arguments}"
            )
        return existing

    def dead_letter(self, stored: _Stored, *, queue: str, reason: str) -> None:
        message = stored.message
        letter = DeadLetter(queue=queue, reason=reason, user_id=stored.user_id, message_id=message.message_id,
                            message_type=message.message_type, body=message.body)  # fmt: skip
        self._dead.append(letter)
        record = self._records.setdefault(dead_letter_record(stored.user_id).name, [])
        if len(record) < DEAD_LETTERS_PER_PRINCIPAL:  # filed by sender as the operator files them on RabbitMQ
            record.append(letter)

    def _provision(self, spec: Queue) -> None:
        self.declare(spec).bound = True


class MemoryBus(Bus):
    """One principal's connection to a `MemoryBroker` (get it from `MemoryBroker.connect`)."""

    def __init__(self, *, broker: MemoryBroker, user: str) -> None:
        super().__init__(user=user, max_message_bytes=broker.max_message_bytes)
        self._broker = broker
        self._subscriptions: set[_MemorySubscription] = set()
        self._closed = False

    async def _put(self, *, queue_name: str, message: Outgoing) -> None:
        self._check_open()
        self._broker.check(self.user, "write", EXCHANGE)
        self._broker.check(self.user, "topic_write", queue_name)
        target = self._broker.queue(queue_name)
        if target is None or not target.bound:
            raise NoRoute(f"no queue named {queue_name!r}")
        target.ready.put_nowait(_Stored.of(message, user_id=self.user))

    async def declare(self, queue: Queue) -> None:
        self._check_open()
        if queue.provisioned:
            if self._broker.queue(queue.name) is None:
                raise NoRoute(f"no queue named {queue.name!r}: the operator declares it (see rockbot.bus.topology)")
            return
        self._broker.check(self.user, "configure", queue.name)
        declared = self._broker.declare(queue)
        self._broker.check(self.user, "write", queue.name)
        self._broker.check(self.user, "read", EXCHANGE)
        self._broker.check(self.user, "topic_read", queue.name)
        declared.bound = True

    async def consume(
        self, *, queue: Queue, handler: Handler, prefetch: int = 1, exclusive: bool = False
    ) -> Subscription:
        self._check_open()
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch} must be at least 1")
        await self.declare(queue)
        self._broker.check(self.user, "read", queue.name)
        target = self._broker.queue(queue.name)
        assert target is not None
        if target.exclusive or (exclusive and target.consumers):
            raise InUse(f"another connection consumes {queue.name!r} exclusively")
        subscription = _MemorySubscription(queue=target, handler=handler, prefetch=prefetch,
                                           share=self.dead_letter_share)
        target.consumers.add(subscription)
        target.exclusive = exclusive
        self._subscriptions.add(subscription)
        return subscription

    async def _close_transport(self) -> None:
        for subscription in list(self._subscriptions):
            await subscription.close()
        if not self._closed:
            self._broker.disconnected(self.user)
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise BusError("the bus is closed")


class _MemorySubscription(Subscription):
    def __init__(self, *, queue: _MemoryQueue, handler: Handler, prefetch: int, share: DeadLetterShare) -> None:
        self._queue = queue
        self._handler = handler
        self._share = share
        self._slots = asyncio.Semaphore(prefetch)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"consume {queue.spec.name}")

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            stored = await self._queue.next_live()
            task = asyncio.create_task(self._handle(stored))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def _handle(self, stored: _Stored) -> None:
        message = stored.message
        delivery = Delivery(
            queue=self._queue.spec.name,
            body=message.body,
            content_type=CONTENT_TYPE,
            message_type=message.message_type,
            schema_version=message.schema_version,
            message_id=message.message_id,
            correlation_id=message.correlation_id,
            reply_to=message.reply_to,
            accept_within_seconds=message.accept_within_seconds,
            redelivered=stored.returns > 0,
            user_id=stored.user_id,
            trace_context=message.trace_context,
            published_at=message.published_at,
            exchange=EXCHANGE,  # the one route this broker has
            routing_key=self._queue.spec.name,
        )
        try:
            outcome = await run_handler(handler=self._handler, delivery=delivery, share=self._share)
        except asyncio.CancelledError:
            self._queue.put_back(stored)
            raise
        finally:
            self._slots.release()
        if outcome == "requeue":
            self._queue.put_back(stored)
        elif outcome == "drop":
            self._queue.dead_letter(stored, reason="rejected")

    async def close(self, *, drain_seconds: float = 0.0) -> None:
        self._queue.consumers.discard(self)
        if not self._queue.consumers:
            self._queue.exclusive = False
        await cancel_and_wait(self._dispatcher)
        if self._in_flight and drain_seconds > 0:
            await asyncio.wait(self._in_flight, timeout=drain_seconds)
        for task in list(self._in_flight):
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
