"""Long-term memories in the run store, on a real PostgreSQL (pgvector) and on SQLite (sqlite-vec): found by meaning
within their scope only, bounded per scope and per agent, forgotten at once, expired in the database."""

from __future__ import annotations

import datetime

import pytest
from sqlalchemy import event, select, text

from rockbot.console import memory_store
from rockbot.console.memory_store import MemoryCeilings, MemoryFilter, MemoryStore, new_memory_id
from rockbot.console.store import Store
from rockbot.console.store_schema import AGENT_TOTAL, INDEXED_DIMENSIONS, memory_usage
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.memories import Embed, Forget, Pending, Recall, Remember, Room, Usage
from tests.fixtures.llm import EMBEDDING_MODEL, embed

DIMS = 384
NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
FACTS = [
    "The team deploys on Tuesdays between 14:00 and 16:00 UTC.",
    "Ann prefers answers in French.",
    "The staging database is called orca-staging.",
]


def remember(text: str, *, caller: str = "console:ann", shared: bool = False, max_items: int = 100,
             max_bytes: int = 100_000, retention_days: int = 30, memory_id: str | None = None,
             model: str = EMBEDDING_MODEL, dims: int = DIMS) -> Remember:  # fmt: skip
    return Remember(caller=caller, shared=shared, memory_id=memory_id or new_memory_id(), text=text,
                    embedding=embed(text, dimensions=dims), model=model, retention_days=retention_days,
                    max_items=max_items, max_bytes=max_bytes)  # fmt: skip


def recall(query: str, *, caller: str = "console:ann", shared: bool = False, k: int = 3,
           model: str = EMBEDDING_MODEL, dims: int = DIMS) -> Recall:  # fmt: skip
    return Recall(caller=caller, shared=shared, embedding=embed(query, dimensions=dims), model=model, k=k)


@pytest.fixture
def memories(store: Store) -> MemoryStore:
    return MemoryStore(store=store)


async def keep(memories: MemoryStore, *facts: str, agent: str = "triage", **options: object) -> list[str]:
    ids = []
    for fact in facts:
        reply = await memories.remember(namespace="team-a", agent=agent, request=remember(fact, **options), now=NOW)
        assert reply.error is None, reply.error
        ids.append(reply.stored)
    return ids


async def test_recall_finds_the_memory_nearest_in_meaning_first(memories: MemoryStore) -> None:
    ids = await keep(memories, *FACTS)
    found = await memories.recall(namespace="team-a", agent="triage", request=recall("when does the team deploy?"),
                                  now=NOW)  # fmt: skip
    assert found[0].id == ids[0]
    assert found[0].text == FACTS[0] and found[0].score > found[-1].score
    assert found[0].created_at == NOW


async def test_a_caller_never_recalls_another_callers_memory(memories: MemoryStore) -> None:
    await keep(memories, *FACTS, caller="console:ann")
    assert await memories.recall(namespace="team-a", agent="triage", request=recall("deploy", caller="console:bob"),
                                 now=NOW) == []  # fmt: skip


async def test_no_agent_reads_another_agents_memories(memories: MemoryStore) -> None:
    await keep(memories, *FACTS, agent="triage")
    for namespace, agent in (("team-a", "other"), ("team-b", "triage")):
        assert await memories.recall(namespace=namespace, agent=agent, request=recall("deploy"), now=NOW) == []
    (memory_id,) = await keep(memories, "a private fact", agent="triage")
    assert not await memories.forget(namespace="team-a", agent="other", scope="console:ann", memory_id=memory_id)
    assert await memories.get(memory_id) is not None


async def test_a_pending_memory_is_bounded_listed_and_recalled_once_its_own_agent_embeds_it(
        memories: MemoryStore) -> None:  # fmt: skip
    kept = []
    for fact in FACTS[:2]:  # kept without an embedding, within the scope's bound, as an agent remembers now
        reply = await memories.answer(namespace="team-a", agent="triage",
                                      request=remember(fact, max_items=2).model_copy(update={"embedding": None}))
        kept.append(reply.stored)
    refused = await memories.answer(namespace="team-a", agent="triage",
                                    request=remember(FACTS[2], max_items=2).model_copy(update={"embedding": None}))
    assert refused.error is not None and "holds 2 memories" in refused.error.message
    assert [m.text for m in (await memories.list(filters=MemoryFilter())).memories] == FACTS[1::-1]
    assert await memories.recall(namespace="team-a", agent="triage", request=recall("deploy")) == []
    other = await memories.answer(namespace="team-a", agent="other", request=Pending())
    assert other.memories == []
    pending = await memories.answer(namespace="team-a", agent="triage", request=Pending())
    assert [m.id for m in pending.memories] == kept
    embedding = Embed(memory_id=kept[0], embedding=embed(FACTS[0], dimensions=DIMS), model=EMBEDDING_MODEL)
    assert (await memories.answer(namespace="team-a", agent="other", request=embedding)).stored is None
    assert (await memories.answer(namespace="team-a", agent="triage", request=embedding)).stored == kept[0]
    assert (await memories.answer(namespace="team-a", agent="triage", request=embedding)).stored is None  # once
    found = await memories.recall(namespace="team-a", agent="triage", request=recall("when does the team deploy?"))
    assert [m.id for m in found] == kept[:1]
    assert [m.id for m in (await memories.answer(namespace="team-a", agent="triage", request=Pending())).memories] \
        == kept[1:]  # fmt: skip


async def test_an_agent_scope_is_shared_by_every_caller_and_apart_from_theirs(memories: MemoryStore) -> None:
    await keep(memories, FACTS[0], caller="console:ann", shared=True)
    shared = await memories.recall(namespace="team-a", agent="triage",
                                   request=recall("deploy", caller="console:bob", shared=True), now=NOW)  # fmt: skip
    assert [m.text for m in shared] == [FACTS[0]]
    assert await memories.recall(namespace="team-a", agent="triage", request=recall("deploy", caller="console:ann"),
                                 now=NOW) == []  # fmt: skip
    (stored,) = (await memories.list(filters=MemoryFilter(caller="console:ann"))).memories
    assert (stored.scope, stored.caller) == ("", "console:ann")


async def test_a_scope_is_bounded_in_count_with_an_error_that_names_the_fix(memories: MemoryStore) -> None:
    await keep(memories, "one", "two", max_items=2)
    reply = await memories.remember(namespace="team-a", agent="triage", request=remember("three", max_items=2),
                                    now=NOW)  # fmt: skip
    assert reply.stored is None and reply.error is not None and reply.error.code == ErrorCode.REJECTED
    assert "holds 2 memories" in reply.error.message and "maxItemsPerScope" in reply.error.message
    assert len((await memories.list(filters=MemoryFilter(agent="triage"))).memories) == 2
    await keep(memories, "three", max_items=2, caller="console:bob")  # another scope has its own bound


async def test_a_kept_memory_is_answered_with_its_scopes_room_when_asked(store: Store) -> None:
    """The least left under the scope's bounds and its agent's (the console's ceilings), so that an agent writes
    behind within it; an agent that does not ask (an older one) gets no such field."""
    memories = MemoryStore(store=store, ceilings=MemoryCeilings(items_per_agent=5))
    asked = remember("abcd", max_items=3, max_bytes=100).model_copy(update={"room": True})
    reply = await memories.remember(namespace="team-a", agent="triage", request=asked, now=NOW)
    assert reply.room == Room(items=2, bytes=96)
    await keep(memories, "x", "y", caller="console:bob")
    reply = await memories.remember(namespace="team-a", agent="triage", now=NOW,
                                    request=asked.model_copy(update={"memory_id": new_memory_id()}))  # fmt: skip
    assert reply.room == Room(items=1, bytes=92)  # the agent's 5 over all its scopes: one left
    assert (await memories.remember(namespace="team-a", agent="triage", request=remember("z"), now=NOW)).room is None
    usage = Usage(caller="console:ann", max_items=10, max_bytes=100)  # asked as a turn starts: ann holds 3, 9 bytes
    assert (await memories.answer(namespace="team-a", agent="triage", request=usage)).room == Room(items=0, bytes=91)
    usage = Usage(caller="console:cy", max_items=10, max_bytes=100)
    assert (await memories.answer(namespace="team-a", agent="other", request=usage)).room == Room(items=5, bytes=100)


async def test_a_scope_is_bounded_in_bytes(memories: MemoryStore) -> None:
    await keep(memories, "x" * 600, max_bytes=1000)
    reply = await memories.remember(namespace="team-a", agent="triage", request=remember("y" * 600, max_bytes=1000),
                                    now=NOW)  # fmt: skip
    assert reply.error is not None and "(600 bytes)" in reply.error.message and "1000 bytes" in reply.error.message
    first = await memories.remember(namespace="team-a", agent="triage",
                                    request=remember("z" * 1500, caller="console:bob", max_bytes=1000), now=NOW)
    assert first.error is not None and "this scope holds 0 memories (0 bytes)" in first.error.message


async def test_an_agent_claiming_a_larger_bound_gets_the_consoles_ceiling(store: Store) -> None:
    memories = MemoryStore(store=store, ceilings=MemoryCeilings(items_per_scope=2, items_per_agent=3))
    await keep(memories, "one", "two", max_items=1_000_000)
    refused = await memories.remember(namespace="team-a", agent="triage",
                                      request=remember("three", max_items=1_000_000), now=NOW)  # fmt: skip
    assert refused.error is not None and "at most 2" in refused.error.message
    await keep(memories, "three", caller="console:bob", max_items=1_000_000)
    over = await memories.remember(namespace="team-a", agent="triage",
                                   request=remember("four", caller="console:cy", max_items=1_000_000), now=NOW)
    assert over.error is not None and "agent team-a/triage (over all its scopes)" in over.error.message
    assert len((await memories.list(filters=MemoryFilter())).memories) == 3


async def test_a_redelivered_remember_is_kept_once(memories: MemoryStore, store: Store) -> None:
    request = remember(FACTS[0])
    for _ in range(2):
        reply = await memories.remember(namespace="team-a", agent="triage", request=request, now=NOW)
        assert reply.stored == request.memory_id
    assert await _usage(store, "console:ann") == (1, len(FACTS[0]))
    taken = await memories.remember(namespace="team-b", agent="evil",
                                    request=remember("mine now", memory_id=request.memory_id), now=NOW)  # fmt: skip
    assert taken.error is not None and taken.error.code == ErrorCode.INVALID_ARGUMENTS
    assert (await memories.get(request.memory_id)).text == FACTS[0]


async def test_forgetting_deletes_at_once_and_frees_the_bound(memories: MemoryStore, store: Store) -> None:
    first, _ = await keep(memories, "one", "two", max_items=2)
    reply = await memories.answer(namespace="team-a", agent="triage",
                                  request=Forget(caller="console:bob", memory_id=first))  # fmt: skip
    assert not reply.forgotten  # another caller's
    reply = await memories.answer(namespace="team-a", agent="triage",
                                  request=Forget(caller="console:ann", memory_id=first))  # fmt: skip
    assert reply.forgotten and await memories.get(first) is None
    assert await _usage(store, "console:ann") == (1, 3) and await _usage(store, AGENT_TOTAL) == (1, 3)
    await keep(memories, "three", max_items=2)


async def test_expired_memories_are_never_recalled_and_are_deleted_by_the_sweep(memories: MemoryStore,
                                                                                store: Store) -> None:  # fmt: skip
    await keep(memories, FACTS[0], retention_days=1)
    await keep(memories, FACTS[1], retention_days=30)
    later = NOW + datetime.timedelta(days=2)
    found = await memories.recall(namespace="team-a", agent="triage", request=recall("deploys team french"),
                                  now=later)  # fmt: skip
    assert [m.text for m in found] == [FACTS[1]]
    assert await memories.delete_expired(now=later) == 1
    assert await _usage(store, "console:ann") == (1, len(FACTS[1]))
    assert [m.text for m in (await memories.list(filters=MemoryFilter(), now=NOW)).memories] == [FACTS[1]]


async def test_only_vectors_of_the_same_model_and_size_are_compared(memories: MemoryStore) -> None:
    await keep(memories, FACTS[0])
    await keep(memories, FACTS[0], model="another-model")
    await keep(memories, FACTS[0], dims=64)
    for request in (recall("deploy"), recall("deploy", model="another-model"), recall("deploy", dims=64)):
        found = await memories.recall(namespace="team-a", agent="triage", request=request, now=NOW)
        assert len(found) == 1 and found[0].score == pytest.approx(found[0].score)


async def test_people_list_and_search_their_memories_newest_first_page_by_page(memories: MemoryStore) -> None:
    for index, fact in enumerate(FACTS):
        await memories.remember(namespace="team-a", agent="triage", request=remember(fact),
                                now=NOW + datetime.timedelta(minutes=index))  # fmt: skip
    await keep(memories, "Bob's fact about deploys", caller="console:bob")
    first = await memories.list(filters=MemoryFilter(caller="console:ann"), limit=2)
    rest = await memories.list(filters=MemoryFilter(caller="console:ann"), limit=2, cursor=first.next_cursor)
    assert [m.text for m in first.memories + rest.memories] == FACTS[::-1] and rest.next_cursor is None
    found = await memories.list(filters=MemoryFilter(caller="console:ann", text="DEPLOYS"))
    assert [m.text for m in found.memories] == [FACTS[0]]
    literal = await memories.list(filters=MemoryFilter(text="%"))
    assert literal.memories == []  # a LIKE wildcard is searched for as itself


async def _usage(store: Store, scope: str) -> tuple[int, int]:
    async with store.engine.connect() as connection:
        row = (await connection.execute(select(memory_usage.c.items_held, memory_usage.c.bytes_held)
                                        .where(memory_usage.c.scope == scope))).one()  # fmt: skip
    return row.items_held, row.bytes_held


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
async def test_postgres_has_pgvector_and_an_hnsw_index_per_common_size(store: Store) -> None:
    async with store.engine.connect() as connection:
        version = await connection.scalar(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))
        indexes = (await connection.execute(text(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'memories' AND indexdef LIKE '%hnsw%'"
        ))).all()  # fmt: skip
    assert version is not None
    assert sorted(name for name, _ in indexes) == sorted(f"memories_hnsw_{d}" for d in INDEXED_DIMENSIONS)
    assert all("vector_cosine_ops" in definition for _, definition in indexes)


@pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
async def test_a_large_scope_is_searched_through_the_hnsw_index(
    store: Store, memories: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory_store, "EXACT_UP_TO", 2)
    words = ["deploy", "database", "french", "lunch", "holiday", "budget", "invoice", "printer"]
    await keep(memories, *[f"note about {w}" for w in words], caller="console:ann", shared=True)
    await keep(memories, "note about deploy", caller="console:bob")  # another scope: filtered out by the scan
    statements: list[str] = []
    event.listen(store.engine.sync_engine, "before_cursor_execute",
                 lambda *args: statements.append(args[2]))  # fmt: skip
    found = await memories.recall(namespace="team-a", agent="triage",
                                  request=recall("deploy", caller="console:bob", shared=True, k=2), now=NOW)
    assert found[0].text == "note about deploy" and len(found) == 2
    query = [s for s in statements if "FROM memories" in s][-1]  # the exact one first answered nothing: too large
    assert f"CAST(memories.embedding AS VECTOR({DIMS}))" in query and f"memories.dims = {DIMS}" in query
    vector = str(embed("deploy", dimensions=DIMS))
    async with store.engine.connect() as connection:  # the planner takes the partial index for that shape
        plan = "\n".join(row[0] for row in await connection.execute(text(
            f"EXPLAIN SELECT id FROM memories WHERE memories.dims = {DIMS} AND scope = '' "
            f"ORDER BY CAST(memories.embedding AS VECTOR({DIMS})) <=> CAST('{vector}' AS VECTOR({DIMS})) LIMIT 2")))
    assert f"memories_hnsw_{DIMS}" in plan


def test_an_embedding_with_a_nan_or_an_infinity_or_only_zeros_is_refused() -> None:
    for bad in ([1.0, float("nan")], [float("inf"), -1.0], [float("inf"), float("-inf")], [0.0, 0.0]):
        with pytest.raises(ValueError, match=r"no NaN or infinity|no direction"):
            Recall(caller="console:ann", embedding=bad, model=EMBEDDING_MODEL)
    assert Recall(caller="console:ann", embedding=[1e308, 1e308], model=EMBEDDING_MODEL).embedding[0] == 1e308
