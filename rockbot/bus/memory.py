"""The in-memory bus: one process, no broker; for local mode and fast tests.

It keeps the broker's delivery rules (manual ack, prefetch, redelivery with the `redelivered` flag,
no route to an undeclared queue, conflicting declarations refused) so code tested on it behaves
the same on RabbitMQ. Messages do not survive the process.
"""

from __future__ import annotations

import asyncio
import contextlib

from pydantic import BaseModel, ConfigDict

from rockbot.bus.errors import BusError, NoRoute
from rockbot.bus.interface import Bus, Handler, Subscription, run_handler
from rockbot.bus.messages import CONTENT_TYPE, Delivery, Outgoing
from rockbot.bus.topology import Queue


class _Stored(BaseModel):
    model_config = ConfigDict(frozen=True)

    message: Outgoing
    redelivered: bool = False
    #: The event loop's clock reading after which the message is discarded undelivered.
    expires_at: float | None = None

    @classmethod
    def of(cls, message: Outgoing) -> _Stored:
        ttl = message.expires_after_seconds
        return cls(message=message, expires_at=None if ttl is None else asyncio.get_running_loop().time() + ttl)

    def expired(self) -> bool:
        return self.expires_at is not None and asyncio.get_running_loop().time() >= self.expires_at


class _MemoryQueue:
    def __init__(self, spec: Queue) -> None:
        self.spec = spec
        self.ready: asyncio.Queue[_Stored] = asyncio.Queue()


class MemoryBus(Bus):
    def __init__(self) -> None:
        super().__init__()
        self._queues: dict[str, _MemoryQueue] = {}
        self._subscriptions: set[_MemorySubscription] = set()
        self._closed = False

    async def _put(self, *, queue: Queue, message: Outgoing) -> None:
        self._check_open()
        self._declare(queue).ready.put_nowait(_Stored.of(message))

    async def _put_reply(self, *, queue_name: str, message: Outgoing) -> None:
        self._check_open()
        target = self._queues.get(queue_name)
        if target is None:
            raise NoRoute(f"no queue named {queue_name!r}")
        target.ready.put_nowait(_Stored.of(message))

    async def consume(self, *, queue: Queue, handler: Handler, prefetch: int = 1) -> Subscription:
        self._check_open()
        if prefetch < 1:
            raise ValueError(f"prefetch={prefetch} must be at least 1")
        subscription = _MemorySubscription(queue=self._declare(queue), handler=handler, prefetch=prefetch)
        self._subscriptions.add(subscription)
        return subscription

    async def _close_transport(self) -> None:
        for subscription in list(self._subscriptions):
            await subscription.close()
        self._closed = True

    def _declare(self, spec: Queue) -> _MemoryQueue:
        existing = self._queues.get(spec.name)
        if existing is None:
            existing = self._queues[spec.name] = _MemoryQueue(spec)
        elif existing.spec.arguments != spec.arguments:
            raise BusError(
                f"queue {spec.name!r} exists with arguments {existing.spec.arguments}, not {spec.arguments}"
            )
        return existing

    def _check_open(self) -> None:
        if self._closed:
            raise BusError("the bus is closed")


class _MemorySubscription(Subscription):
    def __init__(self, *, queue: _MemoryQueue, handler: Handler, prefetch: int) -> None:
        self._queue = queue
        self._handler = handler
        self._slots = asyncio.Semaphore(prefetch)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._dispatcher = asyncio.create_task(self._dispatch(), name=f"consume {queue.spec.name}")

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            stored = await self._queue.ready.get()
            while stored.expired():  # like the broker: an expired message is never delivered
                stored = await self._queue.ready.get()
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
            redelivered=stored.redelivered,
        )
        try:
            outcome = await run_handler(handler=self._handler, delivery=delivery)
        except asyncio.CancelledError:
            self._queue.ready.put_nowait(stored.model_copy(update={"redelivered": True}))
            raise
        finally:
            self._slots.release()
        if outcome == "requeue":
            self._queue.ready.put_nowait(stored.model_copy(update={"redelivered": True}))

    async def close(self, *, drain_seconds: float = 0.0) -> None:
        self._dispatcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._dispatcher
        if self._in_flight and drain_seconds > 0:
            await asyncio.wait(self._in_flight, timeout=drain_seconds)
        for task in list(self._in_flight):
            task.cancel()
        await asyncio.gather(*self._in_flight, return_exceptions=True)
