"""Provisioning the bus: the exchange, the work queues and one broker user per principal.

Two implementations administer a broker the same way: `management.RabbitAdmin` (RabbitMQ's HTTP
management API, used by the operator and by `rockbot local --amqp-url`) and `memory.MemoryBroker`.
Each `ensure_*` compares before it writes and says whether it wrote, so a settled system costs
reads only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from rockbot.bus.identity import CONSOLE, Principal
from rockbot.bus.permissions import Limits, Permissions, limits_for, permissions_for
from rockbot.bus.topology import MAX_REPLY_SLOTS, Queue, agent_replies, inbox_of, reply_slots
from rockbot.contracts.agent_config import AgentBackend, AgentConfig

#: Enough replicas for every reply slot there may be (deleting an Agent's queues deletes them all).
MAX_REPLICAS = MAX_REPLY_SLOTS // 2
#: Broker user tags, so a sweep can find the users it manages.
AGENT_TAG = "rockbot-agent"
SERVICE_TAG = "rockbot-service"


#: The header naming a filed dead letter's sender (`deadletters.py`): set by the operator, never copied from a message.
SENDER_HEADER = "x-rockbot-sender"
#: Where and why a message died, as its filed copy says (the names RabbitMQ gives them; set by the operator).
QUEUE_HEADER = "x-first-death-queue"
REASON_HEADER = "x-first-death-reason"


def where_and_why(headers: dict[str, Any]) -> dict[str, str]:
    """Where and why the broker dead-lettered a message: the newest entry of its `x-death`, whose queue and reason the
    broker writes at every death. Not its `x-first-death-*` headers, which RabbitMQ leaves as they are when the sender
    set them already: a sender could make its record show a death anywhere, for any reason."""
    deaths = headers.get("x-death")
    newest = deaths[0] if isinstance(deaths, list) and deaths and isinstance(deaths[0], dict) else {}
    return {header: _text(newest[key]) for header, key in ((QUEUE_HEADER, "queue"), (REASON_HEADER, "reason"))
            if key in newest}  # fmt: skip


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class DeadLetter(BaseModel):
    """A message a work queue gave up on, as found in `rockbot.dead-letters`."""

    model_config = ConfigDict(frozen=True)

    queue: str  # where it was first refused
    reason: str  # rejected (refused or unreadable), delivery_limit, expired, maxlen
    user_id: str | None
    message_id: str | None
    message_type: str | None
    body: bytes


class BrokerAdmin(Protocol):
    async def ensure_topology(self) -> None:
        """The exchange `rockbot`, the dead-letter exchange and queue, and the fixed work queues."""

    async def ensure_queue(self, queue: Queue) -> bool:
        """Declare a provisioned queue and bind it to `rockbot` by its name; True if anything was written."""

    async def create_user(
        self, *, user: str, tags: Sequence[str], permissions: Permissions, limits: Limits, queues: Sequence[Queue]
    ) -> bool:
        """Make a user that does not exist yet, unable to log in, with its permissions, limits and queues (declared
        and bound as `ensure_queue` does); False, and nothing written, if the user exists."""

    async def ensure_user(self, *, user: str, password: str, tags: Sequence[str] = ()) -> bool:
        """The user with this password and tags; True if anything was written."""

    async def ensure_permissions(self, *, user: str, permissions: Permissions) -> bool:
        """The user's permissions in this virtual host, topic ones on `rockbot` included; True if written."""

    async def ensure_limits(self, *, user: str, limits: Limits) -> bool:
        """The user's connection and channel limits (over all its connections); True if written."""

    async def delete_user(self, user: str) -> bool:
        """Remove the user's access (the user itself when this virtual host was its only one); True if it existed."""

    async def delete_queue(self, queue: Queue) -> bool:
        """Delete a provisioned queue and what it holds; True if it existed."""

    async def users(self, *, tag: str) -> set[str]:
        """The users tagged `tag` that have permissions in this virtual host."""

    async def dead_letters(self, *, count: int = 100, sender: str | None = None) -> list[DeadLetter]:
        """The oldest `count` dead letters, left in their queue: of everyone (`rockbot.dead-letters`, the newest
        10 000), or the record of one `sender` (its first ones, see `deadletters.py`)."""


async def ensure_principal(
    admin: BrokerAdmin,
    principal: Principal,
    *,
    password: str,
    calls: Iterable[Principal] = (),
    called_by: Iterable[Principal] = (),
    replicas: int = 1,
) -> bool:
    """The principal's user with the permissions `permissions_for` derives, and an agent's queues; True if written.

    An agent's queues are its inbox and the reply slots its `replicas` need (`topology.reply_slots`), all
    declared here with fixed arguments, since agents declare nothing. The login works only once
    everything else is in place (a user that cannot log in yet, the queues, its permissions, then its
    password), so a process that logs in as soon as it can finds all it needs. A new principal's user is
    made with all but its password at once (`create_user`: nothing to read, and what does not depend on
    each other written at once), an existing one's settings are compared one by one.
    """
    tag = AGENT_TAG if principal.kind == "agent" else SERVICE_TAG
    permissions = permissions_for(principal, calls=calls, called_by=called_by)
    limits = limits_for(principal, replicas=replicas)
    queues = agent_queues(principal, replicas=replicas) if principal.kind == "agent" else []
    wrote = await admin.create_user(user=principal.user, tags=(tag,), permissions=permissions, limits=limits,
                                    queues=queues)  # fmt: skip
    if not wrote:
        for queue in queues:
            wrote = await admin.ensure_queue(queue) or wrote
        wrote = await admin.ensure_permissions(user=principal.user, permissions=permissions) or wrote
        wrote = await admin.ensure_limits(user=principal.user, limits=limits) or wrote
    return await admin.ensure_user(user=principal.user, password=password, tags=(tag,)) or wrote


async def forget_principal(admin: BrokerAdmin, principal: Principal) -> bool:
    """The principal's user gone, and an agent's inbox with it; True if anything existed."""
    existed = await admin.delete_user(principal.user)
    if principal.kind == "agent":
        for queue in agent_queues(principal, replicas=MAX_REPLICAS):
            existed = await admin.delete_queue(queue) or existed
    return existed


def agent_queues(principal: Principal, *, replicas: int) -> list[Queue]:
    """An agent's inbox and the reply slots of `replicas` processes."""
    namespace, name = principal.namespace, principal.name
    slots = [agent_replies(namespace=namespace, name=name, slot=n) for n in range(reply_slots(replicas))]
    return [inbox_of(principal), *slots]


def callees(config: AgentConfig) -> list[Principal]:
    """The agents an agent calls: its sub-agents and agent-backed Tools, from its resolved config."""
    return [
        Principal.agent(namespace=tool.backend.namespace, name=tool.backend.name)
        for tool in config.tools
        if isinstance(tool.backend, AgentBackend)
    ]


async def provision_agents(
    admin: BrokerAdmin,
    configs: Iterable[AgentConfig],
    *,
    scheduler: Principal,
    password: Callable[[Principal], str],
) -> None:
    """Users for a set of agents that know each other's resolved configs (`rockbot local`, tests) and their scheduler.

    Each agent may call what its config calls and answer its callers, `scheduler`, which may send work
    to every one of them, and the console (`service.console`: people's chats).
    """
    calls = {Principal.agent(namespace=config.namespace, name=config.name): callees(config) for config in configs}
    await ensure_principal(admin, scheduler, password=password(scheduler), calls=calls)
    await ensure_principal(admin, CONSOLE, password=password(CONSOLE))
    for me, called in calls.items():
        callers = [other for other, theirs in calls.items() if me in theirs]
        await ensure_principal(admin, me, password=password(me), calls=called,
                               called_by=[scheduler, CONSOLE, *callers])
