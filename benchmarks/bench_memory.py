"""Long-term memory benchmarks (issue 32), printed; real PostgreSQL (pgvector), SQLite (sqlite-vec) and RabbitMQ as
the tests start them, 384-number embeddings (the size of MiniLM/BGE-small).

    python -m benchmarks.bench_memory [--postgres 1000000] [--sqlite 100000] [--turns 200] [--skip-agent]

1. Recall in PostgreSQL holding `--postgres` memories: 90 % in callers' scopes of 1,000 each (compared whole),
   10 % in one Agent-wide scope (larger than `EXACT_UP_TO`: through the HNSW index, iterative scan); p50/p95 of
   `MemoryStore.recall` (k=5) for each, the HNSW's recall@5 against the exact answer, and `remember` (insert and
   the usage rows) p50.
2. Recall in SQLite holding `--sqlite` memories in callers' scopes of 1,000; and, to say where it stops, one
   scope of 10,000 and of 100,000 (SQLite compares whole).
3. A turn through an agent on a real RabbitMQ, its console on the seeded PostgreSQL, embeddings and model from
   the scripted server on 127.0.0.1: how long a `remember` call takes (written behind: until the broker confirmed
   the request; and one that waits for the console's insert), and how much later the model is asked with the
   automatic recall on than off.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import insert, text

from rockbot.agent.embeddings import Embedder
from rockbot.agent.long_term_memory import BusMemoryDesk
from rockbot.agent.registry import ToolContext
from rockbot.agent.runtime import AgentRuntime
from rockbot.bus import CONSOLE, AmqpBus, Principal
from rockbot.console import memory_store
from rockbot.console.memories import MemoryAnswerer
from rockbot.console.memory_store import MemoryStore, new_memory_id
from rockbot.console.store import Store
from rockbot.console.store_schema import memories as memories_table
from rockbot.contracts.agent_config import AgentConfig
from rockbot.contracts.memories import Recall
from tests.fixtures.llm import EMBEDDING_MODEL, ScriptedLLM, Turn
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.rabbitmq import RabbitBroker, provisioned

DIMS = 384
SCOPE = 1000


_NOW = datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC)
_LATER = _NOW.replace(year=2027)


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms"


def _vector(rng: random.Random) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(DIMS)]


def _load() -> str:
    return "load " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _tree_cpu(root: int | None) -> float:
    """CPU seconds (user + system, with reaped children's) of process `root` and its descendants, from /proc;
    0 for none."""
    if root is None:
        return 0.0
    parents, used = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parents[pid] = int(fields[1])
        used[pid] = sum(int(x) for x in fields[11:15])
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree, grew = tree | more, bool(more)
    return sum(used.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


class Cpu:
    """CPU spent between `start()` and `per(n)`: this process (`resource`), and the servers' process trees."""

    def __init__(self, **servers: int | None) -> None:
        self._servers = servers

    def start(self) -> Cpu:
        self._began = (time.process_time(), {name: _tree_cpu(pid) for name, pid in self._servers.items()})
        return self

    def per(self, count: int) -> str:
        """CPU per operation, in ms, of this process and each server."""
        own, servers = self._began
        parts = [f"this process {(time.process_time() - own) / count * 1000:.2f}"]
        parts += [f"{name} {(_tree_cpu(pid) - servers[name]) / count * 1000:.2f}"
                  for name, pid in self._servers.items()]
        return "CPU per call (ms): " + ", ".join(parts)


def _postmaster(postgres: PostgresServer) -> int:
    return int((postgres.data / "postmaster.pid").read_text().split()[0])


async def _timed_recalls(memories: MemoryStore, *, namespace: str, agent: str, caller: str, shared: bool,
                         rounds: int, rng: random.Random, cpu: Cpu | None = None) -> list[float]:  # fmt: skip
    """`rounds` recalls' times; `cpu` (started here) then says their CPU per call."""
    samples = []
    if cpu is not None:
        cpu.start()
    for _ in range(rounds):
        request = Recall(caller=caller, shared=shared, embedding=_vector(rng), model=EMBEDDING_MODEL, k=5)
        started = time.perf_counter()
        found = await memories.recall(namespace=namespace, agent=agent, request=request)
        samples.append(time.perf_counter() - started)
        assert len(found) == 5
    return samples


async def seed_postgres(store: Store, *, total: int) -> str:
    """`total` memories made by the database itself: 90 % in callers' scopes of `SCOPE` (10 agents), the rest in
    the last agent's shared scope. Their size's HNSW index is dropped first (built once afterwards by
    `build_hnsw`, far faster than row by row); its definition, as the migration made it, is returned."""
    shared = total // 10
    async with store.engine.begin() as connection:
        definition = await connection.scalar(text(
            f"SELECT indexdef FROM pg_indexes WHERE indexname = 'memories_hnsw_{DIMS}'"))
        await connection.execute(text(f"DROP INDEX memories_hnsw_{DIMS}"))
        await connection.execute(text(f"""
            INSERT INTO memories (id, namespace, agent, scope, caller, text, tags, bytes, model, dims, embedding,
                                  created_at, expires_at)
            SELECT 'm-' || lpad(to_hex(i), 16, '0'), 'ns-' || ((i / {SCOPE}) % 10), 'agent-' || ((i / {SCOPE}) % 10),
                   CASE WHEN i >= :total - {shared} THEN '' ELSE 'console:user-' || (i / {SCOPE}) END,
                   'console:user-' || (i / {SCOPE}), 'memory number ' || i, '[]', 20, '{EMBEDDING_MODEL}', {DIMS},
                   (SELECT array_agg(random() * 2 - 1)::vector FROM generate_series(1, {DIMS} + 0 * i)),
                   timestamp '2026-11-01' + i * interval '1 second', timestamp '2027-11-01'
            FROM generate_series(0, :total - 1) AS i"""), {"total": total})
        await connection.execute(text("""
            INSERT INTO memory_usage (namespace, agent, scope, items_held, bytes_held)
            SELECT namespace, agent, scope, count(*), sum(bytes) FROM memories GROUP BY namespace, agent, scope"""))
    await _vacuum(store)
    return str(definition)


async def build_hnsw(store: Store, definition: str) -> float:
    """Build the dropped HNSW index again; how long it took."""
    async with store.engine.connect() as connection:
        await connection.execute(text("SET maintenance_work_mem = '6GB'"))
        await connection.execute(text("SET max_parallel_maintenance_workers = 1"))
        started = time.perf_counter()
        await connection.execute(text(definition))
        await connection.commit()
    await _vacuum(store)
    return time.perf_counter() - started


async def _definition() -> str:
    return (f"CREATE INDEX memories_hnsw_{DIMS} ON memories USING hnsw ((embedding::vector({DIMS})) "
            f"vector_cosine_ops) WHERE dims = {DIMS}")


async def _vacuum(store: Store) -> None:
    async with store.engine.connect() as connection:
        autocommit = await connection.execution_options(isolation_level="AUTOCOMMIT")
        await autocommit.execute(text("VACUUM ANALYZE memories"))


def last_caller(total: int) -> tuple[Principal, str]:
    """The agent and caller of the last callers' scope the seeding made (one of `SCOPE` memories)."""
    index = (total - total // 10) // SCOPE - 1
    return Principal.agent(namespace=f"ns-{index % 10}", name=f"agent-{index % 10}"), f"console:user-{index}"


def shared_scope(total: int) -> Principal:
    index = (total - 1) // SCOPE
    return Principal.agent(namespace=f"ns-{index % 10}", name=f"agent-{index % 10}")


async def postgres_recall(*, postgres: PostgresServer, total: int, hnsw: bool) -> None:
    store = await Store.open(url=postgres.create_database())
    started = time.perf_counter()
    definition = await seed_postgres(store, total=total)
    print(f"   ({total:,} memories seeded in {time.perf_counter() - started:.0f} s)", flush=True)
    memories = MemoryStore(store=store)
    rng = random.Random(7)
    agent, who = last_caller(total)
    cpu = Cpu(postgres=_postmaster(postgres))
    caller = await _timed_recalls(memories, namespace=agent.namespace, agent=agent.name, caller=who, shared=False,
                                  rounds=300, rng=rng, cpu=cpu)  # fmt: skip
    print(f"1. PostgreSQL, {total:,} memories: recall (k=5) in a caller's scope of {SCOPE:,} (compared whole; the "
          f"plan uses the scope's index, never the HNSW) {_percentiles(caller)}; {cpu.per(len(caller))} ({_load()}; "
          "goal p95 <= 20 ms)", flush=True)
    if not hnsw:
        await store.close()
        return
    built = await build_hnsw(store, definition)
    owner = shared_scope(total)
    shared = await _timed_recalls(memories, namespace=owner.namespace, agent=owner.name, caller="console:x",
                                  shared=True, rounds=300, rng=rng, cpu=cpu)  # fmt: skip
    shared_cpu = cpu.per(len(shared))
    hits = asked = 0
    for _ in range(30):  # the HNSW answer against the exact one (every memory of the scope compared)
        request = Recall(caller="console:x", shared=True, embedding=_vector(rng), model=EMBEDDING_MODEL, k=5)
        approximate = {m.id for m in await memories.recall(namespace=owner.namespace, agent=owner.name,
                                                           request=request)}  # fmt: skip
        memory_store.EXACT_UP_TO = 10**9
        exact = {m.id for m in await memories.recall(namespace=owner.namespace, agent=owner.name, request=request)}
        memory_store.EXACT_UP_TO = 20_000
        hits, asked = hits + len(approximate & exact), asked + len(exact)
    await store.close()
    path = "HNSW" if total // 10 > memory_store.EXACT_UP_TO else "exact"
    print(f"4. PostgreSQL, {total:,} memories, their HNSW index built in {built:.0f} s: recall in a shared scope of "
          f"{total // 10:,} ({path}) {_percentiles(shared)}; {shared_cpu}; recall@5 {hits / asked:.2f} against the "
          f"exact answer ({_load()}; goal p95 <= 20 ms)", flush=True)


async def sqlite_recall(*, total: int) -> None:
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-sqlite-") as root:
        store = await Store.open(url=f"sqlite:///{Path(root) / 'runs.db'}")
        rng = random.Random(11)
        started = time.perf_counter()
        layout = [("ns-0", "agent-0", f"console:user-{i // SCOPE}") for i in range(total)]
        layout += [("ns-1", "wide", "console:ten")] * 10_000 + [("ns-2", "huge", "console:hundred")] * 100_000
        for start in range(0, len(layout), 10_000):
            rows = [{"id": new_memory_id(), "namespace": ns, "agent": agent, "scope": scope, "caller": scope,
                     "text": "memory", "tags": [], "bytes": 6, "model": EMBEDDING_MODEL, "dims": DIMS,
                     "embedding": _vector(rng), "created_at": _NOW, "expires_at": _LATER}
                    for ns, agent, scope in layout[start:start + 10_000]]  # fmt: skip
            async with store.engine.begin() as connection:
                await connection.execute(insert(memories_table), rows)
        async with store.engine.begin() as connection:
            await connection.execute(text("ANALYZE"))
        print(f"   ({len(layout):,} SQLite memories seeded in {time.perf_counter() - started:.0f} s)", flush=True)
        memories = MemoryStore(store=store)
        cpu = Cpu()
        caller = await _timed_recalls(memories, namespace="ns-0", agent="agent-0", shared=False, rounds=300,
                                      caller=f"console:user-{total // SCOPE - 1}", rng=rng, cpu=cpu)  # fmt: skip
        caller_cpu = cpu.per(len(caller))
        wide = await _timed_recalls(memories, namespace="ns-1", agent="wide", caller="console:ten", shared=False,
                                    rounds=100, rng=rng)  # fmt: skip
        huge = await _timed_recalls(memories, namespace="ns-2", agent="huge", caller="console:hundred",
                                    shared=False, rounds=30, rng=rng)  # fmt: skip
        await store.close()
    print(f"2. SQLite, {total:,} memories in scopes of {SCOPE:,}: recall {_percentiles(caller)}, {caller_cpu}; "
          f"one scope of 10,000 {_percentiles(wide)}; one of 100,000 {_percentiles(huge)} ({_load()}; goal p95 <= "
          "20 ms)", flush=True)


async def agent_turns(*, postgres: PostgresServer, total: int, turns: int) -> None:
    """Remember and the automatic recall through an agent, on a database as migrated (its HNSW index kept up by
    every insert) holding `total` memories."""
    store = await Store.open(url=postgres.create_database())
    await seed_postgres(store, total=total)
    print(f"   (HNSW index over {total:,} for the agent's database built in "
          f"{await build_hnsw(store, await _definition()):.0f} s)", flush=True)
    agent, who = last_caller(total)
    llm = await ScriptedLLM(embedding_dimensions=DIMS).start()
    memories = MemoryStore(store=store)
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-rabbit-") as root:
        broker = RabbitBroker(root=Path(root))
        broker.start()
        try:
            async with provisioned(broker, f"bench-{uuid.uuid4().hex[:6]}") as vhost:
                console = await AmqpBus.connect(url=await vhost.url(CONSOLE))
                answerer = MemoryAnswerer(memories=memories, bus=console)
                await answerer.start()
                bus = await AmqpBus.connect(url=await vhost.url(agent))
                cpu = Cpu(postgres=_postmaster(postgres), rabbitmq=broker._server and broker._server.pid)
                durations: dict[bool, list[float]] = {False: [], True: []}
                embeds = await _timed_embeds(llm.url, turns)
                cpu_text: dict[str, str] = {}
                asked: dict[str, list[float]] = {"off": [], "on": []}
                for mode in ("off", "on", "off", "on"):
                    config = AgentConfig.model_validate({
                        "name": agent.name, "namespace": agent.namespace,
                        "model": {"base_url": llm.url, "name": "scripted-model"},
                        "long_term_memory": {"embeddings": {"base_url": llm.url, "model": EMBEDDING_MODEL},
                                             "max_items_per_scope": 100_000,
                                             "auto_recall": {"min_score": 0.0} if mode == "on" else None},
                    })  # fmt: skip
                    runtime = await AgentRuntime.from_config(config, bus=bus, env={},
                                                             memory_desk=BusMemoryDesk(bus=bus)).start()
                    if mode == "off":  # a remember call as the loop makes it (the registry's validation included)
                        context = ToolContext(session_id=runtime.conversation(caller=who,
                                                                              session_id="s").id)  # fmt: skip
                        memory = runtime.kit.long_term
                        for waited in (False, True):
                            cpu.start()
                            for n in range(turns):
                                if waited:  # no word of the console on the scope's room: it waits for the console
                                    memory._rooms.clear()
                                started = time.perf_counter()
                                outcome = await runtime.registry.invoke(
                                    "remember", {"text": f"fact {n} about deploys"}, context=context)
                                durations[waited].append(time.perf_counter() - started)
                                assert outcome.error is None, outcome.error
                                await memory.settled()  # its reply and embedding, as before the model's next call
                            cpu_text.setdefault(f"remember {waited}", cpu.per(turns))
                    cpu.start()
                    for n in range(turns):
                        llm.play(_stamp(asked[mode], time.perf_counter()))
                        await runtime.chat(f"s{n}", f"what about fact {n} and deploys?", caller=who)
                    cpu_text[mode] = cpu.per(turns)
                    await runtime.close()
                await answerer.stop()
                await bus.close()
                await console.close()
        finally:
            broker.stop()
    await store.close()
    await llm.stop()
    off, on = statistics.median(asked["off"]), statistics.median(asked["on"])
    print(f"3. through an agent on RabbitMQ, its database holding {total:,} memories: a remember call ({turns} of "
          f"them, the first waiting for the console, the others written behind) {_percentiles(durations[False])} "
          f"(goal p50 <= 5 ms), {cpu_text['remember False']}; one that waits for the console (no word on the scope's "
          f"room in this process) {_percentiles(durations[True])}, {cpu_text['remember True']}; an embedding alone "
          f"{_percentiles(embeds)}; the model asked {off * 1000:.2f} ms after the turn started without the automatic "
          f"recall, {on * 1000:.2f} ms with it: +{(on - off) * 1000:.2f} ms at p50 (goal <= 15 ms); a turn's "
          f"{cpu_text['off']} without, {cpu_text['on']} with it ({_load()})", flush=True)


async def _timed_embeds(url: str, count: int) -> list[float]:
    """`count` embeddings asked of the scripted endpoint, one after another: what each took."""
    embedder = Embedder(base_url=url, model=EMBEDDING_MODEL)
    samples = []
    for n in range(count):
        started = time.perf_counter()
        await embedder.embed(f"fact {n} about deploys")
        samples.append(time.perf_counter() - started)
    await embedder.close()
    return samples


def _stamp(samples: list[float], sent: float):
    """A scripted turn that notes how long after `sent` the model was asked."""

    def answer(body: dict) -> Turn:
        samples.append(time.perf_counter() - sent)
        return Turn(text="ok")

    return answer


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", type=int, default=1_000_000)
    parser.add_argument("--sqlite", type=int, default=100_000)
    parser.add_argument("--agent-memories", type=int, default=20_000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--no-hnsw", action="store_true", help="skip 4. (the HNSW build over --postgres memories)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rockbot-bench-pg-"))
    postgres = PostgresServer(root=root, durable=True)
    postgres.init()
    postgres.start()
    try:
        await postgres_recall(postgres=postgres, total=args.postgres, hnsw=False)
        if args.sqlite:
            await sqlite_recall(total=args.sqlite)
        if args.turns:
            await agent_turns(postgres=postgres, total=args.agent_memories, turns=args.turns)
        if not args.no_hnsw:
            await postgres_recall(postgres=postgres, total=args.postgres, hnsw=True)
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
