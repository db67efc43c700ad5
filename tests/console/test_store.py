"""The run store on PostgreSQL and SQLite: written once per event, owned by its agent, listed, opened, forgotten;
and the working memory of each conversation."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from sqlalchemy import func, select

from rockbot.console.store import Batch, Store, StoreUnavailable
from rockbot.console.store_models import BadCursor, RunFilter
from rockbot.console.store_schema import run_events, runs, working_memory
from rockbot.contracts.recording import MemoryStored
from tests.console.events import event_id, typical_run

T0 = datetime.datetime(2026, 11, 1, 12, 0, tzinfo=datetime.UTC)


async def _count(store: Store, table) -> int:
    async with store.engine.connect() as connection:
        return int(await connection.scalar(select(func.count()).select_from(table)) or 0)


async def test_a_run_is_written_once_however_often_its_events_arrive(store: Store) -> None:
    events = typical_run(at=T0)
    first = await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])
    again = await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])

    timeline = len(events) - 2  # without the start and the end, which are the run's row
    assert (first.written, first.duplicates) == (timeline, 0)
    assert (again.written, again.duplicates) == (0, timeline)
    assert await _count(store, runs) == 1
    assert await _count(store, run_events) == timeline


async def test_an_agent_cannot_write_to_another_agents_run(store: Store) -> None:
    events = typical_run(at=T0, answer="the real answer")
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])
    forged = typical_run(run_id=events[0].run_id, at=T0, answer="forged", outcome="Failed")

    result = await store.write(batches=[Batch(namespace="team-b", agent="evil", events=forged)])

    assert result.refused == len(forged) and result.written == 0
    run = await store.get_run(events[0].run_id)
    assert run is not None and (run.namespace, run.agent, run.outcome) == ("team-a", "triage", "Succeeded")
    assert "forged" not in str([entry.data for entry in run.timeline])


async def test_a_run_shows_its_timeline_in_order_with_tools_scripts_and_tokens(store: Store) -> None:
    events = typical_run(at=T0, tools=3)
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])

    run = await store.get_run(events[0].run_id)

    assert run is not None
    assert (run.outcome, run.prompt_tokens, run.completion_tokens, run.tool_calls) == ("Succeeded", 320, 40, 3)
    assert run.started_at == T0 and run.source == "chat" and run.session_id == "s1"
    kinds = [entry.kind for entry in run.timeline]
    assert kinds[:3] == ["message", "model_request", "message"]
    assert kinds.count("tool_call") == 3 and kinds.count("script_run") == 1
    script = next(entry for entry in run.timeline if entry.kind == "script_run")
    assert (script.status, script.data["stdout"], script.data["pod"]) == ("0", "hello\n", "script-abc")
    tool = next(entry for entry in run.timeline if entry.kind == "tool_call")
    assert (tool.name, tool.status, tool.data["arguments"]) == ("tool_0", "ok", '{"x": 1}')
    assert await store.get_run("no-such-run") is None


async def test_a_run_lists_the_sub_agent_runs_its_agent_called_and_no_forged_children(store: Store) -> None:
    parent = typical_run(at=T0)
    child = typical_run(at=T0, source="agent_call", caller="agent.team-a.triage")
    forged = typical_run(at=T0, source="agent_call", caller="agent.team-b.evil")
    child[0] = child[0].model_copy(update={"parent_run_id": parent[0].run_id})
    forged[0] = forged[0].model_copy(update={"parent_run_id": parent[0].run_id})
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=parent),
                               Batch(namespace="team-a", agent="researcher", events=child),
                               Batch(namespace="team-a", agent="researcher", events=forged)])  # fmt: skip

    run = await store.get_run(parent[0].run_id)
    assert run is not None and run.children == [child[0].run_id]
    sub = await store.get_run(child[0].run_id)
    assert sub is not None and sub.parent_run_id == parent[0].run_id


async def test_events_before_their_runs_start_are_kept_and_the_start_fills_the_run_in(store: Store) -> None:
    events = typical_run(at=T0)
    start, rest = events[0], events[1:]
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=rest)])
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=[start])])

    run = await store.get_run(start.run_id)
    assert run is not None and run.source == "chat" and run.outcome == "Succeeded"
    assert len(run.timeline) == len(rest) - 1


async def test_metadata_runs_keep_no_text_whatever_the_agent_sent(store: Store) -> None:
    events = typical_run(at=T0, record="Metadata", question="my password is hunter2")
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])

    run = await store.get_run(events[0].run_id)
    assert run is not None
    assert "hunter2" not in run.model_dump_json() and "result 0" not in run.model_dump_json()
    user = next(entry for entry in run.timeline if entry.kind == "message")
    assert user.data["content"] == "" and user.data["content_cut"] == len("my password is hunter2")


async def test_runs_list_newest_first_by_filter_and_cursor(store: Store) -> None:
    batches = []
    for i in range(7):
        agent = "triage" if i % 2 == 0 else "writer"
        events = typical_run(at=T0 + datetime.timedelta(minutes=i), outcome="Failed" if i == 3 else "Succeeded",
                             source="trigger" if i == 5 else "chat")  # fmt: skip
        batches.append(Batch(namespace="team-a" if i < 6 else "team-b", agent=agent, events=events))
    await store.write(batches=batches)

    seen, cursor = [], None
    while True:
        page = await store.list_runs(filters=RunFilter(namespace="team-a"), limit=2, cursor=cursor)
        seen += [run.started_at for run in page.runs]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == [T0 + datetime.timedelta(minutes=i) for i in reversed(range(6))]
    assert [r.agent for r in (await store.list_runs(filters=RunFilter(agent="writer"))).runs] == ["writer"] * 3
    assert len((await store.list_runs(filters=RunFilter(outcome="Failed"))).runs) == 1
    assert len((await store.list_runs(filters=RunFilter(source="trigger"))).runs) == 1
    window = RunFilter(since=T0 + datetime.timedelta(minutes=2), until=T0 + datetime.timedelta(minutes=4))
    assert len((await store.list_runs(filters=window)).runs) == 2
    with pytest.raises(BadCursor, match="cursor"):
        await store.list_runs(cursor="not-a-cursor")


async def test_a_sessions_history_is_its_callers_finished_full_runs(store: Store) -> None:
    first = typical_run(at=T0, session_id="s1", caller="agent.team-a.boss", tools=1, question="one", answer="1")
    second = typical_run(at=T0 + datetime.timedelta(minutes=1), session_id="s1", caller="agent.team-a.boss", tools=0,
                         question="two", answer="2")  # fmt: skip
    other_caller = typical_run(at=T0, session_id="s1", caller="http", question="not yours")
    failed = typical_run(at=T0 + datetime.timedelta(minutes=2), session_id="s1", caller="agent.team-a.boss",
                         outcome="Failed", question="broken")  # fmt: skip
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=e)
                               for e in (first, second, other_caller, failed)])  # fmt: skip

    history = await store.session_history(namespace="team-a", agent="triage", caller="agent.team-a.boss",
                                          session_id="s1")  # fmt: skip

    contents = [m["content"] for m in history.messages if m["role"] in ("user", "assistant") and m["content"]]
    assert contents == ["one", "1", "two", "2"]
    assert [m["role"] for m in history.messages][:4] == ["user", "assistant", "tool", "assistant"]
    assert history.messages[1]["tool_calls"][0]["function"]["name"] == "tool_0"
    assert history.run_ids == [first[0].run_id, second[0].run_id]
    elsewhere = await store.session_history(namespace="team-a", agent="writer", caller="agent.team-a.boss",
                                            session_id="s1")  # fmt: skip
    assert elsewhere.messages == []
    runs_of_session = await store.session_runs(namespace="team-a", agent="triage", session_id="s1")
    assert len(runs_of_session) == 4 and runs_of_session[0].started_at == T0


async def test_expired_runs_are_deleted_in_batches_with_their_timelines(store: Store) -> None:
    old = [typical_run(at=T0 - datetime.timedelta(days=40), retention_days=30) for _ in range(5)]
    kept = typical_run(at=T0, retention_days=30)
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=e) for e in [*old, kept]])

    deleted = await store.delete_expired(now=T0, batch_size=2)

    assert deleted == 5
    assert await _count(store, runs) == 1
    assert await _count(store, run_events) == len(kept) - 2


async def test_working_memory_is_kept_per_conversation_and_forgotten_when_it_expires(store: Store) -> None:
    def chunk(run_id: str, key: str, text: str) -> MemoryStored:
        return MemoryStored(id=event_id(), run_id=run_id, at=T0, key=key, content=text, ttl_seconds=1200)

    boss = typical_run(at=T0, session_id="s1", caller="agent.team-a.boss", tools=0)
    quiet = typical_run(at=T0, session_id="s2", caller="agent.team-a.boss", tools=0, record="Metadata")
    stored = [chunk(boss[0].run_id, "ab12cd-0", "# Part one"), chunk(quiet[0].run_id, "ef34ab-0", "private")]
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=[*boss, *quiet, *stored])])
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=stored)])  # a redelivery

    def read(*, agent: str = "triage", caller: str = "agent.team-a.boss", session_id: str = "s1", key: str = "ab12cd-0",
             now: datetime.datetime = T0):
        return store.session_memory(namespace="team-a", agent=agent, caller=caller, session_id=session_id, key=key,
                                    now=now)  # fmt: skip

    assert ((await read()).memory, (await read()).memory_cut) == ("# Part one", 0)
    assert await _count(store, working_memory) == 1  # once, and nothing of the Metadata run
    assert (await read(caller="http")).memory is None  # the conversation's key only
    assert (await read(agent="writer")).memory is None
    assert (await read(session_id="s2", key="ef34ab-0")).memory is None
    assert (await read(now=T0 + datetime.timedelta(seconds=1201))).memory is None
    await store.delete_expired(now=T0 + datetime.timedelta(seconds=1201))
    assert await _count(store, working_memory) == 0 and await _count(store, runs) == 2


async def test_migrations_run_once_when_several_processes_start_together(store_url: str) -> None:
    stores = await asyncio.gather(*(Store.open(url=store_url) for _ in range(3)))
    try:
        for each in stores:
            assert (await each.list_runs()).runs == []
    finally:
        for each in stores:
            await each.close()


async def test_an_unreachable_database_is_store_unavailable_naming_it() -> None:
    with pytest.raises(StoreUnavailable, match="cannot reach"):
        await Store.open(url="postgresql://nobody@127.0.0.1:9/none")


def test_an_unknown_database_scheme_names_the_ones_supported() -> None:
    with pytest.raises(ValueError, match="postgresql://"):
        asyncio.run(Store.open(url="mysql://x@y/z"))


async def test_reads_right_after_the_database_restarted_are_answered(private_postgres) -> None:
    """No ping before each read (a round trip per page): a connection the restart killed is replaced on first use."""
    store = await Store.open(url=private_postgres.create_database(), pool_size=2)
    try:
        events = typical_run(session_id="s1", caller="console:alice")
        await store.write(batches=[Batch(namespace="ns", agent="a", events=events)])
        await asyncio.gather(*(store.list_runs(filters=RunFilter(namespace="ns")) for _ in range(2)))  # both pooled
        await asyncio.to_thread(private_postgres.kill)  # a crash: every pooled connection is dead
        await asyncio.to_thread(private_postgres.start)
        listed = await store.list_runs(filters=RunFilter(namespace="ns"))
        opened = await store.get_run(events[0].run_id)
        history = await store.session_history(namespace="ns", agent="a", caller="console:alice", session_id="s1")
    finally:
        await store.close()
    assert [run.run_id for run in listed.runs] == [events[0].run_id]
    assert opened is not None and opened.run_id == events[0].run_id
    assert history.run_ids == [events[0].run_id]
