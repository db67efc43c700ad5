"""The delivery rules every bus implementation keeps (see rockbot.bus.interface)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Literal

import pytest
from pydantic import BaseModel

from rockbot.bus import (
    AccessRefused,
    BadMessage,
    Bus,
    BusError,
    BusUnavailable,
    Delivery,
    NoRoute,
    Permissions,
    Queue,
    Refused,
    RequestTimeout,
    TooLarge,
    interface,
)
from rockbot.bus.admin import DeadLetter
from rockbot.bus.topology import DELIVERY_LIMIT, work_queue
from tests.bus.conftest import Broker, principal
from tests.waiting import eventually

WAIT = 10.0  # generous upper bound for things that should happen at once; never a timing assertion


class Ping(BaseModel):
    schema_version: Literal[1] = 1
    n: int


class Other(BaseModel):
    text: str


def fresh_queue(**arguments: object) -> Queue:
    return Queue(name=f"test.{uuid.uuid4().hex}", arguments=dict(arguments))


async def declared(bus: Bus, **arguments: object) -> Queue:
    """A queue its owner has declared (publishers never declare the queues they publish to)."""
    queue = fresh_queue(**arguments)
    await bus.declare(queue)
    return queue


async def test_published_message_arrives_with_its_contract_metadata(bus: Bus) -> None:
    queue = await declared(bus)
    received: asyncio.Queue[Delivery] = asyncio.Queue()
    await bus.publish(queue=queue, body=Ping(n=7), message_id="m-1")
    await bus.consume(queue=queue, handler=received.put)
    delivery = await asyncio.wait_for(received.get(), WAIT)
    assert delivery.decode(Ping) == Ping(n=7)
    assert delivery.json() == {"schema_version": 1, "n": 7}
    assert (delivery.content_type, delivery.message_type, delivery.schema_version) == (
        "application/json", "Ping", 1)
    assert (delivery.message_id, delivery.redelivered, delivery.queue) == ("m-1", False, queue.name)
    assert delivery.user_id == "service.test"


async def test_a_delivery_knows_when_it_was_published_to_the_millisecond(bus: Bus) -> None:
    """The queue-wait metric reads this: a 32-bit float header would be off by up to a minute."""
    queue = await declared(bus)
    received: asyncio.Queue[Delivery] = asyncio.Queue()
    before = time.time()
    await bus.publish(queue=queue, body=Ping(n=2))
    after = time.time()
    await bus.consume(queue=queue, handler=received.put)
    delivery = await asyncio.wait_for(received.get(), WAIT)
    assert delivery.published_at is not None
    assert before - 0.001 <= delivery.published_at <= after + 0.001


async def test_decoding_into_the_wrong_contract_is_a_bad_message(bus: Bus) -> None:
    queue = await declared(bus)
    received: asyncio.Queue[Delivery] = asyncio.Queue()
    await bus.publish(queue=queue, body=Ping(n=1))
    await bus.consume(queue=queue, handler=received.put)
    delivery = await asyncio.wait_for(received.get(), WAIT)
    with pytest.raises(BadMessage, match="does not match the contract"):
        delivery.decode(Other)


async def test_message_unfinished_when_its_consumer_stops_is_redelivered(broker: Broker) -> None:
    first_bus, second_bus = await broker.connect(), await broker.connect()
    queue = await declared(first_bus)
    started = asyncio.Event()

    async def stuck(delivery: Delivery) -> None:
        started.set()
        await asyncio.Event().wait()

    subscription = await first_bus.consume(queue=queue, handler=stuck)
    await first_bus.publish(queue=queue, body=Ping(n=1))
    await asyncio.wait_for(started.wait(), WAIT)
    await subscription.close()

    received: asyncio.Queue[Delivery] = asyncio.Queue()
    await second_bus.consume(queue=queue, handler=received.put)
    delivery = await asyncio.wait_for(received.get(), WAIT)
    assert delivery.decode(Ping) == Ping(n=1)
    assert delivery.redelivered is True


async def test_draining_close_lets_the_running_handler_finish_and_ack(bus: Bus) -> None:
    queue = fresh_queue()
    started, release, done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow(delivery: Delivery) -> None:
        started.set()
        await release.wait()
        done.set()

    subscription = await bus.consume(queue=queue, handler=slow)
    await bus.publish(queue=queue, body=Ping(n=1))
    await asyncio.wait_for(started.wait(), WAIT)
    closing = asyncio.create_task(subscription.close(drain_seconds=WAIT))
    release.set()
    await asyncio.wait_for(closing, WAIT)
    assert done.is_set()

    # Acked: a new consumer gets the next message, not the drained one again.
    received: asyncio.Queue[Delivery] = asyncio.Queue()
    await bus.consume(queue=queue, handler=received.put)
    await bus.publish(queue=queue, body=Ping(n=2))
    assert (await asyncio.wait_for(received.get(), WAIT)).decode(Ping) == Ping(n=2)
    assert received.empty()


async def test_failing_handler_gets_its_message_once_more_then_it_is_dropped(bus: Bus) -> None:
    queue = await declared(bus)
    seen: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()

    async def fails_on_one(delivery: Delivery) -> None:
        ping = delivery.decode(Ping)
        await seen.put((ping.n, delivery.redelivered))
        if ping.n == 1:
            raise RuntimeError("boom")

    await bus.consume(queue=queue, handler=fails_on_one)
    await bus.publish(queue=queue, body=Ping(n=1))
    assert await asyncio.wait_for(seen.get(), WAIT) == (1, False)
    assert await asyncio.wait_for(seen.get(), WAIT) == (1, True)
    await bus.publish(queue=queue, body=Ping(n=2))
    assert await asyncio.wait_for(seen.get(), WAIT) == (2, False)
    assert seen.empty()


async def test_a_transient_bus_error_requeues_the_message_even_after_redelivery(bus: Bus) -> None:
    queue = await declared(bus)
    seen: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()
    handled = asyncio.Event()

    async def reply_fails_twice(delivery: Delivery) -> None:
        await seen.put((delivery.decode(Ping).n, delivery.redelivered))
        if seen.qsize() <= 2:  # e.g. the reply could not be published while the broker was away
            raise BusUnavailable("could not publish the reply")
        handled.set()

    await bus.consume(queue=queue, handler=reply_fails_twice)
    await bus.publish(queue=queue, body=Ping(n=1))
    await asyncio.wait_for(handled.wait(), WAIT)
    assert [seen.get_nowait() for _ in range(3)] == [(1, False), (1, True), (1, True)]


async def test_a_bad_message_is_dropped_at_once(bus: Bus) -> None:
    queue = await declared(bus)
    seen: asyncio.Queue[tuple[int, bool]] = asyncio.Queue()

    async def unreadable_one(delivery: Delivery) -> None:
        ping = delivery.decode(Ping)
        await seen.put((ping.n, delivery.redelivered))
        if ping.n == 1:
            delivery.decode(Other)  # raises BadMessage

    await bus.consume(queue=queue, handler=unreadable_one)
    await bus.publish(queue=queue, body=Ping(n=1))
    assert await asyncio.wait_for(seen.get(), WAIT) == (1, False)
    await bus.publish(queue=queue, body=Ping(n=2))
    assert await asyncio.wait_for(seen.get(), WAIT) == (2, False)
    assert seen.empty()


async def test_prefetch_bounds_how_many_handlers_run_at_once(bus: Bus) -> None:
    queue = await declared(bus)
    running = 0
    peak = 0
    finished: asyncio.Queue[int] = asyncio.Queue()
    gate, two_running = asyncio.Event(), asyncio.Event()

    async def handler(delivery: Delivery) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            two_running.set()
        await gate.wait()
        running -= 1
        await finished.put(delivery.decode(Ping).n)

    for n in range(5):
        await bus.publish(queue=queue, body=Ping(n=n))
    await bus.consume(queue=queue, handler=handler, prefetch=2)
    await asyncio.wait_for(two_running.wait(), WAIT)
    await asyncio.sleep(0.2)  # room for a third handler to start if prefetch were not enforced
    assert running == 2
    gate.set()
    got = sorted([await asyncio.wait_for(finished.get(), WAIT) for _ in range(5)])
    assert got == [0, 1, 2, 3, 4]
    assert peak == 2


async def test_request_gets_the_reply_with_its_correlation_id(broker: Broker) -> None:
    server, client = await broker.connect("service.server"), await broker.connect("service.client")
    queue, replies = fresh_queue(), fresh_queue()

    async def double(delivery: Delivery) -> None:
        assert delivery.user_id == "service.client"
        await server.reply(to=delivery, body=Ping(n=delivery.decode(Ping).n * 2))

    await server.consume(queue=queue, handler=double)
    reply = await client.request(
        queue=queue, body=Ping(n=21), reply_queue=replies, correlation_id="call-1", timeout_seconds=WAIT,
        responder=principal(server),
    )
    assert reply.decode(Ping) == Ping(n=42)
    assert reply.correlation_id == "call-1"
    assert reply.queue == replies.name
    assert reply.user_id == "service.server"


async def test_concurrent_requests_each_get_their_own_reply(broker: Broker) -> None:
    server, client = await broker.connect("service.server"), await broker.connect("service.client")
    queue, replies = fresh_queue(), fresh_queue()
    arrived: list[Delivery] = []
    all_arrived = asyncio.Event()

    async def collect(delivery: Delivery) -> None:
        arrived.append(delivery)
        if len(arrived) == 3:
            all_arrived.set()
        await all_arrived.wait()
        # Answer in reverse order of arrival: routing must follow correlation ids, not order.
        await asyncio.sleep(0.05 * (3 - arrived.index(delivery)))
        await server.reply(to=delivery, body=Ping(n=-delivery.decode(Ping).n))

    await server.consume(queue=queue, handler=collect, prefetch=3)
    results = await asyncio.gather(*(
        client.request(queue=queue, body=Ping(n=n), reply_queue=replies, correlation_id=f"c{n}", timeout_seconds=WAIT,
                       responder=principal(server))
        for n in (1, 2, 3)
    ))
    assert [(r.correlation_id, r.decode(Ping).n) for r in results] == [("c1", -1), ("c2", -2), ("c3", -3)]


async def test_request_without_a_responder_times_out_and_expires_undelivered(broker: Broker) -> None:
    server, client = await broker.connect("service.server"), await broker.connect("service.client")
    queue, replies = await declared(server), fresh_queue()
    with pytest.raises(RequestTimeout, match="no reply to 'late'"):
        await client.request(
            queue=queue, body=Ping(n=1), reply_queue=replies, correlation_id="late", timeout_seconds=0.3,
            responder=principal(server),
        )
    # The message's time to live started when the broker confirmed it, within those 0.3 s: by this
    # bound, not by luck, it has expired 0.3 s later.
    await asyncio.sleep(0.3)

    delivered: list[str | None] = []

    async def echo(delivery: Delivery) -> None:
        delivered.append(delivery.correlation_id)
        await server.reply(to=delivery, body=delivery.decode(Ping))

    await server.consume(queue=queue, handler=echo)
    reply = await client.request(
        queue=queue, body=Ping(n=2), reply_queue=replies, correlation_id="fresh", timeout_seconds=WAIT,
        responder=principal(server),
    )
    assert (reply.correlation_id, reply.decode(Ping).n) == ("fresh", 2)
    assert delivered == ["fresh"]  # the stale request expired with its wait: nobody ran it


async def test_a_request_handed_over_is_held_by_the_broker_and_handled_after_its_wait_ended(broker: Broker) -> None:
    """`hand_over` returns once the broker confirmed the request, which never expires: its sender acted on it."""
    server, client = await broker.connect("service.server"), await broker.connect("service.client")
    queue, replies = await declared(server), fresh_queue()
    waiting = await client.hand_over(queue=queue, body=Ping(n=1), reply_queue=replies, correlation_id="held",
                                     timeout_seconds=0.3, responder=principal(server))  # fmt: skip
    with pytest.raises(RequestTimeout, match="no reply to 'held'"):
        await waiting
    await asyncio.sleep(0.3)  # a request of `request` would have expired by now
    delivered: asyncio.Queue[str | None] = asyncio.Queue()

    async def echo(delivery: Delivery) -> None:
        await delivered.put(delivery.correlation_id)
        await server.reply(to=delivery, body=delivery.decode(Ping))

    await server.consume(queue=queue, handler=echo)
    assert await asyncio.wait_for(delivered.get(), WAIT) == "held"
    waiting = await client.hand_over(queue=queue, body=Ping(n=2), reply_queue=replies, correlation_id="answered",
                                     timeout_seconds=WAIT, responder=principal(server))  # fmt: skip
    assert (await waiting).decode(Ping) == Ping(n=2)


async def test_two_requests_cannot_wait_on_one_correlation_id(bus: Bus) -> None:
    queue, replies = fresh_queue(), fresh_queue()
    me = principal(bus)
    published = asyncio.Event()

    async def take_without_replying(delivery: Delivery) -> None:
        published.set()

    await bus.consume(queue=queue, handler=take_without_replying)
    first = asyncio.create_task(
        bus.request(queue=queue, body=Ping(n=1), reply_queue=replies, correlation_id="same", timeout_seconds=WAIT,
                    responder=me)
    )
    await asyncio.wait_for(published.wait(), WAIT)  # a request waits for its reply before it is published
    with pytest.raises(BusError, match="already waiting"):
        await bus.request(queue=queue, body=Ping(n=2), reply_queue=replies, correlation_id="same", timeout_seconds=WAIT,
                          responder=me)
    first.cancel()


async def test_reply_to_a_queue_that_does_not_exist_is_no_route(bus: Bus) -> None:
    queue = await declared(bus)
    received: asyncio.Queue[Delivery] = asyncio.Queue()
    await bus.publish(queue=queue, body=Ping(n=1), reply_to=f"test.gone.{uuid.uuid4().hex}", correlation_id="x")
    await bus.consume(queue=queue, handler=received.put)
    delivery = await asyncio.wait_for(received.get(), WAIT)
    with pytest.raises(NoRoute, match=r"no queue named 'test\.gone"):
        await bus.reply(to=delivery, body=Ping(n=2))


async def test_declaring_a_queue_with_other_arguments_is_refused(bus: Bus) -> None:
    queue = await declared(bus, **{"x-expires": 60_000})
    await bus.publish(queue=queue, body=Ping(n=1))
    with pytest.raises(BusError):
        await bus.declare(Queue(name=queue.name, arguments={"x-expires": 120_000}))
    # The refusal does not break the bus.
    received: asyncio.Queue[Delivery] = asyncio.Queue()
    await bus.consume(queue=queue, handler=received.put)
    await bus.publish(queue=queue, body=Ping(n=3))
    assert [(await asyncio.wait_for(received.get(), WAIT)).decode(Ping).n for _ in range(2)] == [1, 3]


# ---- identity: who sent it, who may do what, whose reply counts


async def test_a_principal_may_publish_only_where_its_permissions_say(broker: Broker) -> None:
    owner = await broker.connect("service.owner")
    queue = await declared(owner)
    narrow = Permissions(write=r"^rockbot$", topic_write=r"^test\.elsewhere$")
    outsider = await broker.connect("service.outsider", narrow)
    with pytest.raises(AccessRefused, match="service\\.outsider"):
        await outsider.publish(queue=queue, body=Ping(n=1))
    # The refusal does not break the connection.
    with pytest.raises(NoRoute):
        await outsider.publish(queue=Queue(name="test.elsewhere"), body=Ping(n=2))


async def test_a_principal_cannot_read_or_declare_a_queue_it_does_not_own(broker: Broker) -> None:
    owner = await broker.connect("service.owner")
    queue = await declared(owner)
    await owner.publish(queue=queue, body=Ping(n=1))
    mine = r"^(rockbot|test\.mine\..+)$"
    outsider = await broker.connect("service.outsider", Permissions(configure=mine, write=mine, read=mine))
    with pytest.raises(AccessRefused):
        await outsider.consume(queue=queue, handler=_never)
    with pytest.raises(AccessRefused):
        await outsider.declare(fresh_queue())


async def test_a_requester_takes_the_reply_only_from_the_principal_it_asked(broker: Broker) -> None:
    server, client = await broker.connect("service.server"), await broker.connect("service.client")
    intruder = await broker.connect("service.intruder")
    queue, replies = await declared(server), fresh_queue()
    asked, release = asyncio.Event(), asyncio.Event()

    async def slow_double(delivery: Delivery) -> None:
        asked.set()
        await release.wait()
        await server.reply(to=delivery, body=Ping(n=delivery.decode(Ping).n * 2))

    await server.consume(queue=queue, handler=slow_double)
    call = asyncio.create_task(client.request(
        queue=queue, body=Ping(n=21), reply_queue=replies, correlation_id="call-1", timeout_seconds=WAIT,
        responder=principal(server),
    ))  # fmt: skip
    await asyncio.wait_for(asked.wait(), WAIT)
    # The intruder knows the reply queue and the correlation id, and answers first.
    await intruder.publish(queue=replies, body=Ping(n=666), correlation_id="call-1")
    await asyncio.sleep(0.1)  # room for the forged reply to be (wrongly) taken
    assert not call.done()
    release.set()
    reply = await asyncio.wait_for(call, WAIT)
    assert (reply.user_id, reply.decode(Ping).n) == ("service.server", 42)


async def test_a_message_over_the_size_limit_is_refused_before_it_is_sent(bus: Bus) -> None:
    queue = await declared(bus)
    with pytest.raises(TooLarge, match=r"over the bus's limit"):
        await bus.publish(queue=queue, body=Other(text="x" * bus.max_message_bytes))


# ---- dead letters: work queues never loop a message forever


async def test_a_refused_message_is_dead_lettered_not_requeued(broker: Broker) -> None:
    owner = await broker.connect("service.owner")
    queue = await provisioned(broker)
    seen: list[int] = []

    async def refuse_one(delivery: Delivery) -> None:
        ping = delivery.decode(Ping)
        seen.append(ping.n)
        if ping.n == 1:
            raise Refused("not from whom it should be")

    await owner.consume(queue=queue, handler=refuse_one)
    await owner.publish(queue=queue, body=Ping(n=1), message_id="poison")
    await owner.publish(queue=queue, body=Ping(n=2))
    letters = await eventually(lambda: _dead_letters(broker, count=1))
    assert [(d.queue, d.reason, d.message_id, d.user_id) for d in letters] == [
        (queue.name, "rejected", "poison", "service.owner")]
    assert sorted(seen) == [1, 2]


async def test_a_work_queue_gives_up_on_a_message_after_its_delivery_limit(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(interface, "TRANSIENT_PAUSE_SECONDS", 0.0)
    owner = await broker.connect("service.owner")
    queue = await provisioned(broker)
    deliveries = 0

    async def always_transient(delivery: Delivery) -> None:
        nonlocal deliveries
        deliveries += 1
        raise BusUnavailable("the reply never gets out")

    await owner.consume(queue=queue, handler=always_transient)
    await owner.publish(queue=queue, body=Ping(n=1), message_id="stuck")
    letters = await eventually(lambda: _dead_letters(broker, count=1))
    assert [(d.reason, d.message_id) for d in letters] == [("delivery_limit", "stuck")]
    assert deliveries == DELIVERY_LIMIT + 1


async def provisioned(broker: Broker) -> Queue:
    """A work queue as the operator declares it (quorum, delivery limit, dead-letter exchange)."""
    queue = work_queue(f"test.work.{uuid.uuid4().hex}")
    await broker.admin.ensure_queue(queue)
    return queue


async def _dead_letters(broker: Broker, *, count: int) -> list[DeadLetter]:
    letters = await broker.admin.dead_letters()
    assert len(letters) >= count
    return letters


async def _never(delivery: Delivery) -> None:
    raise AssertionError("no message should reach this handler")
