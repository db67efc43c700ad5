"""Issue 31 §4 and §5 on the real broker (Debian's RabbitMQ 3.10, which does not check `CC` against topic
permissions): a principal's dead-letter record holds its own dead letters only, and says truly where and why each
died, whatever headers a sender sets."""

from __future__ import annotations

import datetime
from urllib.parse import quote

import aio_pika
from pydantic import BaseModel

from rockbot.bus import OPERATOR, AmqpBus, Delivery, Principal, Refused
from rockbot.bus.admin import SENDER_HEADER
from rockbot.bus.amqp import user_of
from rockbot.bus.deadletters import DeadLetterKeeper
from rockbot.bus.topology import CONSOLE_RUNS, DEAD_LETTERS_PER_PRINCIPAL, EXCHANGE, dead_letter_record, work_queue
from tests.bus.conftest import TEST_PERMISSIONS
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

FORGER = Principal.agent(namespace="team-a", name="forger")
REFUSING = work_queue("test.work.refusing")


class Note(BaseModel):
    n: int


async def publish_raw(url: str, *, routing_key: str, message_id: str, headers: dict[str, object]) -> None:
    """A message as a hostile client sends it: any headers it likes, its own login as `user_id` (the broker checks)."""
    async with await aio_pika.connect(url) as connection:
        channel = await connection.channel()
        exchange = await channel.get_exchange(EXCHANGE, ensure=False)
        await exchange.publish(aio_pika.Message(
            Note(n=0).model_dump_json().encode(), content_type="application/json", type="Note", headers=headers,
            message_id=message_id, user_id=user_of(url),
        ), routing_key=routing_key)  # fmt: skip


async def refusing_consumer(vhost: Vhost) -> AmqpBus:
    await vhost.admin.ensure_queue(REFUSING)

    async def refuse(delivery: Delivery) -> None:
        raise Refused("this consumer refuses everything")

    consumer = await AmqpBus.connect(url=await vhost.login("service.consumer", TEST_PERMISSIONS))
    await consumer.consume(queue=REFUSING, handler=refuse, prefetch=16)
    return consumer


async def test_no_copy_of_a_message_lands_in_another_principals_dead_letter_record(vhost: Vhost) -> None:
    """An agent CCs a full record's worth of messages it may send (to `console.runs`) to the victim's record, with the
    operator's sender header set to the victim, also after an older rockbot bound the records to `rockbot`: the
    record keeps the victim's own dead letters only, and its next real one is filed."""
    victim_url = await vhost.login("service.victim", TEST_PERMISSIONS)
    record = dead_letter_record("service.victim")
    keeper = DeadLetterKeeper(url=await vhost.url(OPERATOR), user=OPERATOR.user, admin=vhost.admin)
    await keeper.start()
    consumer = await refusing_consumer(vhost)
    try:
        async with await AmqpBus.connect(url=victim_url) as victim:
            await victim.publish(queue=REFUSING, body=Note(n=1), message_id="victims-first")
            await eventually(lambda: _filed(keeper, 1))
            path = f"bindings/{quote(vhost.name, safe='')}/e/{EXCHANGE}/q/{quote(record.name, safe='')}"
            await vhost.admin._call("POST", path, {"routing_key": record.name})  # as an older rockbot bound it
            await vhost.admin.ensure_topology()  # the operator's start-up after the upgrade
            forger = await vhost.url(FORGER)
            for n in range(DEAD_LETTERS_PER_PRINCIPAL):
                await publish_raw(forger, routing_key=CONSOLE_RUNS.name, message_id=f"forged-{n}",
                                  headers={"CC": [record.name], SENDER_HEADER: "service.victim"})
            await victim.publish(queue=REFUSING, body=Note(n=2), message_id="victims-second")
            await eventually(lambda: _filed(keeper, 2))
    finally:
        await consumer.close()
        await keeper.close()
    kept = await vhost.admin.dead_letters(sender="service.victim", count=DEAD_LETTERS_PER_PRINCIPAL + 1)
    assert [(letter.message_id, letter.user_id) for letter in kept] == [("victims-first", "service.victim"),
                                                                         ("victims-second", "service.victim")]
    assert vhost.queues()[record.name] == (2, 0)


async def test_a_dead_letter_record_says_where_and_why_the_broker_dead_lettered_it_not_the_sender(
        vhost: Vhost) -> None:
    """A sender sets `x-first-death-*` (which RabbitMQ keeps as they are) and `x-death` (which it adds to) to claim
    its message expired in another agent's inbox: its record and the shared queue say it was refused where it was."""
    flooder_url = await vhost.login("service.flooder", TEST_PERMISSIONS)
    elsewhere = {"queue": "agent.team-b.victim.inbox", "reason": "expired", "count": 1, "exchange": "forged",
                 "routing-keys": ["agent.team-b.victim.inbox"], "time": datetime.datetime.now(datetime.UTC)}
    here = {**elsewhere, "queue": REFUSING.name, "reason": "rejected", "count": 7}
    forgeries = {
        "first-death": {"x-first-death-queue": elsewhere["queue"], "x-first-death-reason": "expired",
                        "x-first-death-exchange": "forged"},
        "death-elsewhere": {"x-death": [elsewhere]},
        "death-here": {"x-death": [here]},
    }  # fmt: skip
    keeper = DeadLetterKeeper(url=await vhost.url(OPERATOR), user=OPERATOR.user, admin=vhost.admin)
    await keeper.start()
    consumer = await refusing_consumer(vhost)
    try:
        for message_id, headers in forgeries.items():
            await publish_raw(flooder_url, routing_key=REFUSING.name, message_id=message_id, headers=headers)
        await eventually(lambda: _filed(keeper, len(forgeries)))
    finally:
        await consumer.close()
        await keeper.close()
    for letters in (await vhost.admin.dead_letters(sender="service.flooder"), await vhost.admin.dead_letters()):
        assert sorted((letter.message_id, letter.queue, letter.reason) for letter in letters) == sorted(
            (message_id, REFUSING.name, "rejected") for message_id in forgeries)


async def _filed(keeper: DeadLetterKeeper, count: int) -> None:
    assert keeper.filed == count, keeper.filed
