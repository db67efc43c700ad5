"""Progress events a caller can follow while the agent works: text as it streams, tools as they run.

`AgentRuntime.chat(..., on_event=...)` passes each one to the callback as it happens, so a chat
UI can show the answer being written and which tools are running.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rockbot.contracts.errors import ErrorInfo


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
EventSink = Callable[[Event], Awaitable[None] | None]


async def emit(sink: EventSink | None, event: Event) -> None:
    """Deliver an event to a sync or async callback."""
    if sink is None:
        return
    result: Any = sink(event)
    if result is not None:
        await result
