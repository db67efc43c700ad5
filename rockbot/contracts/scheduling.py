"""Scheduling requests from an agent's tools to the operator (queue `operator.scheduling`), and the replies.

The agent has no Kubernetes rights: it asks the operator to create, update, list or delete the
ScheduledTasks it owns. Each request names the agent (`namespace/name`), is answered on that
agent's own scheduling reply queue (see `rockbot.bus.topology`), and is signed with the agent's
token (the Secret `rockbot-<agent>-http-token` that the operator generates and wires into the pod
as `ROCKBOT_HTTP_TOKEN`): HMAC-SHA256 over `signing_payload`, which binds the agent, the message's
correlation id and reply queue, the issue time and the operation. The operator recomputes it from
the Secret and refuses a mismatch or an issue time more than `MAX_CLOCK_SKEW` off its clock.

Trust model. The operator takes the requesting agent from the message's sender (its broker login,
see `rockbot.bus.identity`) and refuses a request whose `agent` is not the sender. The signature is a
second factor: it proves the sender also holds that agent's token, so a leaked broker login alone
cannot create, change, list or cancel an agent's tasks, and a captured request is refused once the
window has passed (within it, a replay can only repeat the same operation, answered on the same
queue).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from rockbot.contracts.errors import ErrorInfo

#: Version 2: requests carry `issued_at` and `signature`; the operator refuses version 1.
REQUEST_SCHEMA_VERSION = 2
SCHEMA_VERSION = 1  # of the replies, unchanged
#: How far a request's `issued_at` may be from the operator's clock (either way).
MAX_CLOCK_SKEW = datetime.timedelta(minutes=5)

#: A task name as the agent gives it (a DNS label short enough to be prefixed with the agent's name).
TASK_NAME = r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"


class _Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScheduleTask(_Contract):
    """Create the task, or update it if this agent already has one by that name."""

    action: Literal["schedule"] = "schedule"
    name: Annotated[str, Field(pattern=TASK_NAME)]
    cron: Annotated[str, Field(min_length=1, max_length=256)]
    prompt: Annotated[str, Field(min_length=1, max_length=100_000)]
    run_once: bool = False
    time_zone: Annotated[str, Field(min_length=1, max_length=64)] = "UTC"


class ListTasks(_Contract):
    action: Literal["list"] = "list"


class CancelTask(_Contract):
    action: Literal["cancel"] = "cancel"
    name: Annotated[str, Field(min_length=1, max_length=253)]


Operation = ScheduleTask | ListTasks | CancelTask


class SchedulingRequest(_Contract):
    """One operation, signed by the agent; `correlation_id` and `reply_to` travel as message properties.

    Validation errors never echo input (the signature stays out of replies and logs).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    schema_version: Literal[2] = REQUEST_SCHEMA_VERSION
    agent: Annotated[str, Field(pattern=r"^[a-z0-9][-a-z0-9]*/[a-z0-9][-a-z0-9]*$", max_length=127)]
    issued_at: AwareDatetime
    signature: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$", repr=False)]
    operation: Operation = Field(discriminator="action")

    @classmethod
    def signed(
        cls,
        *,
        token: str,
        agent: str,
        operation: Operation,
        correlation_id: str,
        reply_to: str,
        issued_at: datetime.datetime,
    ) -> SchedulingRequest:
        """The request as the agent sends it: signed with its token for this message's ids."""
        payload = signing_payload(
            agent=agent, correlation_id=correlation_id, reply_to=reply_to, issued_at=issued_at, operation=operation
        )
        return cls(agent=agent, issued_at=issued_at, signature=_mac(token, payload), operation=operation)

    def signed_by(self, *, token: str, correlation_id: str, reply_to: str) -> bool:
        """Whether `token` signed this request as delivered with these ids (constant-time comparison)."""
        payload = signing_payload(
            agent=self.agent, correlation_id=correlation_id, reply_to=reply_to, issued_at=self.issued_at,
            operation=self.operation,
        )
        return hmac.compare_digest(_mac(token, payload), self.signature)


def signing_payload(
    *, agent: str, correlation_id: str, reply_to: str, issued_at: datetime.datetime, operation: Operation
) -> bytes:
    """The canonical bytes that are signed: sorted-key compact JSON, the instant in UTC to the microsecond."""
    return json.dumps(
        {
            "version": REQUEST_SCHEMA_VERSION,
            "agent": agent,
            "correlation_id": correlation_id,
            "reply_to": reply_to,
            "issued_at": issued_at.astimezone(datetime.UTC).isoformat(timespec="microseconds"),
            "operation": operation.model_dump(mode="json"),
        },
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
    ).encode()


def _mac(token: str, payload: bytes) -> str:
    return hmac.new(token.encode(), payload, hashlib.sha256).hexdigest()


class TaskSummary(_Contract):
    """One task as the agent sees it; `mine` is False for tasks a person applied for this agent."""

    name: str
    schedule: str
    time_zone: str
    prompt: str
    run_once: bool
    suspend: bool
    mine: bool
    completed: bool = False
    next_run: datetime.datetime | None = None
    last_run: datetime.datetime | None = None
    last_outcome: str | None = None
    problem: str | None = None


class SchedulingReply(_Contract):
    """`task` answers schedule/cancel, `tasks` answers list; `error` replaces both on failure."""

    schema_version: Literal[1] = SCHEMA_VERSION
    now: datetime.datetime
    task: TaskSummary | None = None
    tasks: list[TaskSummary] = Field(default_factory=list)
    error: ErrorInfo | None = None

    @model_validator(mode="after")
    def _error_alone(self) -> SchedulingReply:
        if self.error is not None and (self.task is not None or self.tasks):
            raise ValueError("error: a failed reply carries no task")
        return self
