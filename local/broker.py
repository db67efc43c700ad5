"""Give every part of a local run its own principal on the bus, as the operator does in a cluster.

The in-memory bus is a `MemoryBroker` with one user per agent, the scripts-manager and
`service.local` (the scheduler): each part connects as itself and the same permissions hold as on
RabbitMQ. With `--amqp-url`, that URL must log in as a broker administrator: its management API
(`--management-url`, by default the AMQP host on port 15672) provisions the same users, each with a
password made up for this run, and every part connects with its own login.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Iterable

from yarl import URL

from rockbot.bus import LOCAL, SCRIPTS_MANAGER, AmqpBus, Bus, MemoryBroker, Principal
from rockbot.bus.admin import BrokerAdmin, ensure_principal, provision_agents
from rockbot.bus.management import RabbitAdmin
from rockbot.contracts.agent_config import AgentConfig

Connect = Callable[[Principal], Awaitable[Bus]]


async def provision(
    admin: BrokerAdmin, configs: Iterable[AgentConfig], *, scheduler: Principal, password: Callable[[Principal], str]
) -> None:
    """The topology, the scripts-manager, the agents and their scheduler (`service.local`)."""
    await admin.ensure_topology()
    await ensure_principal(admin, SCRIPTS_MANAGER, password=password(SCRIPTS_MANAGER))
    await provision_agents(admin, configs, scheduler=scheduler, password=password)


async def in_memory(configs: Iterable[AgentConfig], *, scheduler: Principal = LOCAL) -> Connect:
    broker = MemoryBroker()
    await provision(broker, configs, scheduler=scheduler, password=lambda _: "")

    async def connect(principal: Principal) -> Bus:
        return broker.connect(principal.user)

    return connect


async def on_rabbitmq(
    configs: Iterable[AgentConfig], *, amqp_url: str, management_url: str | None, scheduler: Principal = LOCAL
) -> Connect:
    passwords: dict[Principal, str] = {}

    def password(principal: Principal) -> str:
        return passwords.setdefault(principal, secrets.token_urlsafe(24))

    async with RabbitAdmin.for_amqp_url(amqp_url, management_url=management_url) as admin:
        await provision(admin, configs, scheduler=scheduler, password=password)

    async def connect(principal: Principal) -> Bus:
        login = URL(amqp_url).with_user(principal.user).with_password(passwords[principal])
        return await AmqpBus.connect(url=str(login))

    return connect
