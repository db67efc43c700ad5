"""When an Evaluation runs, as a pure function of (its object, its Agent's generation, now): no API, no bus, no clock.

Due, in this order:
- a run the status holds `active` when this process first looks at the object: the operator running it stopped
  (SIGKILL, a lost Lease, a rollout) before it ended, so it runs again with the same run id, `attempt` one more; the
  cases the stopped one had sent are not waited for (their replies reach nobody and are dropped);
- a new spec generation (`observedGeneration`), or a new `rockbot.dev/run-requested` value (`runRequested`);
- a slot of `spec.schedule`: the cursor is `status.nextRunTime`, kept as a ScheduledTask's nextScheduleTime is (the
  shared `CronSchedule`): of several slots passed while no operator ran, only the latest runs; a new spec re-bases
  the cursor on now, so applying never runs a slot from the past;
- a generation of the Agent under test other than the one the last run ran against (`agentGeneration`; none when
  the last run was refused because the Agent did not exist, so its appearance starts a run).

The operator writes the returned status (the run `active`) before it sends the first case, conditionally on the
resourceVersion planned from: of two replicas planning the same object, one write wins and the other plans again
from the newer object, where the run is taken. The run's end is written only while the status still holds that
run at that attempt, so a run is counted once in the trend.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.operator.scheduling.planning import run_id
from rockbot.resources import GROUP
from rockbot.resources.evaluation import ActiveEvaluationRun, EvaluationSpec, EvaluationStatus, RunReason

#: Set to any new value to run an Evaluation again with its spec unchanged.
RUN_REQUESTED = f"{GROUP}/run-requested"


@dataclass(frozen=True)
class Claim:
    """The status to write before running `run` (it records the run active)."""

    status: EvaluationStatus
    run: ActiveEvaluationRun

    @property
    def resumed(self) -> bool:
        return self.run.attempt > 1


def schedule_of(spec: EvaluationSpec) -> CronSchedule | None:
    """The parsed `spec.schedule` (None without one); `InvalidSchedule` names the field to fix."""
    if spec.schedule is None:
        return None
    return CronSchedule.parse(schedule=spec.schedule, time_zone=spec.time_zone)


def plan(*, body: dict[str, Any], agent_generation: int | None, now: datetime.datetime,
         recovering: bool) -> Claim | None:  # fmt: skip
    """The run to start now, if any. `recovering`: this process's first look at the object (or after its own run
    failed); only then is a run held active one that nobody runs (later, it is this or another replica's own)."""
    metadata = body.get("metadata") or {}
    try:
        spec = EvaluationSpec.model_validate(body.get("spec") or {})
        current = EvaluationStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return None  # the API server checked both against the CRD: only a hand-edited status gets here
    status = current.model_copy(deep=True)
    if current.active is not None:
        if not recovering:
            return None
        status.active = current.active.model_copy(update={"attempt": current.active.attempt + 1})
        return Claim(status=status, run=status.active)
    generation = metadata.get("generation")
    requested = _requested(metadata)
    spec_changed = current.observed_generation != generation
    try:
        schedule = schedule_of(spec)
    except InvalidSchedule:
        schedule = None  # the run for this spec says why (Ready False, InvalidSchedule)
    if schedule is None:
        status.next_run_time = None
    elif spec_changed or status.next_run_time is None:
        status.next_run_time = schedule.next_after(now)
    reason: RunReason | None = None
    slot: datetime.datetime | None = None
    if spec_changed:
        reason = "Spec"
    elif requested != current.run_requested:
        reason = "Requested"
    elif schedule is not None and current.next_run_time is not None and current.next_run_time <= now:
        reason = "Schedule"
        slot, status.next_run_time = schedule.due(cursor=current.next_run_time, now=now)
    elif agent_generation not in (None, current.agent_generation):
        reason = "AgentChanged"
    if reason is None:
        return None
    status.observed_generation = generation
    status.run_requested = requested
    status.active = ActiveEvaluationRun(run_id=run_id(uid=str(metadata.get("uid", "")), scheduled_time=slot or now),
                                        reason=reason, start_time=now, scheduled_time=slot)  # fmt: skip
    return Claim(status=status, run=status.active)


def wake_at(body: dict[str, Any]) -> datetime.datetime | None:
    """When the next slot of the schedule is due (None without a schedule)."""
    if not (body.get("spec") or {}).get("schedule"):
        return None
    raw = (body.get("status") or {}).get("nextRunTime")
    return datetime.datetime.fromisoformat(raw) if raw else None


def _requested(metadata: dict[str, Any]) -> str:
    return str((metadata.get("annotations") or {}).get(RUN_REQUESTED, ""))
