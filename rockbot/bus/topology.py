"""Every queue name on the bus, in one place, so senders and receivers cannot drift apart.

All queues are durable and all messages persistent; everything goes through the default exchange
with the queue name as routing key. Each queue is declared with the same arguments by whoever
touches it first, so declarations never conflict.

| queue                                          | carries                                     | consumed by        |
| ---------------------------------------------- | ------------------------------------------- | ------------------ |
| `script.invoke`                                | `ScriptInvokeRequest`                       | scripts-manager    |
| `script.result.<namespace>.<agent>.<instance>` | `ScriptInvokeResponse`/`ScriptInvokeError`  | one agent process  |
| `agent.<namespace>.<name>.inbox`               | `InboxRequest` (user turns, tasks, calls)   | that agent         |
| `agent.<namespace>.<name>.replies.<instance>`  | `InboxReply` to that process's agent calls  | one agent process  |
| `operator.scheduling`                          | scheduling requests from agents             | operator           |
| `agent.<namespace>.<name>.scheduling-replies.<instance>` | `SchedulingReply` to that process  | one agent process  |
| `local.scheduler.replies.<instance>`           | `InboxReply` to `rockbot local`'s tasks     | one local process  |

Reply queues belong to one process (`instance`, random per process): replicas sharing one would
take each other's replies. They expire after an hour unused, so processes that are gone leave
nothing behind.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

_SEGMENT = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$")
_REPLY_QUEUE_EXPIRES_MS = 3600 * 1000


class Queue(BaseModel):
    """A named queue and the arguments it is always declared with."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=255)]
    arguments: dict[str, Any] = Field(default_factory=dict)


def _segment(*, field: str, value: str) -> str:
    if not _SEGMENT.match(value):
        raise ValueError(
            f"{field}={value!r} cannot be part of a queue name: use lower-case letters, digits, '.' and '-' "
            "(a Kubernetes object name)"
        )
    return value


SCRIPT_INVOKE = Queue(name="script.invoke")
OPERATOR_SCHEDULING = Queue(name="operator.scheduling")


def script_result(*, namespace: str, agent: str, instance: str) -> Queue:
    """Where the scripts-manager answers one agent process's script requests (their `reply_to`)."""
    return Queue(
        name=f"script.result.{_segment(field='namespace', value=namespace)}.{_segment(field='agent', value=agent)}"
        f".{_segment(field='instance', value=instance)}",
        arguments={"x-expires": _REPLY_QUEUE_EXPIRES_MS},
    )


def agent_inbox(*, namespace: str, name: str) -> Queue:
    """The one queue an agent consumes for work addressed to it."""
    return Queue(
        name=f"agent.{_segment(field='namespace', value=namespace)}.{_segment(field='name', value=name)}.inbox"
    )


def agent_replies(*, namespace: str, name: str, instance: str) -> Queue:
    """Where the answers to one agent process's calls of other agents arrive."""
    inbox = agent_inbox(namespace=namespace, name=name)
    return Queue(
        name=f"{inbox.name.removesuffix('.inbox')}.replies.{_segment(field='instance', value=instance)}",
        arguments={"x-expires": _REPLY_QUEUE_EXPIRES_MS},
    )


def scheduling_reply_prefix(*, namespace: str, name: str) -> str:
    """What every scheduling reply queue of this agent's processes starts with (the operator checks it)."""
    inbox = agent_inbox(namespace=namespace, name=name)
    return f"{inbox.name.removesuffix('.inbox')}.scheduling-replies."


def scheduling_replies(*, namespace: str, name: str, instance: str) -> Queue:
    """Where the operator answers one agent process's scheduling requests."""
    return Queue(
        name=scheduling_reply_prefix(namespace=namespace, name=name) + _segment(field="instance", value=instance),
        arguments={"x-expires": _REPLY_QUEUE_EXPIRES_MS},
    )


def local_scheduler_replies(*, instance: str) -> Queue:
    """Where agents answer the ScheduledTasks that one `rockbot local` process fires."""
    return Queue(
        name=f"local.scheduler.replies.{_segment(field='instance', value=instance)}",
        arguments={"x-expires": _REPLY_QUEUE_EXPIRES_MS},
    )
