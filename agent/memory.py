"""Working memory: where large tool results wait, in chunks, until the model asks for them.

A result longer than the model's threshold (`ModelConfig.max_result_chars`, 16,000 characters by
default) would crowd the context window. It is split (see `chunking`) into entries scoped to the
session, and the model gets an index table of keys to read with `get_from_working_memory(key)`.
Entries expire after `DEFAULT_TTL_SECONDS` (20 minutes): long enough for a turn and its follow-up
questions, short enough that a busy agent's memory stays bounded; each session also keeps at
most `max_entries_per_session` entries (oldest dropped first).
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable

from rockbot.agent.chunking import split_into_chunks

DEFAULT_TTL_SECONDS = 20 * 60


class WorkingMemory:
    def __init__(
        self,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        max_entries_per_session: int = 512,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._ttl = ttl_seconds
        self._max_entries = max_entries_per_session
        self._clock = clock
        self._sessions: dict[str, OrderedDict[str, tuple[float, str]]] = {}
        self._next_sweep = 0.0

    def put(self, *, session_id: str, key: str, value: str) -> None:
        self._expire()
        entries = self._sessions.setdefault(session_id, OrderedDict())
        entries[key] = (self._clock() + self._ttl, value)
        entries.move_to_end(key)
        while len(entries) > self._max_entries:
            entries.popitem(last=False)

    def get(self, *, session_id: str, key: str) -> str | None:
        self._expire()
        entry = self._sessions.get(session_id, {}).get(key)
        if entry is None or entry[0] <= self._clock():
            return None
        return entry[1]

    def keys(self, *, session_id: str) -> list[str]:
        now = self._clock()
        return [key for key, (deadline, _) in self._sessions.get(session_id, {}).items() if deadline > now]

    def _expire(self) -> None:
        """Drop expired entries, at most once every few seconds (a full sweep walks every entry)."""
        now = self._clock()
        if now < self._next_sweep:
            return
        self._next_sweep = now + 5.0
        for session_id in list(self._sessions):
            entries = self._sessions[session_id]
            for key in [k for k, (deadline, _) in entries.items() if deadline <= now]:
                del entries[key]
            if not entries:
                del self._sessions[session_id]

    def offload(self, *, session_id: str, tool_name: str, content: str, threshold: int) -> str:
        """Return `content` if it is short enough, else store it in chunks and return the index table."""
        if len(content) <= threshold:
            return content
        chunks = split_into_chunks(content, max_chars=max(threshold // 2, 1))
        run = secrets.token_hex(3)
        rows = []
        for n, chunk in enumerate(chunks):
            key = f"tool:{tool_name}:{run}:chunk{n}"
            self.put(session_id=session_id, key=key, value=chunk.text)
            heading = chunk.heading.replace("|", "\\|")[:80]
            rows.append(f"| {n} | {heading} | {len(chunk.text)} | `{key}` |")
        minutes = self._ttl / 60
        return "\n".join(
            [
                f"The result of {tool_name!r} is large ({len(content)} characters), so it was split into "
                f"{len(chunks)} chunk(s) kept in working memory for {minutes:g} minutes.",
                "Call get_from_working_memory(key) for each chunk you need before drawing conclusions.",
                "",
                "| # | Heading | Characters | Key |",
                "|---|---------|------------|-----|",
                *rows,
            ]
        )
