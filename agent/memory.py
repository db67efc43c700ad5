"""Working memory: where large tool results wait, in chunks, until the model asks for them.

A result longer than the model's threshold (`ModelConfig.max_result_chars`, 16,000 characters by
default) would crowd the context window. It is split (see `chunking`) into entries scoped to the
session, and the model gets an index of keys to read with `get_from_working_memory(key)`.
Entries expire after `DEFAULT_TTL_SECONDS` (20 minutes): long enough for a turn and its follow-up
questions, short enough that a busy agent's memory stays bounded; each session also keeps at
most `max_entries_per_session` entries (oldest dropped first).

Sessions are conversations (`ConversationKey.id`). This process's entries are a cache: each chunk stored
is told to the `observers` (the run recorder keeps it in the run store, under the conversation), and a
key this process does not hold (stored by another replica, or before a restart) is asked of `recall`
(the run store, over the bus), so a conversation's working memory is the same on every replica.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from rockbot.agent.chunking import split_into_chunks

DEFAULT_TTL_SECONDS = 20 * 60
#: What every index `offload` writes says, and nothing else a tool answers is likely to.
_INDEX_MARK = "chunk(s) in working memory for"
#: The most chunks one result is split into: more would make the index itself a burden.
MAX_CHUNKS = 64


class MemoryObserver(Protocol):
    """Told of each chunk stored, with how long it is kept."""

    def __call__(self, *, session_id: str, key: str, value: str, ttl_seconds: float) -> None: ...


#: Asked (session, key) for a chunk this process does not hold; None when nobody keeps it.
Recall = Callable[[str, str], Awaitable[str | None]]


class WorkingMemory:
    def __init__(
        self,
        *,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        max_entries_per_session: int = 512,
        clock: Callable[[], float] = time.monotonic,
        observers: Sequence[MemoryObserver] = (),
        recall: Recall | None = None,
    ):
        self._ttl = ttl_seconds
        self._max_entries = max_entries_per_session
        self._clock = clock
        self._observers = list(observers)
        self._recall = recall
        self._sessions: dict[str, OrderedDict[str, tuple[float, str]]] = {}
        self._next_sweep = 0.0

    def put(self, *, session_id: str, key: str, value: str) -> None:
        """Keep a chunk here and tell the observers (the run store keeps it for the conversation's other turns)."""
        self._keep(session_id=session_id, key=key, value=value)
        for observe in self._observers:
            observe(session_id=session_id, key=key, value=value, ttl_seconds=self._ttl)

    async def read(self, *, session_id: str, key: str) -> str | None:
        """A chunk: this process's, else recalled (another replica's, an earlier pod's) and kept here from then on."""
        value = self.get(session_id=session_id, key=key)
        if value is None and self._recall is not None:
            value = await self._recall(session_id, key)
            if value is not None:
                self._keep(session_id=session_id, key=key, value=value)
        return value

    def _keep(self, *, session_id: str, key: str, value: str) -> None:
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
        """Return `content` if it is short enough, else store it in chunks and return their index.

        Bounded on every side: a chunk is at most `threshold` characters (so reading one back is never
        chunked again), at most `MAX_CHUNKS` are stored and never more than this session's memory keeps
        (so every key handed out is still there), and the index stays within `threshold // 4` characters:
        chunk titles are listed while they fit, the keys always follow one pattern. What does not fit is
        said, not silently lost."""
        if len(content) <= threshold:
            return content
        size = min(threshold, max(threshold // 2, -(-2 * len(content) // MAX_CHUNKS)))
        chunks = split_into_chunks(content, max_chars=size)
        kept = chunks[: min(MAX_CHUNKS, self._max_entries)]
        run = secrets.token_hex(3)
        keys = [f"{run}-{n}" for n in range(len(kept))]
        for key, chunk in zip(keys, kept, strict=True):
            self.put(session_id=session_id, key=key, value=chunk.text)
        stored = sum(len(chunk.text) for chunk in kept)
        lines = [
            f"{tool_name!r} returned {len(content)} characters: {len(kept)} {_INDEX_MARK} "
            f"{self._ttl / 60:g} minutes, keys `{keys[0]}` to `{keys[-1]}`.",
            "Read those you need with get_from_working_memory(key) before concluding.",
        ]
        if len(kept) < len(chunks):
            lines.append(f"Only its first {stored} characters fit ({len(chunks) - len(kept)} chunks left out).")
        budget = threshold // 4 - sum(len(line) + 1 for line in lines)
        rows = [f"{key}: {chunk.title[:60]} ({len(chunk.text)} chars)" for key, chunk in zip(keys, kept, strict=True)]
        shown = []
        for row in rows:
            if budget - len(row) - 1 < 40:  # room left for the line saying how many rows are not shown
                break
            shown.append(row)
            budget -= len(row) + 1
        if shown:
            lines += ["", *shown]
            if len(shown) < len(rows):
                lines.append(f"(and {len(rows) - len(shown)} more, up to `{keys[-1]}`)")
        return "\n".join(lines)


def is_index(message: dict[str, object]) -> bool:
    """Whether a history message is a tool answer that `offload` replaced by an index of chunks (a conversation
    continued from the store, or resent by an OpenAI client, may hold one that another process wrote)."""
    content = message.get("content")
    return message.get("role") == "tool" and isinstance(content, str) and _INDEX_MARK in content
