"""Trace context crosses the bus: a handler's work is a child of the span that sent its message (both buses)."""

from __future__ import annotations

import asyncio

from opentelemetry import trace

from rockbot.bus import Bus, Delivery
from rockbot.telemetry import tracer
from tests.bus.conftest import Broker, principal
from tests.bus.test_contract import WAIT, Ping, declared, fresh_queue
from tests.fixtures.tracing import Spans


async def test_a_handler_runs_in_a_consumer_span_child_of_the_producer_span(bus: Bus, spans: Spans) -> None:
    queue = await declared(bus)
    seen: asyncio.Queue[trace.SpanContext] = asyncio.Queue()

    async def handler(delivery: Delivery) -> None:
        with tracer.start_as_current_span("work"):
            await seen.put(trace.get_current_span().get_span_context())

    await bus.consume(queue=queue, handler=handler)
    with tracer.start_as_current_span("caller") as caller:
        await bus.publish(queue=queue, body=Ping(n=1), message_id="m-1")
    work = await asyncio.wait_for(seen.get(), WAIT)

    assert work.trace_id == caller.get_span_context().trace_id
    await spans.ended("process Ping")
    producer, consumer = spans.one("publish Ping"), spans.one("process Ping")
    assert spans.ancestors(spans.one("work")) == ["process Ping", "publish Ping", "caller"]
    assert producer.kind == trace.SpanKind.PRODUCER and consumer.kind == trace.SpanKind.CONSUMER
    assert producer.attributes["messaging.rabbitmq.destination.routing_key"] == queue.name
    assert consumer.attributes["messaging.message.id"] == "m-1"
    assert consumer.attributes["rockbot.bus.sender"] == "service.test"
    assert consumer.attributes["rockbot.bus.outcome"] == "ack"
    assert consumer.attributes["rockbot.bus.queue_wait_seconds"] >= 0


async def test_a_reply_continues_the_requesters_trace(broker: Broker, spans: Spans) -> None:
    server, client = await broker.connect("service.server"), await broker.connect("service.client")
    queue, replies = fresh_queue(), fresh_queue()

    async def double(delivery: Delivery) -> None:
        await server.reply(to=delivery, body=Ping(n=delivery.decode(Ping).n * 2))

    await server.consume(queue=queue, handler=double)
    with tracer.start_as_current_span("caller"):
        await client.request(
            queue=queue, body=Ping(n=21), reply_queue=replies, correlation_id="call-1", timeout_seconds=WAIT,
            responder=principal(server),
        )
    await spans.ended("process Ping", count=2)
    caller = spans.one("caller")
    assert {span.context.trace_id for span in spans.all()} == {caller.context.trace_id}
    reply = next(s for s in spans.named("process Ping") if s.attributes["messaging.rabbitmq.destination.routing_key"]
                 == replies.name)
    assert spans.ancestors(reply) == ["publish Ping", "process Ping", "publish Ping", "caller"]


async def test_a_refused_message_is_an_error_on_its_consumer_span(bus: Bus, spans: Spans) -> None:
    queue = await declared(bus)
    handled = asyncio.Event()

    async def refuses(delivery: Delivery) -> None:
        handled.set()
        delivery.decode(Ping, max_bytes=1)  # TooLarge: dropped

    await bus.consume(queue=queue, handler=refuses)
    await bus.publish(queue=queue, body=Ping(n=1))
    await asyncio.wait_for(handled.wait(), WAIT)
    await spans.ended("process Ping")
    consumer = spans.one("process Ping")
    assert consumer.attributes["rockbot.bus.outcome"] == "drop"
    assert consumer.status.status_code == trace.StatusCode.ERROR
    assert consumer.parent is not None and consumer.parent.span_id == spans.one("publish Ping").context.span_id
