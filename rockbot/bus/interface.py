"""The bus every rockbot process talks through: publish, consume with manual ack, request/reply.

A handler's message is acked only after the handler returns, so anything it publishes (its reply)
is confirmed first. What happens to the message of a handler that raises depends on why:
- a transient bus error (`BusUnavailable`, or a plain `BusError` such as the broker refusing a
  publish or the bus closing) requeues it every time, after a short pause: the work may well be
  done and only its reply failed to go out, so dropping it would lose the request;
- `BadMessage` drops it at once with an error log: the same bytes will never parse;
- anything else (a bug, `NoRoute`, `RequestTimeout`) requeues it once and then drops it with an
  error log, so a poison message cannot loop forever.
A consumer that stops mid-handle leaves its messages to be redelivered. Request/reply is built
here once on top of `publish` and `consume`, so both implementations share it.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Literal, Self

from pydantic import BaseModel

from rockbot.bus.errors import BadMessage, BusError, NoRoute, RequestTimeout
from rockbot.bus.messages import Delivery, Outgoing, encode
from rockbot.bus.topology import Queue

log = logging.getLogger(__name__)

Handler = Callable[[Delivery], Awaitable[None]]
Outcome = Literal["ack", "requeue", "drop"]

_REPLY_PREFETCH = 64
#: How long a handler that hit a transient bus error holds its slot before its message is requeued.
TRANSIENT_PAUSE_SECONDS = 0.5


async def run_handler(*, handler: Handler, delivery: Delivery) -> Outcome:
    """Run a handler and say what to do with its message (cancellation propagates: no ack)."""
    try:
        await handler(delivery)
    except BadMessage:
        log.exception("message %s on %s cannot be read; dropping it", delivery.message_id, delivery.queue)
        return "drop"
    except BusError as exc:
        if isinstance(exc, NoRoute | RequestTimeout):
            return _after_failure(delivery)
        log.warning("handler for %s hit a bus error (%s); requeueing message %s",
                    delivery.queue, exc, delivery.message_id)
        await asyncio.sleep(TRANSIENT_PAUSE_SECONDS)  # no hot loop while the bus recovers
        return "requeue"
    except Exception:
        return _after_failure(delivery)
    return "ack"


def _after_failure(delivery: Delivery) -> Outcome:
    """Called from an `except` block: one more try, then drop (a poison message must not loop)."""
    if delivery.redelivered:
        log.exception("handler for %s failed again; dropping message %s", delivery.queue, delivery.message_id)
        return "drop"
    log.warning("handler for %s failed; requeueing message %s once", delivery.queue, delivery.message_id,
                exc_info=True)
    return "requeue"


class Subscription(ABC):
    """A running consumer; closing it leaves unfinished messages to be redelivered."""

    @abstractmethod
    async def close(self, *, drain_seconds: float = 0.0) -> None:
        """Stop taking messages, let in-flight handlers finish for up to `drain_seconds`, cancel the rest."""


class Bus(ABC):
    def __init__(self) -> None:
        self._reply_routers: dict[str, _ReplyRouter] = {}
        self._router_lock = asyncio.Lock()

    async def publish(
        self,
        *,
        queue: Queue,
        body: BaseModel,
        message_id: str | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expires_after_seconds: float | None = None,
    ) -> None:
        """Declare `queue` if needed and put a persistent message on it; returns once confirmed.

        A message with `expires_after_seconds` that no consumer has taken by then is discarded.
        """
        message = encode(
            body=body,
            message_id=message_id,
            correlation_id=correlation_id,
            reply_to=reply_to,
            expires_after_seconds=expires_after_seconds,
        )
        await self._put(queue=queue, message=message)

    async def reply(self, *, to: Delivery, body: BaseModel) -> None:
        """Answer `to` on its `reply_to` queue with its correlation id; `NoRoute` if that queue is gone."""
        if not to.reply_to:
            raise BusError(f"message {to.message_id!r} on {to.queue!r} has no reply_to to answer")
        await self._put_reply(queue_name=to.reply_to, message=encode(body=body, correlation_id=to.correlation_id))

    @abstractmethod
    async def _put(self, *, queue: Queue, message: Outgoing) -> None:
        """Declare `queue` if needed and put `message` on it, confirmed."""

    @abstractmethod
    async def _put_reply(self, *, queue_name: str, message: Outgoing) -> None:
        """Put `message` on an existing queue (never declared by the replier); `NoRoute` if it is gone."""

    @abstractmethod
    async def consume(self, *, queue: Queue, handler: Handler, prefetch: int = 1) -> Subscription:
        """Run `handler` for each message, at most `prefetch` at a time, acking after each returns."""

    @abstractmethod
    async def _close_transport(self) -> None: ...

    async def request(
        self,
        *,
        queue: Queue,
        body: BaseModel,
        reply_queue: Queue,
        correlation_id: str,
        timeout_seconds: float,
    ) -> Delivery:
        """Publish `body` and wait for the reply carrying `correlation_id`; `RequestTimeout` after `timeout_seconds`.

        The request expires undelivered with the wait: no consumer starts work nobody will read.
        """
        router = await self._router(reply_queue)
        future = router.expect(correlation_id)
        try:
            async with asyncio.timeout(timeout_seconds):
                await self.publish(
                    queue=queue,
                    body=body,
                    message_id=correlation_id,
                    correlation_id=correlation_id,
                    reply_to=reply_queue.name,
                    expires_after_seconds=timeout_seconds,  # after that nobody waits for the answer
                )
                return await future
        except TimeoutError:
            raise RequestTimeout(
                f"no reply to {correlation_id!r} on {reply_queue.name!r} within {timeout_seconds:g} s"
            ) from None
        finally:
            router.forget(correlation_id)

    async def close(self) -> None:
        for router in list(self._reply_routers.values()):
            await router.subscription.close()
        self._reply_routers.clear()
        await self._close_transport()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _router(self, reply_queue: Queue) -> _ReplyRouter:
        async with self._router_lock:
            router = self._reply_routers.get(reply_queue.name)
            if router is None:
                router = _ReplyRouter()
                router.subscription = await self.consume(
                    queue=reply_queue, handler=router.on_reply, prefetch=_REPLY_PREFETCH
                )
                self._reply_routers[reply_queue.name] = router
            return router


class _ReplyRouter:
    """One consumer per reply queue, handing each reply to the request waiting for it."""

    subscription: Subscription

    def __init__(self) -> None:
        self._waiting: dict[str, asyncio.Future[Delivery]] = {}

    def expect(self, correlation_id: str) -> asyncio.Future[Delivery]:
        if correlation_id in self._waiting:
            raise BusError(f"a request with correlation id {correlation_id!r} is already waiting for its reply")
        future: asyncio.Future[Delivery] = asyncio.get_running_loop().create_future()
        self._waiting[correlation_id] = future
        return future

    def forget(self, correlation_id: str) -> None:
        self._waiting.pop(correlation_id, None)

    async def on_reply(self, delivery: Delivery) -> None:
        future = self._waiting.get(delivery.correlation_id or "")
        if future is None or future.done():
            log.info("dropping a reply on %s that nobody waits for (%s)", delivery.queue, delivery.correlation_id)
            return
        future.set_result(delivery)
