"""The runs an object starts on an agent, as its status records them: ScheduledTasks and Triggers alike.

A kind adds what names its runs (a slot, a delivery) by subclassing both models and pointing the
active run at its record type; the bookkeeping over them is `rockbot.runs`.
"""

from __future__ import annotations

import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from rockbot.resources.common import Schema

Outcome = Literal["Succeeded", "Failed", "Missed", "Replaced"]
ConcurrencyPolicy = Literal["Allow", "Forbid", "Replace"]
#: A printer column's path to the outcome of the run that ended last (a history is oldest first).
LAST_OUTCOME = ".status.history[-1:].outcome"
LAST_OUTCOME_HELP = "How the run that ended last ended."
#: The longest message or answer summary a record keeps.
TEXT_LIMIT = 1000


class RunRecord(Schema):
    """A run that ended (or never started: Missed, or Failed before it began)."""

    run_id: str
    start_time: datetime.datetime | None = None
    completion_time: datetime.datetime | None = None
    outcome: Outcome
    message: Annotated[str, Field(max_length=1024)] = ""
    summary: Annotated[str, Field(max_length=1024)] = Field(default="", description="The answer, truncated.")
    agent_run: Annotated[str, Field(max_length=64)] = Field(
        default="", description="The agent's turn in the run store: rockbot runs show <agentRun>."
    )


class ActiveRun(Schema):
    """A run sent to the agent, waiting for its answer."""

    record: ClassVar[type[RunRecord]] = RunRecord

    run_id: str
    start_time: datetime.datetime

    def finished(
        self, *, outcome: Outcome, now: datetime.datetime, message: str = "", summary: str = "", agent_run: str = ""
    ) -> RunRecord:
        """This run's history record, ended now (`agent_run`: the agent's recorded turn, when it answered)."""
        return self.record.model_validate(
            {**self.model_dump(), "completion_time": now, "outcome": outcome,
             "message": truncate(message), "summary": truncate(summary), "agent_run": agent_run[:64]}
        )  # fmt: skip


def truncate(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else text[: TEXT_LIMIT - 1] + "…"
