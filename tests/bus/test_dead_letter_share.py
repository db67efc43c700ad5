"""Issue 18 P5 on the real broker: one sender's refused messages cannot push its earlier dead letters out."""

from __future__ import annotations

from pydantic import BaseModel

from rockbot.bus import AmqpBus, Delivery, Refused
from rockbot.bus.interface import DEAD_LETTERS_PER_SENDER_MINUTE
from rockbot.bus.topology import work_queue
from tests.bus.conftest import TEST_PERMISSIONS
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually


class Note(BaseModel):
    n: int


async def test_a_sender_gets_a_share_of_the_dead_letters_and_its_first_ones_are_kept(vhost: Vhost) -> None:
    queue = work_queue("test.work.refusing")
    await vhost.admin.ensure_queue(queue)
    handled: list[int] = []

    async def refuse(delivery: Delivery) -> None:
        handled.append(delivery.decode(Note).n)
        raise Refused("this consumer refuses everything")

    flood = DEAD_LETTERS_PER_SENDER_MINUTE + 50
    consumer_url = await vhost.login("service.consumer", TEST_PERMISSIONS)
    sender_url = await vhost.login("service.flooder", TEST_PERMISSIONS)
    async with await AmqpBus.connect(url=consumer_url) as consumer, await AmqpBus.connect(url=sender_url) as sender:
        await consumer.consume(queue=queue, handler=refuse, prefetch=16)
        for n in range(flood):
            await sender.publish(queue=queue, body=Note(n=n), message_id=f"note-{n}")

        async def all_handled() -> None:
            assert len(handled) == flood, f"{len(handled)} of {flood} handled"
            assert vhost.queues()[queue.name] == (0, 0)

        await eventually(all_handled, within=60)
    letters = await vhost.admin.dead_letters(count=flood)
    kept = sorted(int((letter.message_id or "note-x").split("-")[1]) for letter in letters
                  if letter.user_id == "service.flooder")
    assert len(kept) == DEAD_LETTERS_PER_SENDER_MINUTE  # the rest of the minute's were dropped, not dead-lettered
    assert kept[0] == 0  # its first one is on record
