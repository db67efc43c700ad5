"""Agent loop benchmarks against the scripted LLM (a real HTTP+SSE server on 127.0.0.1).

    python -m benchmarks.bench_agent [--rounds 300]

1. Loop overhead per tool-call round trip: the time of one round (ask the model, parse the stream,
   run a no-op tool, append the answers) minus the time spent inside the model's HTTP request itself
   (HTTP + the scripted server) and inside the tool. Goal: under 2 ms. The rounds are played as
   user turns of `ROUNDS_PER_TURN` rounds each (an agent's max_iterations is at most 100).
2. The same with tracing on, in the same process right after: the OpenTelemetry SDK recording every
   span (turn, model request, tool call) and exporting them over OTLP/HTTP to a collector stand-in on
   127.0.0.1, as `OTEL_EXPORTER_OTLP_ENDPOINT` sets it up. The difference is tracing's cost per tool
   call (a process can install the SDK once, so "off" runs first, then "on").
3. Three tools that each take 200 ms, run in parallel versus one after another.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rockbot.agent.defining import tool
from rockbot.agent.runtime import AgentRuntime
from rockbot.contracts.agent_config import AgentConfig
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn

ROUNDS_PER_TURN = 50


def config(url: str, **fields) -> AgentConfig:
    return AgentConfig.model_validate({
        "name": "bench", "namespace": "bench", "model": {"base_url": url, "name": "scripted-model"},
        "system_prompt": "You are a benchmark.", **fields,
    })


def tools_module(*tools):
    class Module:
        @staticmethod
        async def install(*, registry, kit):
            for t in tools:
                registry.register(t)

    return Module


async def loop_overhead(rounds: int, *, label: str) -> float:
    in_tool = 0.0

    @tool
    async def noop(n: int) -> str:
        """Do nothing."""
        nonlocal in_tool
        started = time.perf_counter()
        result = f"ok {n}"
        in_tool += time.perf_counter() - started
        return result

    turns = [min(ROUNDS_PER_TURN, rounds - start) for start in range(0, rounds, ROUNDS_PER_TURN)]
    llm = await ScriptedLLM(chunk_chars=8).start()
    for size in turns:
        llm.play(*[Turn(text="Working on it.", tool_calls=[ScriptedCall(name="noop", arguments={"n": i})])
                   for i in range(size)], Turn(text="done"))
    agent = AgentRuntime.from_config(config(llm.url, max_iterations=ROUNDS_PER_TURN + 1), env={},
                                     tool_sets=[tools_module(noop)], max_messages=10 * ROUNDS_PER_TURN)
    in_model: list[float] = []
    attempt = agent.llm._attempt

    async def timed_attempt(*args, **kwargs):
        started = time.perf_counter()
        try:
            return await attempt(*args, **kwargs)
        finally:
            in_model.append(time.perf_counter() - started)

    agent.llm._attempt = timed_attempt  # the stopwatch around the HTTP request (its span is the loop's cost)
    async with agent:
        started = time.perf_counter()
        results = [await agent.chat(f"bench-{n}", "go", caller="service.test") for n in range(len(turns))]
        total = time.perf_counter() - started
    await llm.stop()
    assert [(r.answer, r.iterations) for r in results] == [("done", size + 1) for size in turns], results
    overhead = (total - sum(in_model) - in_tool) / rounds
    per_round = total / (rounds + len(turns))
    print(f"loop, tracing {label}: {rounds} tool-call round trips in {total * 1000:.0f} ms "
          f"({per_round * 1000:.2f} ms per round, model request median {statistics.median(in_model) * 1000:.2f} ms)")
    verdict = "meets" if overhead < 0.002 else "MISSES"
    print(f"loop, tracing {label}: own overhead per round trip {overhead * 1000:.3f} ms ({verdict} the 2 ms goal)")
    return overhead


class _Collector(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that takes every export and answers OK (the spans' cost is the sender's)."""

    exports = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).exports += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def start_tracing() -> None:
    """What a process does with OTEL_EXPORTER_OTLP_ENDPOINT set: the SDK, batching, OTLP/HTTP export."""
    from rockbot.telemetry import setup_tracing

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{server.server_address[1]}"
    assert setup_tracing(service="rockbot-bench")


def span_cost(count: int = 100_000) -> float:
    """Seconds one span costs as the code starts it (current, with an attribute check)."""
    from rockbot.telemetry import tracer

    started = time.perf_counter()
    for _ in range(count):
        with tracer.start_as_current_span("bench") as span:
            if span.is_recording():
                span.set_attribute("n", 1)
    return (time.perf_counter() - started) / count


async def tracing_cost(rounds: int) -> None:
    from rockbot.telemetry import flush_tracing

    await loop_overhead(min(rounds, ROUNDS_PER_TURN), label="off (warm-up)")
    off = await loop_overhead(rounds, label="off")
    noop = span_cost()
    start_tracing()
    on = await loop_overhead(rounds, label="on")
    recorded = span_cost(1_000)  # under the batch queue (2048): none dropped
    await asyncio.to_thread(flush_tracing)
    print(f"tracing: cost per tool call {(on - off) * 1000:+.3f} ms (off {off * 1000:.3f} ms, on {on * 1000:.3f} ms; "
          f"{_Collector.exports} OTLP exports received)")
    print(f"tracing: one span costs {noop * 1e6:.2f} us off (the API's no-op), {recorded * 1e6:.1f} us on")


async def parallel_speedup() -> None:
    @tool
    async def slow(n: int) -> str:
        """Take 200 ms."""
        await asyncio.sleep(0.2)
        return f"slow {n}"

    timings = {}
    for parallel in (False, True):
        llm = await ScriptedLLM().start()
        llm.play(Turn(tool_calls=[ScriptedCall(name="slow", arguments={"n": i}) for i in range(3)]),
                 Turn(text="done"))
        agent = AgentRuntime.from_config(config(llm.url, parallel_tool_calls=parallel), env={},
                                         tool_sets=[tools_module(slow)])
        async with agent:
            started = time.perf_counter()
            await agent.chat("bench", "go", caller="service.test")
            timings[parallel] = time.perf_counter() - started
        await llm.stop()
    print(f"tools: three 200 ms tools serial {timings[False] * 1000:.0f} ms, parallel {timings[True] * 1000:.0f} ms, "
          f"speed-up x{timings[False] / timings[True]:.2f}")


async def main(rounds: int) -> None:
    await parallel_speedup()
    await tracing_cost(rounds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    asyncio.run(main(parser.parse_args().rounds))
