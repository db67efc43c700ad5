"""What provisioning a principal costs on the real broker's management API, counted as the broker receives it."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import aio_pika
import aiohttp
import pytest
from aiohttp import web

from rockbot.bus import OPERATOR, Principal
from rockbot.bus.admin import AGENT_TAG, agent_queues, ensure_principal
from rockbot.bus.management import RabbitAdmin
from rockbot.bus.permissions import limits_for, permissions_for
from tests.fixtures.rabbitmq import Vhost, password_of


@contextlib.asynccontextmanager
async def counted(vhost: Vhost) -> AsyncIterator[tuple[RabbitAdmin, list[str]]]:
    """An admin whose management calls pass through a relay that notes each as `METHOD path`."""
    calls: list[str] = []
    upstream = vhost.broker.management_url.rstrip("/")

    async with aiohttp.ClientSession() as session:
        async def relay(request: web.Request) -> web.Response:
            calls.append(f"{request.method} {request.raw_path.removeprefix('/api/')}")
            async with session.request(request.method, upstream + request.raw_path, data=await request.read(),
                                       headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
                                       ) as answer:  # fmt: skip
                return web.Response(status=answer.status, body=await answer.read(),
                                    content_type=answer.content_type if answer.status != 204 else None)

        app = web.Application()
        app.router.add_route("*", "/{path:.*}", relay)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with RabbitAdmin(url=f"http://127.0.0.1:{port}/", username="guest", password="guest",
                                   vhost=vhost.name) as admin:  # fmt: skip
                yield admin, calls
        finally:
            await runner.cleanup()


async def test_a_new_agent_is_written_without_reading_back_and_a_settled_one_only_reads(vhost: Vhost) -> None:
    agent = Principal.agent(namespace="team-a", name=f"new-{uuid.uuid4().hex[:8]}")  # a user no vhost has yet
    password = password_of(agent.user)
    async with counted(vhost) as (admin, calls):
        assert await ensure_principal(admin, agent, password=password, called_by=[OPERATOR], replicas=1)
        queues = agent_queues(agent, replicas=1)
        made = [f"PUT users/{agent.user}"] + [f"PUT queues/{vhost.admin._vhost}/{queue.name}" for queue in queues]
        settings = [f"POST bindings/{vhost.admin._vhost}/e/rockbot/q/{queue.name}" for queue in queues] + [
            f"PUT permissions/{vhost.admin._vhost}/{agent.user}",
            f"PUT topic-permissions/{vhost.admin._vhost}/{agent.user}",
            f"PUT user-limits/{agent.user}/max-connections", f"PUT user-limits/{agent.user}/max-channels"]
        # Nothing read back but whether the user exists; the queues before their bindings, the password last.
        assert calls[0] == f"GET users/{agent.user}" and calls[1] == made[0] and sorted(calls[2:6]) == sorted(made[1:])
        assert sorted(calls[6:14]) == sorted(settings) and calls[14:] == [f"PUT users/{agent.user}"]

        calls.clear()
        assert not await ensure_principal(admin, agent, password=password, called_by=[OPERATOR], replicas=1)
        assert {call.split()[0] for call in calls} == {"GET"}

    wanted = permissions_for(agent, called_by=[OPERATOR])
    shown = await vhost.admin._get(f"permissions/{vhost.admin._vhost}/{agent.user}")
    assert (shown["configure"], shown["write"], shown["read"]) == (wanted.configure, wanted.write, wanted.read)
    [topic] = await vhost.admin._get(f"topic-permissions/{vhost.admin._vhost}/{agent.user}")
    assert (topic["write"], topic["read"]) == (wanted.topic_write, wanted.topic_read)
    limits = limits_for(agent, replicas=1)
    [shown_limits] = await vhost.admin._get(f"user-limits/{agent.user}")
    assert shown_limits["value"] == {"max-connections": limits.max_connections, "max-channels": limits.max_channels}
    assert (await vhost.admin._get(f"users/{agent.user}"))["tags"] == [AGENT_TAG]
    for queue in agent_queues(agent, replicas=1):
        assert (await vhost.admin._get(f"queues/{vhost.admin._vhost}/{queue.name}"))["arguments"] == queue.arguments
        bindings = await vhost.admin._get(f"bindings/{vhost.admin._vhost}/e/rockbot/q/{queue.name}")
        assert [binding["routing_key"] for binding in bindings] == [queue.name]
    connection = await aio_pika.connect(vhost.broker.vhost_url(vhost.name, user=agent.user, password=password))
    await connection.close()


async def test_a_user_made_at_once_cannot_log_in_before_its_password_is_set(vhost: Vhost) -> None:
    agent = Principal.agent(namespace="team-a", name=f"early-{uuid.uuid4().hex[:8]}")
    assert await vhost.admin.create_user(user=agent.user, tags=(AGENT_TAG,), permissions=permissions_for(agent),
                                         limits=limits_for(agent), queues=agent_queues(agent, replicas=1))  # fmt: skip
    assert not await vhost.admin.create_user(user=agent.user, tags=(AGENT_TAG,), permissions=permissions_for(agent),
                                             limits=limits_for(agent), queues=[])  # fmt: skip
    url = vhost.broker.vhost_url(vhost.name, user=agent.user, password=password_of(agent.user))
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        await aio_pika.connect(url)
    assert await vhost.admin.ensure_user(user=agent.user, password=password_of(agent.user), tags=(AGENT_TAG,))
    connection = await aio_pika.connect(url)
    await connection.close()
