"""Progress events a caller can follow while the agent works: text as it streams, tools as they run.

`AgentRuntime.chat(..., on_event=...)` passes each one to the callback as it happens, so a chat
UI can show the answer being written and which tools are running. The events themselves are a contract
(`rockbot.contracts.progress`): the inbox relays them over the bus to a caller that asks for them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from rockbot.contracts.progress import (
    ApprovalDecided,
    ApprovalRequested,
    Event,
    TextDelta,
    ToolFinished,
    ToolStarted,
)

__all__ = ["ApprovalDecided", "ApprovalRequested", "Event", "EventSink", "TextDelta", "ToolFinished", "ToolStarted",
           "emit"]

EventSink = Callable[[Event], Awaitable[None] | None]


async def emit(sink: EventSink | None, event: Event) -> None:
    """Deliver an event to a sync or async callback."""
    if sink is None:
        return
    result: Any = sink(event)
    if result is not None:
        await result
