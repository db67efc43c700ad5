"""Scheduling requests from an agent's tools to the operator (queue `operator.scheduling`), and the replies.

The agent has no Kubernetes rights: it asks the operator to create, update, list or delete the
ScheduledTasks it owns. Each request names the agent (`namespace/name`) and is answered on that
agent's own scheduling reply queue (see `rockbot.bus.topology`); the operator checks both before
touching anything.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rockbot.contracts.errors import ErrorInfo

SCHEMA_VERSION = 1

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


class SchedulingRequest(_Contract):
    schema_version: Literal[1] = SCHEMA_VERSION
    agent: Annotated[str, Field(pattern=r"^[a-z0-9][-a-z0-9]*/[a-z0-9][-a-z0-9]*$", max_length=127)]
    operation: ScheduleTask | ListTasks | CancelTask = Field(discriminator="action")


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
