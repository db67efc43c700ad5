"""What each principal may do on the bus: one pure function, enforced by RabbitMQ and by the memory bus alike.

RabbitMQ checks, per virtual host and user, three regular expressions over resource names
(`configure`: declare or delete a queue; `write`: publish to an exchange, bind a queue; `read`:
consume from a queue, bind from an exchange) and, for the topic exchange `rockbot`, two over routing
keys (`topic_write`: the routing key of a publish; `topic_read`: the binding key of a bind). Since
every message is routed by its queue's name, `topic_write` is exactly "which queues may this
principal put messages on", and `topic_read` "which queue names may it bind", so nobody can bind a
queue of its own to another's name (or to `#`) and listen in.

For an agent X in namespace N (see `topology` for the names):
- it declares and binds nothing, no queue and no exchange (so it chooses no queue arguments: no
  dead-letter relay, TTL or alternate exchange), and reads only its inbox and its reply slots
  (`agent.N.X.replies.<n>`), which the operator declares with fixed arguments;
- it publishes to `script.invoke`, `operator.scheduling`, `operator.usage`, `console.runs`, `console.history`,
  `console.approvals`, `console.memory`, `console.files`,
  the inboxes of the agents it `calls`
  (its sub-agents and agent-backed Tools) and the reply queues of the principals it is `called_by`
  (the agents that call it, the operator's or `rockbot local`'s scheduler), and nowhere else.
Only `service.scripts-manager` reads `script.invoke`; it alone writes to `console.file-reads` (the files a script
request names) and `console.file-writes` (a call's artifacts too large for its answer) and reads the console's
answers on reply queues it declares (`service.scripts-manager.replies.<inst>`); only the operator reads its three
queues and `rockbot.dead-letters.intake`, and only it files dead letters into the principals' records
(`rockbot.dead-letters.<principal>`, through the exchange `rockbot.dead-letters.records`, which nobody else may
write to), which nobody consumes (people read them as the broker's administrator). The
gateway (`service.gateway`) may put Trigger runs on any agent's inbox, like the operator's scheduled
runs, and reads only `gateway.runs`, where agents answer them: it already reads the Secrets of the
namespaces it serves (webhook keys), agents' bus logins among them, so narrowing its inboxes further
would protect nothing. Only the console (`service.console`) reads `console.runs`, `console.history`,
`console.approvals`, `console.memory`, `console.files`, `console.file-reads` and `console.file-writes`, and it
answers history, memory and file requests (file reads and writes on the scripts-manager's reply queues) and
approvals on agents' reply queues (it checks each is the asking agent's own). It also puts people's chat turns on
any agent's inbox (a `user_message` that names the person, which agents take only from the console) and reads the
progress and answers on reply queues of its own (`service.console.replies.<instance>`), which every agent may write
to (the console takes a message there only from the agent it asked).
Every expression is anchored, so none matches more than the names it spells out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict

from rockbot.bus import topology
from rockbot.bus.identity import CONSOLE, GATEWAY, OPERATOR, SCRIPTS_MANAGER, Principal

#: One segment of a queue name (a DNS label: namespaces, names and instances hold no dots).
_SEGMENT = r"[-a-z0-9]+"
_SLOT = r"[0-9]+"
_ANY_INBOX = rf"agent\.{_SEGMENT}\.{_SEGMENT}\.inbox"
_ANY_REPLY_SLOT = rf"agent\.{_SEGMENT}\.{_SEGMENT}\.replies\.{_SLOT}"
_NOTHING = "^$"

Action = Literal["configure", "write", "read", "topic_write", "topic_read"]


class Permissions(BaseModel):
    """RabbitMQ's permission expressions for one user in one virtual host (topic ones on `rockbot`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    configure: str = _NOTHING
    write: str = _NOTHING
    read: str = _NOTHING
    topic_write: str = _NOTHING
    topic_read: str = _NOTHING

    def allows(self, action: Action, resource: str) -> bool:
        """Whether RabbitMQ would allow `action` on `resource` (a queue or exchange name, or a routing key)."""
        return re.search(getattr(self, action), resource) is not None


def _any_of(patterns: Iterable[str]) -> str:
    alternatives = sorted(set(patterns))
    return f"^({'|'.join(alternatives)})$" if alternatives else _NOTHING


def _name(name: str) -> str:
    return re.escape(name)


def _family(prefix: str) -> str:
    """Every queue whose name is `prefix` and one more segment (a per-process instance)."""
    return re.escape(prefix) + _SEGMENT


def _slots(principal: Principal) -> str:
    """Every reply slot of an agent (`agent.<ns>.<name>.replies.<n>`)."""
    return re.escape(topology.agent_replies_prefix(namespace=principal.namespace, name=principal.name)) + _SLOT


def reply_queues(principal: Principal) -> str:
    """A pattern (unanchored) of the queues where `principal` receives answers from the agents it asks."""
    if principal.kind == "agent":
        return _slots(principal)
    if principal == OPERATOR:
        return _name(topology.OPERATOR_RUNS.name)
    if principal == GATEWAY:
        return _name(topology.GATEWAY_RUNS.name)
    return _family(topology.service_replies_prefix(principal.name))


def is_reply_queue_of(principal: Principal, queue_name: str) -> bool:
    """Whether `queue_name` is one where `principal` receives answers to its requests to agents."""
    return re.fullmatch(reply_queues(principal), queue_name) is not None


def _declared(principal: Principal) -> list[str]:
    """Queues the principal declares and binds itself: a service's per-process reply queues; agents none."""
    if principal.kind == "agent" or principal in (OPERATOR, GATEWAY):
        return []
    return [reply_queues(principal)]


def _provisioned(principal: Principal) -> list[str]:
    """Queues the operator declares for the principal, which it only consumes."""
    if principal.kind == "agent":
        return [_name(topology.inbox_of(principal).name), _slots(principal)]
    if principal == OPERATOR:
        return [_name(queue.name) for queue in (topology.OPERATOR_SCHEDULING, topology.OPERATOR_RUNS,
                                                topology.OPERATOR_USAGE, topology.DEAD_LETTER_INTAKE)]
    if principal == SCRIPTS_MANAGER:
        return [_name(topology.SCRIPT_INVOKE.name)]
    if principal == GATEWAY:
        return [_name(topology.GATEWAY_RUNS.name)]
    if principal == CONSOLE:
        return [_name(q.name) for q in (topology.CONSOLE_RUNS, topology.CONSOLE_HISTORY, topology.CONSOLE_APPROVALS,
                                        topology.CONSOLE_MEMORY, topology.CONSOLE_FILES,
                                        topology.CONSOLE_FILE_READS, topology.CONSOLE_FILE_WRITES)]
    return []


def _publishes_to(principal: Principal, *, calls: Iterable[Principal], called_by: Iterable[Principal]) -> list[str]:
    inboxes = [_name(topology.inbox_of(callee).name) for callee in calls if callee.kind == "agent"]
    if principal.kind == "agent":
        fixed = [_name(queue.name) for queue in (topology.SCRIPT_INVOKE, topology.OPERATOR_SCHEDULING,
                                                 topology.OPERATOR_USAGE, topology.CONSOLE_RUNS,
                                                 topology.CONSOLE_HISTORY, topology.CONSOLE_APPROVALS,
                                                 topology.CONSOLE_MEMORY, topology.CONSOLE_FILES)]
        return [*fixed, *inboxes, *(reply_queues(caller) for caller in called_by)]
    if principal == OPERATOR:  # scheduled runs to any inbox, answers to any agent's scheduling requests
        # (it files dead letters into their records through an exchange of their own: `_exchanges`)
        return [_ANY_INBOX, _ANY_REPLY_SLOT]
    if principal == GATEWAY:  # Trigger runs to any inbox
        return [_ANY_INBOX]
    if principal == CONSOLE:  # people's chat turns to any inbox; answers to the asking agent's own reply queue
        # and to the scripts-manager's file reads
        return [_ANY_INBOX, _ANY_REPLY_SLOT, reply_queues(SCRIPTS_MANAGER)]
    if principal == SCRIPTS_MANAGER:  # answers, to the asking agent's own reply queue (checked per request);
        # the files a script request names, from the console, and the artifacts it keeps there
        return [_ANY_REPLY_SLOT, _name(topology.CONSOLE_FILE_READS.name), _name(topology.CONSOLE_FILE_WRITES.name)]
    return inboxes


class Limits(BaseModel):
    """How much of the broker one principal may hold at once (RabbitMQ's user limits), over all its processes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_connections: int
    max_channels: int


#: Channels one process opens at most: publishing, its inbox, its reply queue, a passing declare.
CHANNELS_PER_CONNECTION = 8
#: Connections of one platform service over all its replicas (each process opens one or two).
SERVICE_CONNECTIONS = 64


def limits_for(principal: Principal, *, replicas: int = 1) -> Limits:
    """An agent's processes (`replicas`, and those of a rolling update beside them) hold one connection each;
    a platform service, trusted, gets room for its replicas. Nobody can take all of the broker's connections."""
    connections = topology.reply_slots(replicas) if principal.kind == "agent" else SERVICE_CONNECTIONS
    return Limits(max_connections=connections, max_channels=connections * CHANNELS_PER_CONNECTION)


def _exchanges(principal: Principal) -> list[str]:
    """The exchanges `principal` publishes to: `rockbot`, and for the operator the records' own (`deadletters`)."""
    records = [_name(topology.DEAD_LETTER_RECORDS_EXCHANGE)] if principal == OPERATOR else []
    return [_name(topology.EXCHANGE), *records]


def permissions_for(
    principal: Principal, *, calls: Iterable[Principal] = (), called_by: Iterable[Principal] = ()
) -> Permissions:
    """Everything `principal` may do; `calls` and `called_by` matter for agents (and `calls` for services).

    `called_by` holds the agents that call this one and the services that send it runs
    (`service.operator` and `service.gateway` in a cluster, `service.local` locally).
    """
    declared = _declared(principal)
    exchange = _name(topology.EXCHANGE)
    return Permissions(
        configure=_any_of(declared),
        write=_any_of([*_exchanges(principal), *declared]),  # publish: the exchanges; bind: the queue
        # bind: the exchange (only who declares binds); consume: the queue
        read=_any_of([*([exchange] if declared else []), *declared, *_provisioned(principal)]),
        topic_write=_any_of(_publishes_to(principal, calls=calls, called_by=called_by)),
        topic_read=_any_of(declared),
    )
