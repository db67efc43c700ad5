"""What an agent tells its caller while a turn runs: text as it streams, tools as they start and end, approvals.

In process, `AgentRuntime.chat(..., on_event=...)` hands each event to a callback; over the bus, an inbox
request that asks for `progress` gets them as `TurnProgress` messages on its reply queue before the
`InboxReply` (the console relays them to a person's browser). Everything in them is the model's or a
tool's output: hostile text to whoever shows it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from rockbot.contracts.errors import ErrorInfo

SCHEMA_VERSION = 1
#: The longest `TurnProgress` message a requester reads (a longer one is dropped unread); the sender keeps each
#: within it by sending a text in pieces of at most `MAX_PROGRESS_CHARS` and cutting a tool's arguments there.
MAX_PROGRESS_BYTES = 1024 * 1024
MAX_PROGRESS_CHARS = 65_536


class TextDelta(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["text"] = "text"
    text: str


class ToolStarted(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["tool_started"] = "tool_started"
    call_id: str
    name: str
    arguments: str


class ToolFinished(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["tool_finished"] = "tool_finished"
    call_id: str
    name: str
    error: ErrorInfo | None = None
    duration_seconds: float

    @property
    def ok(self) -> bool:
        return self.error is None


class ApprovalRequested(BaseModel):
    """A call waits for a person's approval (it started; it runs only once approved)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["approval_requested"] = "approval_requested"
    call_id: str
    name: str
    approval_id: str
    timeout_seconds: float


class ApprovalDecided(BaseModel):
    """How the wait ended: `approved`, `denied` (by a person, with a reason) or `timed_out` (then on_timeout)."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["approval_decided"] = "approval_decided"
    call_id: str
    name: str
    approval_id: str
    outcome: Literal["approved", "denied", "timed_out"]
    runs: bool
    decided_by: str = ""
    reason: str = ""


Event = TextDelta | ToolStarted | ToolFinished | ApprovalRequested | ApprovalDecided


class TurnProgress(BaseModel):
    """One step of a turn in flight, sent to the requester's reply queue (correlation id: the request's id).

    `seq` counts from 0 per turn, so a receiver can tell a gap (a message lost with a connection) from order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: Annotated[str, Field(min_length=1, max_length=256)]
    seq: Annotated[int, Field(ge=0)]
    event: Annotated[Event, Field(discriminator="kind")]
