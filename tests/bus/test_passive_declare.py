"""Issue 31 §5 on the real broker (Debian's RabbitMQ 3.10): what a passive queue declare tells an agent about another
namespace is what the security model (docs/concepts/security.md) says, queue names and depths, and nothing of the
messages."""

from __future__ import annotations

import re
from pathlib import Path

import aio_pika
import aiormq
import pytest

from rockbot.bus import OPERATOR, AmqpBus, Principal
from rockbot.bus.topology import inbox_of
from rockbot.contracts.inbox import InboxRequest
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

SECURITY_MODEL = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "security.md"
PROBER = Principal.agent(namespace="team-a", name="prober")
VICTIM = Principal.agent(namespace="team-b", name="victim")


async def test_a_passive_declare_tells_another_tenant_a_queues_depth_and_nothing_of_its_messages(
        vhost: Vhost) -> None:
    await vhost.url(VICTIM)  # its inbox, as the operator declares it
    inbox = inbox_of(VICTIM)
    async with await AmqpBus.connect(url=await vhost.url(OPERATOR)) as operator:
        for n in range(3):
            await operator.publish(queue=inbox, body=InboxRequest(kind="scheduled_task", request_id=f"r{n}",
                                                                  session_id="s", content="secret plans"))
    async with await aio_pika.connect(await vhost.url(PROBER)) as connection:

        async def depth() -> None:
            queue = await (await connection.channel()).declare_queue(inbox.name, passive=True)
            assert (queue.declaration_result.message_count, queue.declaration_result.consumer_count) == (3, 0)

        await eventually(depth)  # a quorum queue's count follows its log a moment later
        async def ignore(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            pass

        for refused in (lambda q: q.get(no_ack=True), lambda q: q.consume(ignore),
                        lambda q: q.bind("rockbot", routing_key=inbox.name), lambda q: q.purge()):
            channel = await connection.channel()  # each refusal closes its channel
            with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
                await refused(await channel.declare_queue(inbox.name, passive=True))
        await depth()  # nothing taken
    model = SECURITY_MODEL.read_text()
    said = re.search(r"\*\*What any broker login can learn: queue names and depths\.\*\*(.+?)\n\n", model, re.S)
    assert said is not None and "before 4.2.6" in said.group(1) and "how deep its inbox is" in said.group(1)
