"""The ScheduledTask resource: a prompt sent to an Agent on a cron schedule, exactly once per slot."""

from __future__ import annotations

import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from rockbot.resources.common import Condition, KubeName, LocalObjectReference, PrinterColumn, Resource, Schema
from rockbot.resources.runs import LAST_OUTCOME, LAST_OUTCOME_HELP, ActiveRun, ConcurrencyPolicy, RunRecord

#: Five fields (minute), six fields (seconds first), or a macro such as @hourly.
CRON = (
    r"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)"
    r"|(\S+\s+){4}\S+|(\S+\s+){5}\S+)$"
)


class ScheduledTaskSpec(Schema):
    agent_ref: LocalObjectReference = Field(description="The Agent that runs the task, in this namespace.")
    schedule: Annotated[str, Field(pattern=CRON, max_length=256)] = Field(
        description="Cron: 5 fields (minute), 6 fields (second first), or @hourly-style macros."
    )
    time_zone: Annotated[str, Field(pattern=r"^[A-Za-z0-9_+\-/]{1,64}$")] = Field(
        default="UTC", description="IANA time zone, e.g. Europe/Berlin."
    )
    prompt: Annotated[str, Field(min_length=1, max_length=100_000)] = Field(
        description="What the agent is asked at each run."
    )
    suspend: bool = Field(default=False, description="While true no slot starts a run.")
    concurrency_policy: ConcurrencyPolicy = Field(
        default="Forbid",
        description="While an earlier run goes: Allow, Forbid (skip the slot) or Replace (ignore the earlier answer).",
    )
    starting_deadline_seconds: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="How late a slot may still start; later it is Missed. Omit for no deadline."
    )
    missed_run_policy: Literal["Skip", "RunOnce"] = Field(
        default="RunOnce", description="After downtime: skip missed slots, or run the latest one once."
    )
    run_once: bool = Field(default=False, description="Fire at the next slot only, then mark Complete.")
    run_timeout_seconds: Annotated[int, Field(ge=1, le=86_400)] = Field(
        default=600, description="Longest a run may take; then it is Failed."
    )
    successful_runs_history_limit: Annotated[int, Field(ge=0, le=100)] = Field(
        default=3, description="Successful runs kept in status.history."
    )
    failed_runs_history_limit: Annotated[int, Field(ge=0, le=100)] = Field(
        default=1, description="Failed runs, and separately skipped slots, kept in status.history."
    )


class SlotRecord(RunRecord):
    scheduled_time: datetime.datetime


class SlotRun(ActiveRun):
    record: ClassVar[type[RunRecord]] = SlotRecord

    scheduled_time: datetime.datetime


class ScheduledTaskStatus(Schema):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    last_schedule_time: datetime.datetime | None = None
    next_schedule_time: datetime.datetime | None = None
    active: list[SlotRun] = Field(default_factory=list)
    history: list[SlotRecord] = Field(default_factory=list)
    completed: bool = False


class ScheduledTask(Resource):
    kind: ClassVar[str] = "ScheduledTask"
    plural: ClassVar[str] = "scheduledtasks"
    short_names: ClassVar[list[str]] = ["st"]
    printer_columns: ClassVar[list[PrinterColumn]] = [
        PrinterColumn(name="Agent", type="string", json_path=".spec.agentRef.name"),
        PrinterColumn(name="Schedule", type="string", json_path=".spec.schedule"),
        PrinterColumn(name="Zone", type="string", json_path=".spec.timeZone"),
        PrinterColumn(name="Suspend", type="boolean", json_path=".spec.suspend"),
        PrinterColumn(name="Last", type="date", json_path=".status.lastScheduleTime"),
        PrinterColumn(name="Outcome", type="string", json_path=LAST_OUTCOME, description=LAST_OUTCOME_HELP),
        # A string, not a date: kubectl prints a date column as an age, and a future time as <invalid>.
        PrinterColumn(name="Next", type="string", json_path=".status.nextScheduleTime"),
        PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),
    ]

    api_version: str = "rockbot.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ScheduledTaskSpec
    status: ScheduledTaskStatus | None = None


__all__ = ["KubeName", "ScheduledTask", "ScheduledTaskSpec", "ScheduledTaskStatus"]
