"""Console benchmarks (issue 20), printed; real PostgreSQL, RabbitMQ and API server as the tests start them.

    python -m benchmarks.bench_console [--runs 100000] [--renders 200] [--chats 40] [--kubeconfig PATH]

1. The Runs page with `--runs` runs in PostgreSQL (one INSERT ... SELECT, as bench_runstore): p50/p95 of
   rendering it over HTTP (a namespace and agent filtered, 50 rows, newest first) and of a run's page, with a
   permission answer that costs nothing (what is measured is the store, the template and the HTTP server).
2. Chat's time to the first token: an agent process (`rockbot agent`, its own login on a real RabbitMQ) whose
   model is the scripted OpenAI-compatible SSE server; `--chats` turns streamed from the agent's own
   `/v1/chat/completions`, and as many through the console's chat (POST, SSE relay over the bus), interleaved;
   time from sending to the first text in the answer.
3. SubjectAccessReviews per page against the real API server (`--kubeconfig`, the shared rig's by default):
   the Agents, Runs, Agent and Approvals pages loaded 20 times each by one user, with the answers kept 10 s
   (the default) and not kept at all; the reviews sent, per page load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
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
from sqlalchemy import text

from benchmarks.bench_runstore import seed_runs
from rockbot.bus import CONSOLE, AmqpBus, Principal
from rockbot.console.approvals import ApprovalDesk
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import AccessReviewer, Authorizer
from rockbot.console.chat import ChatRelay
from rockbot.console.recording import HistoryAnswerer, RecorderMetrics, RunWriter
from rockbot.console.store import Store
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
    listing, opening, cpu = [], [], {}
    async with serving(_app(authorizer=Everyone(), kube=_agents(20), store=store)) as url, \
            aiohttp.ClientSession() as http:
        for kind, samples, path in (("list", listing, "/runs?namespace=ns-7&agent=agent-7"),
                                    ("open", opening, f"/runs/{_md5(7)}")):
            started = time.process_time()
            for _ in range(renders):
                t = time.perf_counter()
                async with http.get(url + path) as answer:
                    body = await answer.text()
                samples.append(time.perf_counter() - t)
                assert answer.status == 200, (kind, answer.status, body[:300])
            cpu[kind] = (time.process_time() - started) / renders
    await store.close()
    print(f"1. Runs page with {runs:,} runs (loaded in {loaded:.0f} s), over HTTP: a page of 50 by namespace+agent "
          f"{_percentiles(listing)} ({cpu['list'] * 1000:.1f} ms CPU of the console and client per render); a run's "
          f"page {_percentiles(opening)} ({cpu['open'] * 1000:.1f} ms CPU) (goal p95 < 100 ms)")


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


async def chat_first_token(*, chats: int) -> None:
    llm = await ScriptedLLM(loop=True).start()
    llm.play(Turn(text="The first token, then the rest of a short answer."))
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
                store = await Store.open(url=f"sqlite:///{root}/runs.db")
                metrics = RecorderMetrics(CollectorRegistry())
                writer = RunWriter(store=store, bus=console_bus, readiness=Readiness(), metrics=metrics)
                history = HistoryAnswerer(store=store, bus=console_bus, metrics=metrics)
                relay = ChatRelay()
                for part in (writer, history):  # the console records runs and answers histories, as deployed
                    await part.start()
                await relay.start(bus=console_bus)
                try:
                    async with agent_process(config, bus_url=vhost.url_of(me), folder=Path(root)) as agent, \
                            serving(_app(authorizer=Everyone(), kube=_agents(1), chat=relay)) as console, \
                            aiohttp.ClientSession() as http:
                        direct, relayed = await _interleaved(http, agent=agent, console=console, chats=chats)
                finally:
                    for part in (relay, history, writer):
                        await part.stop()
                    await console_bus.close()
                    await store.close()
        finally:
            broker.stop()
            await llm.stop()
    added = statistics.median(relayed) - statistics.median(direct)
    print(f"2. chat, time to the first token ({chats} turns each, interleaved): the agent's own endpoint "
          f"{_percentiles(direct)}; through the console (bus relay, SSE) {_percentiles(relayed)}; the console adds "
          f"{added * 1000:.1f} ms at p50 (goal < 20 ms)")


async def _interleaved(http: aiohttp.ClientSession, *, agent: str, console: str,
                       chats: int) -> tuple[list[float], list[float]]:
    direct, relayed = [], []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for n in range(chats + 2):  # the first two warm both paths up, not counted
        body = {"messages": [{"role": "user", "content": f"hello {n}"}], "stream": True}
        started = time.perf_counter()
        async with http.post(f"{agent}/v1/chat/completions", json=body, headers=headers) as answer:
            seconds = await _first_text(answer, relayed=False, started=started)
        if n >= 2:
            direct.append(seconds)
        turn = {"session": f"s{n}", "message": f"hello {n}"}
        started = time.perf_counter()
        async with http.post(f"{console}/agents/bench/bench/chat", json=turn,
                             headers={"X-CSRF-Token": SESSIONS.csrf_token(principal="local")}) as answer:
            seconds = await _first_text(answer, relayed=True, started=started)
        if n >= 2:
            relayed.append(seconds)
    return direct, relayed


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
                        before = reviewer.reviews
                        for _ in range(loads):
                            async with http.get(url + path) as answer:
                                await answer.read()
                                assert answer.status in (200, 403), (path, answer.status)
                        counts.append(f"{path.split('?')[0]} {(reviewer.reviews - before) / loads:.2f}")
                figures.append(f"kept {ttl:g} s: " + ", ".join(counts))
        finally:
            await store.close()
            await kube.close()
    print(f"3. SubjectAccessReviews per page load (5 namespaces of Agents, {loads} loads each, one user): "
          + "; ".join(figures))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--renders", type=int, default=200)
    parser.add_argument("--chats", type=int, default=40)
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG", "/var/tmp/k8s/kubeconfig"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rockbot-bench-pg-"))
    postgres = PostgresServer(root=root, durable=True)
    postgres.init()
    postgres.start()
    try:
        await runs_page(postgres=postgres, runs=args.runs, renders=args.renders)
    finally:
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    await chat_first_token(chats=args.chats)
    await reviews_per_page(kubeconfig=args.kubeconfig)


if __name__ == "__main__":
    asyncio.run(main())
