"""Issue 18 P4 on the real broker: one principal's login cannot take all of the broker's connections."""

from __future__ import annotations

import contextlib

import aio_pika
import pytest

from rockbot.bus import GATEWAY, Principal
from rockbot.bus.admin import ensure_principal
from rockbot.bus.permissions import CHANNELS_PER_CONNECTION, SERVICE_CONNECTIONS
from tests.fixtures.rabbitmq import Vhost, password_of

AGENT = Principal.agent(namespace="team-a", name="greedy")


async def test_an_agents_login_opens_as_many_connections_as_its_processes_may_have_and_no_more(vhost: Vhost) -> None:
    url = await vhost.url(AGENT)  # provisioned for one replica: 2 x 1 + 1 processes (a rolling update)
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(3):
            stack.push_async_callback((await aio_pika.connect(url)).close)
        with pytest.raises(Exception, match=r"got <Connection.Close"):
            extra = await aio_pika.connect(url)
            stack.push_async_callback(extra.close)
    limits = await vhost.admin._get(f"user-limits/{AGENT.user}")
    assert [item["value"] for item in limits] == [{"max-connections": 3, "max-channels": 3 * CHANNELS_PER_CONNECTION}]


async def test_every_principal_gets_limits_and_a_settled_one_costs_no_write(vhost: Vhost) -> None:
    await vhost.url(GATEWAY)
    assert not await ensure_principal(vhost.admin, GATEWAY, password=password_of(GATEWAY.user))
    await ensure_principal(vhost.admin, AGENT, password=password_of(AGENT.user), replicas=1)
    assert not await ensure_principal(vhost.admin, AGENT, password=password_of(AGENT.user), replicas=1)
    assert await ensure_principal(vhost.admin, AGENT, password=password_of(AGENT.user), replicas=4)  # scaled up
    agent_limits = (await vhost.admin._get(f"user-limits/{AGENT.user}"))[0]["value"]
    service_limits = (await vhost.admin._get(f"user-limits/{GATEWAY.user}"))[0]["value"]
    assert agent_limits == {"max-connections": 9, "max-channels": 9 * CHANNELS_PER_CONNECTION}
    assert service_limits == {"max-connections": SERVICE_CONNECTIONS,
                              "max-channels": SERVICE_CONNECTIONS * CHANNELS_PER_CONNECTION}
