"""Run store benchmarks (issue 19), printed; real PostgreSQL and RabbitMQ as the tests start them.

    python -m benchmarks.bench_runstore [--rounds 300] [--events 40000] [--runs 1000000] [--size-runs 10000]

1. Recording's cost per tool call: one agent process, the scripted LLM (HTTP+SSE on 127.0.0.1), a
   no-op tool, `--rounds` tool-call rounds with recording off, then on (events built, redacted,
   buffered and published on the bus in the background), CPU and wall time per round.
2. The writer: `--events` run events (typical turns of 3 tool calls) waiting on `console.runs` of a
   real RabbitMQ, written by the console's `RunWriter` to a real PostgreSQL; events/s until the
   queue is empty and every row is there.
3. Reading at scale: `--runs` runs put into PostgreSQL with one INSERT ... SELECT, one of them with
   200 timeline entries; p50/p95 of listing a page (newest first, by namespace and agent, and its
   10th page through the cursor) and of opening the run with 200 entries.
4. Database size per 10,000 typical runs (3 tool calls each), written through the store.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry
from sqlalchemy import text

from rockbot.agent.defining import tool
from rockbot.agent.recording import bus_publisher
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import CONSOLE, AmqpBus, MemoryBroker, Principal
from rockbot.bus.admin import ensure_principal
from rockbot.bus.topology import CONSOLE_RUNS
from rockbot.console.recording import RecorderMetrics, RunWriter, WriterLimits
from rockbot.console.store import Batch, Store
from rockbot.console.store_models import RunFilter
from rockbot.contracts.agent_config import AgentConfig
from rockbot.contracts.recording import RunEvents
from rockbot.health import Readiness
from tests.console.events import typical_run
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.rabbitmq import RabbitBroker, provisioned

AGENT = Principal.agent(namespace="bench", name="bench")


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms"


@tool
async def noop(x: int) -> int:
    """Return x."""
    return x


class _Tools:
    @staticmethod
    async def install(*, registry, kit):
        registry.register(noop)


async def recording_overhead(*, rounds: int) -> None:
    llm = await ScriptedLLM().start()
    broker = MemoryBroker()
    await ensure_principal(broker, AGENT, password="")
    bus = broker.connect(AGENT.user)
    config = AgentConfig.model_validate({"name": "bench", "namespace": "bench", "max_iterations": 100,
                                         "model": {"base_url": llm.url, "name": "scripted-model"}})  # fmt: skip
    results = {}
    try:
        for mode in ("off", "on", "off", "on"):
            runtime = await AgentRuntime.from_config(
                config, bus=bus, tool_sets=[_Tools], publish_runs=bus_publisher(bus) if mode == "on" else None,
            ).start()  # fmt: skip
            per_turn = 50
            turns = rounds // per_turn
            for _ in range(turns):
                llm.play(*[Turn(tool_calls=[ScriptedCall(name="noop", arguments={"x": 1})])] * (per_turn - 1),
                         Turn(text="done"))  # fmt: skip
            cpu, wall = time.process_time(), time.perf_counter()
            for turn in range(turns):
                await runtime.chat(f"s{turn}", "go", caller="http")
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            await runtime.close()  # sends what is buffered (its cost counted below, not in the turns)
            calls = turns * (per_turn - 1)
            results.setdefault(mode, []).append((cpu / calls, wall / calls))
    finally:
        await llm.stop()
        await bus.close()
    off_cpu = min(c for c, _ in results["off"])
    on_cpu = min(c for c, _ in results["on"])
    off_wall = min(w for _, w in results["off"])
    on_wall = min(w for _, w in results["on"])
    print(f"1. recording per tool call ({rounds} rounds, best of 2): off {off_wall * 1000:.3f} ms wall / "
          f"{off_cpu * 1000:.3f} ms CPU; on {on_wall * 1000:.3f} ms wall / {on_cpu * 1000:.3f} ms CPU; "
          f"added {(on_wall - off_wall) * 1000:.3f} ms wall, {(on_cpu - off_cpu) * 1000:.3f} ms CPU (goal < 1 ms)")


async def writer_throughput(*, postgres: PostgresServer, events: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-rabbit-") as root:
        broker = RabbitBroker(root=Path(root))
        broker.start()
        try:
            async with provisioned(broker, f"bench-{uuid.uuid4().hex[:6]}") as vhost:
                agent = await AmqpBus.connect(url=await vhost.url(AGENT))
                messages = [RunEvents(events=typical_run(tools=3)) for _ in range(events // 14)]
                total = sum(len(m.events) for m in messages)
                for message in messages:
                    await agent.publish(queue=CONSOLE_RUNS, body=message)
                await agent.close()
                store = await Store.open(url=postgres.create_database())
                console = await AmqpBus.connect(url=await vhost.url(CONSOLE))
                writer = RunWriter(store=store, bus=console, readiness=Readiness(),
                                   metrics=RecorderMetrics(CollectorRegistry()),
                                   limits=WriterLimits(events_per_second=1e9, burst_events=1e9))  # fmt: skip
                cpu, wall = time.process_time(), time.perf_counter()
                await writer.start()
                while True:  # every row written (counted in the database, not asked of the broker)
                    async with store.engine.connect() as connection:
                        written = await connection.scalar(text("SELECT count(*) FROM run_events"))
                    if written >= total - 2 * len(messages):
                        break
                    await asyncio.sleep(0.05)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                await writer.stop()
                await console.close()
                async with store.engine.connect() as connection:
                    rows = await connection.scalar(text("SELECT count(*) FROM run_events"))
                    runs = await connection.scalar(text("SELECT count(*) FROM runs"))
                await store.close()
                print(f"2. writer, RabbitMQ -> PostgreSQL: {total} events ({len(messages)} messages) in {wall:.2f} s "
                      f"= {total / wall:,.0f} events/s, writer CPU {cpu:.2f} s ({total / cpu:,.0f} events per "
                      f"CPU-second); rows {rows} + {runs} runs (goal >= 2,000 events/s)")
        finally:
            broker.stop()


async def seed_runs(store: Store, *, runs: int) -> None:
    """`runs` finished runs over 20 namespaces and 200 agents, inserted by the database itself (seconds, not hours)."""
    async with store.engine.begin() as connection:
        await connection.execute(text("""
            INSERT INTO runs (run_id, namespace, agent, source, caller, session_id, model, record, started_at,
                              ended_at, outcome, prompt_tokens, completion_tokens, tool_calls, expires_at)
            SELECT md5(i::text), 'ns-' || (i % 20), 'agent-' || (i % 200),
                   (ARRAY['chat','trigger','scheduled_task'])[1 + i % 3], 'http', 's' || (i % 5000), 'm', 'Full',
                   timestamp '2026-01-01' + i * interval '1 second', timestamp '2026-01-01' + i * interval '1 second',
                   (ARRAY['Succeeded','Failed'])[1 + (i % 17 = 0)::int], 300, 40, 3, timestamp '2026-12-31'
            FROM generate_series(1, :n) AS i"""), {"n": runs})


async def reads_at_scale(*, postgres: PostgresServer, runs: int) -> None:
    url = postgres.create_database()
    store = await Store.open(url=url)
    started = time.perf_counter()
    await seed_runs(store, runs=runs)
    target = typical_run(tools=3)[0].run_id
    events = []
    for _ in range(17):  # 12 timeline entries each: 204
        events += typical_run(run_id=target, tools=3)
    await store.write(batches=[Batch(namespace="ns-1", agent="agent-1", events=events)])
    async with store.engine.begin() as connection:
        await connection.execute(text("ANALYZE"))
    loaded = time.perf_counter() - started
    run = await store.get_run(target)
    assert run is not None
    filters = RunFilter(namespace="ns-7", agent="agent-7")
    first, deep, opened = [], [], []
    for _ in range(200):
        t = time.perf_counter()
        page = await store.list_runs(filters=filters, limit=50)
        first.append(time.perf_counter() - t)
    cursor = None
    for _ in range(10):
        page = await store.list_runs(filters=RunFilter(namespace="ns-7"), limit=50, cursor=cursor)
        cursor = page.next_cursor
    for _ in range(200):
        t = time.perf_counter()
        await store.list_runs(filters=RunFilter(namespace="ns-7"), limit=50, cursor=cursor)
        deep.append(time.perf_counter() - t)
    for _ in range(200):
        t = time.perf_counter()
        await store.get_run(target)
        opened.append(time.perf_counter() - t)
    await store.close()
    print(f"3. {runs:,} runs (loaded in {loaded:.0f} s): list a page of 50 by namespace+agent {_percentiles(first)}; "
          f"the 11th page by namespace via the cursor {_percentiles(deep)}; open a run with "
          f"{len(run.timeline)} timeline entries {_percentiles(opened)} (goal p95 < 50 ms)")


async def size_per_runs(*, postgres: PostgresServer, runs: int) -> None:
    url = postgres.create_database()
    store = await Store.open(url=url)
    async with store.engine.connect() as connection:
        before = await connection.scalar(text("SELECT pg_database_size(current_database())"))
    now = datetime.datetime.now(datetime.UTC)
    for start in range(0, runs, 200):
        batches = [Batch(namespace="ns", agent="a", events=typical_run(tools=3, at=now))
                   for _ in range(min(200, runs - start))]  # fmt: skip
        await store.write(batches=batches)
    async with store.engine.begin() as connection:
        await connection.execute(text("CHECKPOINT"))
        after = await connection.scalar(text("SELECT pg_database_size(current_database())"))
    await store.close()
    print(f"4. database size for {runs:,} typical runs (3 tool calls, 14 events each): "
          f"{(after - before) / 2**20:.1f} MiB, {(after - before) / runs / 1024:.1f} KiB per run")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--events", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--size-runs", type=int, default=10_000)
    args = parser.parse_args()
    if args.rounds:
        await recording_overhead(rounds=args.rounds)
    root = Path(tempfile.mkdtemp(prefix="rockbot-bench-pg-"))
    postgres = PostgresServer(root=root, durable=True)
    postgres.init()
    postgres.start()
    try:
        await writer_throughput(postgres=postgres, events=args.events)
        await reads_at_scale(postgres=postgres, runs=args.runs)
        await size_per_runs(postgres=postgres, runs=args.size_runs)
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
