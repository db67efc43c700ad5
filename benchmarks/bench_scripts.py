"""Script execution figures: local sandbox latency, bus round trip, end-to-end throughput.

1. The local sandbox (bubblewrap + rlimits, the real backend) running `pass`, p50/p95 over
   --runs runs, against a bare `python -c pass` of the same interpreter (goal: at most 1.5x).
2. The bus round trip through a real RabbitMQ broker (a private one is started unless
   --amqp-url, an administrator's URL, is given): an agent's request on `script.invoke` answered
   by an echoing scripts-manager, each logged in as itself, p50 and p95 (goal: under 5 ms p50);
   and the cost of that identity: the same raw AMQP request/reply, interleaved in one run, once as
   before it (one shared login, the default exchange, no `user_id`) and once with it (each side its
   own user with its permissions, the `rockbot` topic exchange, `user_id` stamped by the sender,
   validated by the broker and checked by the receiver).
3. Scripts per second through the whole path (agent client -> broker -> scripts-manager with
   concurrency --concurrency -> local sandbox -> reply), --scripts scripts in flight at once.

    python -m benchmarks.bench_scripts [--runs 50] [--concurrency 4] [--scripts 40] [--amqp-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aio_pika
from yarl import URL

from agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, Delivery, Principal
from rockbot.bus.admin import ensure_principal
from rockbot.bus.management import RabbitAdmin
from rockbot.bus.topology import EXCHANGE, SCRIPT_INVOKE, agent_replies
from rockbot.contracts.agent_config import AgentConfig, ModelConfig
from rockbot.contracts.scripts import ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.local.broker import Connect, on_rabbitmq
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends import ScriptJob, SessionTerms
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.rabbitmq import RabbitBroker


def percentile(samples: list[float], fraction: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


async def timed(runs: int, action: Callable[[], Awaitable[object]]) -> list[float]:
    await action()  # warm-up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        await action()
        samples.append(time.perf_counter() - started)
    return samples


async def sandbox_latency(runs: int) -> None:
    settings = ScriptsManagerSettings(scripts_backend="local", scripts_package_cache=Path(tempfile.mkdtemp()))
    backend = await LocalBackend.create(settings=settings)
    python = backend._interpreter.executable

    async def bare() -> None:
        process = await asyncio.create_subprocess_exec(python, "-c", "pass")
        await process.wait()

    async def sandboxed() -> None:
        result = await backend.run(ScriptJob(request_id="b", script="pass", input_data=None, timeout_seconds=10))
        assert result.exit_code == 0, result

    bare_samples = await timed(runs, bare)
    sandbox_samples = await timed(runs, sandboxed)
    p50_bare, p50_box = statistics.median(bare_samples), statistics.median(sandbox_samples)
    print(f"local sandbox ({backend.isolation.kind}), {runs} runs of `pass`:")
    for label, samples in (("bare `python -c pass`", bare_samples), ("sandboxed script", sandbox_samples)):
        print(f"  {label:22}  p50 {statistics.median(samples) * 1000:7.1f} ms   "
              f"p95 {percentile(samples, .95) * 1000:7.1f} ms")
    print(f"  ratio p50 {p50_box / p50_bare:.2f}x (goal <= 1.5x)")
    await session_latency(backend, runs)


async def session_latency(backend: LocalBackend, runs: int) -> None:
    """A PerConversation session's later calls (`x += 1` in its kept interpreter), and its first call (a new one
    each time), in the same local sandbox."""
    terms = SessionTerms(owner="agent.default.bench", session="0" * 32, idle_seconds=300, max_seconds=3600)
    opened = 0

    async def first() -> None:
        nonlocal opened
        opened += 1
        fresh = terms.model_copy(update={"session": f"{opened:032x}"})
        result = await backend.run(ScriptJob(request_id="f", script="x = 0", input_data=None, timeout_seconds=10,
                                             session=fresh))  # fmt: skip
        assert result.session == "new", result

    await backend.run(ScriptJob(request_id="s", script="x = 0", input_data=None, timeout_seconds=10, session=terms))

    async def later() -> None:
        result = await backend.run(ScriptJob(request_id="l", script="x += 1", input_data=None, timeout_seconds=10,
                                             session=terms))  # fmt: skip
        assert (result.exit_code, result.session) == (0, "kept"), result

    later_samples = await timed(runs, later)
    first_samples = await timed(min(runs, 20), first)  # each opens a session: fewer, within the manager's cap
    print(f"local session ({backend.isolation.kind}), `x += 1` in a kept interpreter:")
    for label, samples in (("session's later call", later_samples), ("session's first call", first_samples)):
        print(f"  {label:22}  p50 {statistics.median(samples) * 1000:7.1f} ms   "
              f"p95 {percentile(samples, .95) * 1000:7.1f} ms")
    await backend.close()


BENCH = Principal.agent(namespace="default", name="bench")


async def bus_round_trip(connect: Connect, runs: int) -> None:
    async with await connect(SCRIPTS_MANAGER) as server, await connect(BENCH) as client:
        async def echo(delivery: Delivery) -> None:
            request = delivery.decode(ScriptInvokeRequest)
            await server.reply(to=delivery, body=ScriptInvokeResponse(
                request_id=request.request_id, stdout=request.script, stderr="", exit_code=0, duration_seconds=0))

        await server.consume(queue=SCRIPT_INVOKE, handler=echo, prefetch=8)
        sandbox = ScriptSandbox(bus=client, namespace=BENCH.namespace, agent=BENCH.name)

        async def call() -> None:
            answer = await sandbox.execute_python_script(script="pass", request_id=uuid.uuid4().hex)
            assert isinstance(answer, ScriptInvokeResponse), answer

        samples = await timed(runs, call)
    print(f"bus request/reply through RabbitMQ, {runs} round trips:")
    p50, p95 = statistics.median(samples), percentile(samples, 0.95)
    print(f"  p50 {p50 * 1000:.2f} ms   p95 {p95 * 1000:.2f} ms (goal p50 < 5 ms)")


PERSISTENT = aio_pika.DeliveryMode.PERSISTENT


class _RawEcho:
    """A request/reply pair on plain aio-pika, with per-principal identity or without (the same code).

    Both use the same kinds of queues and persistent messages, so the difference is identity's alone.
    """

    def __init__(self, *, server_url: str, client_url: str, identity: bool) -> None:
        self._urls = (server_url, client_url)
        self._identity = identity
        self._waiting: dict[str, asyncio.Future[None]] = {}
        self._opened: list[aio_pika.abc.AbstractConnection] = []

    async def open(self) -> None:
        server, client = [await aio_pika.connect(url) for url in self._urls]
        self._opened += [server, client]
        server_channel = await server.channel(publisher_confirms=True)
        self._client = await client.channel(publisher_confirms=True)
        if self._identity:  # the real topology: provisioned work queue and reply slot, topic exchange
            self._queue = SCRIPT_INVOKE.name
            work = await server_channel.declare_queue(self._queue, passive=True)
            self._reply = agent_replies(namespace=BENCH.namespace, name=BENCH.name, slot=0).name
            replies = await self._client.declare_queue(self._reply, passive=True)  # the operator's reply slot
            self._server_exchange = await server_channel.get_exchange(EXCHANGE, ensure=False)
            self._client_exchange = await self._client.get_exchange(EXCHANGE, ensure=False)
        else:  # one login, the default exchange; the same kinds of queues (a quorum work queue)
            self._queue, self._reply = f"bench.noid.{uuid.uuid4().hex}", f"bench.noid.r.{uuid.uuid4().hex}"
            work = await server_channel.declare_queue(self._queue, durable=True, arguments=SCRIPT_INVOKE.arguments)
            replies = await self._client.declare_queue(self._reply, durable=True, arguments={"x-expires": 3_600_000})
            self._server_exchange = server_channel.default_exchange
            self._client_exchange = self._client.default_exchange
        await work.consume(self._echo)
        await replies.consume(self._answered, no_ack=True)

    async def _echo(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if self._identity and Principal.parse(message.user_id) != BENCH:
            raise RuntimeError(f"a request from {message.user_id!r}")
        reply = aio_pika.Message(message.body, correlation_id=message.correlation_id, delivery_mode=PERSISTENT,
                                 user_id=SCRIPTS_MANAGER.user if self._identity else None)
        await self._server_exchange.publish(reply, routing_key=message.reply_to or "", mandatory=True)
        await message.ack()

    async def _answered(self, message: aio_pika.abc.AbstractIncomingMessage) -> None:
        if self._identity and Principal.parse(message.user_id) != SCRIPTS_MANAGER:
            return
        future = self._waiting.pop(message.correlation_id or "", None)
        if future is not None:
            future.set_result(None)

    async def round_trip(self, body: bytes) -> float:
        correlation_id = uuid.uuid4().hex
        self._waiting[correlation_id] = asyncio.get_running_loop().create_future()
        started = time.perf_counter()
        request = aio_pika.Message(body, correlation_id=correlation_id, reply_to=self._reply, delivery_mode=PERSISTENT,
                                   user_id=BENCH.user if self._identity else None)
        await self._client_exchange.publish(request, routing_key=self._queue, mandatory=True)
        await asyncio.wait_for(self._waiting[correlation_id], 10)
        return time.perf_counter() - started

    async def close(self) -> None:
        server, client = self._opened
        await server.close()  # its consumer first, so deleting the work queue cancels nobody
        if not self._identity:
            channel = await client.channel()
            await channel.queue_delete(self._queue)
        await client.close()


async def identity_cost(*, admin_url: str, management_url: str | None, runs: int) -> None:
    """The broker round trip with and without per-principal identity, alternating, in one run."""
    passwords = {principal: secrets.token_urlsafe(16) for principal in (SCRIPTS_MANAGER, BENCH)}
    async with RabbitAdmin.for_amqp_url(admin_url, management_url=management_url) as admin:
        await admin.ensure_topology()
        for principal, password in passwords.items():
            await ensure_principal(admin, principal, password=password)

    def login(principal: Principal) -> str:
        return str(URL(admin_url).with_user(principal.user).with_password(passwords[principal]))

    with_identity = _RawEcho(server_url=login(SCRIPTS_MANAGER), client_url=login(BENCH), identity=True)
    without = _RawEcho(server_url=admin_url, client_url=admin_url, identity=False)
    body = ScriptInvokeRequest(request_id="r", agent=BENCH.name, script="pass").model_dump_json().encode()
    samples: dict[bool, list[float]] = {True: [], False: []}
    for pair in (with_identity, without):
        await pair.open()
        await pair.round_trip(body)  # warm-up
    try:
        for _ in range(runs):
            for identity, pair in ((False, without), (True, with_identity)):
                samples[identity].append(await pair.round_trip(body))
    finally:
        await with_identity.close()
        await without.close()
    print(f"the cost of per-principal identity, {runs} raw AMQP round trips each way, interleaved:")
    for identity, label in ((False, "one shared login, default exchange"), (True, "own logins, topic permissions")):
        print(f"  {label:38}  p50 {statistics.median(samples[identity]) * 1000:.2f} ms   "
              f"p95 {percentile(samples[identity], 0.95) * 1000:.2f} ms")
    difference = statistics.median(samples[True]) - statistics.median(samples[False])
    print(f"  difference at p50: {difference * 1000:+.2f} ms")


async def throughput(connect: Connect, *, concurrency: int, scripts: int) -> None:
    settings = ScriptsManagerSettings(
        scripts_backend="local", scripts_concurrency=concurrency, health_host="127.0.0.1",
        health_port=0, drain_seconds=0, scripts_package_cache=Path(tempfile.mkdtemp()),
    )  # fmt: skip
    manager_bus = await connect(SCRIPTS_MANAGER)
    manager = ScriptsManager(settings=settings, bus=manager_bus)
    await manager.start()
    try:
        async with await connect(BENCH) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace=BENCH.namespace, agent=BENCH.name, start_ceiling_seconds=60)
            await sandbox.execute_python_script(script="pass")
            started = time.perf_counter()
            results = await asyncio.gather(*(
                sandbox.execute_python_script(script=f"print(sum(range({n} * 1000)))") for n in range(scripts)
            ))
            elapsed = time.perf_counter() - started
    finally:
        await manager.stop()
        await manager_bus.close()
    assert all(isinstance(r, ScriptInvokeResponse) and r.exit_code == 0 for r in results), results
    print(f"end to end, {scripts} scripts, manager concurrency {concurrency}:")
    print(f"  {scripts / elapsed:.1f} scripts/s ({elapsed:.2f} s)")


@contextlib.asynccontextmanager
async def broker(url: str | None, management_url: str | None) -> AsyncIterator[tuple[str, str | None]]:
    """An administrator's URL and the management API: the given broker's, or a private one's."""
    if url:
        yield url, management_url
        return
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-rabbit-") as root:
        rabbit = RabbitBroker(root=Path(root))
        await asyncio.to_thread(rabbit.start)
        try:
            yield rabbit.url, rabbit.management_url
        finally:
            await asyncio.to_thread(rabbit.stop)


async def main(args: argparse.Namespace) -> None:
    await sandbox_latency(args.runs)
    bench = AgentConfig(name=BENCH.name, namespace=BENCH.namespace, model=ModelConfig(base_url="http://-", name="-"))
    async with broker(args.amqp_url, args.management_url) as (admin_url, management_url):
        await identity_cost(admin_url=admin_url, management_url=management_url, runs=args.round_trips)
        connect = await on_rabbitmq([bench], amqp_url=admin_url, management_url=management_url)
        await bus_round_trip(connect, args.round_trips)
        await throughput(connect, concurrency=args.concurrency, scripts=args.scripts)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--scripts", type=int, default=40)
    parser.add_argument("--amqp-url", default=None, help="an administrator's URL of a broker (default: a private one)")
    parser.add_argument("--management-url", default=None, help="its management API (default: AMQP host, port 15672)")
    asyncio.run(main(parser.parse_args()))
