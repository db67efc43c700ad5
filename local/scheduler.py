"""Fire ScheduledTasks locally, and answer the agents' scheduling tools: the operator's semantics, no status.

Each task sends its prompt to the agent's inbox over the bus at every slot, like the operator does;
`concurrencyPolicy` is honoured, `suspend` skips, `runOnce` stops after one run. Missed slots are not
caught up: nothing ran before this process started.

The `scheduling` tools (`schedule_task`, `list_scheduled_tasks`, `cancel_scheduled_task`) are the
agent's own (`rockbot.agent.toolsets.scheduling.scheduling_tools`), answered here in process instead of
by the operator over the bus, by the operator's rules: an agent's task is named `<agent>.<name>`, lists
show the tasks for that agent (those from the files marked as set by a person), and an agent changes or
cancels only the tasks it created. They last for the run.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from rockbot.agent.registry import ToolRegistry
from rockbot.agent.toolsets.kit import ToolKit
from rockbot.agent.toolsets.scheduling import GUIDE, scheduling_tools
from rockbot.bus import Bus, Principal
from rockbot.bus.topology import agent_inbox, local_scheduler_replies
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.contracts.scheduling import CancelTask, ListTasks, ScheduleTask, SchedulingReply, TaskSummary
from rockbot.local.manifests import NAMESPACE
from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.resources import ScheduledTask
from rockbot.tasks import cancel_and_wait

logger = logging.getLogger(__name__)
Report = Callable[[str, InboxReply | None, str | None], None]
PROMPT_PREVIEW = 200


@dataclass
class _Entry:
    task: ScheduledTask
    schedule: CronSchedule
    owner: str | None  # the agent that created it with schedule_task; None for a task from the files
    loop: asyncio.Task[None] | None = None
    completed: bool = False
    last_run: datetime.datetime | None = None
    last_outcome: str | None = None
    running: set[asyncio.Task[None]] = field(default_factory=set)


class LocalScheduler:
    """One asyncio task per ScheduledTask; `close()` stops them all."""

    def __init__(self, *, bus: Bus, tasks: list[ScheduledTask], report: Report) -> None:
        self._bus = bus
        self._report = report
        self._entries = {
            task.metadata["name"]: _Entry(task=task, schedule=_parsed(task), owner=None) for task in tasks
        }
        self._started = False
        #: Per process: two `rockbot local` runs on one broker must not take each other's replies.
        self._replies = local_scheduler_replies(instance=secrets.token_hex(4))

    def start(self) -> None:
        self._started = True
        for entry in self._entries.values():
            entry.loop = asyncio.create_task(self._fire_forever(entry))

    async def close(self) -> None:
        await cancel_and_wait(*(entry.loop for entry in self._entries.values()))

    def tool_set(self) -> _SchedulingTools:
        """What gives an agent the `scheduling` tools answered by this scheduler (for `AgentRuntime` tool_sets)."""
        return _SchedulingTools(scheduler=self)

    def answer(self, *, agent: str, operation: ScheduleTask | ListTasks | CancelTask) -> SchedulingReply:
        """Carry out one agent's scheduling operation, or say what to change, as the operator does."""
        now = datetime.datetime.now(datetime.UTC)
        try:
            if isinstance(operation, ScheduleTask):
                return SchedulingReply(now=now, task=self._summary(self._schedule(agent, operation), agent, now))
            if isinstance(operation, CancelTask):
                entry = self._own(agent, operation.name)
                del self._entries[entry.task.metadata["name"]]
                if entry.loop is not None:
                    entry.loop.cancel()
                return SchedulingReply(now=now, task=self._summary(entry, agent, now))
            listed = sorted((e for e in self._entries.values() if e.task.spec.agent_ref.name == agent),
                            key=lambda e: e.task.metadata["name"])
            return SchedulingReply(now=now, tasks=[self._summary(entry, agent, now) for entry in listed])
        except _Refused as refused:
            return SchedulingReply(now=now, error=ErrorInfo(code=refused.code, message=str(refused)))

    def _schedule(self, agent: str, operation: ScheduleTask) -> _Entry:
        name = f"{agent}.{operation.name}"
        existing = self._entries.get(name)
        if existing is not None and existing.owner != agent:
            raise _Refused(ErrorCode.REJECTED, f"task {name!r} was not created by you, so you cannot change it")
        task = ScheduledTask.model_validate({
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"agentRef": {"name": agent}, "schedule": operation.cron, "timeZone": operation.time_zone,
                     "prompt": operation.prompt, "runOnce": operation.run_once},
        })  # fmt: skip
        try:
            schedule = _parsed(task)
        except InvalidSchedule as exc:
            field_name = "time_zone" if exc.field == "timeZone" else "cron"
            raise _Refused(ErrorCode.INVALID_ARGUMENTS, f"{field_name}: {exc.message}") from None
        if existing is not None and existing.loop is not None:
            existing.loop.cancel()
        entry = self._entries[name] = _Entry(task=task, schedule=schedule, owner=agent)
        if self._started:
            entry.loop = asyncio.create_task(self._fire_forever(entry))
        return entry

    def _own(self, agent: str, name: str) -> _Entry:
        entry = self._entries.get(f"{agent}.{name}") or self._entries.get(name)
        if entry is None:
            own = sorted(e.task.metadata["name"].removeprefix(f"{agent}.") for e in self._entries.values()
                         if e.owner == agent)
            hint = f"your tasks are: {', '.join(own)}" if own else "you have no scheduled tasks"
            raise _Refused(ErrorCode.INVALID_ARGUMENTS, f"you have no task named {name!r}; {hint}")
        if entry.owner != agent:
            raise _Refused(ErrorCode.REJECTED, f"task {name!r} was not created by you, so you cannot change it")
        return entry

    def _summary(self, entry: _Entry, agent: str, now: datetime.datetime) -> TaskSummary:
        spec = entry.task.spec
        mine = entry.owner == agent
        done = entry.completed or spec.suspend
        prompt = spec.prompt if len(spec.prompt) <= PROMPT_PREVIEW else spec.prompt[: PROMPT_PREVIEW - 1] + "…"
        return TaskSummary(
            name=entry.task.metadata["name"].removeprefix(f"{agent}.") if mine else entry.task.metadata["name"],
            schedule=spec.schedule,
            time_zone=spec.time_zone,
            prompt=prompt,
            run_once=spec.run_once,
            suspend=spec.suspend,
            mine=mine,
            completed=entry.completed,
            next_run=None if done else entry.schedule.next_after(now),
            last_run=entry.last_run,
            last_outcome=entry.last_outcome,
        )

    async def _fire_forever(self, entry: _Entry) -> None:
        task, running = entry.task, entry.running
        instant = datetime.datetime.now(datetime.UTC)
        while True:
            instant = entry.schedule.next_after(instant)
            delay = (instant - datetime.datetime.now(datetime.UTC)).total_seconds()
            await asyncio.sleep(max(0.0, delay))
            if task.spec.suspend:
                continue
            policy = task.spec.concurrency_policy
            if running and policy == "Forbid":
                self._report(task.metadata["name"], None, "skipped: the previous run is still going (Forbid)")
                continue
            if running and policy == "Replace":
                for run in running:
                    run.cancel()
            entry.last_run = instant
            run = asyncio.create_task(self._run(entry, instant))
            running.add(run)
            run.add_done_callback(running.discard)
            if task.spec.run_once:
                entry.completed = True
                await asyncio.gather(run, return_exceptions=True)
                return

    async def _run(self, entry: _Entry, instant: datetime.datetime) -> None:
        task = entry.task
        name = task.metadata["name"]
        request = InboxRequest(
            kind="scheduled_task",
            request_id=f"{name}-{instant:%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}",
            session_id=f"task-{name}",
            content=task.spec.prompt,
            reply_to=self._replies.name,
        )
        try:
            delivery = await self._bus.request(
                queue=agent_inbox(namespace=NAMESPACE, name=task.spec.agent_ref.name),
                body=request,
                reply_queue=self._replies,
                correlation_id=request.request_id,
                timeout_seconds=task.spec.run_timeout_seconds,
                responder=Principal.agent(namespace=NAMESPACE, name=task.spec.agent_ref.name),
            )
            reply = delivery.decode(InboxReply)
            entry.last_outcome = "Succeeded" if reply.error is None else "Failed"
            self._report(name, reply, None)
        except Exception as error:  # a failed run is reported, and the next slot still fires
            entry.last_outcome = "Failed"
            self._report(name, None, f"failed: {error}")


class _SchedulingTools:
    """The `scheduling` set of a local run: the agent's own tools, answered by the local scheduler."""

    def __init__(self, *, scheduler: LocalScheduler) -> None:
        self._scheduler = scheduler

    async def install(self, *, registry: ToolRegistry, kit: ToolKit) -> None:
        async def ask(operation: ScheduleTask | ListTasks | CancelTask) -> SchedulingReply:
            return self._scheduler.answer(agent=kit.config.name, operation=operation)

        for defined in scheduling_tools(ask):
            registry.register(defined)
        kit.guides.add(GUIDE)


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _parsed(task: ScheduledTask) -> CronSchedule:
    return CronSchedule.parse(schedule=task.spec.schedule, time_zone=task.spec.time_zone)
