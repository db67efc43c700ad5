"""Conversations kept in memory per `ConversationKey.id` (agent, caller, session id), bounded so a
long-lived agent cannot grow without end.

Two bounds: each conversation keeps at most `max_messages` messages (older turns are dropped
whole, at a user message, so an assistant's tool calls are never separated from their `role:
tool` answers, which providers reject), and at most `max_sessions` conversations are kept (the
least recently used is forgotten). The system prompt is not stored: it is prepended per request.
This process's copy: when the run store is there (`recording.SessionHistory`), a turn starts from the
recorded history instead (every replica's turns, an earlier pod's), and this copy is the fallback.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

Message = dict[str, Any]


class Conversations:
    def __init__(self, *, max_messages: int = 200, max_sessions: int = 1000):
        if max_messages < 2:
            raise ValueError(f"max_messages must be at least 2, got {max_messages}")
        self._max_messages = max_messages
        self._max_sessions = max_sessions
        self._histories: OrderedDict[str, list[Message]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def max_messages(self) -> int:
        return self._max_messages

    def history(self, session_id: str) -> list[Message]:
        """A copy of the session's messages (empty for a new session)."""
        return list(self._histories.get(session_id, ()))

    def lock(self, session_id: str) -> asyncio.Lock:
        """Turns of one session run one after another; different sessions run side by side."""
        return self._locks.setdefault(session_id, asyncio.Lock())

    def save(self, session_id: str, messages: list[Message]) -> None:
        self._histories[session_id] = trimmed(messages, self._max_messages)
        self._histories.move_to_end(session_id)
        while len(self._histories) > self._max_sessions:
            forgotten, _ = self._histories.popitem(last=False)
            lock = self._locks.get(forgotten)
            if lock is not None and not lock.locked():
                del self._locks[forgotten]

    def __len__(self) -> int:
        return len(self._histories)


def trimmed(messages: list[Message], limit: int) -> list[Message]:
    """The newest `limit` messages at most, starting at a user message (a turn is never cut in two)."""
    if len(messages) <= limit:
        return list(messages)
    start = len(messages) - limit
    while start < len(messages) and messages[start].get("role") != "user":
        start += 1
    if start == len(messages):  # one enormous turn: keep its tail from the last user message
        starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        start = starts[-1] if starts else len(messages) - 1
    return list(messages[start:])
