"""Script execution figures: local sandbox latency, bus round trip, end-to-end throughput.

1. The local sandbox (bubblewrap + rlimits, the real backend) running `pass`, p50/p95 over
   --runs runs, against a bare `python -c pass` of the same interpreter (goal: at most 1.5x).
2. The bus round trip through a real RabbitMQ broker (a private one is started unless
   --amqp-url is given): request/reply to an echo consumer, p50 and p95 (goal: under 5 ms p50).
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
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from agent.sandbox import ScriptSandbox
from rockbot.bus import AmqpBus, Delivery, Queue
from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.rabbitmq import RabbitBroker


class Ping(BaseModel):
    schema_version: Literal[1] = 1
    n: int


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


async def bus_round_trip(url: str, runs: int) -> None:
    queue, replies = Queue(name=f"bench.{uuid.uuid4().hex}"), Queue(name=f"bench.r.{uuid.uuid4().hex}")
    async with await AmqpBus.connect(url=url) as server, await AmqpBus.connect(url=url) as client:
        async def echo(delivery: Delivery) -> None:
            await server.reply(to=delivery, body=delivery.decode(Ping))

        await server.consume(queue=queue, handler=echo, prefetch=8)
        counter = iter(range(10**9))

        async def call() -> None:
            n = next(counter)
            await client.request(queue=queue, body=Ping(n=n), reply_queue=replies,
                                 correlation_id=f"c{n}", timeout_seconds=10)

        samples = await timed(runs, call)
    print(f"bus request/reply through RabbitMQ, {runs} round trips:")
    p50, p95 = statistics.median(samples), percentile(samples, 0.95)
    print(f"  p50 {p50 * 1000:.2f} ms   p95 {p95 * 1000:.2f} ms (goal p50 < 5 ms)")


async def throughput(url: str, *, concurrency: int, scripts: int) -> None:
    settings = ScriptsManagerSettings(
        amqp_url=url, scripts_backend="local", scripts_concurrency=concurrency, health_host="127.0.0.1",
        health_port=0, drain_seconds=0, scripts_package_cache=Path(tempfile.mkdtemp()),
    )  # fmt: skip
    manager = ScriptsManager(settings=settings)
    await manager.start()
    try:
        async with await AmqpBus.connect(url=url) as bus:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="bench", reply_grace_seconds=60)
            await sandbox.execute_python_script(script="pass")
            started = time.perf_counter()
            results = await asyncio.gather(*(
                sandbox.execute_python_script(script=f"print(sum(range({n} * 1000)))") for n in range(scripts)
            ))
            elapsed = time.perf_counter() - started
    finally:
        await manager.stop()
    assert all(isinstance(r, ScriptInvokeResponse) and r.exit_code == 0 for r in results), results
    print(f"end to end, {scripts} scripts, manager concurrency {concurrency}:")
    print(f"  {scripts / elapsed:.1f} scripts/s ({elapsed:.2f} s)")


@contextlib.contextmanager
def broker(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-rabbit-") as root:
        rabbit = RabbitBroker(root=Path(root))
        rabbit.start()
        try:
            yield rabbit.url
        finally:
            rabbit.stop()


async def main(args: argparse.Namespace) -> None:
    await sandbox_latency(args.runs)
    with broker(args.amqp_url) as url:
        await bus_round_trip(url, args.round_trips)
        await throughput(url, concurrency=args.concurrency, scripts=args.scripts)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--round-trips", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--scripts", type=int, default=40)
    parser.add_argument("--amqp-url", default=None, help="an existing broker (default: start a private one)")
    asyncio.run(main(parser.parse_args()))
