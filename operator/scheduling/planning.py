"""The scheduling decisions, as pure functions of (task, agent, now): no API, no bus, no sleeping.

`plan_task` says what a task's status must become now and which runs to trigger; `complete_run`
records an agent's answer. The firing loop writes the planned status *before* it publishes a
trigger, conditionally on the resourceVersion it read, so a slot belongs to exactly one writer.

The cursor is `status.nextScheduleTime`: the next slot not yet handled. A slot at or before now is
due; of several due slots (downtime), only the latest may fire and the others are recorded once
as Missed, so catching up is never a burst. A spec change (a new generation) re-bases the cursor
on now, so editing or resuming a task never fires a slot from the past.

A run-once task completes when its run starts, not when its slot passes: if the agent is missing
or not Ready (or, with Forbid, a run is still active) the slot waits, with nothing recorded, and
fires as soon as it can; only its starting deadline (startingDeadlineSeconds, or 60 s under the
Skip missed-run policy) ends the wait, with a Missed record. "Remind me in two hours" is not lost
because the agent was rolling out at that moment.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from rockbot import runs
from rockbot.conditions import ConditionUpdate, merge_condition_models
from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.resources.common import Condition
from rockbot.resources.runs import truncate
from rockbot.resources.scheduledtask import ScheduledTaskSpec, ScheduledTaskStatus, SlotRecord, SlotRun
from rockbot.runs import AgentState

#: Without startingDeadlineSeconds, how late a slot may still fire under the Skip missed-run policy.
SKIP_GRACE_SECONDS = 60
#: The kind part of a scheduled run's request id (see `rockbot.runs.request_id`).
KIND = "scheduledtask"
_TICK = datetime.timedelta(microseconds=1)


class Trigger(BaseModel):
    """One run to send to the agent's inbox, after the status that records it has been written."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    task: str
    agent: str
    run_id: str
    scheduled_time: datetime.datetime
    prompt: str

    @property
    def request_id(self) -> str:
        """The inbox request id (and correlation id of the reply): names the task and the run."""
        return runs.request_id(kind=KIND, namespace=self.namespace, name=self.task, run=self.run_id)


class Plan(BaseModel):
    """The status to write (None: unchanged), the runs to trigger after writing it, and when to look again."""

    status: dict[str, Any] | None
    triggers: list[Trigger]
    wake_at: datetime.datetime | None


def run_id(*, uid: str, scheduled_time: datetime.datetime) -> str:
    """Deterministic: the same task and slot give the same id on every replica and after a restart."""
    return runs.run_id(uid=uid, key=f"{scheduled_time.astimezone(datetime.UTC):%Y%m%dT%H%M%SZ}")


def canonical_status(raw: dict[str, Any] | None) -> ScheduledTaskStatus:
    """The stored status as a model; an unreadable one (hand-edited) starts afresh."""
    try:
        return ScheduledTaskStatus.model_validate(raw or {})
    except ValidationError:
        return ScheduledTaskStatus()


def plan_task(*, body: dict[str, Any], agent: AgentState, now: datetime.datetime) -> Plan:
    metadata = body.get("metadata") or {}
    namespace, name, uid = metadata.get("namespace", ""), metadata.get("name", ""), metadata.get("uid", "")
    generation = metadata.get("generation")
    current = canonical_status(body.get("status"))
    status = current.model_copy(deep=True)
    spec_changed = status.observed_generation != generation
    status.observed_generation = generation
    try:
        spec = ScheduledTaskSpec.model_validate(body.get("spec") or {})
    except ValidationError as exc:
        return _invalid(current, status, reason="InvalidSpec", message=str(exc), generation=generation, now=now)
    runs.expire(status, timeout_seconds=spec.run_timeout_seconds, now=now)
    try:
        schedule = CronSchedule.parse(schedule=spec.schedule, time_zone=spec.time_zone)
    except InvalidSchedule as exc:
        reason = "InvalidTimeZone" if exc.field == "timeZone" else "InvalidSchedule"
        return _invalid(current, status, reason=reason, message=str(exc), generation=generation, now=now, spec=spec)
    if spec_changed:
        status.completed = False
        status.next_schedule_time = schedule.next_after(now)
    triggers: list[Trigger] = []
    if spec.suspend or status.completed:
        status.next_schedule_time = None
    elif status.next_schedule_time is None:
        status.next_schedule_time = schedule.next_after(now)
    elif status.next_schedule_time <= now:
        slot = _handle_due(status, spec=spec, schedule=schedule, agent=agent, uid=uid, now=now)
        if slot is not None:
            triggers.append(
                Trigger(
                    namespace=namespace,
                    task=name,
                    agent=spec.agent_ref.name,
                    run_id=slot.run_id,
                    scheduled_time=slot.scheduled_time,
                    prompt=spec.prompt,
                )
            )
    status.conditions = _conditions(
        status,
        spec=spec,
        agent=agent,
        generation=generation,
        now=now,
        valid=ConditionUpdate(
            type="Valid", status="True", reason="ScheduleValid", message=_valid_message(spec, status, schedule)
        ),
    )
    _trim(status, spec=spec)
    return Plan(status=_changed(current, status), triggers=triggers, wake_at=_wake_at(status, spec=spec, now=now))


def active_triggers(*, body: dict[str, Any]) -> list[Trigger]:
    """A trigger for every run the status holds active: what to publish again after a possible loss.

    Same run ids, so the same request ids: the agent's inbox answers a copy it has seen without
    running it again.
    """
    metadata = body.get("metadata") or {}
    try:
        spec = ScheduledTaskSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return []
    return [
        Trigger(
            namespace=metadata.get("namespace", ""),
            task=metadata.get("name", ""),
            agent=spec.agent_ref.name,
            run_id=active.run_id,
            scheduled_time=active.scheduled_time,
            prompt=spec.prompt,
        )
        for active in canonical_status(body.get("status")).active
    ]


def complete_run(
    *, body: dict[str, Any], run_id: str, now: datetime.datetime, answer: str | None, error: str | None,
    agent_run: str = "",
) -> dict[str, Any] | None:
    """The status with `run_id` finished; None when it is not active (already timed out, replaced, or done)."""
    status = canonical_status(body.get("status"))
    if not runs.complete(status, run=run_id, now=now, answer=answer, error=error, agent_run=agent_run):
        return None
    try:
        spec = ScheduledTaskSpec.model_validate(body.get("spec") or {})
    except ValidationError:
        return status.to_wire()
    _trim(status, spec=spec)
    return status.to_wire()


def _handle_due(
    status: ScheduledTaskStatus,
    *,
    spec: ScheduledTaskSpec,
    schedule: CronSchedule,
    agent: AgentState,
    uid: str,
    now: datetime.datetime,
) -> SlotRun | None:
    """Handle every slot from the cursor to now; return the run to start, if any."""
    first = status.next_schedule_time
    assert first is not None
    if spec.run_once:
        latest, status.next_schedule_time = first, None
    else:
        latest, status.next_schedule_time = schedule.due(cursor=first, now=now)
    if spec.run_once:
        status.completed = True
    if latest > first:
        before = schedule.latest_at_or_before(latest - _TICK) or first
        span = f"the slot at {_stamp(first)}"
        if before > first:
            span = f"the slots from {_stamp(first)} to {_stamp(before)}"
        _record(
            status,
            run=run_id(uid=uid, scheduled_time=first),
            scheduled=first,
            outcome="Missed",
            now=now,
            message=f"{span} passed while no operator was firing; only the latest slot is considered",
        )
    run = run_id(uid=uid, scheduled_time=latest)
    late = (now - latest).total_seconds()
    deadline = _starting_deadline(spec)
    if deadline is not None and late > deadline:
        _record(
            status,
            run=run,
            scheduled=latest,
            outcome="Missed",
            now=now,
            message=f"{late:.0f} s late, past the starting deadline of {deadline} s "
            f"(startingDeadlineSeconds, missedRunPolicy {spec.missed_run_policy})",
        )
        return None
    if spec.run_once and (not agent.ready or (status.active and spec.concurrency_policy == "Forbid")):
        # A run-once slot is not lost to a brief outage: it waits (the agent's changes and the end
        # of the active run wake the loop) until it can start or its starting deadline passes.
        status.completed = False
        status.next_schedule_time = latest
        return None
    refusal = agent.refusal(spec.agent_ref.name)
    if refusal is not None:
        _record(status, run=run, scheduled=latest, outcome=refusal[0], now=now, message=refusal[1])
        return None
    started = SlotRun(run_id=run, scheduled_time=latest, start_time=now)
    skipped = runs.start(status, started, policy=spec.concurrency_policy, now=now)
    if skipped is not None:
        _record(status, run=run, scheduled=latest, outcome="Missed", now=now, message=skipped)
        return None
    status.last_schedule_time = latest
    return started


def _record(
    status: ScheduledTaskStatus,
    *,
    run: str,
    scheduled: datetime.datetime,
    outcome: Literal["Failed", "Missed"],
    now: datetime.datetime,
    message: str,
) -> None:
    status.history.append(
        SlotRecord(
            run_id=run, scheduled_time=scheduled, completion_time=now, outcome=outcome, message=truncate(message)
        )
    )


def _trim(status: ScheduledTaskStatus, *, spec: ScheduledTaskSpec) -> None:
    runs.trim(
        status, successful_limit=spec.successful_runs_history_limit, failed_limit=spec.failed_runs_history_limit
    )


def _conditions(
    status: ScheduledTaskStatus,
    *,
    spec: ScheduledTaskSpec | None,
    agent: AgentState,
    generation: int | None,
    now: datetime.datetime,
    valid: ConditionUpdate,
) -> list[Condition]:
    suspended = spec is not None and spec.suspend
    updates = [
        valid,
        ConditionUpdate(
            type="Suspended",
            status="True" if suspended else "False",
            reason="Suspended" if suspended else "Active",
            message="spec.suspend is true: no slot fires" if suspended else "",
        ),
    ]
    updates.append(agent.condition(spec.agent_ref.name if spec is not None else "?"))
    return merge_condition_models(status.conditions, updates, generation=generation, now=now)


def _invalid(
    current: ScheduledTaskStatus,
    status: ScheduledTaskStatus,
    *,
    reason: str,
    message: str,
    generation: int | None,
    now: datetime.datetime,
    spec: ScheduledTaskSpec | None = None,
) -> Plan:
    status.next_schedule_time = None
    status.conditions = _conditions(
        status,
        spec=spec,
        agent=AgentState(exists=True, ready=True),
        generation=generation,
        now=now,
        valid=ConditionUpdate(type="Valid", status="False", reason=reason, message=truncate(message)),
    )
    status.conditions = [condition for condition in status.conditions if condition.type != "AgentReady"]
    return Plan(
        status=_changed(current, status),
        triggers=[],
        wake_at=_wake_at(status, spec=spec, now=now) if spec is not None else None,
    )


def _valid_message(spec: ScheduledTaskSpec, status: ScheduledTaskStatus, schedule: CronSchedule) -> str:
    if status.next_schedule_time is None:
        return f"{spec.schedule!r} in {spec.time_zone}"
    local = status.next_schedule_time.astimezone(schedule.zone)
    return f"{spec.schedule!r} in {spec.time_zone}; next run at {local.isoformat()}"


def _starting_deadline(spec: ScheduledTaskSpec) -> int | None:
    """How late (s) a slot may still start: startingDeadlineSeconds, or the Skip policy's grace."""
    if spec.starting_deadline_seconds is None and spec.missed_run_policy == "Skip":
        return SKIP_GRACE_SECONDS
    return spec.starting_deadline_seconds


def _wake_at(
    status: ScheduledTaskStatus, *, spec: ScheduledTaskSpec, now: datetime.datetime
) -> datetime.datetime | None:
    expiry = runs.next_expiry(status, timeout_seconds=spec.run_timeout_seconds)
    instants = [] if expiry is None else [expiry]
    slot = status.next_schedule_time
    if slot is not None and slot > now:
        instants.append(slot)
    elif slot is not None and (deadline := _starting_deadline(spec)) is not None:
        instants.append(slot + datetime.timedelta(seconds=deadline) + _TICK)  # a waiting run-once slot gives up
    return min(instants, default=None)


def _changed(current: ScheduledTaskStatus, status: ScheduledTaskStatus) -> dict[str, Any] | None:
    wanted = status.to_wire()
    return None if wanted == current.to_wire() else wanted


def _stamp(instant: datetime.datetime) -> str:
    return instant.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
