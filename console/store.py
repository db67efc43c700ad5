"""The run store: writes agents' run events once each, answers the read API and session histories, forgets old runs.

    store = await Store.open(url="postgresql+asyncpg://console:...@db/rockbot")   # or sqlite+aiosqlite:///runs.db
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=[...])])
    page = await store.list_runs(filters=RunFilter(agent="triage"))

Opening runs Alembic's migrations once, under a lock (PostgreSQL: an advisory lock, so replicas
starting together migrate one after another; SQLite: a lock file beside the database), so the
schema is the code's before anything reads or writes.

Writing is idempotent: a run's row is upserted by its id only while it belongs to the sender (a
run id another agent already holds is refused), a timeline event is inserted once by (run, event
id). A run recorded as `Metadata` keeps no text of messages, arguments, results or output, whatever
its agent sent. A whole `write` is one transaction: the caller acks its messages after it returns.
"""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import logging
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Self, TypeVar

from alembic import command
from alembic.config import Config
from pydantic import BaseModel, ConfigDict
from sqlalchemy import Connection, bindparam, delete, func, select, text, tuple_, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from rockbot.console.sqlite_engine import create_engine as sqlite_engine
from rockbot.console.store_models import (
    MAX_PAGE,
    MAX_TIMELINE,
    RunDetail,
    RunFilter,
    RunPage,
    RunSummary,
    TimelineEntry,
    decode_cursor,
    encode_cursor,
)
from rockbot.console.store_schema import conversation_files, run_events, runs, working_memory
from rockbot.contracts.recording import (
    ApprovalRecorded,
    HistoryReply,
    MemoryStored,
    MessageRecorded,
    ModelRequested,
    RunEnded,
    RunEvent,
    RunStarted,
    TimelineEvent,
    ToolCalled,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

MIGRATIONS = pathlib.Path(__file__).parent / "migrations"
#: The advisory lock key the migrations hold on PostgreSQL ("rockbot" in ASCII, as a number).
MIGRATION_LOCK = 0x726F636B626F74
DEFAULT_RETENTION_DAYS = 30
#: How many of a session's newest runs its history is read from.
HISTORY_RUNS = 100
_TEXT_FIELDS = {"message": ("content",), "tool_call": ("arguments", "result"), "script_run": ("stdout", "stderr"),
                "approval": ("reason",)}


def _history_query() -> Any:
    """A session's recorded messages (newest `HISTORY_RUNS` Full, Succeeded runs), built once: what a chat turn waits
    for, where building the statement and its cache key cost more than the database's answer."""
    recent = (
        select(runs.c.run_id, runs.c.started_at)
        .where(
            runs.c.namespace == bindparam("namespace"), runs.c.agent == bindparam("agent"),
            runs.c.session_id == bindparam("session_id"), runs.c.caller == bindparam("caller"),
            runs.c.record == "Full", runs.c.outcome == "Succeeded",
        )
        .order_by(runs.c.started_at.desc()).limit(HISTORY_RUNS)
        .subquery()
    )  # fmt: skip
    return (
        select(run_events.c.run_id, run_events.c.body, run_events.c.name)
        .join(recent, recent.c.run_id == run_events.c.run_id)
        .where(run_events.c.kind == "message")
        .order_by(recent.c.started_at, run_events.c.at, run_events.c.id)
    )


_HISTORY = _history_query()


class StoreUnavailable(Exception):
    """The database cannot be reached or refused the work; the same work may succeed later."""


class Batch(BaseModel):
    """Events one agent sent (the agent is the broker-validated sender, never a field of the events)."""

    model_config = ConfigDict(frozen=True)

    namespace: str
    agent: str
    events: Sequence[RunEvent]


class Written(BaseModel):
    """What a `write` did: timeline events new to the store, timeline events it already had (run starts and ends
    are upserts, counted in neither), events refused (another agent's run)."""

    written: int = 0
    duplicates: int = 0
    refused: int = 0


def database_url(url: str) -> str:
    """`url` with the async driver this store uses (`postgresql://` → asyncpg, `sqlite://` → aiosqlite)."""
    parsed = make_url(url)
    driver = {"postgresql": "postgresql+asyncpg", "postgres": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}
    if parsed.drivername in driver:
        parsed = parsed.set(drivername=driver[parsed.drivername])
    if parsed.drivername not in ("postgresql+asyncpg", "sqlite+aiosqlite"):
        raise ValueError(
            f"database URL scheme {parsed.drivername!r} is not supported: use postgresql://USER:PASSWORD@HOST/DB "
            "or sqlite:///PATH"
        )
    return parsed.render_as_string(hide_password=False)


def redacted(url: str) -> str:
    """The URL with its password hidden, for logs and errors."""
    return make_url(url).render_as_string(hide_password=True)


class Store:
    def __init__(self, *, engine: AsyncEngine) -> None:
        self.engine = engine
        self._reads = engine.execution_options(isolation_level="AUTOCOMMIT")
        self.dialect = engine.dialect.name
        self._insert = postgresql.insert if self.dialect == "postgresql" else sqlite.insert

    @classmethod
    async def open(cls, *, url: str, migrate: bool = True, pool_size: int = 5) -> Self:
        """Connect (and migrate, under the lock); `StoreUnavailable` when the database cannot be reached."""
        url = database_url(url)
        if url.startswith("sqlite"):
            path = make_url(url).database
            if path and path != ":memory:":
                pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
            engine = sqlite_engine(url)
        else:
            engine = create_async_engine(url, pool_size=pool_size)
        store = cls(engine=engine)
        if migrate:
            try:
                await store.migrate()
            except BaseException:
                await engine.dispose()
                raise
        return store

    async def close(self) -> None:
        await self.engine.dispose()

    async def migrate(self) -> None:
        """Bring the schema to the newest revision; one process at a time does it."""
        if self.dialect == "postgresql":
            async with self._connection() as connection:
                await connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
                await connection.commit()
                try:
                    await connection.run_sync(_upgrade)
                finally:
                    await connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
                    await connection.commit()
        else:  # the lock first: a connection's first statements (WAL) need the database that a migration holds
            async with _file_lock(make_url(self.engine.url).database), self._connection() as connection:
                await connection.run_sync(_upgrade)

    # -- writing ----------------------------------------------------------------------------------

    async def write(self, *, batches: Sequence[Batch]) -> Written:
        """Write every batch in one transaction (each event at most once); `StoreUnavailable` on a database failure."""
        result = Written()
        merged: dict[tuple[str, str], list[RunEvent]] = {}
        for batch in batches:  # one set of statements per agent, however many of its messages the batch holds
            merged.setdefault((batch.namespace, batch.agent), []).extend(batch.events)
        batches = [Batch(namespace=ns, agent=agent, events=events) for (ns, agent), events in merged.items()]
        async with self._connection() as connection, connection.begin():
            for batch in batches:
                counts = await self._write_one(connection, batch)
                result.written += counts.written
                result.duplicates += counts.duplicates
                result.refused += counts.refused
        return result

    async def _write_one(self, connection: AsyncConnection, batch: Batch) -> Written:
        owner = {"namespace": batch.namespace, "agent": batch.agent}
        started = [e for e in batch.events if isinstance(e, RunStarted)]
        if started:
            rows = [{**owner, **_run_row(e)} for e in started]
            statement = self._insert(runs)
            changed = {k: statement.excluded[k] for k in rows[0] if k not in ("run_id", "namespace", "agent")}
            await connection.execute(
                statement.on_conflict_do_update(
                    index_elements=["run_id"], set_=changed,
                    where=(runs.c.namespace == batch.namespace) & (runs.c.agent == batch.agent),
                ),
                rows,
            )  # fmt: skip
        others = {e.run_id: e.at for e in batch.events if not isinstance(e, RunStarted)}
        if others:  # a run whose start is not (yet) here: a row to hang its events on
            placeholders = [
                {**owner, "run_id": run_id, "started_at": at,
                 "expires_at": at + datetime.timedelta(days=DEFAULT_RETENTION_DAYS)}
                for run_id, at in others.items()
            ]  # fmt: skip
            await connection.execute(self._insert(runs).on_conflict_do_nothing(index_elements=["run_id"]), placeholders)
        run_ids = {e.run_id for e in batch.events}
        owned = {
            row.run_id: row.record
            for row in await connection.execute(
                select(runs.c.run_id, runs.c.record).where(
                    runs.c.run_id.in_(run_ids), runs.c.namespace == batch.namespace, runs.c.agent == batch.agent
                )
            )
        }
        counts = Written(refused=sum(1 for e in batch.events if e.run_id not in owned))
        if counts.refused:
            log.warning("refusing %d events of %s/%s for runs that belong to another agent",
                        counts.refused, batch.namespace, batch.agent)  # fmt: skip
        timeline = [
            _event_row(e, record=owned[e.run_id])
            for e in batch.events
            if e.run_id in owned and not isinstance(e, RunStarted | RunEnded | MemoryStored)
        ]
        if timeline:
            statement = self._insert(run_events).on_conflict_do_nothing(index_elements=["run_id", "event_id"])
            inserted = await connection.execute(statement.returning(run_events.c.id), timeline)
            new = len(inserted.all())
            counts.written += new
            counts.duplicates += len(timeline) - new
        memory = [  # text, so only a Full run's
            {"run_id": e.run_id, "key": e.key, "content": e.content, "content_cut": e.content_cut, "stored_at": e.at,
             "expires_at": e.at + datetime.timedelta(seconds=e.ttl_seconds)}
            for e in batch.events if isinstance(e, MemoryStored) and owned.get(e.run_id) == "Full"
        ]  # fmt: skip
        if memory:
            statement = self._insert(working_memory).on_conflict_do_nothing(index_elements=["run_id", "key"])
            inserted = await connection.execute(statement.returning(working_memory.c.key), memory)
            new = len(inserted.all())
            counts.written += new
            counts.duplicates += len(memory) - new
        ended = [
            {"ended_run": e.run_id, "ended_at": e.at, "outcome": e.outcome, "error": e.error,
             "prompt_tokens": e.prompt_tokens, "completion_tokens": e.completion_tokens, "tool_calls": e.tool_calls}
            for e in batch.events if isinstance(e, RunEnded) and e.run_id in owned
        ]  # fmt: skip
        if ended:
            await connection.execute(
                update(runs).where(runs.c.run_id == bindparam("ended_run")).values(
                    {name: bindparam(name) for name in ended[0] if name != "ended_run"}
                ),
                ended,
            )  # fmt: skip
        return counts

    # -- reading ----------------------------------------------------------------------------------

    async def list_runs(
        self, *, filters: RunFilter | None = None, limit: int = 50, cursor: str | None = None
    ) -> RunPage:
        """Runs matching `filters`, newest first, `limit` at a time; `BadCursor` for a cursor not handed out here."""
        limit = max(1, min(limit, MAX_PAGE))
        query = select(runs).where(*_conditions(filters or RunFilter()))
        if cursor:
            at, run_id = decode_cursor(cursor)
            query = query.where(tuple_(runs.c.started_at, runs.c.run_id) < tuple_(at, run_id))
        query = query.order_by(runs.c.started_at.desc(), runs.c.run_id.desc()).limit(limit + 1)
        rows = await self._read(lambda connection: _mappings(connection, query))
        page = [RunSummary.model_validate(dict(row)) for row in rows[:limit]]
        last = page[-1] if len(rows) > limit else None
        return RunPage(runs=page, next_cursor=last and encode_cursor(started_at=last.started_at, run_id=last.run_id))

    async def get_run(self, run_id: str) -> RunDetail | None:
        """One run with its timeline (oldest first, at most `MAX_TIMELINE` entries) and its child runs' ids."""
        return await self._read(lambda connection: _run(connection, run_id))

    async def session_runs(
        self, *, namespace: str, agent: str, session_id: str, caller: str | None = None, limit: int = MAX_PAGE
    ) -> list[RunSummary]:
        """A session's runs, oldest first (of one caller when `caller` is given)."""
        query = select(runs).where(
            runs.c.namespace == namespace, runs.c.agent == agent, runs.c.session_id == session_id
        )
        if caller is not None:
            query = query.where(runs.c.caller == caller)
        query = query.order_by(runs.c.started_at.desc(), runs.c.run_id.desc()).limit(max(1, min(limit, MAX_PAGE)))
        rows = await self._read(lambda connection: _mappings(connection, query))
        return [RunSummary.model_validate(dict(row)) for row in reversed(rows)]

    async def session_history(
        self, *, namespace: str, agent: str, caller: str, session_id: str, max_messages: int = 200
    ) -> HistoryReply:
        """The messages of a session's finished runs recorded in `Full` (the conversation key: agent, caller,
        session), oldest first, at most `max_messages` of the newest, starting at a user message."""
        key = {"namespace": namespace, "agent": agent, "session_id": session_id, "caller": caller}
        rows = await self._read(lambda connection: _rows(connection, _HISTORY, key))
        messages = [_chat_message(role=row.name, body=row.body) for row in rows]
        start = max(0, len(messages) - max_messages)
        while start < len(messages) and messages[start]["role"] != "user":
            start += 1
        run_ids = list(dict.fromkeys(row.run_id for row in rows))
        return HistoryReply(session_id=session_id, messages=messages[start:], run_ids=run_ids)

    async def session_memory(
        self, *, namespace: str, agent: str, caller: str, session_id: str, key: str,
        now: datetime.datetime | None = None,
    ) -> HistoryReply:  # fmt: skip
        """A working-memory chunk of the conversation (agent, caller, session) not yet expired, and how many of its
        characters were not kept (`memory` None: it has none under `key`)."""
        now = now or datetime.datetime.now(datetime.UTC)
        query = (
            select(working_memory.c.content, working_memory.c.content_cut)
            .join(runs, runs.c.run_id == working_memory.c.run_id)
            .where(
                working_memory.c.key == key, working_memory.c.expires_at > now, runs.c.namespace == namespace,
                runs.c.agent == agent, runs.c.caller == caller, runs.c.session_id == session_id,
                runs.c.record == "Full",
            )
            .order_by(working_memory.c.stored_at.desc()).limit(1)
        )  # fmt: skip
        found = await self._read(lambda connection: _rows(connection, query))
        row = found[0] if found else None
        if row is None:
            return HistoryReply(session_id=session_id)
        return HistoryReply(session_id=session_id, memory=row.content, memory_cut=row.content_cut)

    # -- retention --------------------------------------------------------------------------------

    async def delete_expired(self, *, now: datetime.datetime, batch_size: int = 1000) -> int:
        """Delete runs past their retention, and working-memory chunks and conversation files past theirs,
        `batch_size` runs (or chunks) per short transaction; how many runs were deleted."""
        async with self._connection() as connection, connection.begin():
            await connection.execute(delete(conversation_files).where(conversation_files.c.expires_at < now))
        while True:
            async with self._connection() as connection, connection.begin():
                expired = (
                    await connection.execute(
                        select(working_memory.c.run_id, working_memory.c.key)
                        .where(working_memory.c.expires_at < now).limit(batch_size)
                    )
                ).all()  # fmt: skip
                if expired:
                    await connection.execute(delete(working_memory).where(
                        tuple_(working_memory.c.run_id, working_memory.c.key).in_([tuple(row) for row in expired])))
            if len(expired) < batch_size:
                break
            await asyncio.sleep(0)  # let the writer's transactions in between
        deleted = 0
        while True:
            async with self._connection() as connection, connection.begin():
                ids = (
                    await connection.scalars(select(runs.c.run_id).where(runs.c.expires_at < now).limit(batch_size))
                ).all()
                if not ids:
                    return deleted
                await connection.execute(delete(run_events).where(run_events.c.run_id.in_(ids)))
                await connection.execute(delete(working_memory).where(working_memory.c.run_id.in_(ids)))
                await connection.execute(delete(runs).where(runs.c.run_id.in_(ids)))
            deleted += len(ids)
            await asyncio.sleep(0)

    # -- plumbing ---------------------------------------------------------------------------------

    def _connection(self, *, reading: bool = False) -> _Connecting:
        """A pooled connection; `reading`: one without a transaction (a read is one statement, or statements that
        each see their own snapshot anyway under READ COMMITTED), so no BEGIN and ROLLBACK round trips."""
        return _Connecting(self._reads if reading else self.engine)

    async def _read(self, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """`read` on a pooled connection, and once more if that connection was dead (the database restarted since;
        the whole pool is then replaced): no ping before every read, a round trip that was most of a page's store
        time on a loaded machine."""
        try:
            async with self._connection(reading=True) as connection:
                return await read(connection)
        except StoreUnavailable as exc:
            if not (isinstance(exc.__cause__, DBAPIError) and exc.__cause__.connection_invalidated):
                raise
        async with self._connection(reading=True) as connection:
            return await read(connection)


class _Connecting:
    """`async with store._connection() as connection`: a pooled connection; database failures are `StoreUnavailable`."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._context: Any = None

    async def __aenter__(self) -> AsyncConnection:
        self._context = self._engine.connect()
        try:
            return await self._context.__aenter__()
        except (OperationalError, DBAPIError, OSError, ConnectionError) as exc:
            raise StoreUnavailable(f"cannot reach the run store's database: {exc}") from exc

    async def __aexit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            await self._context.__aexit__(kind, exc, tb)
        except (OperationalError, DBAPIError, OSError, ConnectionError) as failure:
            raise StoreUnavailable(f"the run store's database failed: {failure}") from failure
        if isinstance(exc, OperationalError | DBAPIError | OSError | ConnectionError):
            raise StoreUnavailable(f"the run store's database failed: {exc}") from exc


async def _mappings(connection: AsyncConnection, query: Any) -> Sequence[Any]:
    return (await connection.execute(query)).mappings().all()


async def _rows(connection: AsyncConnection, query: Any, parameters: dict[str, Any] | None = None) -> Sequence[Any]:
    return (await connection.execute(query, parameters)).all()


async def _run(connection: AsyncConnection, run_id: str) -> RunDetail | None:
    row = (await connection.execute(select(runs).where(runs.c.run_id == run_id))).mappings().first()
    if row is None:
        return None
    entries = (
        await connection.execute(
            select(run_events).where(run_events.c.run_id == run_id)
            .order_by(run_events.c.at, run_events.c.id).limit(MAX_TIMELINE + 1)
        )
    ).mappings().all()  # fmt: skip
    omitted = 0
    if len(entries) > MAX_TIMELINE:
        total = await connection.scalar(select(func.count()).where(run_events.c.run_id == run_id))
        omitted = int(total or 0) - MAX_TIMELINE
    children = (  # only runs the parent's agent called: a caller names its parent run itself
        await connection.scalars(
            select(runs.c.run_id).where(
                runs.c.parent_run_id == run_id, runs.c.caller == f"agent.{row['namespace']}.{row['agent']}"
            ).order_by(runs.c.started_at).limit(MAX_PAGE)
        )
    ).all()
    return RunDetail(
        **dict(row),
        timeline=[_entry(entry) for entry in entries[:MAX_TIMELINE]],
        timeline_omitted=omitted,
        children=list(children),
    )


def _upgrade(connection: Connection) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
    connection.commit()


@asynccontextmanager
async def _file_lock(database: str | None) -> AsyncIterator[None]:
    """An exclusive lock on `<database>.lock`, waited for off the event loop."""
    if not database or database == ":memory:":
        yield
        return
    handle = await asyncio.to_thread(open, f"{database}.lock", "a")
    with handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _conditions(filters: RunFilter) -> list[Any]:
    columns = {"namespace": runs.c.namespace, "agent": runs.c.agent, "source": runs.c.source,
               "outcome": runs.c.outcome, "session_id": runs.c.session_id, "caller": runs.c.caller}  # fmt: skip
    conditions = [column == getattr(filters, name) for name, column in columns.items() if getattr(filters, name)]
    if filters.since is not None:
        conditions.append(runs.c.started_at >= filters.since)
    if filters.until is not None:
        conditions.append(runs.c.started_at < filters.until)
    return conditions


def _run_row(started: RunStarted) -> dict[str, Any]:
    return {
        "run_id": started.run_id, "source": started.source, "caller": started.caller,
        "session_id": started.session_id, "parent_run_id": started.parent_run_id, "request_id": started.request_id,
        "trace_id": started.trace_id, "model": started.model, "record": started.record, "started_at": started.at,
        "expires_at": started.at + datetime.timedelta(days=started.retention_days),
    }  # fmt: skip


def _event_row(event: TimelineEvent, *, record: str) -> dict[str, Any]:
    body = event.model_dump(mode="json", exclude={"id", "run_id", "at", "kind"})
    if record != "Full":
        for field in _TEXT_FIELDS.get(event.kind, ()):
            body[f"{field}_cut"] = body.get(f"{field}_cut", 0) + len(body[field])
            body[field] = ""
        if isinstance(event, MessageRecorded):
            body["tool_calls"] = [{"id": c.get("id"), "name": (c.get("function") or {}).get("name")}
                                  for c in event.tool_calls]  # fmt: skip
    row: dict[str, Any] = {"run_id": event.run_id, "event_id": event.id, "kind": event.kind, "at": event.at,
                           "body": body, "duration_seconds": None}  # fmt: skip
    if isinstance(event, MessageRecorded):
        row.update(name=event.role, status="")
    elif isinstance(event, ModelRequested):
        row.update(name=event.model, status=event.status, duration_seconds=event.latency_seconds)
    elif isinstance(event, ToolCalled):
        row.update(name=event.name, status=event.error_code or "ok", duration_seconds=event.duration_seconds)
    elif isinstance(event, ApprovalRecorded):
        row.update(name=event.name, status=event.state)
    else:
        status = "" if event.exit_code is None else str(event.exit_code)
        row.update(name=event.backend, status=status, duration_seconds=event.duration_seconds)
    return row


def _entry(row: Any) -> TimelineEntry:
    return TimelineEntry(
        event_id=row["event_id"], kind=row["kind"], at=row["at"], name=row["name"], status=row["status"],
        duration_seconds=row["duration_seconds"], data=row["body"],
    )  # fmt: skip


def _chat_message(*, role: str, body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": body.get("content") or None}
    if body.get("tool_calls"):
        message["tool_calls"] = body["tool_calls"]
    if body.get("tool_call_id"):
        message["tool_call_id"] = body["tool_call_id"]
    if role in ("user", "tool") and message["content"] is None:
        message["content"] = ""
    return message
