"""The run store's tables (SQLAlchemy Core), the same on PostgreSQL and SQLite; Alembic's migrations create them.

Three tables:
- `runs`: one row per agent turn, keyed by the run id the agent chose; which agent it belongs to
  (`namespace`, `agent`) is set by its first event from the broker-validated sender and never
  changes, so no other agent can write to it. Listing reads it alone (newest first, by
  `started_at`, `run_id`), through an index per filter it offers.
- `run_events`: a run's timeline, one row per message, model request, tool call or script run,
  unique by (run, event id) so a redelivered event is written once. What differs per kind lives
  in `body` (JSON); what a list or a filter needs (`kind`, `name`, `status`, `duration_seconds`) has
  columns of its own.
- `working_memory`: the chunks of large tool results a run stored (agent/memory.py), unique by (run,
  key). Whose they are is the run's conversation (its agent, caller and session), so a later turn of
  that conversation reads them by joining `runs`; each has its own, short expiry.
- `memories`: what agents were told to remember (long-term memory), each with its embedding (none, and
  `dims` 0, while it waits for the agent to embed it: `remember` answers before that), by agent
  (`namespace`, `agent`, the broker-validated sender) and scope (the caller whose memory it is, or `""`
  for an Agent's one shared memory), with who told it (`caller`) and its own expiry. Runs never own them:
  deleting a run or a conversation leaves them, forgetting deletes them.
- `memory_usage`: how many memories and bytes each scope holds, and (scope `|`, which no caller can be)
  each agent over all its scopes; kept in step by every write, so a bound is checked without counting.
- `conversation_files`: what people attached to a conversation and what its scripts wrote under /output, by
  conversation (agent, caller, session), with a random id, a sniffed type and the retention of its run.
- `file_parts`: the chunks of a script's file the scripts-manager is still writing (`WriteFile`), by the file's id
  and offset, with the conversation and run it is for; the last chunk moves them into `conversation_files` in one
  transaction, so no reader ever sees part of a file. The console's sweep deletes the parts of a file not completed
  within `PART_SECONDS` (its writer died).
Times are stored as UTC without a zone (SQLite keeps none) and read back as aware UTC times.
"""

from __future__ import annotations

import datetime
import struct
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import LargeBinary, SmallInteger


class UtcDateTime(TypeDecorator[datetime.datetime]):
    """An aware UTC time in, stored without a zone, an aware UTC time out."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime.datetime | None, dialect: Dialect) -> datetime.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"{value!r} has no time zone: the store keeps UTC times only")
        return value.astimezone(datetime.UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime.datetime | None, dialect: Dialect) -> datetime.datetime | None:
        return None if value is None else value.replace(tzinfo=datetime.UTC)


#: A 64-bit key on PostgreSQL; SQLite autoincrements only an INTEGER PRIMARY KEY (which is 64-bit there too).
BigKey = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

runs = Table(
    "runs",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("namespace", String(63), nullable=False),
    Column("agent", String(63), nullable=False),
    Column("source", String(32), nullable=False, server_default=""),
    Column("caller", String(256), nullable=False, server_default=""),
    Column("session_id", String(256), nullable=False, server_default=""),
    Column("parent_run_id", String(64), nullable=True),
    Column("request_id", String(256), nullable=False, server_default=""),
    Column("trace_id", String(32), nullable=False, server_default=""),
    Column("model", String(256), nullable=False, server_default=""),
    Column("record", String(16), nullable=False, server_default="Full"),
    Column("started_at", UtcDateTime(), nullable=False),
    Column("ended_at", UtcDateTime(), nullable=True),
    Column("outcome", String(16), nullable=True),
    Column("error", Text(), nullable=False, server_default=""),
    Column("prompt_tokens", BigInteger(), nullable=False, server_default="0"),
    Column("completion_tokens", BigInteger(), nullable=False, server_default="0"),
    Column("tool_calls", Integer(), nullable=False, server_default="0"),
    Column("expires_at", UtcDateTime(), nullable=False),
    Index("runs_by_time", "started_at", "run_id"),
    Index("runs_by_agent", "namespace", "agent", "started_at", "run_id"),
    Index("runs_by_source", "source", "started_at", "run_id"),
    Index("runs_by_outcome", "outcome", "started_at", "run_id"),
    Index("runs_by_session", "namespace", "agent", "session_id", "caller", "started_at"),
    Index("runs_by_parent", "parent_run_id"),
    Index("runs_by_expiry", "expires_at"),
)

run_events = Table(
    "run_events",
    metadata,
    Column("id", BigKey, primary_key=True, autoincrement=True),
    Column("run_id", String(64), ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("event_id", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("at", UtcDateTime(), nullable=False),
    Column("name", String(256), nullable=False, server_default=""),
    Column("status", String(256), nullable=False, server_default=""),
    Column("duration_seconds", Float(), nullable=True),
    Column("body", JSON(), nullable=False),
    UniqueConstraint("run_id", "event_id", name="run_events_once"),
    Index("run_events_timeline", "run_id", "at", "id"),
)

working_memory = Table(
    "working_memory",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("key", String(64), primary_key=True),
    Column("content", Text(), nullable=False),
    Column("content_cut", Integer(), nullable=False, server_default="0"),
    Column("stored_at", UtcDateTime(), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Index("working_memory_by_key", "key"),
    Index("working_memory_by_expiry", "expires_at"),
)


class Embedding(TypeDecorator[list[float]]):
    """A vector: pgvector's `vector` on PostgreSQL (of any dimension: each index says which it covers), and
    sqlite-vec's little-endian float32 blob on SQLite. Written only: searches compare in the database."""

    impl = LargeBinary
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "postgresql":
            from pgvector.sqlalchemy import Vector

            return dialect.type_descriptor(Vector())
        return dialect.type_descriptor(LargeBinary())

    def process_bind_param(self, value: list[float] | None, dialect: Dialect) -> Any:
        if value is None or dialect.name == "postgresql":
            return value
        return struct.pack(f"<{len(value)}f", *value)


#: The `memory_usage` scope that counts a whole agent (a caller never holds `|`).
AGENT_TOTAL = "|"

memories = Table(
    "memories",
    metadata,
    Column("id", String(18), primary_key=True),
    Column("namespace", String(63), nullable=False),
    Column("agent", String(63), nullable=False),
    Column("scope", String(256), nullable=False),
    Column("caller", String(256), nullable=False),
    Column("text", Text(), nullable=False),
    Column("tags", JSON(), nullable=False),
    Column("bytes", Integer(), nullable=False),
    Column("model", String(256), nullable=False),
    Column("dims", SmallInteger(), nullable=False),
    #: None (and `dims` 0) while the memory waits for the agent to embed it.
    Column("embedding", Embedding(), nullable=True),
    Column("run_id", String(64), nullable=False, server_default=""),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Index("memories_by_scope", "namespace", "agent", "scope", "created_at"),
    Index("memories_by_caller", "caller", "created_at"),
    Index("memories_by_expiry", "expires_at"),
    Index("memories_pending", "namespace", "agent", "created_at", postgresql_where=text("dims = 0"),
          sqlite_where=text("dims = 0")),
)

memory_usage = Table(
    "memory_usage",
    metadata,
    Column("namespace", String(63), primary_key=True),
    Column("agent", String(63), primary_key=True),
    Column("scope", String(256), primary_key=True),
    Column("items_held", Integer(), nullable=False),
    Column("bytes_held", BigInteger(), nullable=False),
)

#: The embedding sizes PostgreSQL keeps an HNSW index for (one partial index each, `memories_hnsw_<n>`, made by the
#: migration): the common models' (MiniLM/BGE-small 384, 512, BGE-base/nomic 768, BGE-large/mxbai 1024, OpenAI's
#: text-embedding-3-small and ada-002 1536). Another size is searched exactly.
INDEXED_DIMENSIONS = (384, 512, 768, 1024, 1536)

#: A conversation's files: what people attached and what scripts wrote under /output. Whose they are is the
#: conversation (`namespace`, `agent`, `caller`, `session_id`: the broker-validated agent and caller), never a field
#: a sender wrote; `id` is random (128 bits), so a file is never found by guessing. Each has the retention of the run
#: it came with (`expires_at`), and goes with it.
conversation_files = Table(
    "conversation_files",
    metadata,
    Column("id", String(40), primary_key=True),
    Column("namespace", String(63), nullable=False),
    Column("agent", String(63), nullable=False),
    Column("caller", String(256), nullable=False),
    Column("session_id", String(256), nullable=False),
    Column("run_id", String(64), nullable=False, server_default=""),
    Column("origin", String(16), nullable=False),
    Column("name", String(255), nullable=False),
    Column("media_type", String(128), nullable=False),
    Column("size", BigInteger(), nullable=False),
    Column("content", LargeBinary(), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Column("expires_at", UtcDateTime(), nullable=False),
    Index("conversation_files_by_conversation", "namespace", "agent", "caller", "session_id", "created_at"),
    Index("conversation_files_by_run", "run_id"),
    Index("conversation_files_by_expiry", "expires_at"),
)

#: The chunks of a file being written; a file is in `conversation_files`, and visible, only once whole.
file_parts = Table(
    "file_parts",
    metadata,
    Column("file_id", String(40), primary_key=True),
    Column("start_byte", BigInteger(), primary_key=True),
    Column("namespace", String(63), nullable=False),
    Column("agent", String(63), nullable=False),
    Column("caller", String(256), nullable=False),
    Column("session_id", String(256), nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("name", String(255), nullable=False),
    Column("size", BigInteger(), nullable=False),
    Column("content", LargeBinary(), nullable=False),
    Column("created_at", UtcDateTime(), nullable=False),
    Index("file_parts_by_age", "created_at"),
)
