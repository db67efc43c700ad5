"""Spans of the bus: one producer span per message sent, one consumer span per message handled.

The producer span is current while the message is encoded, so the trace context the message carries
names it, and the consumer span (started from that context) is its child: work a handler does joins
the sender's trace, across processes. Spans are named by the message's type (`publish
InboxRequest`, `process ScriptInvokeReply`), never by a queue's name, which may hold a per-process
id; the routing key and queue are attributes (OpenTelemetry's messaging conventions for RabbitMQ).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from rockbot.bus.messages import Delivery, Outgoing
from rockbot.bus.topology import EXCHANGE
from rockbot.telemetry import extract, tracer

#: The longest wait a sender's stamp (`x-published-at-ms`) is believed for: no request waits longer in a queue of
#: rockbot's (a script request expires with its timeout, a reply within the hour), so a stamp of 0 (1970) or of next
#: year says nothing, and one message cannot add more than this to a queue-wait histogram's sum.
BELIEVED_WAIT_SECONDS = 3600.0
#: How far ahead of the receiver's clock a sender's may be.
CLOCK_SKEW_SECONDS = 60.0

SYSTEM = "rabbitmq"


@contextmanager
def sending(message_type: str) -> Iterator[Span]:
    """The producer span of one message (encode the message inside it)."""
    with tracer.start_as_current_span(f"publish {message_type}", kind=SpanKind.PRODUCER) as span:
        yield span


def describe_sent(span: Span, *, routing_key: str, message: Outgoing) -> None:
    if span.is_recording():
        span.set_attributes({
            "messaging.system": SYSTEM,
            "messaging.operation.name": "publish",
            "messaging.operation.type": "send",
            "messaging.destination.name": EXCHANGE,
            "messaging.rabbitmq.destination.routing_key": routing_key,
            "messaging.message.body.size": len(message.body),
            **_ids(message.message_id, message.correlation_id),
        })  # fmt: skip


@contextmanager
def handling(delivery: Delivery) -> Iterator[Span]:
    """The consumer span of one delivery, a child of the span that sent it."""
    with tracer.start_as_current_span(
        f"process {delivery.message_type or 'message'}", context=extract(delivery.trace_context),
        kind=SpanKind.CONSUMER,
    ) as span:  # fmt: skip
        if span.is_recording():
            span.set_attributes({
                "messaging.system": SYSTEM,
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
                "messaging.destination.name": EXCHANGE,
                "messaging.rabbitmq.destination.routing_key": delivery.queue,
                "messaging.message.body.size": len(delivery.body),
                "rockbot.bus.sender": delivery.user_id or "",
                "rockbot.bus.redelivered": delivery.redelivered,
                **_ids(delivery.message_id, delivery.correlation_id),
            })  # fmt: skip
            wait = queue_wait(delivery)
            if wait is not None:
                span.set_attribute("rockbot.bus.queue_wait_seconds", wait)
        yield span


def settled(span: Span, outcome: str) -> None:
    """Record what became of the message (`ack`, `requeue`, `drop`); anything but ack is an error."""
    if span.is_recording():
        span.set_attribute("rockbot.bus.outcome", outcome)
        if outcome != "ack":
            span.set_status(Status(StatusCode.ERROR, f"message {outcome}"))


def queue_wait(delivery: Delivery, *, now: float | None = None) -> float | None:
    """Seconds from sending to handling at `now` (default: this moment; the two clocks may differ a little;
    never below zero), or None when the message does not say, or says what cannot be: its stamp is the sender's
    claim, believed only within `BELIEVED_WAIT_SECONDS` before `now` and `CLOCK_SKEW_SECONDS` after it."""
    if delivery.published_at is None:
        return None
    wait = (time.time() if now is None else now) - delivery.published_at
    if not -CLOCK_SKEW_SECONDS <= wait <= BELIEVED_WAIT_SECONDS:
        return None
    return max(0.0, wait)


def _ids(message_id: str | None, correlation_id: str | None) -> dict[str, str]:
    ids = {}
    if message_id:
        ids["messaging.message.id"] = message_id
    if correlation_id:
        ids["messaging.message.conversation_id"] = correlation_id
    return ids
