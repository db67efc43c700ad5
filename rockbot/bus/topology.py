"""Every exchange and queue name on the bus, and the arguments they are declared with, in one place.

Every message is published to one durable topic exchange, `rockbot`, with the target queue's name
as routing key; every queue is bound to it with its own name (names hold no `*` or `#`, so the
binding is exact). Nothing uses the default exchange: publishing there would bypass the topic
permissions that say who may write to which queue (see `permissions`).

| queue                                         | carries                                    | consumed by     |
| --------------------------------------------- | ------------------------------------------ | --------------- |
| `script.invoke`                               | `ScriptInvokeRequest`                      | scripts-manager |
| `agent.<namespace>.<name>.inbox`              | `InboxRequest` (user turns, tasks, calls)  | that agent      |
| `agent.<namespace>.<name>.replies.<slot>`     | every answer to one agent process (below)  | one agent proc. |
| `operator.scheduling`                         | scheduling requests from agents            | operator        |
| `operator.scheduling.runs`                    | `InboxReply` to scheduled runs             | operator        |
| `operator.usage`                              | `UsageReport`: tokens an agent process used | operator       |
| `gateway.runs`                                | `InboxReply` to Trigger runs               | gateway         |
| `service.<name>.replies.<inst>`               | `InboxReply` to a service's requests       | one service     |
| `console.runs`                                | `RunEvents`: what agents did, to record    | console         |
| `console.history`                             | `HistoryRequest` (reply: `HistoryReply`)   | console         |
| `console.approvals`                           | `ApprovalRequest` (reply: `ApprovalDecision`) | console      |
| `console.memory`                              | `Remember`/`Recall`/`Forget` (reply: `MemoryReply`) | console |
| `console.files`                               | `SaveFiles`, `ListFiles` (`FilesSaved`, `FilesListed`) | console |
| `console.file-reads`                          | `ReadFile` from the scripts-manager (reply: `FileChunk`) | console |
| `console.file-writes`                         | `WriteFile` from the scripts-manager (`FileWritten`) | console |
| `rockbot.dead-letters`                        | what a work queue refused or gave up on    | people          |
| `rockbot.dead-letters.intake`                 | the same, to be filed by sender            | operator        |
| `rockbot.dead-letters.<principal>`            | one sender's dead letters (its first ones) | people          |

Work queues (`script.invoke`, the inboxes, `operator.scheduling`, `operator.scheduling.runs`,
`operator.usage`, `gateway.runs`, `console.runs`, `console.history`, `console.approvals`, `console.memory`,
`console.files`, `console.file-reads`, `console.file-writes`) are
quorum queues, *provisioned*: declared and bound by the operator (inboxes when it reconciles the
Agent, so messages to an agent that has not started yet are kept), never by their consumers, which
only check that they exist. A message a consumer refuses, or one delivered more than
`DELIVERY_LIMIT` + 1 times (its consumer crashed on it, or kept failing), goes to the exchange
`rockbot.dead-letters` and from there to the queue of that name (the newest `DEAD_LETTERS_KEPT`
are kept), never back to the queue. Requests that expired unread go there too. The exchange also
copies each into `rockbot.dead-letters.intake`, from which the operator files it by its sender
(`user_id`) into that principal's own record, `rockbot.dead-letters.<principal>` (see `deadletters`):
one sender's flood can fill only its own record, and never pushes its first ones out. Records are bound to
an exchange of their own, `rockbot.dead-letters.records`, never to `rockbot`: nobody's message reaches them but
what the operator files (and the dead-letter queues are bound to the fanout `rockbot.dead-letters` only).

An agent process gets every answer (other agents' `InboxReply`, the scripts-manager's script
results, the operator's `SchedulingReply` and `UsageTotal`, the console's `HistoryReply`) on one
reply queue, `agent.<ns>.<name>.replies.<slot>`. Agents declare nothing (a declare right would let
them choose arguments: a dead-letter relay, a TTL, an exchange of their own): the operator
provisions `reply_slots(replicas)` such queues per Agent, with fixed arguments, and each process
claims the first free one with an exclusive consumer, which the broker gives to one connection at a
time (`Bus.own_replies`); a process that is gone frees its slot. Replies a gone process left behind
are dropped by the next one (nobody waits for them) or expire. Services' reply queues
(`service.<name>.replies.<inst>`) are declared by the service itself (a trusted process) and expire
after an hour unused.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from rockbot.bus.identity import Principal

EXCHANGE = "rockbot"
DEAD_LETTER_EXCHANGE = "rockbot.dead-letters"
#: Where the operator files dead letters into the principals' records (`deadletters`): a direct exchange of its own
#: that only it may publish to. The records are bound to it alone, never to `rockbot`, so no copy of a message sent
#: there (`CC`/`BCC`, which RabbitMQ checks against topic permissions only from 4.1) can land in a record.
DEAD_LETTER_RECORDS_EXCHANGE = "rockbot.dead-letters.records"
#: Redeliveries a work queue allows before it dead-letters a message (RabbitMQ's `x-delivery-limit`).
DELIVERY_LIMIT = 5
DEAD_LETTERS_KEPT = 10_000
#: The largest message the bus carries; the broker's `max_message_size` (chart, test broker) is the same.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_REPLY_QUEUE_EXPIRES_MS = 3600 * 1000
_WORK = {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT, "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE}
#: A service's reply queue: gone an hour after its service is; every agent it calls may write to it (the console's
#: chat progress), so the broker bounds it and refuses a flood at the bound (the sender drops and counts it).
_REPLIES = {"x-expires": _REPLY_QUEUE_EXPIRES_MS, "x-max-length": 10_000, "x-overflow": "reject-publish"}
#: An agent's reply slots: a reply nobody took within the hour is gone; a flood cannot grow them without end.
_SLOT = {"x-message-ttl": _REPLY_QUEUE_EXPIRES_MS, "x-max-length": 10_000}
#: The most reply slots an Agent gets (`reply_slots` of the most replicas an Agent may have, 20).
MAX_REPLY_SLOTS = 41


class Queue(BaseModel):
    """A named queue, the arguments it is always declared with, and who declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=255)]
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: Declared and bound by the operator's provisioning; a consumer only checks that it exists.
    provisioned: bool = False
    #: The exchange it is bound to by its name.
    exchange: str = EXCHANGE


def _segment(*, field: str, value: str) -> str:
    if not _LABEL.match(value):
        raise ValueError(
            f"{field}={value!r} cannot be part of a queue name: use a DNS label (lower-case letters, digits "
            "and '-', at most 63; a Kubernetes namespace or Agent name)"
        )
    return value


def work_queue(name: str) -> Queue:
    """A provisioned quorum queue that bounds redeliveries and dead-letters what it gives up on."""
    return Queue(name=name, arguments=_WORK, provisioned=True)


SCRIPT_INVOKE = work_queue("script.invoke")
OPERATOR_SCHEDULING = work_queue("operator.scheduling")
#: Where agents answer scheduled runs; any operator replica may complete any run.
OPERATOR_RUNS = work_queue("operator.scheduling.runs")
#: Where agent processes report the tokens they used (the operator keeps each Agent's day in its status).
OPERATOR_USAGE = work_queue("operator.usage")
#: Where agents answer Trigger runs; any gateway replica may complete any run, also after a restart.
GATEWAY_RUNS = work_queue("gateway.runs")
#: Where agents publish their run events; the console writes them to the run store.
CONSOLE_RUNS = work_queue("console.runs")
#: Where agents ask the console for a session's history (answered on the agent's replies queue).
CONSOLE_HISTORY = work_queue("console.history")
#: Where agents ask the console to keep, find and forget long-term memories (answered on the agent's replies queue).
CONSOLE_MEMORY = work_queue("console.memory")
#: Where agents ask the console to keep a conversation's files (a script's artifacts; answered on the agent's replies).
CONSOLE_FILES = work_queue("console.files")
#: Where the scripts-manager reads the conversation files a script request names (answered on its own replies).
CONSOLE_FILE_READS = work_queue("console.file-reads")
#: Where the scripts-manager keeps a call's artifacts too large for its answer, a chunk at a time (its own replies).
CONSOLE_FILE_WRITES = work_queue("console.file-writes")
#: Where agents put tool calls that wait for a person's approval; the console holds each until decided or expired.
CONSOLE_APPROVALS = work_queue("console.approvals")
DEAD_LETTERS = Queue(
    name="rockbot.dead-letters",
    arguments={"x-queue-type": "quorum", "x-max-length": DEAD_LETTERS_KEPT, "x-overflow": "drop-head"},
    provisioned=True,
)
#: Where the dead-letter exchange also puts every dead letter, for the operator to file by sender; it keeps the
#: first ones while nobody files them (a flood while the operator is down cannot push earlier ones out).
DEAD_LETTER_INTAKE = Queue(
    name="rockbot.dead-letters.intake",
    arguments={"x-max-length": DEAD_LETTERS_KEPT, "x-overflow": "reject-publish"},
    provisioned=True,
)
#: Each principal's record keeps its first this many dead letters of the past `DEAD_LETTER_RECORD_SECONDS`.
DEAD_LETTERS_PER_PRINCIPAL = 1000
DEAD_LETTER_RECORD_SECONDS = 7 * 24 * 3600
_RECORD_PREFIX = "rockbot.dead-letters."
UNKNOWN_SENDER = "unknown"


def dead_letter_record(sender: str | None) -> Queue:
    """The queue keeping the dead letters of `sender` (a broker user); `...unknown` for a non-principal."""
    principal = Principal.parse(sender)
    return Queue(
        name=_RECORD_PREFIX + (principal.user if principal is not None else UNKNOWN_SENDER),
        arguments={"x-max-length": DEAD_LETTERS_PER_PRINCIPAL, "x-overflow": "reject-publish",
                   "x-message-ttl": DEAD_LETTER_RECORD_SECONDS * 1000},
        provisioned=True, exchange=DEAD_LETTER_RECORDS_EXCHANGE,
    )  # fmt: skip


def is_dead_letter_record(queue_name: str) -> bool:
    """Whether `queue_name` is a principal's dead-letter record (not the shared queue or the intake)."""
    return queue_name.startswith(_RECORD_PREFIX) and queue_name != DEAD_LETTER_INTAKE.name


#: The queues that exist whatever Agents there are (the operator declares them at start-up).
FIXED_QUEUES = (SCRIPT_INVOKE, OPERATOR_SCHEDULING, OPERATOR_RUNS, OPERATOR_USAGE, GATEWAY_RUNS, CONSOLE_RUNS,
                CONSOLE_HISTORY, CONSOLE_APPROVALS, CONSOLE_MEMORY, CONSOLE_FILES, CONSOLE_FILE_READS,
                CONSOLE_FILE_WRITES)


def _agent_prefix(*, namespace: str, name: str) -> str:
    return f"agent.{_segment(field='namespace', value=namespace)}.{_segment(field='name', value=name)}."


def agent_inbox(*, namespace: str, name: str) -> Queue:
    """The one queue an agent consumes for work addressed to it."""
    return work_queue(_agent_prefix(namespace=namespace, name=name) + "inbox")


def agent_replies_prefix(*, namespace: str, name: str) -> str:
    return _agent_prefix(namespace=namespace, name=name) + "replies."


def reply_slots(replicas: int) -> int:
    """How many reply queues the operator provisions for an Agent of `replicas`: every process of a rolling
    update (old and new side by side) and of a pod that is still stopping gets one."""
    return min(MAX_REPLY_SLOTS, 2 * max(replicas, 1) + 1)


def agent_replies(*, namespace: str, name: str, slot: int) -> Queue:
    """The reply queue `slot` of an agent: every answer to the one process that holds it (see `Bus.own_replies`)."""
    if not 0 <= slot < MAX_REPLY_SLOTS:
        raise ValueError(f"slot={slot} is not a reply slot: use 0 to {MAX_REPLY_SLOTS - 1}")
    return Queue(name=agent_replies_prefix(namespace=namespace, name=name) + str(slot), arguments=_SLOT,
                 provisioned=True)


def service_replies_prefix(service: str) -> str:
    return f"service.{_segment(field='service', value=service)}.replies."


def service_replies(*, service: str, instance: str) -> Queue:
    """Where agents answer the requests of one process of a service (e.g. `rockbot local`'s tasks)."""
    return Queue(name=service_replies_prefix(service) + _segment(field="instance", value=instance), arguments=_REPLIES)


def local_scheduler_replies(*, instance: str) -> Queue:
    """Where agents answer the ScheduledTasks that one `rockbot local` process fires."""
    return service_replies(service="local", instance=instance)


def inbox_of(principal: Principal) -> Queue:
    return agent_inbox(namespace=principal.namespace, name=principal.name)
