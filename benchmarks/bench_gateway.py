"""Webhook accept latency and runs started per second: the gateway against the API emulator and a bus.

The gateway runs in this process against the Kubernetes API emulator (real HTTP) and a bus
(in-memory, or RabbitMQ with --amqp-url); a fake agent answers every run at once, so each run also
costs its completion write. Two measures:

- accept latency: signed webhooks sent one after another to one Trigger, timed at the sender from
  the request to the 202 (read, signature, decision, the conditional status write, the publish),
  and the part of it the gateway spent waiting for the API server (the emulator validates every
  write in Python: a real API server answers a status patch much sooner);
- runs started per second: `--senders` clients at once, each sending `--per-sender` deliveries,
  spread over `--triggers` Triggers (each Trigger's status is one object, so its deliveries are
  group-committed: one write per round trip, not one each).

    python -m benchmarks.bench_gateway [--latency-runs 300] [--triggers 1,20] [--senders 32]
                                       [--per-sender 25] [--rabbitmq [--amqp-url amqp://admin@...]]

With --rabbitmq the bus is a RabbitMQ broker: the one --amqp-url names (an administrator's URL), or a
private one started for the run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import statistics
import time
import uuid

import aiohttp
import kmock
import yaml

from benchmarks.bench_scripts import broker as rabbitmq
from rockbot.bus import GATEWAY, Delivery, Principal
from rockbot.bus.topology import agent_inbox
from rockbot.contracts.agent_config import AgentConfig, ModelConfig
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.gateway.app import Gateway
from rockbot.gateway.settings import GatewaySettings
from rockbot.kube import AGENTS, SECRETS, TRIGGERS, KubeClient
from rockbot.local import broker
from tests.fixtures.kubeapi import CRDS_DIR, apply_crd, client_for
from tests.kubeapi import KubeApiEmulator

NS = "default"
KEY = b"benchmark-key"
PAYLOAD = json.dumps({"action": "opened", "issue": {"number": 7, "title": "Login fails on Safari"},
                      "repository": {"full_name": "acme/shop"}}).encode()  # fmt: skip


async def setup(kube: KubeClient, triggers: int) -> None:
    for path in sorted(CRDS_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                await apply_crd(kube, document)
    await kube.create(AGENTS, namespace=NS, body={
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "triage"},
        "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m"}},
    })  # fmt: skip
    await kube.patch(AGENTS, namespace=NS, name="triage", subresource="status", body={"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "DeploymentReady", "lastTransitionTime": "2024-05-01T00:00:00Z"}
    ]}})  # fmt: skip
    await kube.create(SECRETS, namespace=NS, body={"apiVersion": "v1", "kind": "Secret",
                                                   "metadata": {"name": "hook"}, "stringData": {"k": KEY.decode()}})
    for index in range(triggers):
        await kube.create(TRIGGERS, namespace=NS, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Trigger", "metadata": {"name": f"hook-{index:03d}"},
            "spec": {"agentRef": {"name": "triage"}, "webhook": {"secretKeyRef": {"name": "hook", "key": "k"}},
                     "prompt": "Triage #{{ payload.issue.number }}: {{ payload.issue.title }}"},
        })  # fmt: skip


def timed(kube: KubeClient, waited: list[float]) -> KubeClient:
    """`kube`, adding the time its reads and writes take to `waited[0]`."""
    for method in ("get", "patch"):
        plain = getattr(kube, method)

        async def measured(*args, _plain=plain, **kwargs):
            started = time.perf_counter()
            try:
                return await _plain(*args, **kwargs)
            finally:
                waited[0] += time.perf_counter() - started

        setattr(kube, method, measured)
    return kube


async def send(session: aiohttp.ClientSession, port: int, trigger: str) -> int:
    headers = {"Content-Type": "application/json", "X-GitHub-Delivery": str(uuid.uuid4()),
               "X-Hub-Signature-256": "sha256=" + hmac.new(KEY, PAYLOAD, hashlib.sha256).hexdigest()}  # fmt: skip
    async with session.post(f"http://127.0.0.1:{port}/hooks/{NS}/{trigger}", data=PAYLOAD, headers=headers) as answer:
        await answer.read()
        return answer.status


async def served(kube: KubeClient, triggers: int) -> None:
    """Until every Trigger says Ready (the gateway has loaded and settled it)."""
    while True:
        listing = await kube.list(TRIGGERS, namespace=NS)
        ready = [item for item in listing.items
                 if any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (item.get("status") or {}).get("conditions", []))]  # fmt: skip
        if len(ready) == triggers:
            return
        await asyncio.sleep(0.05)


async def run(*, latency_runs: int, triggers: int, senders: int, per_sender: int, amqp_url: str | None,
              management_url: str | None) -> None:  # fmt: skip
    emulator = KubeApiEmulator()
    agent = AgentConfig(name="triage", namespace=NS, model=ModelConfig(base_url="https://llm.example/v1", name="m"))
    if amqp_url:
        connect = await broker.on_rabbitmq([agent], amqp_url=amqp_url, management_url=management_url,
                                           scheduler=GATEWAY)  # fmt: skip
    else:
        connect = await broker.in_memory([agent], scheduler=GATEWAY)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(emulator)
        await stack.enter_async_context(kmock.Server(emulator))
        kube = await stack.enter_async_context(client_for(emulator))
        session = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=senders)))
        await setup(kube, triggers)
        agent_bus = await connect(Principal.agent(namespace=NS, name="triage"))
        stack.push_async_callback(agent_bus.close)

        async def answer(delivery: Delivery) -> None:
            request = delivery.decode(InboxRequest)
            await agent_bus.reply(to=delivery, body=InboxReply(request_id=request.request_id,
                                                               session_id=request.session_id, answer="ok"))

        inbox = await agent_bus.consume(queue=agent_inbox(namespace=NS, name="triage"), handler=answer, prefetch=256)
        settings = GatewaySettings(webhook_host="127.0.0.1", webhook_port=0, health_host="127.0.0.1", health_port=0,
                                   namespaces=[NS])  # fmt: skip
        waited = [0.0]
        gateway_kube = timed(await stack.enter_async_context(client_for(emulator)), waited)
        gateway_bus = await connect(GATEWAY)
        stack.push_async_callback(gateway_bus.close)
        gateway = Gateway(settings=settings, kube=gateway_kube, bus=gateway_bus)
        await gateway.start()
        await served(kube, triggers)
        port = gateway.webhook_port
        assert port is not None

        latencies = []
        waited[0] = 0.0
        for _ in range(latency_runs):
            started = time.perf_counter()
            status = await send(session, port, "hook-000")
            latencies.append(time.perf_counter() - started)
            if status != 202:
                raise RuntimeError(f"a delivery was answered {status}")
        latencies.sort()
        api_share = waited[0] / sum(latencies)

        mark = len(emulator.requests)
        names = [f"hook-{index:03d}" for index in range(triggers)]

        async def sender(number: int) -> list[int]:
            return [await send(session, port, names[(number + sent) % triggers]) for sent in range(per_sender)]

        started = time.perf_counter()
        statuses = [status for answers in await asyncio.gather(*(sender(n) for n in range(senders)))
                    for status in answers]  # fmt: skip
        elapsed = time.perf_counter() - started
        writes = len(emulator.writes_since(mark))
        await gateway.stop()
        await inbox.close()
    accepted = statuses.count(202)
    print(f"bus: {'RabbitMQ' if amqp_url else 'in-memory'}; API: the emulator over HTTP, in this process")
    print(f"accept latency, {latency_runs} webhooks one after another: p50 {statistics.median(latencies) * 1000:.1f} "
          f"ms, p99 {latencies[int(len(latencies) * 0.99) - 1] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms; "
          f"{api_share:.0%} of it waiting for the API server")
    print(f"{senders} senders x {per_sender} webhooks over {triggers} Trigger(s): {accepted} runs started in "
          f"{elapsed:.2f} s = {accepted / elapsed:.1f} runs/s; {writes / max(accepted, 1):.2f} API writes per run "
          f"(records and completions, group-committed); other answers: {len(statuses) - accepted}")


async def main(args: argparse.Namespace) -> None:
    for triggers in (int(count) for count in args.triggers.split(",")):
        options = {"latency_runs": args.latency_runs, "triggers": triggers, "senders": args.senders,
                   "per_sender": args.per_sender}  # fmt: skip
        if not args.rabbitmq:
            await run(**options, amqp_url=None, management_url=None)
            continue
        async with rabbitmq(args.amqp_url, args.management_url) as (admin_url, management_url):
            await run(**options, amqp_url=admin_url, management_url=management_url)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency-runs", type=int, default=300)
    parser.add_argument("--triggers", default="1,20", help="comma-separated Trigger counts, one run each")
    parser.add_argument("--senders", type=int, default=32)
    parser.add_argument("--per-sender", type=int, default=25)
    parser.add_argument("--rabbitmq", action="store_true", help="run the bus on RabbitMQ (default: in memory)")
    parser.add_argument("--amqp-url", default=None, help="its administrator URL (default: a private broker)")
    parser.add_argument("--management-url", default=None, help="its management API (default: AMQP host, port 15672)")
    return parser.parse_args()


if __name__ == "__main__":
    asyncio.run(main(arguments()))
