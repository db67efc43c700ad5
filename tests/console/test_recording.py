"""The console's bus side: run events from agents written under the sender's name, bounded per agent, and
session histories answered only from the asking agent's own runs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from rockbot.bus import CONSOLE, OPERATOR, AccessRefused, MemoryBroker, Principal
from rockbot.bus.topology import CONSOLE_HISTORY, CONSOLE_RUNS, agent_replies
from rockbot.console.recording import HistoryAnswerer, RecorderMetrics, RunWriter, WriterLimits
from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from rockbot.contracts.recording import HistoryReply, HistoryRequest, RunEvents
from rockbot.health import Readiness
from tests.buses import login
from tests.console.events import typical_run
from tests.waiting import eventually

TRIAGE = Principal.agent(namespace="team-a", name="triage")
EVIL = Principal.agent(namespace="team-b", name="evil")


class Console:
    def __init__(self, *, broker: MemoryBroker, store: Store, limits: WriterLimits) -> None:
        self.broker = broker
        self.store = store
        self.readiness = Readiness()
        self.metrics = RecorderMetrics(CollectorRegistry())
        self.limits = limits

    async def __aenter__(self) -> Console:
        self.bus = await login(self.broker, CONSOLE)
        self.writer = RunWriter(store=self.store, bus=self.bus, readiness=self.readiness, metrics=self.metrics,
                                limits=self.limits)  # fmt: skip
        self.history = HistoryAnswerer(store=self.store, bus=self.bus, metrics=self.metrics)
        await self.writer.start()
        await self.history.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.writer.stop()
        await self.history.stop()
        await self.bus.close()


@pytest.fixture
async def broker() -> MemoryBroker:
    return MemoryBroker()


@pytest.fixture
async def console(broker: MemoryBroker, store: Store) -> AsyncIterator[Console]:
    async with Console(broker=broker, store=store, limits=WriterLimits(events_per_second=0.01, burst_events=60)) as c:
        yield c


async def test_events_are_recorded_as_the_agent_that_sent_them(broker: MemoryBroker, console: Console) -> None:
    agent = await login(broker, TRIAGE)
    events = typical_run()
    await agent.publish(queue=CONSOLE_RUNS, body=RunEvents(events=events))

    async def recorded() -> None:
        page = await console.store.list_runs(filters=RunFilter(namespace="team-a", agent="triage"))
        assert [run.run_id for run in page.runs] == [events[0].run_id]
        run = await console.store.get_run(events[0].run_id)
        assert run is not None and run.outcome == "Succeeded" and len(run.timeline) == len(events) - 2

    await eventually(recorded)
    await agent.close()


async def test_another_agent_cannot_write_into_a_run_it_does_not_own(broker: MemoryBroker, console: Console) -> None:
    triage, evil = await login(broker, TRIAGE), await login(broker, EVIL)
    events = typical_run()
    await triage.publish(queue=CONSOLE_RUNS, body=RunEvents(events=events))
    await eventually(lambda: _has_run(console.store, events[0].run_id))

    await evil.publish(queue=CONSOLE_RUNS, body=RunEvents(events=typical_run(run_id=events[0].run_id,
                                                                             outcome="Failed")))  # fmt: skip

    async def refused() -> None:
        assert console.metrics.events.labels("refused_owner")._value.get() == len(events)

    await eventually(refused)
    run = await console.store.get_run(events[0].run_id)
    assert run is not None and (run.agent, run.outcome) == ("triage", "Succeeded")


async def test_only_agents_may_send_run_events(broker: MemoryBroker, console: Console) -> None:
    operator = await login(broker, OPERATOR)
    with pytest.raises(AccessRefused):
        await operator.publish(queue=CONSOLE_RUNS, body=RunEvents(events=typical_run()))


async def test_an_agent_over_its_rate_is_refused_and_others_are_not(broker: MemoryBroker, console: Console) -> None:
    triage, evil = await login(broker, TRIAGE), await login(broker, EVIL)
    # 14 events each: 4 fit the burst of 60
    flood = [RunEvents(events=typical_run(tools=3, namespace="team-b", agent="evil")) for _ in range(6)]
    for message in flood:
        await evil.publish(queue=CONSOLE_RUNS, body=message)
    honest = typical_run()
    await triage.publish(queue=CONSOLE_RUNS, body=RunEvents(events=honest))

    async def settled() -> None:
        assert await _has_run(console.store, honest[0].run_id)
        assert console.metrics.events.labels("refused_rate")._value.get() == 2 * 14
        written = await console.store.list_runs(filters=RunFilter(namespace="team-b"))
        assert len(written.runs) == 4

    await eventually(settled)
    dead = await broker.dead_letters(count=100)
    assert any(letter.user_id == EVIL.user for letter in dead)


async def test_an_agent_reads_its_own_sessions_history_and_no_one_elses(broker: MemoryBroker, console: Console) -> None:
    triage = await login(broker, TRIAGE)
    evil = await login(broker, EVIL)
    mine = typical_run(session_id="s1", caller="http", tools=1, question="hello", answer="hi")
    await triage.publish(queue=CONSOLE_RUNS, body=RunEvents(events=mine))
    await eventually(lambda: _has_run(console.store, mine[0].run_id))

    reply = await triage.request(
        queue=CONSOLE_HISTORY, body=HistoryRequest(session_id="s1", caller="http"), correlation_id=uuid.uuid4().hex,
        reply_queue=agent_replies(namespace="team-a", name="triage", slot=0), timeout_seconds=5,
        responder=CONSOLE,
    )  # fmt: skip
    history = reply.decode(HistoryReply)
    assert [m["content"] for m in history.messages if m["role"] == "user"] == ["hello"]
    assert history.messages[-1] == {"role": "assistant", "content": "hi"}

    theirs = await evil.request(
        queue=CONSOLE_HISTORY, body=HistoryRequest(session_id="s1", caller="http"), correlation_id=uuid.uuid4().hex,
        reply_queue=agent_replies(namespace="team-b", name="evil", slot=0), timeout_seconds=5,
        responder=CONSOLE,
    )  # fmt: skip
    assert theirs.decode(HistoryReply).messages == []


async def test_a_history_answer_goes_only_to_the_askers_own_queue(broker: MemoryBroker, console: Console) -> None:
    evil = await login(broker, EVIL)
    before = len(await broker.dead_letters(count=1000))
    await evil.publish(queue=CONSOLE_HISTORY, body=HistoryRequest(session_id="s1"), correlation_id="x",
                       reply_to=agent_replies(namespace="team-a", name="triage", slot=0).name)  # fmt: skip

    async def refused() -> None:
        assert len(await broker.dead_letters(count=1000)) == before + 1

    await eventually(refused)


async def _has_run(store: Store, run_id: str) -> bool:
    run = await store.get_run(run_id)
    assert run is not None and run.outcome is not None
    return True
