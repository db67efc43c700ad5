"""What the run store answers: the read API's JSON shapes (the web console and `rockbot runs` read these).

    page = await store.list_runs(filters=RunFilter(namespace="team-a", outcome="Failed"), limit=50)
    for run in page.runs: ...
    more = await store.list_runs(filters=..., cursor=page.next_cursor)
    detail = await store.get_run("3f2a...")   # RunDetail with its timeline, or None
"""

from __future__ import annotations

import base64
import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rockbot.contracts.recording import RecordMode, RunOutcome, RunSource
from rockbot.contracts.scripts import FileName

#: The most runs one page lists, and the most timeline entries one run shows.
MAX_PAGE = 500
MAX_TIMELINE = 5000


class RunFilter(BaseModel):
    """Which runs to list; every field left empty matches everything."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str | None = None
    agent: str | None = None
    source: RunSource | None = None
    outcome: RunOutcome | None = None
    session_id: str | None = None
    #: Who asked (a bus principal, `http`, or `console:<user>` for a person chatting in the console).
    caller: str | None = None
    #: Runs that started at or after `since` and before `until`.
    since: datetime.datetime | None = None
    until: datetime.datetime | None = None


class RunSummary(BaseModel):
    """One run as a list shows it."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    namespace: str
    agent: str
    source: str
    caller: str
    session_id: str
    parent_run_id: str | None
    request_id: str
    trace_id: str
    model: str
    record: RecordMode | str
    started_at: datetime.datetime
    ended_at: datetime.datetime | None
    #: None while the run is still going (or its end was never recorded).
    outcome: RunOutcome | None
    error: str
    prompt_tokens: int
    completion_tokens: int
    tool_calls: int
    expires_at: datetime.datetime


class TimelineEntry(BaseModel):
    """One message, model request, tool call or script run of a run, with its kind's fields in `data`."""

    model_config = ConfigDict(frozen=True)

    event_id: str
    kind: str
    at: datetime.datetime
    name: str
    status: str
    duration_seconds: float | None
    data: dict[str, Any] = Field(default_factory=dict)


class RunDetail(RunSummary):
    timeline: list[TimelineEntry]
    #: Entries left out past `MAX_TIMELINE`.
    timeline_omitted: int = 0
    children: list[str] = Field(default_factory=list)


class RunPage(BaseModel):
    runs: list[RunSummary]
    #: Pass back as `cursor` for the next (older) page; None on the last page.
    next_cursor: str | None = None


class BadCursor(ValueError):
    """A cursor that this store did not hand out."""


def encode_cursor(*, started_at: datetime.datetime, run_id: str) -> str:
    return base64.urlsafe_b64encode(f"{started_at.isoformat()}|{run_id}".encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime.datetime, str]:
    try:
        at, run_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        return datetime.datetime.fromisoformat(at), run_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadCursor(f"cursor={cursor!r} is not one this API handed out: pass next_cursor as it came") from exc


#: Where a conversation's file came from: a person attached it, or a script wrote it under /output.
Origin = Literal["upload", "script", "tool"]


class StoredFile(BaseModel):
    """A file as it is listed (no content)."""

    model_config = ConfigDict(frozen=True)

    id: str
    namespace: str
    agent: str
    caller: str
    session_id: str
    run_id: str
    origin: Origin
    name: FileName
    media_type: str
    size: int
    created_at: datetime.datetime
    expires_at: datetime.datetime
