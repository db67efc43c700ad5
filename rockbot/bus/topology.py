"""Every exchange and queue name on the bus, and the arguments they are declared with, in one place.

Every message is published to one durable topic exchange, `rockbot`, with the target queue's name
as routing key; every queue is bound to it with its own name (names hold no `*` or `#`, so the
binding is exact). Nothing uses the default exchange: publishing there would bypass the topic
permissions that say who may write to which queue (see `permissions`).

| queue                                         | carries                                    | consumed by     |
| --------------------------------------------- | ------------------------------------------ | --------------- |
| `script.invoke`                               | `ScriptInvokeRequest`                      | scripts-manager |
| `script.result.<namespace>.<agent>.<inst>`    | `ScriptInvokeResponse`/`ScriptInvokeError` | one agent proc. |
| `agent.<namespace>.<name>.inbox`              | `InboxRequest` (user turns, tasks, calls)  | that agent      |
| `agent.<namespace>.<name>.replies.<inst>`     | `InboxReply` to that process's agent calls | one agent proc. |
| `operator.scheduling`                         | scheduling requests from agents            | operator        |
| `operator.scheduling.runs`                    | `InboxReply` to scheduled runs             | operator        |
| `operator.usage`                              | `UsageReport`: tokens an agent process used | operator       |
| `gateway.runs`                                | `InboxReply` to Trigger runs               | gateway         |
| `agent.<ns>.<name>.scheduling-replies.<inst>` | `SchedulingReply`, `UsageTotal` to it      | one agent proc. |
| `service.<name>.replies.<inst>`               | `InboxReply` to a service's requests       | one service     |
| `console.runs`                                | `RunEvents`: what agents did, to record    | console         |
| `console.history`                             | `HistoryRequest` (reply: `HistoryReply`)   | console         |
| `console.approvals`                           | `ApprovalRequest` (reply: `ApprovalDecision`) | console      |
| `rockbot.dead-letters`                        | what a work queue refused or gave up on    | people          |

Work queues (`script.invoke`, the inboxes, `operator.scheduling`, `operator.scheduling.runs`,
`operator.usage`, `gateway.runs`, `console.runs`, `console.history`, `console.approvals`) are
quorum queues, *provisioned*: declared and bound by the operator (inboxes when it reconciles the
Agent, so messages to an agent that has not started yet are kept), never by their consumers, which
only check that they exist. A message a consumer refuses, or one delivered more than
`DELIVERY_LIMIT` + 1 times (its consumer crashed on it, or kept failing), goes to the exchange
`rockbot.dead-letters` and from there to the queue of that name (the newest `DEAD_LETTERS_KEPT`
are kept), never back to the queue. Requests that expired unread go there too.

Reply queues belong to one process (`instance`, random per process: replicas sharing one would
take each other's replies), are declared and bound by it, and expire after an hour unused, so
processes that are gone leave nothing behind.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from rockbot.bus.identity import Principal

EXCHANGE = "rockbot"
DEAD_LETTER_EXCHANGE = "rockbot.dead-letters"
#: Redeliveries a work queue allows before it dead-letters a message (RabbitMQ's `x-delivery-limit`).
DELIVERY_LIMIT = 5
DEAD_LETTERS_KEPT = 10_000
#: The largest message the bus carries; the broker's `max_message_size` (chart, test broker) is the same.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_REPLY_QUEUE_EXPIRES_MS = 3600 * 1000
_WORK = {"x-queue-type": "quorum", "x-delivery-limit": DELIVERY_LIMIT, "x-dead-letter-exchange": DEAD_LETTER_EXCHANGE}
_REPLIES = {"x-expires": _REPLY_QUEUE_EXPIRES_MS}


class Queue(BaseModel):
    """A named queue, the arguments it is always declared with, and who declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=255)]
    arguments: dict[str, Any] = Field(default_factory=dict)
    #: Declared and bound by the operator's provisioning; a consumer only checks that it exists.
    provisioned: bool = False


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
#: Where agents put tool calls that wait for a person's approval; the console holds each until decided or expired.
CONSOLE_APPROVALS = work_queue("console.approvals")
DEAD_LETTERS = Queue(
    name="rockbot.dead-letters",
    arguments={"x-queue-type": "quorum", "x-max-length": DEAD_LETTERS_KEPT, "x-overflow": "drop-head"},
    provisioned=True,
)
#: The queues that exist whatever Agents there are (the operator declares them at start-up).
FIXED_QUEUES = (SCRIPT_INVOKE, OPERATOR_SCHEDULING, OPERATOR_RUNS, OPERATOR_USAGE, GATEWAY_RUNS, CONSOLE_RUNS,
                CONSOLE_HISTORY, CONSOLE_APPROVALS)


def script_result_prefix(*, namespace: str, agent: str) -> str:
    return f"script.result.{_segment(field='namespace', value=namespace)}.{_segment(field='agent', value=agent)}."


def script_result(*, namespace: str, agent: str, instance: str) -> Queue:
    """Where the scripts-manager answers one agent process's script requests (their `reply_to`)."""
    return Queue(
        name=script_result_prefix(namespace=namespace, agent=agent) + _segment(field="instance", value=instance),
        arguments=_REPLIES,
    )


def _agent_prefix(*, namespace: str, name: str) -> str:
    return f"agent.{_segment(field='namespace', value=namespace)}.{_segment(field='name', value=name)}."


def agent_inbox(*, namespace: str, name: str) -> Queue:
    """The one queue an agent consumes for work addressed to it."""
    return work_queue(_agent_prefix(namespace=namespace, name=name) + "inbox")


def agent_replies_prefix(*, namespace: str, name: str) -> str:
    return _agent_prefix(namespace=namespace, name=name) + "replies."


def agent_replies(*, namespace: str, name: str, instance: str) -> Queue:
    """Where the answers to one agent process's calls of other agents arrive."""
    return Queue(
        name=agent_replies_prefix(namespace=namespace, name=name) + _segment(field="instance", value=instance),
        arguments=_REPLIES,
    )


def scheduling_reply_prefix(*, namespace: str, name: str) -> str:
    """What every scheduling reply queue of this agent's processes starts with (the operator checks it)."""
    return _agent_prefix(namespace=namespace, name=name) + "scheduling-replies."


def scheduling_replies(*, namespace: str, name: str, instance: str) -> Queue:
    """Where the operator answers one agent process's scheduling requests."""
    return Queue(
        name=scheduling_reply_prefix(namespace=namespace, name=name) + _segment(field="instance", value=instance),
        arguments=_REPLIES,
    )


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
