"""Issue 18's weaknesses P1-P5 as a hostile agent A tries them on a real RabbitMQ, with figures.

Every part runs on a private broker (Debian's RabbitMQ, started here), each principal logged in as
itself with the permissions and limits the operator gives it, the scripts-manager with the local
sandbox and its default settings unless said:
- P1: A puts --flood five-second scripts on `script.invoke`, then B asks for `print(1)`: B's
  latency and how many of A's requests were answered at once (Unavailable); once more with the
  per-agent bound off (ROCKBOT_SCRIPTS_QUEUED_PER_AGENT at its maximum), as before issue 18's fix.
- P2: A's reply queue refuses everything; runs per request of A's 40 cheap ones, and B's latency then.
- P3: A's Agent allows 250m, 96Mi and 2 s; A asks for 1 CPU, 1Gi and 60 s: what its scripts get.
- P4: how many connections A's login opens of 150 tried.
- P5: B's dead letter and A's first one, then 10,050 of A's messages refused (by a consumer whose
  dead-letter share stands for many processes'): what is left in the shared queue and in the records.
Issue 31's surfaces of the console:
- P6: A puts 2 x --flood approval requests asking to wait a year on `console.approvals`, B asks for one once
  half of them are out: how long until B's call is on the desk for a person, and what became of A's; once more
  with the desk as before (prefetch 1,000, no per-agent bound).
- P7: a person's chat page stalls after the first step while A sends 100 progress messages of 3.7 MiB (the
  issue's) and 100 of just under 1 MiB to that turn: the console's memory (its own process, RSS and peak)
  before and after, what it holds for the page, and what the page gets when it reads again.

    python -m benchmarks.bench_tenants [--flood 1000] [--parts 1,2,3,4,5,6,7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import logging
import multiprocessing
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from pathlib import Path
from urllib.parse import quote

import aio_pika
from pydantic import BaseModel

from agent.sandbox import ScriptSandbox
from rockbot.agent.approvals import BusApprover
from rockbot.bus import CONSOLE, OPERATOR, SCRIPTS_MANAGER, AmqpBus, Delivery, Principal, Refused
from rockbot.bus.deadletters import DeadLetterKeeper
from rockbot.bus.interface import DeadLetterShare
from rockbot.bus.permissions import Permissions
from rockbot.bus.topology import (
    CONSOLE_APPROVALS,
    DEAD_LETTERS_KEPT,
    EXCHANGE,
    SCRIPT_INVOKE,
    Queue,
    agent_inbox,
    agent_replies,
    work_queue,
)
from rockbot.console import approvals
from rockbot.console.chat import TURN_BUFFER_BYTES
from rockbot.contracts.agent_config import ScriptLimits
from rockbot.contracts.approvals import ApprovalRequest
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.contracts.progress import MAX_PROGRESS_BYTES, TextDelta, TurnProgress
from rockbot.contracts.scripts import ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.limits import FixedLimits
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.rabbitmq import RabbitBroker, Vhost, provisioned
from tests.waiting import eventually

A = Principal.agent(namespace="bench", name="a")
B = Principal.agent(namespace="bench", name="b")
A_LIMITS = ScriptLimits(cpu="250m", memory="96Mi", timeout_seconds=2)
B_LIMITS = ScriptLimits()


def settings(vhost_url: str, **overrides: object) -> ScriptsManagerSettings:
    values: dict[str, object] = {"amqp_url": vhost_url, "health_host": "127.0.0.1", "health_port": 0,
                                 "scripts_backend": "local", "drain_seconds": 0.0, "scripts_isolation_targets": {}}
    values.update(overrides)
    return ScriptsManagerSettings(**values)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def manager(vhost: Vhost, **overrides: object) -> AsyncIterator[ScriptsManager]:
    limits = FixedLimits({A: A_LIMITS, B: B_LIMITS})
    running = ScriptsManager(settings=settings(await vhost.url(SCRIPTS_MANAGER), **overrides), limits=limits)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


def counted(manager: ScriptsManager, name: str, **labels: str) -> float:
    return manager.metrics.registry.get_sample_value(name, labels) or 0.0


async def b_latency(vhost: Vhost) -> str:
    """How long B's `print(1)` (timeout 30 s) took to be answered."""
    async with await AmqpBus.connect(url=await vhost.url(B)) as bus:
        sandbox = ScriptSandbox(bus=bus, namespace=B.namespace, agent=B.name, start_ceiling_seconds=3)
        started = time.perf_counter()
        answer = await sandbox.execute_python_script(script="print(1)", timeout_seconds=30)
        took = time.perf_counter() - started
    if isinstance(answer, ScriptInvokeResponse):
        return f"answered in {took:.2f} s"
    return f"no answer: {answer.error.code} after {took:.1f} s"  # type: ignore[union-attr]


async def flood_scripts(url: str, count: int, *, script: str, reply_to: str | None = None) -> None:
    """A's `count` requests, published without waiting for answers (A's login is `url`)."""
    async with await AmqpBus.connect(url=url) as bus:
        replies = reply_to or (await bus.own_replies()).name
        for start in range(0, count, 200):
            await asyncio.gather(*(bus.publish(
                queue=SCRIPT_INVOKE, body=ScriptInvokeRequest(request_id=f"a-{n}", agent=A.name, script=script,
                                                              timeout_seconds=10),
                message_id=f"a-{n}", correlation_id=f"a-{n}", reply_to=replies,
            ) for n in range(start, min(start + 200, count))))  # fmt: skip


async def p1(vhost: Vhost, flood: int) -> None:
    for label, overrides in (("with the per-agent bound (16)", {}),
                             ("bound off (as before)", {"scripts_queued_per_agent": 4096})):
        async with manager(vhost, scripts_concurrency=2, scripts_per_agent=1, **overrides) as running:
            started = time.perf_counter()
            await flood_scripts(await vhost.url(A), flood, script="import time\ntime.sleep(5)")
            published = time.perf_counter() - started
            latency = await b_latency(vhost)
            refused = counted(running, "rockbot_scripts_runs_total", backend="local", outcome="Unavailable")
        await purge(vhost, SCRIPT_INVOKE.name)
        print(f"P1 {label}: A queued {flood} five-second scripts in {published:.1f} s; B's print(1) {latency}; "
              f"A's requests answered Unavailable at once: {refused:.0f}")


async def p2(vhost: Vhost) -> None:
    url = await vhost.url(A)  # A's login and queues, as the operator provisions them
    slot = agent_replies(namespace=A.namespace, name=A.name, slot=0)
    path = quote(vhost.name, safe="")
    await vhost.admin._call("DELETE", f"queues/{path}/{slot.name}")
    await vhost.admin._call("PUT", f"queues/{path}/{slot.name}", {
        "durable": True, "arguments": {"x-max-length": 0, "x-overflow": "reject-publish"}})
    await vhost.admin._call("POST", f"bindings/{path}/e/{EXCHANGE}/q/{slot.name}", {"routing_key": slot.name})
    requests = 40
    async with manager(vhost, scripts_queued_per_agent=4096) as running:  # P2 alone: no request answered at once
        await flood_scripts(url, requests, script="pass", reply_to=slot.name)
        deadline = time.monotonic() + 120
        while counted(running, "rockbot_scripts_replies_dropped_total", reason="refused") < requests:
            assert time.monotonic() < deadline, "the refused answers were not all counted within 120 s"
            await asyncio.sleep(0.1)
        latency = await b_latency(vhost)
        runs = counted(running, "rockbot_scripts_runs_total", backend="local", outcome="succeeded") - 1
    print(f"P2 A's reply queue refuses: {runs / requests:.2f} runs per request of A's {requests} "
          f"({runs:.0f} runs, {requests} answers dropped and counted); B's print(1) then {latency}")


async def p3(vhost: Vhost) -> None:
    async with manager(vhost), await AmqpBus.connect(url=await vhost.url(A)) as bus:
        greedy = ScriptSandbox(bus=bus, namespace=A.namespace, agent=A.name, cpu="1", memory="1Gi",
                               start_ceiling_seconds=30)  # fmt: skip
        memory = await greedy.execute_python_script(script="x = bytearray(200 * 2**20)\nprint('allocated')",
                                                    timeout_seconds=60)  # fmt: skip
        slow = await greedy.execute_python_script(script="import time\ntime.sleep(20)", timeout_seconds=60)
    assert isinstance(memory, ScriptInvokeResponse) and isinstance(slow, ScriptInvokeResponse), (memory, slow)
    print(f"P3 A asks 1 CPU, 1Gi, 60 s; its Agent allows {A_LIMITS.cpu}, {A_LIMITS.memory}, "
          f"{A_LIMITS.timeout_seconds} s: 200 MiB allocated -> oom_killed={memory.oom_killed}; "
          f"sleep(20) -> timed_out={slow.timed_out} after {slow.duration_seconds:.1f} s")


async def p4(vhost: Vhost) -> None:
    url = await vhost.url(A)
    opened: list[aio_pika.abc.AbstractConnection] = []
    refused = 0
    for _ in range(150):
        try:
            opened.append(await aio_pika.connect(url, timeout=10))
        except Exception:  # the broker closes a connection over the user's limit
            refused += 1
    for connection in opened:
        await connection.close()
    print(f"P4 A's login opened {len(opened)} of 150 connections ({refused} refused)")


class Note(BaseModel):
    n: int


async def p5(vhost: Vhost) -> None:
    queue = work_queue("bench.refusing")
    await vhost.admin.ensure_queue(queue)
    everything = Permissions(configure=r"^bench\..+$", write="^rockbot$", read=r"^bench\..+$",
                             topic_write=r"^bench\..+$")
    consumer_url = await vhost.login("service.consumer", everything)

    async def refuse(delivery: Delivery) -> None:
        raise Refused("refused")

    keeper = DeadLetterKeeper(url=await vhost.url(OPERATOR), user=OPERATOR.user, admin=vhost.admin)
    await keeper.start()
    flood = DEAD_LETTERS_KEPT + 50
    try:
        async with (await AmqpBus.connect(url=consumer_url) as consumer,
                    await AmqpBus.connect(url=await vhost.login("service.b", everything)) as b,
                    await AmqpBus.connect(url=await vhost.login("service.a", everything)) as a):  # fmt: skip
            consumer.dead_letter_share = DeadLetterShare(per_minute=2 * flood)  # many processes' shares together
            await consumer.consume(queue=queue, handler=refuse, prefetch=64)
            await b.publish(queue=queue, body=Note(n=-1), message_id="b-earlier")
            await a.publish(queue=queue, body=Note(n=-2), message_id="a-earlier")
            started = time.perf_counter()
            for start in range(0, flood, 50):
                await asyncio.gather(*(a.publish(queue=queue, body=Note(n=n), message_id=f"a-{n}")
                                       for n in range(start, min(start + 50, flood))))  # fmt: skip
            deadline = time.monotonic() + 600
            while keeper.filed + keeper.dropped < flood + 2:
                assert time.monotonic() < deadline, "the dead letters were not all filed within 600 s"
                await asyncio.sleep(0.2)
            took = time.perf_counter() - started
    finally:
        await keeper.close()
    counts = await asyncio.to_thread(vhost.queues)  # (ready, unacked) per queue
    oldest = [letter.message_id for letter in await vhost.admin.dead_letters(count=3)]  # B's would be first
    b_record = [letter.message_id for letter in await vhost.admin.dead_letters(sender="service.b")]
    a_first = [letter.message_id for letter in await vhost.admin.dead_letters(sender="service.a", count=3)]
    print(f"P5 A had {flood} messages refused, all filed in {took:.1f} s: the shared rockbot.dead-letters keeps "
          f"{counts['rockbot.dead-letters'][0]}, oldest {oldest} (B's earlier one gone from there); B's record "
          f"{b_record}; A's record keeps {counts['rockbot.dead-letters.service.a'][0]}, first {a_first}; "
          f"{keeper.dropped} of A's dropped past its record")


async def flood_approvals(bus: AmqpBus, count: int, *, reply_to: str, halfway: asyncio.Event) -> None:
    """A's `count` approval requests, each asking to wait a year (A's login is `bus`); `halfway` set at half."""
    year = 365 * 24 * 3600.0
    for start in range(0, count, 100):
        await asyncio.gather(*(bus.publish(
            queue=CONSOLE_APPROVALS, body=(request := approval_request(A, seconds=year, reply_to=reply_to)),
            message_id=request.approval_id, correlation_id=request.approval_id, reply_to=reply_to,
            expires_after_seconds=year,
        ) for _ in range(start, min(start + 100, count))))  # fmt: skip
        if start + 100 >= count // 2:  # confirmed by the broker, so queued before B's
            halfway.set()


def approval_request(agent: Principal, *, seconds: float, reply_to: str) -> ApprovalRequest:
    now = datetime.datetime.now(datetime.UTC)
    return ApprovalRequest(
        approval_id=uuid.uuid4().hex, namespace=agent.namespace, agent=agent.name, session_id="s1", tool_call_id="c1",
        tool_name="delete_database", arguments='{"name": "prod"}', requested_at=now,
        expires_at=now + datetime.timedelta(seconds=seconds), on_timeout="Allow", reply_to=reply_to,
    )  # fmt: skip


async def p6(vhost: Vhost, flood: int) -> None:
    as_before = {"PENDING_PER_AGENT": 10**6, "PREFETCH": 1000}
    for label, patch in ((f"with the per-agent bound ({approvals.PENDING_PER_AGENT})", {}),
                         ("as before (prefetch 1,000, no per-agent bound)", as_before)):
        kept = {name: getattr(approvals, name) for name in patch}
        for name, value in patch.items():
            setattr(approvals, name, value)
        desk = approvals.ApprovalDesk()
        try:
            async with (await AmqpBus.connect(url=await vhost.url(CONSOLE)) as console,
                        await AmqpBus.connect(url=await vhost.url(A)) as a,
                        await AmqpBus.connect(url=await vhost.url(B)) as b):  # fmt: skip
                await desk.start(bus=console)
                halfway = asyncio.Event()
                started = time.perf_counter()
                flooding = asyncio.create_task(flood_approvals(a, flood, reply_to=(await a.own_replies()).name,
                                                               halfway=halfway))
                await halfway.wait()  # B asks while A is flooding
                asked = approval_request(B, seconds=600, reply_to="")
                waiting = asyncio.create_task(BusApprover(bus=b).ask(asked))
                asked_at = time.perf_counter()
                seen = None
                while seen is None and time.perf_counter() - asked_at < 30:
                    if any(request.approval_id == asked.approval_id for request in desk.pending()):
                        seen = time.perf_counter() - asked_at
                    await asyncio.sleep(0.005)
                await flooding
                published = time.perf_counter() - started
                held = sum(1 for request in desk.pending() if request.agent == A.name)
                waiting.cancel()
                await desk.stop()
        finally:
            for name, value in kept.items():
                setattr(approvals, name, value)
        await purge(vhost, CONSOLE_APPROVALS.name)
        shown = f"on the desk after {seen:.3f} s" if seen is not None else "not on the desk within 30 s"
        rest = "" if held == flood else "; the rest waited in the queue" if patch else "; the rest denied at once"
        print(f"P6 {label}: A published {flood} year-long approval requests in {published:.1f} s, B asked after the "
              f"first {flood // 2}: B's request {shown}; A's held {held}{rest}")


async def console_of_a_stalled_chat(url: str, pipe: Connection) -> None:
    """The console's chat side in a process of its own: a person's turn to A whose page reads one step, then stalls
    until the parent says A's flood is in; reports this process's memory at each point."""
    from rockbot.console.chat import ChatRelay  # the child imports what it runs

    logging.disable(logging.WARNING)  # a line per dropped message
    def memory() -> dict[str, int]:
        status = Path("/proc/self/status").read_text()
        return {key: int(line.split()[1]) // 1024 for line in status.splitlines() for key in ("VmRSS", "VmHWM")
                if line.startswith(key + ":")}

    async with await AmqpBus.connect(url=url) as bus:
        relay = ChatRelay(instance="bench", timeout_seconds=600)
        await relay.start(bus=bus)
        steps = relay.turn(namespace=A.namespace, agent=A.name, user="alice", session_id="s1", content="hi")
        pipe.send(("started", memory()))
        await anext(steps)
        gc.collect()
        pipe.send(("stalled", memory()))
        await asyncio.to_thread(pipe.recv)  # A's flood is in
        gc.collect()
        pipe.send(("flooded", {**memory(), "held": relay.buffered(A)}))
        rest = [step async for step in steps]
        pipe.send(("read", {"steps": len(rest), "answer": getattr(rest[-1], "answer", None)}))
        await relay.stop()


def _console_process(url: str, pipe: Connection) -> None:
    asyncio.run(console_of_a_stalled_chat(url, pipe))


async def p7(vhost: Vhost) -> None:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_console_process, args=(await vhost.url(CONSOLE), child))
    turns: asyncio.Queue[InboxRequest] = asyncio.Queue()

    async def take(delivery: Delivery) -> None:
        await turns.put(delivery.decode(InboxRequest))

    async with await AmqpBus.connect(url=await vhost.url(A, called_by=[CONSOLE])) as a:
        await a.consume(queue=agent_inbox(namespace=A.namespace, name=A.name), handler=take)
        process.start()
        try:
            report = {}
            report.update([await asyncio.to_thread(parent.recv)])
            turn = await turns.get()
            replies = Queue(name=str(turn.reply_to))

            async def progress(text: str, count: int, first: int) -> None:
                for seq in range(first, first + count):
                    await a.publish(queue=replies, correlation_id=turn.request_id, body=TurnProgress(
                        request_id=turn.request_id, seq=seq, event=TextDelta(text=text)))

            await progress("started", 1, 0)
            report.update([await asyncio.to_thread(parent.recv)])
            started = time.perf_counter()
            await progress("x" * (3_700 * 1024), 100, 1)  # the issue's: over what the console reads
            await progress("y" * (MAX_PROGRESS_BYTES - 4096), 100, 101)  # just within it
            await a.publish(queue=replies, correlation_id=turn.request_id,
                            body=InboxReply(request_id=turn.request_id, session_id="s1", answer="done"))

            async def drained() -> None:  # the console has taken every message
                assert (await asyncio.to_thread(vhost.queues))[replies.name] == (0, 0)

            await eventually(drained, within=600)
            sent = time.perf_counter() - started
            parent.send("flooded")
            report.update([await asyncio.to_thread(parent.recv)])
            report.update([await asyncio.to_thread(parent.recv)])
        finally:
            await asyncio.to_thread(process.join, 60)
    start, stalled, flooded, read = (report[key] for key in ("started", "stalled", "flooded", "read"))
    print(f"P7 a stalled chat page while A sends 100 progress messages of 3.7 MiB and 100 of 1 MiB ({sent:.1f} s): "
          f"the console's RSS {stalled['VmRSS']} MiB before, {flooded['VmRSS']} MiB after (peak {flooded['VmHWM']} "
          f"MiB, {start['VmRSS']} MiB at start); held for the page {flooded['held'] / 2**20:.1f} MiB (bound "
          f"{TURN_BUFFER_BYTES / 2**20:.0f} MiB a turn); the page then read {read['steps']} steps, the last the "
          f"answer {read['answer']!r}")


async def purge(vhost: Vhost, queue: str) -> None:
    await vhost.admin._call("DELETE", f"queues/{quote(vhost.name, safe='')}/{queue}/contents")


async def main(args: argparse.Namespace) -> None:
    logging.disable(logging.WARNING)  # the refusals' log lines, thousands of them
    with tempfile.TemporaryDirectory(prefix="rockbot-bench-rabbit-") as root:
        rabbit = RabbitBroker(root=Path(root))
        await asyncio.to_thread(rabbit.start)
        try:
            print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)")
            parts = {"1": lambda v: p1(v, args.flood), "2": p2, "3": p3, "4": p4, "5": p5,
                     "6": lambda v: p6(v, 2 * args.flood), "7": p7}
            for name in args.parts.split(","):
                async with provisioned(rabbit, f"bench-p{name}") as vhost:
                    await parts[name](vhost)
            print(f"load average at end: {os.getloadavg()[0]:.1f}")
        finally:
            await asyncio.to_thread(rabbit.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=1000, help="scripts A queues in P1, approval requests in P6")
    parser.add_argument("--parts", default="1,2,3,4,5,6,7", help="which of P1-P7 to run, e.g. 2,5")
    asyncio.run(main(parser.parse_args()))
