"""The bus every rockbot process talks through: publish, consume with manual ack, request/reply.

Each connection acts as one principal (`user`, see `identity`) and stamps it on every message it
publishes; a message that arrives without a sender the bus recognises, or by any route but the
exchange `rockbot` with its queue's own name as routing key (`Delivery.misrouted`: copies, dead-
letter relays, other exchanges), is refused before any handler sees it. A handler's message is acked
only after the handler returns, so anything it publishes (its reply) is confirmed first. What
happens to the message of a handler that raises depends on why:
- a transient bus error (`BusUnavailable`, or a plain `BusError` such as the broker restarting or
  the bus closing) requeues it, after a short pause: the work may well be done and only its reply
  failed to go out, so dropping it would lose the request;
- `BadMessage` (unreadable, `TooLarge`) and `Refused` (the consumer will not handle it) drop it at
  once with a log line: the same bytes will never be handled;
- anything else (a bug, `NoRoute`, `AccessRefused`, `RequestTimeout`) requeues it once and then
  drops it with an error log.
A dropped message of a work queue is dead-lettered (see `topology`), and a work queue dead-letters
a message it has delivered more than `DELIVERY_LIMIT` + 1 times, so no message loops forever, even
one whose consumer crashes on it. A consumer that stops mid-handle leaves its messages to be
redelivered. Request/reply is built here once on top of `publish` and `consume`, so both
implementations share it; a requester takes a reply only from the principal it asked. Sending and
handling are traced here too (see `tracing`), once for both implementations.
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Literal, Self

from pydantic import BaseModel

from rockbot.bus import tracing
from rockbot.bus.errors import (
    AccessRefused,
    BadMessage,
    BusError,
    InUse,
    NoRoute,
    NotAccepted,
    Refused,
    RequestTimeout,
    TooLarge,
)
from rockbot.bus.identity import Principal
from rockbot.bus.messages import Delivery, Outgoing, ReplyAddress, RequestAccepted, encode
from rockbot.bus.topology import MAX_MESSAGE_BYTES, MAX_REPLY_SLOTS, Queue, agent_replies
from rockbot.telemetry import inject

log = logging.getLogger(__name__)

Handler = Callable[[Delivery], Awaitable[None]]
Outcome = Literal["ack", "requeue", "drop"]

_REPLY_PREFETCH = 64
#: Refused messages of one sender a process dead-letters per minute (see `DeadLetterShare`).
DEAD_LETTERS_PER_SENDER_MINUTE = 100
#: How long a consumer's word that it took a request may take to reach the asker (see `Bus.request`).
ACCEPT_TRAVEL_SECONDS = 2.0
#: How long a handler that hit a transient bus error holds its slot before its message is requeued.
TRANSIENT_PAUSE_SECONDS = 0.5


class DeadLetterShare:
    """How many of one sender's messages this process dead-letters per minute; past that it drops them.

    The dead-letter queue keeps the newest `DEAD_LETTERS_KEPT`: without a share per sender, one agent
    sending messages to be refused could push the record of what it did before out of it. Its first
    `per_minute` refusals of each minute are kept; the rest are acked unhandled, with one log line per
    sender and minute saying how many.
    """

    def __init__(self, *, per_minute: int = DEAD_LETTERS_PER_SENDER_MINUTE) -> None:
        self._per_minute = per_minute
        self._minutes: dict[str, tuple[float, int]] = {}  # sender -> (its minute's start, dead letters in it)

    def allows(self, sender: str | None) -> bool:
        now = time.monotonic()
        if len(self._minutes) > 10_000:  # forget senders whose minute is over
            self._minutes = {key: value for key, value in self._minutes.items() if now - value[0] < 60}
        key = sender or ""
        start, count = self._minutes.get(key, (now, 0))
        if now - start >= 60:
            start, count = now, 0
        count += 1
        self._minutes[key] = (start, count)
        if count == self._per_minute + 1:
            log.warning("%s had %d messages refused this minute: dropping the rest of this minute's without "
                        "dead-lettering them, so its earlier dead letters are kept", sender, self._per_minute)
        return count <= self._per_minute


async def run_handler(*, handler: Handler, delivery: Delivery, share: DeadLetterShare) -> Outcome:
    """Run a handler in the message's consumer span and say what to do with its message (cancellation
    propagates: no ack); a message to drop past its sender's `share` is acked instead."""
    with tracing.handling(delivery) as span:
        outcome = await _outcome(handler=handler, delivery=delivery)
        if outcome == "drop" and not share.allows(delivery.user_id):
            outcome = "ack"
        tracing.settled(span, outcome)
        return outcome


async def _outcome(*, handler: Handler, delivery: Delivery) -> Outcome:
    misrouted = delivery.misrouted()
    if misrouted is not None:
        log.warning("refusing message %s on %s from %s: %s; dead-lettering it unhandled",
                    delivery.message_id, delivery.queue, delivery.user_id, misrouted)
        return "drop"
    if delivery.sender is None:
        log.warning("refusing message %s on %s: its sender %r is not a rockbot principal (user_id); dead-lettering it",
                    delivery.message_id, delivery.queue, delivery.user_id)
        return "drop"
    try:
        await handler(delivery)
    except Refused as exc:
        log.warning("refusing message %s on %s from %s: %s; dead-lettering it",
                    delivery.message_id, delivery.queue, delivery.user_id, exc)
        return "drop"
    except BadMessage:
        log.exception("message %s on %s from %s cannot be read; dead-lettering it",
                      delivery.message_id, delivery.queue, delivery.user_id)
        return "drop"
    except BusError as exc:
        if isinstance(exc, NoRoute | RequestTimeout | AccessRefused):
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
    def __init__(self, *, user: str, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        #: The broker user (principal) this connection acts as; stamped on every message it publishes.
        self.user = user
        self.max_message_bytes = max_message_bytes
        self._reply_routers: dict[str, _ReplyRouter] = {}
        self._router_lock = asyncio.Lock()
        self._own_replies: Queue | None = None
        #: Shared by this connection's consumers: one sender's share of the dead letters they make.
        self.dead_letter_share = DeadLetterShare()

    @property
    def principal(self) -> Principal | None:
        return Principal.parse(self.user)

    async def publish(
        self,
        *,
        queue: Queue,
        body: BaseModel,
        message_id: str | None = None,
        correlation_id: str | None = None,
        reply_to: str | None = None,
        expires_after_seconds: float | None = None,
        accept_within_seconds: float | None = None,
    ) -> None:
        """Put a persistent message on `queue` (which its owner declared); returns once confirmed.

        `NoRoute` if the queue does not exist, `AccessRefused` if this principal may not write to it,
        `TooLarge` over `max_message_bytes`. A message with `expires_after_seconds` that no consumer
        has taken by then is discarded (dead-lettered on a work queue).
        """
        await self._post(queue.name, body, message_id=message_id, correlation_id=correlation_id, reply_to=reply_to,
                         expires_after_seconds=expires_after_seconds,
                         accept_within_seconds=accept_within_seconds)  # fmt: skip

    async def reply(self, *, to: Delivery | ReplyAddress, body: BaseModel) -> None:
        """Answer `to` on its `reply_to` queue with its correlation id; `NoRoute` if that queue is gone."""
        if not to.reply_to:
            raise BusError(f"message {to.message_id!r} on {to.queue!r} has no reply_to to answer")  # type: ignore[union-attr]
        await self._post(to.reply_to, body, correlation_id=to.correlation_id)

    async def _post(self, queue_name: str, body: BaseModel, **fields: str | float | None) -> None:
        """Encode `body` with `fields` and the trace context, and put it on `queue_name`, in a producer span."""
        with tracing.sending(type(body).__name__) as span:
            message = encode(body=body, trace_context=inject(), **fields)
            tracing.describe_sent(span, routing_key=queue_name, message=message)
            await self._put(queue_name=queue_name, message=self._checked(message))

    def _checked(self, message: Outgoing) -> Outgoing:
        if len(message.body) > self.max_message_bytes:
            raise TooLarge(
                f"a {message.message_type} of {len(message.body)} bytes is over the bus's limit of "
                f"{self.max_message_bytes} bytes: send less (e.g. a smaller script input)"
            )
        return message

    @abstractmethod
    async def _put(self, *, queue_name: str, message: Outgoing) -> None:
        """Put `message` (as this connection's user) on the existing queue `queue_name`, confirmed."""

    @abstractmethod
    async def declare(self, queue: Queue) -> None:
        """Make sure `queue` exists and is routed to: declare and bind it (its owner), or only check it (provisioned).

        A provisioned queue that does not exist is a `NoRoute` naming who declares it.
        """

    @abstractmethod
    async def consume(
        self, *, queue: Queue, handler: Handler, prefetch: int = 1, exclusive: bool = False
    ) -> Subscription:
        """`declare` the queue, then run `handler` for each message, at most `prefetch` at a time, acking after each.

        `exclusive`: the only consumer of the queue, or `InUse` while another connection consumes it.
        """

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
        responder: Principal,
        accept_within_seconds: float | None = None,
    ) -> Delivery:
        """Publish `body` and wait for `responder`'s reply carrying `correlation_id`; `RequestTimeout` after
        `timeout_seconds`.

        A reply from anybody else is dropped with a warning. The request expires undelivered with the
        wait: no consumer starts work nobody will read.

        With `accept_within_seconds` the wait has two steps. The request is `NotAccepted` unless the responder
        says it took it within that (plus `ACCEPT_TRAVEL_SECONDS`): a `RequestAccepted` on the reply queue. From
        each such word on, the wait is the `answer_within_seconds` it names, never more than `timeout_seconds`:
        only the responder's word counts (the broker checks who sends), and not even its word extends a wait past
        the bound the asker set. A responder that never says (an older one) is still heard if its answer comes
        within the first step. The request expires with the longest wait all the same, not after the first
        step: a copy the broker hands on again after a restart joins the run under way, and only that copy's
        handler can answer it.
        """
        router = await self._router(reply_queue)
        replies = router.expect(correlation_id, responder=responder)
        two_step = accept_within_seconds is not None
        first = accept_within_seconds + ACCEPT_TRAVEL_SECONDS if accept_within_seconds is not None else timeout_seconds
        accepted = False
        try:
            async with asyncio.timeout(first) as deadline:
                await self.publish(
                    queue=queue,
                    body=body,
                    message_id=correlation_id,
                    correlation_id=correlation_id,
                    reply_to=reply_queue.name,
                    expires_after_seconds=first + timeout_seconds if two_step else timeout_seconds,
                    accept_within_seconds=accept_within_seconds,
                )
                while True:
                    delivery = await replies.get()
                    if delivery.message_type != RequestAccepted.__name__:
                        return delivery
                    if not two_step:
                        continue  # a word nobody asked for changes nothing
                    try:
                        word = delivery.decode(RequestAccepted)
                    except BadMessage as exc:
                        log.warning("ignoring an unreadable acceptance of %s: %s", correlation_id, exc)
                        continue
                    accepted = True
                    deadline.reschedule(
                        asyncio.get_running_loop().time() + min(word.answer_within_seconds, timeout_seconds)
                    )
        except TimeoutError:
            if two_step and not accepted:
                raise NotAccepted(
                    f"nobody took {correlation_id!r} (answering on {reply_queue.name!r}) within "
                    f"{accept_within_seconds:g} s"
                ) from None
            raise RequestTimeout(
                f"no reply to {correlation_id!r} on {reply_queue.name!r} within {timeout_seconds:g} s"
                + (" of its acceptance" if accepted else "")
            ) from None
        finally:
            router.forget(correlation_id)

    async def hand_over(self, *, queue: Queue, body: BaseModel, reply_queue: Queue, correlation_id: str,
                        timeout_seconds: float, responder: Principal) -> asyncio.Task[Delivery]:  # fmt: skip
        """Publish a request that never expires and return once the broker confirmed it (its sender acts on it being
        held, see long-term memory's `remember`): the task that waits up to `timeout_seconds` for `responder`'s
        reply carrying `correlation_id` (`RequestTimeout` after), the request being handled even after that."""
        router = await self._router(reply_queue)
        replies = router.expect(correlation_id, responder=responder)
        try:
            await self.publish(queue=queue, body=body, message_id=correlation_id, correlation_id=correlation_id,
                               reply_to=reply_queue.name)  # fmt: skip
        except BaseException:
            router.forget(correlation_id)
            raise
        return asyncio.create_task(self._held_reply(router, replies, correlation_id=correlation_id,
                                                    reply_queue=reply_queue, timeout_seconds=timeout_seconds))

    async def _held_reply(self, router: _ReplyRouter, replies: asyncio.Queue[Delivery], *, correlation_id: str,
                          reply_queue: Queue, timeout_seconds: float) -> Delivery:  # fmt: skip
        try:
            async with asyncio.timeout(timeout_seconds):
                while (delivery := await replies.get()).message_type == RequestAccepted.__name__:
                    continue  # a word nobody asked for changes nothing
                return delivery
        except TimeoutError:
            raise RequestTimeout(f"no reply to {correlation_id!r} on {reply_queue.name!r} within "
                                 f"{timeout_seconds:g} s") from None  # fmt: skip
        finally:
            router.forget(correlation_id)

    async def accept(self, *, to: Delivery | ReplyAddress, answer_within_seconds: float) -> None:
        """Tell the asker of `to` (a request with `accept_within_seconds`) that it is taken and answered within
        `answer_within_seconds`; `NoRoute` if its reply queue is gone."""
        await self.reply(to=to, body=RequestAccepted(answer_within_seconds=answer_within_seconds))

    async def own_replies(self) -> Queue:
        """This agent process's reply queue: the first of its Agent's reply slots that no other process holds.

        Claimed once per connection with an exclusive consumer (see `topology`); `NoRoute` naming the
        fix when every slot the operator provisioned is held.
        """
        async with self._router_lock:
            if self._own_replies is not None:
                return self._own_replies
            principal = self.principal
            if principal is None or principal.kind != "agent":
                raise BusError(f"{self.user} is no agent: a service declares reply queues of its own")
            for slot in range(MAX_REPLY_SLOTS):
                queue = agent_replies(namespace=principal.namespace, name=principal.name, slot=slot)
                router = _ReplyRouter()
                try:
                    router.subscription = await self.consume(
                        queue=queue, handler=router.on_reply, prefetch=_REPLY_PREFETCH, exclusive=True
                    )
                except InUse:
                    continue
                except NoRoute:
                    break
                self._reply_routers[queue.name] = router
                self._own_replies = queue
                return queue
            raise NoRoute(
                f"every reply queue of {principal} is held by another process ({slot} provisioned): more "
                "processes of this Agent run than the operator provisioned for its replicas; wait for stopped "
                "pods to go, or scale the Agent through its spec.replicas"
            )

    async def close(self) -> None:
        self._own_replies = None
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
    """One consumer per reply queue, handing each reply (and word of acceptance) to the request waiting for it."""

    subscription: Subscription

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[Principal, asyncio.Queue[Delivery]]] = {}

    def expect(self, correlation_id: str, *, responder: Principal) -> asyncio.Queue[Delivery]:
        if correlation_id in self._waiting:
            raise BusError(f"a request with correlation id {correlation_id!r} is already waiting for its reply")
        replies: asyncio.Queue[Delivery] = asyncio.Queue()
        self._waiting[correlation_id] = (responder, replies)
        return replies

    def forget(self, correlation_id: str) -> None:
        self._waiting.pop(correlation_id, None)

    async def on_reply(self, delivery: Delivery) -> None:
        responder, replies = self._waiting.get(delivery.correlation_id or "", (None, None))
        if replies is None:
            log.info("dropping a reply on %s that nobody waits for (%s)", delivery.queue, delivery.correlation_id)
            return
        if delivery.sender != responder:
            log.warning("dropping a reply to %s on %s from %s: the request went to %s",
                        delivery.correlation_id, delivery.queue, delivery.user_id, responder)
            return
        replies.put_nowait(delivery)
