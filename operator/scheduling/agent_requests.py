"""The operator's side of the agents' scheduling tools: create, update, list and delete their tasks.

An agent may only touch tasks it owns: ones it created through this queue, which carry an owner
reference to the Agent (so they also go when the Agent goes) and the `rockbot.dev/agent` label.
Listing also shows tasks a person applied for the agent, marked as not its own. Scheduling a
name whose run-once task has completed creates it afresh, so it fires again (an unchanged spec
would otherwise change nothing). Every request is
checked (the agent exists, the reply goes to that agent's own queue, cron and zone parse) and
answered, with a coded error saying what to change when it is refused.

Identity is the agent's claim checked against its reply queue: on a broker shared by all agents
that is not proof. Per-agent broker users (RabbitMQ validates the `user_id` property) would be.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from typing import Any

from rockbot.bus import BadMessage, Bus, Delivery, Subscription
from rockbot.bus.topology import OPERATOR_SCHEDULING, scheduling_reply_prefix
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scheduling import (
    CancelTask,
    ListTasks,
    ScheduleTask,
    SchedulingReply,
    SchedulingRequest,
    TaskSummary,
)
from rockbot.kube import AGENTS, SCHEDULED_TASKS, ApiError, Conflict, Invalid, KubeClient, NotFound
from rockbot.operator.scheduling.clock import Clock
from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.resources import GROUP, VERSION

log = logging.getLogger(__name__)

AGENT_LABEL = f"{GROUP}/agent"
TASK_LABEL = f"{GROUP}/task"
PROMPT_PREVIEW = 200


class Refused(Exception):
    """A request the operator will not carry out; becomes the reply's `error`."""

    def __init__(self, code: ErrorCode, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.info = ErrorInfo(code=code, message=message, retryable=retryable)


def task_resource_name(*, agent: str, name: str) -> str:
    """`<agent>.<name>`: agents' names have no dots, so two agents' tasks can never collide."""
    return f"{agent}.{name}"


class SchedulingRequests:
    """Consumes `operator.scheduling` and answers every request on the requesting agent's reply queue."""

    def __init__(self, *, kube: KubeClient, bus: Bus, clock: Clock) -> None:
        self._kube = kube
        self._bus = bus
        self._clock = clock
        self._subscription: Subscription | None = None

    async def start(self) -> None:
        self._subscription = await self._bus.consume(queue=OPERATOR_SCHEDULING, handler=self._handle, prefetch=8)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()
            self._subscription = None

    async def _handle(self, delivery: Delivery) -> None:
        if not delivery.reply_to:
            log.warning("dropping a scheduling request without reply_to (%s)", delivery.message_id)
            return
        try:
            request = delivery.decode(SchedulingRequest)
            reply = await self.serve(request, reply_to=delivery.reply_to)
        except BadMessage as exc:
            reply = self._error(ErrorInfo(code=ErrorCode.INVALID_ARGUMENTS, message=str(exc)))
        except Refused as refused:
            reply = self._error(refused.info)
        except ApiError as exc:
            reply = self._error(
                ErrorInfo(
                    code=ErrorCode.UNAVAILABLE,
                    retryable=True,
                    message=f"the Kubernetes API refused the operator: {exc}",
                )
            )
        await self._bus.reply(to=delivery, body=reply)

    async def serve(self, request: SchedulingRequest, *, reply_to: str) -> SchedulingReply:
        namespace, agent_name = request.agent.split("/")
        if not reply_to.startswith(scheduling_reply_prefix(namespace=namespace, name=agent_name)):
            raise Refused(
                ErrorCode.REJECTED,
                f"agent {request.agent} must ask for replies on its own scheduling queue, not {reply_to!r}",
            )
        try:
            agent = await self._kube.get(AGENTS, namespace=namespace, name=agent_name)
        except NotFound:
            raise Refused(ErrorCode.REJECTED, f"there is no Agent {request.agent}") from None
        operation = request.operation
        if isinstance(operation, ScheduleTask):
            task = await self._schedule(agent, operation)
            return SchedulingReply(now=self._clock.now(), task=_summary(task, agent=agent, now=self._clock.now()))
        if isinstance(operation, CancelTask):
            task = await self._cancel(agent, operation)
            return SchedulingReply(now=self._clock.now(), task=_summary(task, agent=agent, now=self._clock.now()))
        assert isinstance(operation, ListTasks)
        listing = await self._kube.list(SCHEDULED_TASKS, namespace=namespace)
        tasks = [item for item in listing.items if _targets(item, agent_name)]
        tasks.sort(key=lambda item: item["metadata"]["name"])
        now = self._clock.now()
        return SchedulingReply(now=now, tasks=[_summary(task, agent=agent, now=now) for task in tasks])

    async def _schedule(self, agent: dict[str, Any], operation: ScheduleTask) -> dict[str, Any]:
        try:
            CronSchedule.parse(schedule=operation.cron, time_zone=operation.time_zone)
        except InvalidSchedule as exc:
            field = "time_zone" if exc.field == "timeZone" else "cron"
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"{field}: {exc.message}") from None
        metadata = agent["metadata"]
        name = task_resource_name(agent=metadata["name"], name=operation.name)
        spec = {
            "agentRef": {"name": metadata["name"]},
            "schedule": operation.cron,
            "timeZone": operation.time_zone,
            "prompt": operation.prompt,
            "runOnce": operation.run_once,
        }
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "ScheduledTask",
            "metadata": {
                "name": name,
                "namespace": metadata["namespace"],
                "labels": {AGENT_LABEL: metadata["name"], TASK_LABEL: operation.name},
                "ownerReferences": [
                    {
                        "apiVersion": f"{GROUP}/{VERSION}",
                        "kind": "Agent",
                        "name": metadata["name"],
                        "uid": metadata["uid"],
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": spec,
        }
        try:
            return await self._kube.create(SCHEDULED_TASKS, namespace=metadata["namespace"], body=body)
        except Invalid as exc:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"the task was rejected: {exc.message}") from None
        except Conflict:
            pass
        existing = await self._owned(agent, name=operation.name)
        if (existing.get("status") or {}).get("completed"):
            return await self._recreate(existing, body=body)
        try:
            return await self._kube.patch(
                SCHEDULED_TASKS,
                namespace=metadata["namespace"],
                name=name,
                body={"metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]}, "spec": spec},
            )
        except Invalid as exc:
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"the task was rejected: {exc.message}") from None
        except Conflict:
            raise Refused(
                ErrorCode.UNAVAILABLE, f"task {operation.name!r} changed meanwhile; try again", retryable=True
            ) from None

    async def _recreate(self, existing: dict[str, Any], *, body: dict[str, Any]) -> dict[str, Any]:
        """A completed run-once task scheduled again is a new task: a new uid, so new run ids, and it fires."""
        metadata = existing["metadata"]
        with contextlib.suppress(NotFound):
            await self._kube.delete(
                SCHEDULED_TASKS,
                namespace=metadata["namespace"],
                name=metadata["name"],
                preconditions_uid=metadata["uid"],
            )
        try:
            return await self._kube.create(SCHEDULED_TASKS, namespace=metadata["namespace"], body=body)
        except Conflict:
            raise Refused(
                ErrorCode.UNAVAILABLE, f"the completed task {metadata['name']!r} is still being removed; try again",
                retryable=True,
            ) from None

    async def _cancel(self, agent: dict[str, Any], operation: CancelTask) -> dict[str, Any]:
        task = await self._owned(agent, name=operation.name)
        with contextlib.suppress(NotFound):
            await self._kube.delete(
                SCHEDULED_TASKS,
                namespace=task["metadata"]["namespace"],
                name=task["metadata"]["name"],
                preconditions_uid=task["metadata"]["uid"],
            )
        return task

    async def _owned(self, agent: dict[str, Any], *, name: str) -> dict[str, Any]:
        """The agent's own task by the name it gave it; a clear refusal for anything else."""
        metadata = agent["metadata"]
        try:
            task = await self._kube.get(
                SCHEDULED_TASKS,
                namespace=metadata["namespace"],
                name=task_resource_name(agent=metadata["name"], name=name),
            )
        except NotFound:
            listing = await self._kube.list(
                SCHEDULED_TASKS, namespace=metadata["namespace"], label_selector=f"{AGENT_LABEL}={metadata['name']}"
            )
            own = sorted(
                item["metadata"]["labels"].get(TASK_LABEL, "") for item in listing.items if _owned_by(item, agent)
            )
            hint = f"your tasks are: {', '.join(own)}" if own else "you have no scheduled tasks"
            raise Refused(ErrorCode.INVALID_ARGUMENTS, f"you have no task named {name!r}; {hint}") from None
        if not _owned_by(task, agent):
            raise Refused(ErrorCode.REJECTED, f"task {name!r} was not created by you, so you cannot change it")
        return task

    def _error(self, info: ErrorInfo) -> SchedulingReply:
        return SchedulingReply(now=self._clock.now(), error=info)


def _targets(task: dict[str, Any], agent_name: str) -> bool:
    return ((task.get("spec") or {}).get("agentRef") or {}).get("name") == agent_name


def _owned_by(task: dict[str, Any], agent: dict[str, Any]) -> bool:
    owners = task["metadata"].get("ownerReferences") or []
    return any(owner.get("kind") == "Agent" and owner.get("uid") == agent["metadata"]["uid"] for owner in owners)


def _summary(task: dict[str, Any], *, agent: dict[str, Any], now: datetime.datetime) -> TaskSummary:
    spec = task.get("spec") or {}
    status = task.get("status") or {}
    next_run = status.get("nextScheduleTime")
    if status.get("observedGeneration") != task["metadata"].get("generation"):
        next_run = _next_run(spec, now=now)  # the operator has not planned this version yet
    mine = _owned_by(task, agent)
    history = status.get("history") or []
    valid = next((c for c in status.get("conditions") or [] if c.get("type") == "Valid"), None)
    prompt = str(spec.get("prompt", ""))
    return TaskSummary(
        name=(task["metadata"].get("labels") or {}).get(TASK_LABEL, task["metadata"]["name"])
        if mine
        else task["metadata"]["name"],
        schedule=spec.get("schedule", ""),
        time_zone=spec.get("timeZone", "UTC"),
        prompt=prompt if len(prompt) <= PROMPT_PREVIEW else prompt[: PROMPT_PREVIEW - 1] + "…",
        run_once=bool(spec.get("runOnce", False)),
        suspend=bool(spec.get("suspend", False)),
        mine=mine,
        completed=bool(status.get("completed", False)),
        next_run=next_run,
        last_run=status.get("lastScheduleTime"),
        last_outcome=history[-1].get("outcome") if history else None,
        problem=valid.get("message") if valid is not None and valid.get("status") == "False" else None,
    )


def _next_run(spec: dict[str, Any], *, now: datetime.datetime) -> datetime.datetime | None:
    if spec.get("suspend"):
        return None
    try:
        schedule = CronSchedule.parse(schedule=spec.get("schedule", ""), time_zone=spec.get("timeZone", "UTC"))
        return schedule.next_after(now)
    except InvalidSchedule:
        return None
