"""Firing lag and API writes per run: 200 ScheduledTasks firing every minute on a driven clock.

The scheduler runs against the Kubernetes API emulator (real HTTP) and a bus (in-memory, or
RabbitMQ with --amqp-url). At each minute the clock is set to the slot; the lag of a run is the
real time from that moment until its trigger reaches the agent's inbox: everything the operator
does for 200 simultaneous slots (plan, conditional status write, publish). A fake agent answers
at once, so each run also costs its completion write.

    python -m benchmarks.bench_scheduling [--tasks 200] [--minutes 5] [--amqp-url amqp://admin@...]

The operator and the agent each connect as themselves (with --amqp-url, an administrator's URL:
their users are provisioned through the management API, as `rockbot local` does).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import statistics
import time

import kmock
import yaml

from rockbot.bus import OPERATOR, Delivery, Principal
from rockbot.bus.topology import agent_inbox
from rockbot.clock import ManualClock
from rockbot.contracts.agent_config import AgentConfig, ModelConfig
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.kube import AGENTS, SCHEDULED_TASKS, KubeClient
from rockbot.local import broker
from rockbot.operator.scheduling.firing import Scheduler
from tests.fixtures.kubeapi import CRDS_DIR, apply_crd, client_for
from tests.kubeapi import KubeApiEmulator

START = datetime.datetime(2024, 5, 1, 10, 0, 30, tzinfo=datetime.UTC)


async def setup(kube: KubeClient, tasks: int) -> None:
    for path in sorted(CRDS_DIR.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                await apply_crd(kube, document)
    await kube.create(AGENTS, namespace="default", body={
        "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": "helper"},
        "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m",
                           "apiKeySecretRef": {"name": "llm", "key": "apiKey"}}},
    })
    await kube.patch(AGENTS, namespace="default", name="helper", subresource="status", body={"status": {
        "conditions": [{"type": "Ready", "status": "True", "reason": "DeploymentReady",
                        "lastTransitionTime": "2024-05-01T00:00:00Z"}]}})
    for index in range(tasks):
        await kube.create(SCHEDULED_TASKS, namespace="default", body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "ScheduledTask", "metadata": {"name": f"task-{index:03d}"},
            "spec": {"agentRef": {"name": "helper"}, "schedule": "* * * * *", "prompt": f"Task {index}."},
        })


async def wait_for(condition, *, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the scheduler did not get there in time")
        await asyncio.sleep(0.01)


async def run(*, tasks: int, minutes: int, amqp_url: str | None, management_url: str | None) -> None:
    emulator = KubeApiEmulator()
    model = ModelConfig(base_url="https://llm.example/v1", name="m")
    helper = AgentConfig(name="helper", namespace="default", model=model)
    if amqp_url:
        connect = await broker.on_rabbitmq(
            [helper], amqp_url=amqp_url, management_url=management_url, scheduler=OPERATOR
        )
    else:
        connect = await broker.in_memory([helper], scheduler=OPERATOR)
    async with emulator, kmock.Server(emulator), client_for(emulator) as kube:
        await setup(kube, tasks)
        bus = await connect(Principal.agent(namespace="default", name="helper"))
        operator_bus = await connect(OPERATOR)
        clock = ManualClock(START)
        arrivals: list[float] = []

        async def agent(delivery: Delivery) -> None:
            arrivals.append(time.perf_counter())
            request = delivery.decode(InboxRequest)
            await bus.reply(to=delivery, body=InboxReply(request_id=request.request_id,
                                                         session_id=request.session_id, answer="ok"))

        inbox = await bus.consume(queue=agent_inbox(namespace="default", name="helper"), handler=agent, prefetch=256)
        scheduler = Scheduler(kube=kube, bus=operator_bus, clock=clock, namespaces=["default"])
        await scheduler.start()

        async def all_planned(minute: int) -> bool:
            listing = await kube.list(SCHEDULED_TASKS, namespace="default")
            want = (START.replace(second=0) + datetime.timedelta(minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")
            return all((item.get("status") or {}).get("nextScheduleTime") == want
                       and not (item.get("status") or {}).get("active") for item in listing.items)

        await wait_for(lambda: all_planned(1))
        lags: list[float] = []
        writes = 0
        for minute in range(1, minutes + 1):
            arrivals.clear()
            mark = len(emulator.requests)
            started = time.perf_counter()
            clock.set(START.replace(second=0) + datetime.timedelta(minutes=minute))
            await wait_for(lambda minute=minute: all_planned(minute + 1))
            lags += [arrival - started for arrival in arrivals]
            writes += len(emulator.writes_since(mark))
            if len(arrivals) != tasks:
                raise RuntimeError(f"minute {minute}: {len(arrivals)} triggers for {tasks} tasks")
        await scheduler.stop()
        await inbox.close()
        await bus.close()
        await operator_bus.close()
    lags.sort()
    runs = tasks * minutes
    print(f"bus: {'RabbitMQ' if amqp_url else 'in-memory'}; {tasks} tasks x {minutes} minutes = {runs} runs")
    print(f"firing lag (slot -> trigger published): p50 {statistics.median(lags) * 1000:.1f} ms, "
          f"p99 {lags[int(len(lags) * 0.99) - 1] * 1000:.1f} ms, max {lags[-1] * 1000:.1f} ms")
    print(f"API writes per fired run: {writes / runs:.2f} (fire + completion; conflicts included)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--minutes", type=int, default=5)
    parser.add_argument("--amqp-url", default=None, help="an administrator's URL of a RabbitMQ broker")
    parser.add_argument("--management-url", default=None, help="its management API (default: AMQP host, port 15672)")
    args = parser.parse_args()
    asyncio.run(
        run(tasks=args.tasks, minutes=args.minutes, amqp_url=args.amqp_url, management_url=args.management_url)
    )


if __name__ == "__main__":
    main()
