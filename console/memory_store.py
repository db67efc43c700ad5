"""Long-term memories in the run store's database: kept within bounds, found by meaning, forgotten at once.

    memories = MemoryStore(store=store)
    reply = await memories.remember(namespace="team-a", agent="triage", request=Remember(...))
    found = await memories.recall(namespace="team-a", agent="triage", request=Recall(...))
    page = await memories.list(filters=MemoryFilter(caller="console:ann"), limit=50)

The agent is always the broker-validated sender (or, locally, the agent itself): every query is
held to its rows. A scope (`Caller`: the caller's; `Agent`: one shared, scope `""`) holds at most what the
agent's policy says and never more than the console's ceilings, in count and bytes, and so does each
agent over all its scopes; the counts live in `memory_usage`, kept in step in the same transaction as
every write, so a bound costs one row's update, never a count.

Recall compares the query with the scope's memories of the same embeddings model (cosine distance:
pgvector's `<=>`, sqlite-vec's `vec_distance_cosine`). A scope of up to `EXACT_UP_TO` memories is
compared whole, which finds the true nearest and, with the scope's index, costs a few milliseconds; a
larger one on PostgreSQL goes through the HNSW index of its embedding size (pgvector's iterative scan,
so the scope's filter still yields `k`). Expired memories are never recalled and are deleted by
`delete_expired` (the console's retention sweep). A `Remember` without an embedding is kept pending (`dims` 0: no
recall compares it, no HNSW index holds it) until its agent's `Embed`; `pending` lists those an agent left.
"""

from __future__ import annotations

import datetime
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from sqlalchemy import BigInteger, Float, Integer, and_, bindparam, case, cast, delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from rockbot.console.store import Store, StoreUnavailable
from rockbot.console.store_models import MAX_PAGE, decode_cursor, encode_cursor
from rockbot.console.store_schema import AGENT_TOTAL, INDEXED_DIMENSIONS, Embedding, memories, memory_usage
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.memories import (
    Embed,
    Forget,
    MemoryReply,
    MemoryRequest,
    Pending,
    Recall,
    RecalledMemory,
    Remember,
    Room,
    Usage,
)

#: A scope of at most this many memories is compared whole; a larger one (PostgreSQL) through its HNSW index.
EXACT_UP_TO = 20_000
#: Candidates the HNSW search keeps per query (pgvector's `hnsw.ef_search`; its default is 40).
EF_SEARCH = 100


class MemoryCeilings(BaseModel):
    """The most any agent's policy gets, whatever it claims: per scope, and per agent over all its scopes."""

    model_config = ConfigDict(frozen=True)

    items_per_scope: int = 100_000
    bytes_per_scope: int = 100 * 1024 * 1024
    items_per_agent: int = 1_000_000
    bytes_per_agent: int = 1024 * 1024 * 1024


class MemoryFilter(BaseModel):
    """Which memories a person lists; every field left empty matches everything."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: str | None = None
    agent: str | None = None
    #: Who told the agent (`console:<user>` for a person in the console).
    caller: str | None = None
    #: Words the memory's text holds (case-insensitive).
    text: str | None = None


class StoredMemory(BaseModel):
    """One memory as a person sees it."""

    model_config = ConfigDict(frozen=True)

    id: str
    namespace: str
    agent: str
    #: Whose memory it is: the caller's (`Caller` scope), or "" for the agent's shared one.
    scope: str
    caller: str
    text: str
    tags: list[str]
    model: str
    run_id: str
    created_at: datetime.datetime
    expires_at: datetime.datetime


class MemoryPage(BaseModel):
    memories: list[StoredMemory]
    #: Pass back as `cursor` for the next (older) page; None on the last page.
    next_cursor: str | None = None


class BoundReached(Exception):
    """A scope or an agent holds as much as it may."""


@dataclass(frozen=True, kw_only=True)
class _Bound:
    """What one usage row may hold, and how an error names it."""

    scope: str
    items: int
    bytes: int
    whose: str


_SHOWN = (memories.c.id, memories.c.namespace, memories.c.agent, memories.c.scope, memories.c.caller,
          memories.c.text, memories.c.tags, memories.c.model, memories.c.run_id, memories.c.created_at,
          memories.c.expires_at)  # fmt: skip


def new_memory_id() -> str:
    return f"m-{secrets.token_hex(8)}"


def scope_of(request: Remember | Recall | Forget) -> str:
    """The scope a request speaks of: its caller's, or the agent's shared one (`""`, which no caller is)."""
    return "" if request.shared else request.caller


class MemoryStore:
    def __init__(self, *, store: Store, ceilings: MemoryCeilings | None = None) -> None:
        self._store = store
        self._ceilings = ceilings or MemoryCeilings()
        self._postgres = store.dialect == "postgresql"
        self._exact = self._recall_statement(held_to_exact=False)
        self._exact_indexed = self._recall_statement(held_to_exact=True)
        self._counting: dict[int, Any] = {}

    # -- an agent's requests ----------------------------------------------------------------------

    async def answer(self, *, namespace: str, agent: str, request: MemoryRequest) -> MemoryReply:
        """The reply to one of `agent`'s requests; bounds and bad input are errors in it, a database failure is
        `StoreUnavailable`."""
        if isinstance(request, Remember):
            return await self.remember(namespace=namespace, agent=agent, request=request)
        if isinstance(request, Recall):
            return MemoryReply(memories=await self.recall(namespace=namespace, agent=agent, request=request))
        if isinstance(request, Embed):
            embedded = await self.embed(namespace=namespace, agent=agent, request=request)
            return MemoryReply(stored=request.memory_id if embedded else None)
        if isinstance(request, Pending):
            return MemoryReply(memories=await self.pending(namespace=namespace, agent=agent, limit=request.limit))
        if isinstance(request, Usage):
            return MemoryReply(room=await self.room(namespace=namespace, agent=agent, request=request))
        forgotten = await self.forget(namespace=namespace, agent=agent, scope=scope_of(request),
                                      memory_id=request.memory_id)  # fmt: skip
        return MemoryReply(forgotten=forgotten)

    async def remember(
        self, *, namespace: str, agent: str, request: Remember, now: datetime.datetime | None = None
    ) -> MemoryReply:
        """Keep a memory within its scope's and its agent's bounds; a redelivered request (same id) is kept once."""
        now = now or datetime.datetime.now(datetime.UTC)
        scope = scope_of(request)
        size = len(request.text.encode())
        row = {
            "id": request.memory_id, "namespace": namespace, "agent": agent, "scope": scope,
            "caller": request.caller, "text": request.text, "tags": list(request.tags), "bytes": size,
            "model": request.model, "dims": len(request.embedding or ()), "embedding": request.embedding,
            "run_id": request.run_id, "created_at": now,
            "expires_at": now + datetime.timedelta(days=request.retention_days),
        }  # fmt: skip
        ceilings = self._ceilings
        try:
            async with self._store._connection() as connection, connection.begin():
                inserted = await connection.execute(
                    self._store._insert(memories).on_conflict_do_nothing(index_elements=["id"])
                    .returning(memories.c.id), row,
                )  # fmt: skip
                if inserted.first() is None:
                    return await self._redelivered(connection, namespace=namespace, agent=agent, scope=scope,
                                                   memory_id=request.memory_id)  # fmt: skip
                room = await self._count(connection, namespace=namespace, agent=agent, size=size, bounds=[
                    _Bound(scope=scope, items=min(request.max_items, ceilings.items_per_scope),
                           bytes=min(request.max_bytes, ceilings.bytes_per_scope),
                           whose="this scope" if scope else "the agent's shared memory"),
                    _Bound(scope=AGENT_TOTAL, items=ceilings.items_per_agent, bytes=ceilings.bytes_per_agent,
                           whose=f"agent {namespace}/{agent} (over all its scopes)"),
                ])  # fmt: skip
        except BoundReached as exc:
            return MemoryReply(error=ErrorInfo(code=ErrorCode.REJECTED, message=str(exc)))
        return MemoryReply(stored=request.memory_id, room=room if request.room else None)

    async def room(self, *, namespace: str, agent: str, request: Usage) -> Room:
        """What the request's scope may still take: the least left under its bounds (held to the ceilings) and its
        agent's, as a `remember`'s reply says it."""
        scope, ceilings = scope_of(request), self._ceilings
        bounds = {scope: (min(request.max_items, ceilings.items_per_scope),
                          min(request.max_bytes, ceilings.bytes_per_scope)),
                  AGENT_TOTAL: (ceilings.items_per_agent, ceilings.bytes_per_agent)}  # fmt: skip
        query = select(memory_usage.c.scope, memory_usage.c.items_held, memory_usage.c.bytes_held).where(
            memory_usage.c.namespace == namespace, memory_usage.c.agent == agent,
            memory_usage.c.scope.in_(list(bounds)))  # fmt: skip
        held = {row.scope: row for row in await self._store._read(lambda connection: _all(connection, query))}
        left = [(items - (held[s].items_held if s in held else 0), size - (held[s].bytes_held if s in held else 0))
                for s, (items, size) in bounds.items()]  # fmt: skip
        return Room(items=max(0, min(n for n, _ in left)), bytes=max(0, min(b for _, b in left)))

    async def embed(self, *, namespace: str, agent: str, request: Embed) -> bool:
        """Give `agent`'s pending memory its embedding (once: an embedded one is left as it is); whether it was
        pending."""
        async with self._store._connection() as connection, connection.begin():
            embedded = await connection.execute(
                update(memories).where(memories.c.id == request.memory_id, memories.c.namespace == namespace,
                                       memories.c.agent == agent, memories.c.dims == 0)
                .values(embedding=request.embedding, dims=len(request.embedding), model=request.model)
            )  # fmt: skip
        return bool(embedded.rowcount)

    async def pending(self, *, namespace: str, agent: str, limit: int,
                      now: datetime.datetime | None = None) -> list[RecalledMemory]:  # fmt: skip
        """`agent`'s memories (not expired) still waiting for their embedding, oldest first."""
        now = now or datetime.datetime.now(datetime.UTC)
        query = (select(memories.c.id, memories.c.text, memories.c.tags, memories.c.created_at)
                 .where(memories.c.namespace == namespace, memories.c.agent == agent, memories.c.dims == 0,
                        memories.c.expires_at > now)
                 .order_by(memories.c.created_at).limit(limit))  # fmt: skip
        rows = await self._store._read(lambda connection: _all(connection, query))
        return [RecalledMemory(id=row.id, text=row.text, tags=row.tags, created_at=row.created_at, score=0.0)
                for row in rows]  # fmt: skip

    async def _redelivered(self, connection: AsyncConnection, *, namespace: str, agent: str, scope: str,
                           memory_id: str) -> MemoryReply:  # fmt: skip
        """The answer to a `Remember` whose id is taken: kept already (a redelivery), or another's id."""
        owner = (await connection.execute(
            select(memories.c.namespace, memories.c.agent, memories.c.scope).where(memories.c.id == memory_id)
        )).first()  # fmt: skip
        if owner is not None and tuple(owner) == (namespace, agent, scope):
            return MemoryReply(stored=memory_id)
        return MemoryReply(error=ErrorInfo(code=ErrorCode.INVALID_ARGUMENTS,
                                           message=f"memory id {memory_id} is taken: choose another"))  # fmt: skip

    async def _count(self, connection: AsyncConnection, *, namespace: str, agent: str, size: int,
                     bounds: list[_Bound]) -> Room:  # fmt: skip
        """Add one memory of `size` bytes to the usage rows of `bounds` in one upsert, each only while within its
        bound; what they may still take, or `BoundReached` naming the first it would pass (the caller's transaction
        is then rolled back)."""
        items, held_bytes, scope = memory_usage.c.items_held, memory_usage.c.bytes_held, memory_usage.c.scope
        fits = all(size <= b.bytes for b in bounds)  # else not even a first memory fits: no row is made
        counted: dict[str, Any] = {}
        if fits:
            values: dict[str, Any] = {"namespace": namespace, "agent": agent, "size": size}
            for n, bound in enumerate(bounds):
                values |= {f"scope_{n}": bound.scope, f"items_{n}": bound.items, f"bytes_{n}": bound.bytes}
            statement = self._counting.get(len(bounds))
            if statement is None:
                statement = self._counting[len(bounds)] = self._count_statement(len(bounds))
            counted = {row.scope: row for row in await connection.execute(statement, values)}
        for bound in bounds:
            if (bound.scope not in counted) if fits else (size > bound.bytes):
                held = (await connection.execute(select(items, held_bytes).where(
                    memory_usage.c.namespace == namespace, memory_usage.c.agent == agent, scope == bound.scope,
                ))).first()  # fmt: skip
                raise BoundReached(
                    f"not remembered: {bound.whose} holds {held.items_held if held else 0} memories "
                    f"({held.bytes_held if held else 0} bytes), and may hold at most {bound.items} ({bound.bytes} "
                    "bytes); forget some (recall them, then forget(id)) or ask the Agent's author to raise "
                    "spec.memory.longTerm.maxItemsPerScope / maxBytesPerScope"
                )
        return Room(items=max(0, min(b.items - counted[b.scope].items_held for b in bounds)),
                    bytes=max(0, min(b.bytes - counted[b.scope].bytes_held for b in bounds)))  # fmt: skip

    def _count_statement(self, bounds: int) -> Any:
        """`_count`'s upsert for `bounds` usage rows, built once, its values bound by name (`namespace`, `agent`,
        `size`, and `scope_<n>`, `items_<n>`, `bytes_<n>` for each row): built anew, it cost each remember a
        compile."""
        items, held_bytes, scope = memory_usage.c.items_held, memory_usage.c.bytes_held, memory_usage.c.scope
        size = bindparam("size", type_=Integer())
        max_items = case(*((scope == bindparam(f"scope_{n}"), bindparam(f"items_{n}", type_=Integer()))
                           for n in range(bounds)))  # fmt: skip
        max_bytes = case(*((scope == bindparam(f"scope_{n}"), bindparam(f"bytes_{n}", type_=BigInteger()))
                           for n in range(bounds)))  # fmt: skip
        statement = self._store._insert(memory_usage).values([
            {"namespace": bindparam("namespace"), "agent": bindparam("agent"), "scope": bindparam(f"scope_{n}"),
             "items_held": 1, "bytes_held": size}
            for n in range(bounds)
        ])  # fmt: skip
        return statement.on_conflict_do_update(
            index_elements=["namespace", "agent", "scope"],
            set_={"items_held": items + 1, "bytes_held": held_bytes + size},
            where=(items + 1 <= max_items) & (held_bytes + size <= max_bytes),
        ).returning(scope, items, held_bytes)

    async def recall(
        self, *, namespace: str, agent: str, request: Recall, now: datetime.datetime | None = None
    ) -> list[RecalledMemory]:
        """The scope's `k` memories nearest to the query (of the same embeddings model and size), nearest first.

        One statement and one round trip for a scope compared whole: built once, its values bound; on PostgreSQL
        it is held to scopes of at most `EXACT_UP_TO` by a condition evaluated once before the scan, so a larger
        scope (or an empty one) answers nothing and is then asked again through the HNSW index."""
        dims = len(request.embedding)
        indexed = self._postgres and dims in INDEXED_DIMENSIONS
        values = {
            "namespace": namespace, "agent": agent, "scope": scope_of(request), "model": request.model, "dims": dims,
            "now": now or datetime.datetime.now(datetime.UTC), "query": request.embedding, "k": request.k,
            "exact_up_to": EXACT_UP_TO,
        }  # fmt: skip
        statement = self._exact_indexed if indexed else self._exact
        rows = await self._store._read(lambda connection: _all(connection, statement, values))
        if not rows and indexed:
            async with self._store._connection() as connection, connection.begin():
                if await self._held(connection, namespace=namespace, agent=agent,
                                    scope=values["scope"]) > EXACT_UP_TO:  # fmt: skip
                    rows = await self._approximate(connection, values, request=request)
        return [
            RecalledMemory(id=row.id, text=row.text, tags=row.tags, created_at=row.created_at,
                           score=round(1.0 - float(row.distance), 6))
            for row in sorted(rows, key=lambda row: row.distance)
        ]  # fmt: skip

    def _recall_statement(self, *, held_to_exact: bool) -> Any:
        """The exact recall, its values bound by name (`_SCOPE_OF` and `query`, `k`, `exact_up_to`)."""
        distance = self._distance(memories.c.embedding, None)
        conditions = list(_scope_conditions())
        if held_to_exact:
            held = (select(func.coalesce(func.max(memory_usage.c.items_held), 0)).where(
                memory_usage.c.namespace == bindparam("namespace"), memory_usage.c.agent == bindparam("agent"),
                memory_usage.c.scope == bindparam("scope")).scalar_subquery())  # fmt: skip
            conditions.append(held <= bindparam("exact_up_to"))
        return (select(memories.c.id, memories.c.text, memories.c.tags, memories.c.created_at,
                       distance.label("distance"))
                .where(*conditions).order_by(distance).limit(bindparam("k")))  # fmt: skip

    def _distance(self, column: Any, vector: list[float] | None) -> Any:
        """Cosine distance between a stored embedding and `vector` (None: bound later as `query`), computed in the
        database."""
        query = bindparam("query", vector, type_=Embedding())
        if self._postgres:
            return column.op("<=>", return_type=Float())(query)
        return func.vec_distance_cosine(column, query, type_=Float())

    async def _held(self, connection: AsyncConnection, *, namespace: str, agent: str, scope: str) -> int:
        held = await connection.scalar(select(memory_usage.c.items_held).where(
            memory_usage.c.namespace == namespace, memory_usage.c.agent == agent, memory_usage.c.scope == scope))
        return int(held or 0)

    async def _approximate(self, connection: AsyncConnection, values: dict[str, Any], *, request: Recall) -> Any:
        """The nearest through the HNSW index of the embedding's size: its expression and predicate spelt as the
        migration made them (the size a literal, so the planner matches the partial index)."""
        from pgvector.sqlalchemy import Vector

        dims = len(request.embedding)
        await connection.execute(text("SET LOCAL hnsw.iterative_scan = relaxed_order"))
        await connection.execute(text(f"SET LOCAL hnsw.ef_search = {max(EF_SEARCH, 2 * request.k)}"))
        sized = Vector(dims)
        distance = cast(memories.c.embedding, sized).op("<=>", return_type=Float())(
            cast(bindparam("query", request.embedding, type_=Embedding()), sized))
        query = (select(memories.c.id, memories.c.text, memories.c.tags, memories.c.created_at,
                        distance.label("distance"))
                 .where(text(f"memories.dims = {dims}"), *_scope_conditions()).order_by(distance)
                 .limit(request.k))  # fmt: skip
        return (await connection.execute(query, {k: v for k, v in values.items() if k in _SCOPE_OF})).all()

    async def forget(self, *, namespace: str, agent: str, scope: str | None, memory_id: str) -> bool:
        """Delete a memory of `agent` (of `scope` when given: an agent forgets only in the scope it speaks for);
        whether there was one."""
        conditions = [memories.c.id == memory_id, memories.c.namespace == namespace, memories.c.agent == agent]
        if scope is not None:
            conditions.append(memories.c.scope == scope)
        async with self._store._connection() as connection, connection.begin():
            gone = await self._delete(connection, and_(*conditions))
        return bool(gone)

    async def _delete(self, connection: AsyncConnection, condition: Any) -> int:
        """Delete the memories `condition` selects and take them off their scopes' and agents' usage."""
        rows = (await connection.execute(
            delete(memories).where(condition)
            .returning(memories.c.namespace, memories.c.agent, memories.c.scope, memories.c.bytes)
        )).all()  # fmt: skip
        freed: dict[tuple[str, str, str], list[int]] = {}
        for row in rows:
            for scope in (row.scope, AGENT_TOTAL):
                counts = freed.setdefault((row.namespace, row.agent, scope), [0, 0])
                counts[0] += 1
                counts[1] += row.bytes
        if freed:
            await connection.execute(
                update(memory_usage).where(
                    memory_usage.c.namespace == bindparam("k_namespace"), memory_usage.c.agent == bindparam("k_agent"),
                    memory_usage.c.scope == bindparam("k_scope"),
                ).values(items_held=memory_usage.c.items_held - bindparam("k_items"),
                         bytes_held=memory_usage.c.bytes_held - bindparam("k_bytes")),
                [{"k_namespace": ns, "k_agent": agent, "k_scope": scope, "k_items": items, "k_bytes": size}
                 for (ns, agent, scope), (items, size) in freed.items()],
            )  # fmt: skip
        return len(rows)

    # -- people's reads and deletes ---------------------------------------------------------------

    async def list(self, *, filters: MemoryFilter, limit: int = 50, cursor: str | None = None,
                   now: datetime.datetime | None = None) -> MemoryPage:  # fmt: skip
        """Memories matching `filters` (not expired), newest first, `limit` at a time; `BadCursor` for a cursor not
        handed out here."""
        now = now or datetime.datetime.now(datetime.UTC)
        limit = max(1, min(limit, MAX_PAGE))
        query = select(*_SHOWN).where(memories.c.expires_at > now)
        for name in ("namespace", "agent", "caller"):
            if getattr(filters, name):
                query = query.where(memories.c[name] == getattr(filters, name))
        if filters.text:
            query = query.where(memories.c.text.icontains(filters.text, autoescape=True))
        if cursor:
            at, memory_id = decode_cursor(cursor)
            query = query.where((memories.c.created_at < at)
                                | ((memories.c.created_at == at) & (memories.c.id < memory_id)))  # fmt: skip
        query = query.order_by(memories.c.created_at.desc(), memories.c.id.desc()).limit(limit + 1)
        rows = await self._store._read(lambda connection: _all(connection, query))
        page = [StoredMemory.model_validate(dict(row._mapping)) for row in rows[:limit]]
        last = page[-1] if len(rows) > limit else None
        return MemoryPage(memories=page,
                          next_cursor=last and encode_cursor(started_at=last.created_at, run_id=last.id))  # fmt: skip

    async def get(self, memory_id: str) -> StoredMemory | None:
        query = select(*_SHOWN).where(memories.c.id == memory_id)
        rows = await self._store._read(lambda connection: _all(connection, query))
        return StoredMemory.model_validate(dict(rows[0]._mapping)) if rows else None

    async def delete(self, memory_id: str) -> bool:
        """Delete one memory, at once and for good (a person's forget); whether there was one."""
        async with self._store._connection() as connection, connection.begin():
            return bool(await self._delete(connection, memories.c.id == memory_id))

    # -- retention --------------------------------------------------------------------------------

    async def delete_expired(self, *, now: datetime.datetime, batch_size: int = 1000) -> int:
        """Delete memories past their retention, `batch_size` per short transaction; how many were deleted."""
        deleted = 0
        while True:
            async with self._store._connection() as connection, connection.begin():
                ids = (await connection.scalars(
                    select(memories.c.id).where(memories.c.expires_at <= now).limit(batch_size))).all()
                if ids:
                    deleted += await self._delete(connection, memories.c.id.in_(ids))
            if len(ids) < batch_size:
                return deleted


async def _all(connection: AsyncConnection, query: Any, values: dict[str, Any] | None = None) -> Sequence[Any]:
    return (await connection.execute(query, values)).all()


#: The values a recall's scope conditions are bound to.
_SCOPE_OF = ("namespace", "agent", "scope", "model", "dims", "now")


def _scope_conditions() -> tuple[Any, ...]:
    """A recall's memories: the agent's, of the scope, of the same embeddings model and size, not expired (a pending
    one has `dims` 0: never compared)."""
    return (*(memories.c[name] == bindparam(name) for name in _SCOPE_OF[:5]), memories.c.expires_at > bindparam("now"))


__all__ = ["BoundReached", "MemoryCeilings", "MemoryFilter", "MemoryPage", "MemoryStore", "StoreUnavailable",
           "StoredMemory", "new_memory_id"]
