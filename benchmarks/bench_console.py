"""Console benchmarks (issue 20), printed; real PostgreSQL, RabbitMQ and API server as the tests start them.

    python -m benchmarks.bench_console [--runs 100000] [--renders 200] [--chats 40] [--kubeconfig PATH] [--parts 1,2,3]

1. The Runs page with `--runs` runs in PostgreSQL (one INSERT ... SELECT, as bench_runstore): the listing's
   EXPLAIN ANALYZE, then p50/p95 of rendering it (a namespace and agent filtered, a namespace alone, a run's
   page) over HTTP, in the console's handler (server-side) and in the store, with a permission answer that
   costs nothing (what is measured is the store, the template and the HTTP server).
2. Chat's time to the first token: an agent process (`rockbot agent`, its own login on a real RabbitMQ) whose
   model is the scripted OpenAI-compatible SSE server; `--chats` turns streamed from the agent's own
   `/v1/chat/completions`, and as many through each of two consoles (one sending the conversation with the
   turn, one leaving the agent to ask `console.history` for it), interleaved; time from sending to the first
   text in the answer, and the median moment of each step on the way. The client (the person's browser, the
   endpoint's caller) runs in a process of its own, so the consoles' event loop is theirs alone, as deployed
   (with the console's run writer and history answers, which share it in a real console too).
3. SubjectAccessReviews per page against the real API server (`--kubeconfig`, the shared rig's by default):
   the Agents, Runs, Agent and Approvals pages loaded 20 times each by one user, with the answers kept 10 s
   (the default) and not kept at all; the reviews sent, per page load, and the load's p50.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import datetime
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry
from sqlalchemy import event, text

from benchmarks.bench_runstore import seed_runs
from rockbot.bus import CONSOLE, AmqpBus, Principal
from rockbot.console.approvals import ApprovalDesk
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import AccessReviewer, Authorizer
from rockbot.console.chat import ChatRelay
from rockbot.console.recording import HistoryAnswerer, RecorderMetrics, RunWriter
from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from rockbot.console.web import chat as chat_pages
from rockbot.console.web.app import build_app
from rockbot.console.web.gate import Gate
from rockbot.health import Readiness
from rockbot.kube import KubeClient
from rockbot.local.console import Everyone, ManifestCatalog
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.agent.test_cli import bound_port, ready, rockbot_agent
from tests.fixtures.llm import ScriptedLLM, Turn
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.rabbitmq import RabbitBroker, provisioned

TOKEN = "bench-token"
USER = Identity(username="bench-user")
#: The console's sessions in this process (the CSRF token of the local principal comes from them).
SESSIONS = Sessions()


def _percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"p50 {statistics.median(ordered) * 1000:.1f} ms, p95 {p95 * 1000:.1f} ms"


def _agents(count: int) -> ManifestCatalog:
    """Agents in `count` namespaces, as the console reads them (a catalog in place of the API server's list)."""
    return ManifestCatalog({"agents": [{"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent",
                                        "metadata": {"name": f"agent-{i}", "namespace": f"ns-{i}"},
                                        "spec": {"model": {"name": "m", "baseUrl": "http://127.0.0.1:9/v1"}}}
                                       for i in range(count)]})  # fmt: skip


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _app(*, authorizer: Authorizer, kube, store: Store | None = None, chat: ChatRelay | None = None,
         desk: ApprovalDesk | None = None) -> web.Application:
    gate = Gate(tokens=None, sessions=SESSIONS, local_identity=USER)
    return build_app(gate=gate, authorizer=authorizer, kube=kube, store=store, chat=chat, desk=desk,
                     secure_cookie=False)


async def runs_page(*, postgres: PostgresServer, runs: int, renders: int) -> None:
    store = await Store.open(url=postgres.create_database())
    started = time.perf_counter()
    await seed_runs(store, runs=runs)
    async with store.engine.begin() as connection:
        await connection.execute(text("ANALYZE"))
    loaded = time.perf_counter() - started
    print(f"1. Runs page with {runs:,} runs (loaded in {loaded:.0f} s); the listing's plan:")
    await _explain(store, RunFilter(namespace="ns-7", agent="agent-7"))
    app = _app(authorizer=Everyone(), kube=_agents(20), store=store)
    server, reads = _timed(app, store)
    async with serving(app) as url, aiohttp.ClientSession() as http:
        for kind, path in (("a page of 50 by namespace+agent", "/runs?namespace=ns-7&agent=agent-7"),
                           ("a page of 50 by namespace", "/runs?namespace=ns-7"),
                           ("a run's page", f"/runs/{_md5(7)}")):
            samples = []
            server.clear()
            reads.clear()
            started = time.process_time()
            for _ in range(renders):
                t = time.perf_counter()
                async with http.get(url + path) as answer:
                    body = await answer.text()
                samples.append(time.perf_counter() - t)
                assert answer.status == 200, (kind, answer.status, body[:300])
            cpu = (time.process_time() - started) / renders
            print(f"   {kind}: over HTTP {_percentiles(samples)}; in the console's handler {_percentiles(server)}, of "
                  f"which the store {_percentiles(reads)}; {cpu * 1000:.1f} ms CPU of the console and client per "
                  "render (goal p95 < 100 ms)")
    await store.close()


def _timed(app: web.Application, store: Store) -> tuple[list[float], list[float]]:
    """Time each request in the console's handler (a middleware outside every other) and each store read."""
    server: list[float] = []
    reads: list[float] = []

    @web.middleware
    async def timing(request: web.Request, handler):
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            server.append(time.perf_counter() - started)

    def timed_read(read):
        async def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return await read(*args, **kwargs)
            finally:
                reads.append(time.perf_counter() - started)
        return timed

    app.middlewares.insert(0, timing)
    store.list_runs, store.get_run = timed_read(store.list_runs), timed_read(store.get_run)
    return server, reads


async def _explain(store: Store, filters: RunFilter) -> None:
    """Print EXPLAIN ANALYZE of the first page's query, as `Store.list_runs` builds it."""
    statements: list[str] = []

    def keep(connection, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT"):
            statements.append((statement, parameters))

    event.listen(store.engine.sync_engine, "before_cursor_execute", keep)
    try:
        await store.list_runs(filters=filters, limit=50)
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", keep)
    statement, parameters = statements[-1]
    async with store.engine.connect() as connection:
        raw = await connection.get_raw_connection()
        plan = await raw.driver_connection.fetch("EXPLAIN ANALYZE " + statement, *parameters)
    print("\n".join(f"     {row[0]}" for row in plan))


def _md5(i: int) -> str:
    return hashlib.md5(str(i).encode()).hexdigest()


@contextlib.asynccontextmanager
async def agent_process(config, *, bus_url: str, folder: Path) -> AsyncIterator[str]:
    path = folder / "agent.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command, env = rockbot_agent("--config", str(path), "--bus", bus_url, "--host", "127.0.0.1", "--port", "0",
                                 "--log-format", "text", env={API_KEY_ENV: "k", "BENCH_TOKEN": TOKEN})
    process = await asyncio.create_subprocess_exec(*command, env=env, stderr=asyncio.subprocess.PIPE)
    drain = None
    try:
        base = f"http://127.0.0.1:{await asyncio.wait_for(bound_port(process), 60)}"
        async with aiohttp.ClientSession() as http:
            await asyncio.wait_for(ready(http, base, process), 60)
        drain = asyncio.create_task(process.stderr.read())  # keep its log pipe from filling
        yield base
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)
        if drain is not None:
            await drain


async def _first_text(answer: aiohttp.ClientResponse, *, relayed: bool, started: float) -> float:
    """Seconds from `started` to the first text of the streamed answer (read to its end)."""
    first = None
    async for line in answer.content:
        if first is None and _is_text(line, relayed=relayed):
            first = time.perf_counter() - started
    assert first is not None and answer.status == 200, answer.status
    return first


def _is_text(line: bytes, *, relayed: bool) -> bool:
    if relayed:
        return line.startswith(b"event: text")
    if not line.startswith(b"data: {"):
        return False
    choices = json.loads(line[6:]).get("choices") or [{}]
    return bool((choices[0].get("delta") or {}).get("content"))


class _Phases:
    """Wall-clock marks (time.time(), one machine) of each relayed turn, keyed by its message (`<label> <n>`):
    where the console path's time goes. The agent's own moments are its messages' `published_at` stamps (ms)."""

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, float]] = {}
        self._turns: dict[str, str] = {}  # request id or session -> the turn's message
        self._current: str | None = None  # the turn being posted (they go one at a time)

    def middleware(self):
        """A middleware (outside every other) marking when the console took a turn's post: which turn is current."""

        @web.middleware
        async def taken(request: web.Request, handler):
            if request.method == "POST":
                posted = json.loads(await request.read())  # kept: the handler reads the same bytes
                self._turns[posted["session"]] = self._current = posted["message"]
                self.mark(posted["message"], "console takes the post")
            return await handler(request)

        return taken

    def merge(self, marks: dict[str, dict[str, float]]) -> None:
        """Add the client's marks (its own process: the post, the first text read)."""
        for turn, moments in marks.items():
            self.marks.setdefault(turn, {}).update(moments)

    def mark(self, turn: str | None, what: str, at: float | None = None) -> None:
        if turn is not None:
            self.marks.setdefault(turn, {}).setdefault(what, time.time() if at is None else at)

    def wrap(self, *, bus: AmqpBus, history: HistoryAnswerer, writer: RunWriter, relays: list[ChatRelay],
             store: Store, llm: ScriptedLLM) -> None:
        """Mark the moments of each turn by wrapping the console's parts (before they consume)."""
        publish, on_history, read = bus.publish, history._on_request, store.session_history
        on_events, write = writer._on_events, chat_pages._event

        async def published(**kwargs):
            body = kwargs["body"]
            turn = body.content if kwargs["queue"].name.endswith(".inbox") else None
            if turn is not None:
                self._turns[body.request_id] = turn
                self.mark(turn, "inbox publish")
            await publish(**kwargs)
            self.mark(turn, "inbox confirmed")

        async def history_asked(delivery):
            turn = self._turns.get(json.loads(delivery.body).get("session_id"))
            self.mark(turn, "agent asks history", delivery.published_at)
            self.mark(turn, "console gets history request")
            await on_history(delivery)
            self.mark(turn, "history answer confirmed")

        async def history_read(**kwargs):
            turn = self._turns.get(kwargs["session_id"])
            self.mark(turn, "store read starts")
            found = await read(**kwargs)
            self.mark(turn, "store read")
            return found

        async def events(delivery):
            for recorded in json.loads(delivery.body).get("events", []):
                if recorded.get("kind") == "run_started":
                    turn = self._turns.get(recorded.get("request_id"))
                    self.mark(turn, "agent starts the run", datetime.datetime.fromisoformat(recorded["at"]).timestamp())
            await on_events(delivery)

        async def written(response, kind, data):
            if kind == "text":
                self.mark(self._current, "console writes first text")  # turns go one at a time
            await write(response, kind, data)

        def progress(on_progress):
            async def received(delivery):
                if delivery.message_type == "TurnProgress":
                    turn = self._turns.get(delivery.correlation_id or "")
                    self.mark(turn, "agent sends first progress", delivery.published_at)
                    self.mark(turn, "console gets first progress")
                await on_progress(delivery)
            return received

        def answer(body):
            self.mark(body["messages"][-1]["content"], "model asked")
            return Turn(text="The first token, then the rest of a short answer.")

        bus.publish, history._on_request, store.session_history = published, history_asked, history_read
        writer._on_events, chat_pages._event = events, written
        for relay in relays:
            relay._received = progress(relay._received)
        llm.play(answer)

    def summary(self, label: str) -> str:
        """Each moment's median time after the browser posted, in the order they come."""
        offsets: dict[str, list[float]] = {}
        for turn, marks in self.marks.items():
            if turn.startswith(label) and int(turn.split()[-1]) >= WARM_UP:
                for name, at in marks.items():
                    offsets.setdefault(name, []).append(at - marks["posted"])
        medians = sorted((statistics.median(values), name) for name, values in offsets.items())
        return ", ".join(f"{name} +{median * 1000:.1f}" for median, name in medians[1:])


#: Turns of each kind not counted (the first ones warm every path up).
WARM_UP = 2
#: Turns of one conversation (a turn after the first carries or asks for the ones before).
TURNS_PER_SESSION = 4
#: The console's two ways: sending the conversation with the turn (its store given to the relay), or leaving the
#: agent to ask `console.history` for it (no store: as before the console sent it).
WAYS = ("carried", "asked")


async def chat_first_token(*, chats: int, store_url: str) -> None:
    llm = await ScriptedLLM(loop=True).start()
    phases = _Phases()
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-console-") as root:
        (Path(root) / "rabbit").mkdir()
        broker = RabbitBroker(root=Path(root) / "rabbit")
        broker.start()
        try:
            async with provisioned(broker, f"bench-{uuid.uuid4().hex[:6]}") as vhost:
                config = agent_config(llm_url=llm.url, name="bench", namespace="bench",
                                      http_token={"env": "BENCH_TOKEN"})
                await vhost.provision([config])
                me = Principal.agent(namespace="bench", name="bench")
                console_bus = await AmqpBus.connect(url=vhost.url_of(CONSOLE))
                store = await Store.open(url=store_url)
                metrics = RecorderMetrics(CollectorRegistry())
                writer = RunWriter(store=store, bus=console_bus, readiness=Readiness(), metrics=metrics)
                history = HistoryAnswerer(store=store, bus=console_bus, metrics=metrics)
                relays = {"carried": ChatRelay(store=store), "asked": ChatRelay()}
                phases.wrap(bus=console_bus, history=history, writer=writer, relays=list(relays.values()), store=store,
                            llm=llm)
                for part in (writer, history):  # the console records runs and answers histories, as deployed
                    await part.start()
                for relay in relays.values():
                    await relay.start(bus=console_bus)
                try:
                    apps = {way: _app(authorizer=Everyone(), kube=_agents(1), chat=relays[way]) for way in WAYS}
                    for app in apps.values():
                        app.middlewares.insert(0, phases.middleware())
                    async with agent_process(config, bus_url=vhost.url_of(me), folder=Path(root)) as agent, \
                            serving(apps["carried"]) as carried, serving(apps["asked"]) as asked:
                        cpu = time.process_time()
                        times = await _client_process(agent=agent, consoles={"carried": carried, "asked": asked},
                                                      chats=chats, phases=phases)
                        cpu = (time.process_time() - cpu) / (chats + WARM_UP)
                finally:
                    for part in (*relays.values(), history, writer):
                        await part.stop()
                    await console_bus.close()
                    await store.close()
        finally:
            broker.stop()
            await llm.stop()
    direct = statistics.median(times["direct"])
    print(f"2. chat, time to the first token ({chats} turns each, interleaved, {TURNS_PER_SESSION} per conversation): "
          f"the agent's own endpoint {_percentiles(times['direct'])}\n     where it goes (ms after the post, p50): "
          f"{phases.summary('direct')}\n     CPU of the consoles' process (with their run writer and history answers, "
          f"and the scripted model) per round of three turns: {cpu * 1000:.1f} ms")
    for way in WAYS:
        added = statistics.median(times[way]) - direct
        print(f"   through the console, conversation {way}: {_percentiles(times[way])}, adds {added * 1000:.1f} ms at "
              f"p50 (goal < 20 ms)\n     where it goes (ms after the post, p50): {phases.summary(way)}")


async def _client_process(*, agent: str, consoles: dict[str, str], chats: int,
                          phases: _Phases) -> dict[str, list[float]]:
    """Run the person's side in its own process (the console's event loop is the console's alone, as deployed)."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        times, marks = await asyncio.get_running_loop().run_in_executor(pool, functools.partial(
            _client, agent=agent, consoles=consoles, chats=chats, csrf=SESSIONS.csrf_token(principal="local")))
    phases.merge(marks)
    return times


def _client(*, agent: str, consoles: dict[str, str], chats: int,
            csrf: str) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """The person's side in a process of its own (as a browser is): the turns' times and marks (post, first text)."""
    async def run() -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
        async with aiohttp.ClientSession() as http:
            return await _interleaved(http, agent=agent, consoles=consoles, chats=chats, csrf=csrf)

    return asyncio.run(run())


async def _interleaved(http: aiohttp.ClientSession, *, agent: str, consoles: dict[str, str], chats: int,
                       csrf: str) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    times: dict[str, list[float]] = {"direct": [], **{way: [] for way in consoles}}
    marks: dict[str, dict[str, float]] = {}
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for n in range(chats + WARM_UP):
        body = {"messages": [{"role": "user", "content": f"direct {n}"}], "stream": True}
        posted, started = time.time(), time.perf_counter()
        async with http.post(f"{agent}/v1/chat/completions", json=body, headers=headers) as answer:
            seconds = await _first_text(answer, relayed=False, started=started)
        marks[f"direct {n}"] = {"posted": posted, "client gets first text": posted + seconds}
        if n >= WARM_UP:
            times["direct"].append(seconds)
        for way, console in consoles.items():
            said = f"{way} {n}"
            turn = {"session": f"{way}-{n // TURNS_PER_SESSION}", "message": said}
            posted, started = time.time(), time.perf_counter()
            async with http.post(f"{console}/agents/bench/bench/chat", json=turn,
                                 headers={"X-CSRF-Token": csrf}) as answer:
                seconds = await _first_text(answer, relayed=True, started=started)
            marks[said] = {"posted": posted, "browser gets first text": posted + seconds}
            if n >= WARM_UP:
                times[way].append(seconds)
    return times, marks


PAGES = ("/agents", "/runs?namespace=ns-0", "/agents/ns-0/agent-0", "/approvals")


async def reviews_per_page(*, kubeconfig: str, loads: int = 20) -> None:
    try:
        kube = await KubeClient.from_environment(config_file=kubeconfig)
    except Exception as exc:  # no API server here: say so, measure the rest
        print(f"3. SubjectAccessReviews per page: skipped, no API server through {kubeconfig} ({exc})")
        return
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-sar-") as root:
        store = await Store.open(url=f"sqlite:///{root}/runs.db")
        figures = []
        try:
            for ttl in (10.0, 0.0):
                reviewer = AccessReviewer(kube=kube, ttl=ttl)
                app = _app(authorizer=reviewer, kube=_agents(5), store=store, desk=ApprovalDesk())
                counts = []
                async with serving(app) as url, aiohttp.ClientSession() as http:
                    for path in PAGES:
                        before, times = reviewer.reviews, []
                        for _ in range(loads):
                            started = time.perf_counter()
                            async with http.get(url + path) as answer:
                                await answer.read()
                                assert answer.status in (200, 403), (path, answer.status)
                            times.append(time.perf_counter() - started)
                        counts.append(f"{path.split('?')[0]} {(reviewer.reviews - before) / loads:.2f} "
                                      f"(p50 {statistics.median(times) * 1000:.1f} ms)")
                figures.append(f"kept {ttl:g} s: " + ", ".join(counts))
        finally:
            await store.close()
            await kube.close()
    print(f"3. SubjectAccessReviews per page load and the load's time (5 namespaces of Agents, {loads} loads each, "
          "one user): "
          + "; ".join(figures))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--renders", type=int, default=200)
    parser.add_argument("--chats", type=int, default=40)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", "/var/tmp/k8s/kubeconfig"))
    parser.add_argument("--parts", default="1,2,3", help="which of the three measures to take (e.g. 2)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"load average at the start: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    root = Path(tempfile.mkdtemp(prefix="rockbot-bench-pg-"))
    postgres = PostgresServer(root=root, durable=True)
    postgres.init()
    postgres.start()
    try:
        if "1" in parts:
            await runs_page(postgres=postgres, runs=args.runs, renders=args.renders)
        if "2" in parts:  # the console's run store is PostgreSQL, as deployed
            await chat_first_token(chats=args.chats, store_url=postgres.create_database())
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    if "3" in parts:
        await reviews_per_page(kubeconfig=args.kubeconfig)
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    asyncio.run(main())
