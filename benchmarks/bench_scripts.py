"""Script execution figures: local sandbox latency, bus round trip, end-to-end throughput.

1. The local sandbox (bubblewrap + rlimits, the real backend) running `pass`, p50/p95 over
   --runs runs, against a bare `python -c pass` of the same interpreter (goal: at most 1.5x).
2. The bus round trip through a real RabbitMQ broker (a private one is started unless
   --amqp-url, an administrator's URL, is given): an agent's request on `script.invoke` answered
   by an echoing scripts-manager, each logged in as itself, p50 and p95 (goal: under 5 ms p50).
3. Scripts per second through the whole path (agent client -> broker -> scripts-manager with
   concurrency --concurrency -> local sandbox -> reply), --scripts scripts in flight at once.

    python -m benchmarks.bench_scripts [--runs 50] [--concurrency 4] [--scripts 40] [--amqp-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, Delivery, Principal
from rockbot.bus.topology import SCRIPT_INVOKE
from rockbot.contracts.agent_config import AgentConfig, ModelConfig
from rockbot.contracts.scripts import ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.local.broker import Connect, on_rabbitmq
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends import ScriptJob
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
            sandbox = ScriptSandbox(bus=bus, namespace=BENCH.namespace, agent=BENCH.name, reply_grace_seconds=60)
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
async def broker(url: str | None, management_url: str | None) -> AsyncIterator[Connect]:
    """Logins for the scripts-manager and the benchmark's agent on the given broker, or on a private one."""
    bench = AgentConfig(name=BENCH.name, namespace=BENCH.namespace, model=ModelConfig(base_url="http://-", name="-"))
    if url:
        yield await on_rabbitmq([bench], amqp_url=url, management_url=management_url)
        return
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-rabbit-") as root:
        rabbit = RabbitBroker(root=Path(root))
        await asyncio.to_thread(rabbit.start)
        try:
            yield await on_rabbitmq([bench], amqp_url=rabbit.url, management_url=rabbit.management_url)
        finally:
            await asyncio.to_thread(rabbit.stop)


async def main(args: argparse.Namespace) -> None:
    await sandbox_latency(args.runs)
    async with broker(args.amqp_url, args.management_url) as connect:
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
