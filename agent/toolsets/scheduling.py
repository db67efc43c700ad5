"""The `scheduling` set: the agent schedules its own follow-ups, through the operator over the bus.

The agent has no Kubernetes rights; `schedule_task`, `list_scheduled_tasks` and
`cancel_scheduled_task` send a `SchedulingRequest` to `operator.scheduling` and read the
operator's `SchedulingReply` on this process's own reply queue. The listing states the current
time, so the model can turn "in two hours" into a cron expression.

Every request is signed with this agent's token (`ROCKBOT_HTTP_TOKEN`, from the Secret the operator
generates for the Agent), so the operator knows it comes from this agent and not from another one
sharing the bus (see `rockbot.contracts.scheduling` for what that does and does not protect). Without
the token the tools refuse, saying so. `scheduling_tools(ask)` builds the same three tools over any
answerer: `rockbot local` answers them with its in-process scheduler.
"""

from __future__ import annotations

import datetime
import secrets
import zoneinfo
from collections.abc import Awaitable, Callable
from typing import Annotated

from pydantic import Field

from rockbot.agent.defining import tool
from rockbot.agent.registry import Tool, ToolContext, ToolFailure, ToolRegistry
from rockbot.agent.toolsets.kit import Guide, ToolKit, catalogue_description
from rockbot.bus import OPERATOR, BusError, BusUnavailable, RequestTimeout
from rockbot.bus.topology import OPERATOR_SCHEDULING
from rockbot.contracts.agent_config import HTTP_TOKEN_ENV
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scheduling import (
    TASK_NAME,
    CancelTask,
    ListTasks,
    ScheduleTask,
    SchedulingReply,
    SchedulingRequest,
    TaskSummary,
)

REQUEST_TIMEOUT_SECONDS = 20.0

GUIDE = Guide(
    name="scheduling",
    summary="Scheduling prompts to yourself with cron, once or repeatedly.",
    document=(
        "# Scheduling\n\n"
        "`schedule_task(name, cron, prompt, run_once?, time_zone?)` sends `prompt` to you at the times `cron` "
        "matches, in `time_zone` (IANA, default UTC). Cron has 5 fields `minute hour day month weekday` "
        "(`0 9 * * 1-5` = 09:00 on weekdays), 6 fields with seconds first, or `@hourly`/`@daily`/`@weekly`. "
        "For \"in two hours\", call `list_scheduled_tasks()` to read the current time, add two hours and "
        "schedule that minute, hour, day and month with `run_once=true`. Scheduling an existing name "
        "replaces that task. The prompt must say everything you will need then: you will not remember "
        "this conversation. `cancel_scheduled_task(name)` removes one of your tasks.\n"
    ),
)


Ask = Callable[[ScheduleTask | ListTasks | CancelTask], Awaitable[SchedulingReply]]


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    """The tools, answered by the operator over the bus (`rockbot local` answers them itself)."""
    token_env = kit.config.http_token.env if kit.config.http_token else HTTP_TOKEN_ENV

    async def ask(operation: ScheduleTask | ListTasks | CancelTask) -> SchedulingReply:
        if kit.bus is None:
            raise ToolFailure("this agent has no bus connection to the operator", code=ErrorCode.UNAVAILABLE)
        token = kit.secret(token_env)
        if token is None:
            raise ToolFailure(
                f"the scheduling tools need this agent's token, which the operator provides in env {token_env} "
                f"(from the Secret rockbot-{kit.config.name}-http-token); it is not set in this process",
                code=ErrorCode.REJECTED,
            )
        correlation_id = f"{kit.config.name}.{secrets.token_hex(8)}"
        replies = await kit.bus.own_replies()
        request = SchedulingRequest.signed(
            token=token, agent=kit.agent_id, operation=operation, correlation_id=correlation_id,
            reply_to=replies.name, issued_at=datetime.datetime.now(datetime.UTC),
        )
        try:
            delivery = await kit.bus.request(
                queue=OPERATOR_SCHEDULING, body=request, reply_queue=replies,
                correlation_id=correlation_id, timeout_seconds=REQUEST_TIMEOUT_SECONDS, responder=OPERATOR,
            )
        except RequestTimeout:
            raise ToolFailure(f"the operator did not answer within {REQUEST_TIMEOUT_SECONDS:g} s",
                              code=ErrorCode.TIMEOUT, retryable=True) from None
        except (BusUnavailable, BusError) as exc:
            raise ToolFailure(f"cannot reach the operator: {exc}", code=ErrorCode.UNAVAILABLE, retryable=True) from exc
        return delivery.decode(SchedulingReply)

    for defined in scheduling_tools(ask):
        registry.register(defined)
    kit.guides.add(GUIDE)


def scheduling_tools(ask: Ask) -> list[Tool]:
    """The three tools over whatever answers the operations (`ask`); a reply's error is the tool's error."""

    async def answered(operation: ScheduleTask | ListTasks | CancelTask) -> SchedulingReply:
        reply = await ask(operation)
        if reply.error is not None:
            raise ToolFailure(reply.error.message, code=reply.error.code, retryable=reply.error.retryable)
        return reply

    @tool(name="schedule_task", description=catalogue_description("schedule_task"))
    async def schedule_task(
        name: Annotated[str, Field(pattern=TASK_NAME, description="Short name, e.g. `daily-digest` (a-z, 0-9, -).")],
        cron: Annotated[str, Field(description="Cron: `minute hour day month weekday`, e.g. `30 8 * * 1-5`.")],
        prompt: Annotated[str, Field(min_length=1, description="What to do then, with all context needed.")],
        context: ToolContext,
        run_once: Annotated[bool, Field(description="Fire at the next matching time only.")] = False,
        time_zone: Annotated[str, Field(description="IANA zone of the cron times, e.g. Europe/Berlin.")] = "UTC",
    ) -> str:
        reply = await answered(
            ScheduleTask(name=name, cron=cron, prompt=prompt, run_once=run_once, time_zone=time_zone)
        )
        assert reply.task is not None
        task = reply.task
        when = _local(task.next_run, task.time_zone) if task.next_run else "as soon as the operator has scheduled it"
        return f"Scheduled task {task.name!r} ({task.schedule} in {task.time_zone}); next run: {when}."

    @tool(name="list_scheduled_tasks", description=catalogue_description("list_scheduled_tasks"))
    async def list_scheduled_tasks(context: ToolContext) -> str:
        reply = await answered(ListTasks())
        return render_tasks(reply.tasks, now=reply.now)

    @tool(name="cancel_scheduled_task", description=catalogue_description("cancel_scheduled_task"))
    async def cancel_scheduled_task(
        name: Annotated[str, Field(min_length=1, description="The task's name as list_scheduled_tasks shows it.")],
        context: ToolContext,
    ) -> str:
        reply = await answered(CancelTask(name=name))
        assert reply.task is not None
        return f"Cancelled task {reply.task.name!r}; it will not run again."

    return [schedule_task, list_scheduled_tasks, cancel_scheduled_task]


def render_tasks(tasks: list[TaskSummary], *, now: datetime.datetime) -> str:
    """A Markdown table the model can read, headed by the current time."""
    lines = [f"Current time: {now.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC ({now:%A})."]
    if not tasks:
        return "\n".join([*lines, "You have no scheduled tasks."])
    lines += [
        "",
        "| name | schedule | time zone | next run (local) | next run (UTC) | last outcome | yours | prompt |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for task in tasks:
        if task.problem:
            upcoming, utc = f"invalid: {task.problem}", "-"
        elif task.suspend:
            upcoming, utc = "suspended", "-"
        elif task.completed:
            upcoming, utc = "done (ran once)", "-"
        elif task.next_run is None:
            upcoming, utc = "not scheduled yet", "-"
        else:
            upcoming = _local(task.next_run, task.time_zone)
            utc = f"{task.next_run.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S}"
        cells = [task.name, f"`{task.schedule}`" + (" (once)" if task.run_once else ""), task.time_zone, upcoming,
                 utc, task.last_outcome or "-", "yes" if task.mine else "no (set by a person)", task.prompt]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(lines)


def _local(instant: datetime.datetime, zone: str) -> str:
    try:
        return f"{instant.astimezone(zoneinfo.ZoneInfo(zone)):%Y-%m-%d %H:%M:%S %Z}"
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return f"{instant.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
