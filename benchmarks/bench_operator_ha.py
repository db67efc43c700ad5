"""Operator failover: two operators as the chart runs them (its values, RBAC and ServiceAccount, two replicas
electing a leader with a Lease), on a real API server with a private RabbitMQ; the leader is SIGKILLed (as the
OOM killer does: the Lease is not released) or stopped with SIGTERM (a rolling update, a drain), `--rounds` times
each, a fresh standby started after each. Printed per way, min / median / max over the rounds:
- lease: seconds from the signal until the Lease names the standby;
- reconcile: seconds from the signal until an Agent created at that moment has its Deployment (the new leader
  started kopf, its watches and its reconcilers).

    PYTHONSAFEPATH=1 PYTHONPATH=. .venv/bin/python benchmarks/bench_operator_ha.py --real /var/tmp/k8s --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_operator import Api, _agent, prepare, real, until
from rockbot.bus import OPERATOR, SCRIPTS_MANAGER
from rockbot.kube import AGENTS, DEPLOYMENTS, LEASES, NotFound
from tests.fixtures.rabbitmq import RabbitBroker, provision_on
from tests.operator.deployed import DeployedOperator
from tests.pod_process import PodProcess

LEASE = "rockbot-operator"
LEADING, STANDING_BY = "leading: holding the Lease", "standing by: the leader Lease"


async def holder(api: Api) -> str:
    return (await api.client.get(LEASES, namespace=api.namespace, name=LEASE))["spec"].get("holderIdentity") or ""


async def standing_by(api: Api) -> DeployedOperator:
    standby = api.launch()
    await until(lambda: STANDING_BY in standby.process.output(), within=60, what="a new operator standing by")
    return standby


async def fail_over(api: Api, leader: DeployedOperator, *, how: signal.Signals, index: int) -> tuple[float, float]:
    """Signal the leader; (seconds to the new Lease holder, seconds to the new leader's first reconcile)."""
    held_by = await holder(api)
    began = time.perf_counter()
    if how == signal.SIGKILL:
        leader.process.kill()
    else:
        leader.process.terminate()
    await api.client.create(AGENTS, namespace=api.namespace, body=_agent(index, 0))

    async def moved() -> bool:
        return await holder(api) not in ("", held_by)

    async def reconciled() -> bool:
        try:
            await api.client.get(DEPLOYMENTS, namespace=api.namespace, name=f"rockbot-agent-{index}")
        except NotFound:
            return False
        return True

    await until(moved, within=60, what="the Lease taken over")
    lease = time.perf_counter() - began
    await until(reconciled, within=60, what="the new leader reconciling")
    return lease, time.perf_counter() - began


def figures(seconds: list[float]) -> str:
    return f"{min(seconds):.1f} / {statistics.median(seconds):.1f} / {max(seconds):.1f} s"


async def main(args: argparse.Namespace) -> None:
    broker = RabbitBroker(root=Path(tempfile.mkdtemp(prefix="bench-rabbit-")))
    await asyncio.to_thread(broker.start)
    started: list[PodProcess] = []
    try:
        await provision_on(broker, OPERATOR, SCRIPTS_MANAGER)
        async with real(args, broker, started, {}) as api:
            try:
                await prepare(api.client, api.namespace, tools=0)
                leader = api.launch()
                await until(lambda: LEADING in leader.process.output(), within=60, what="the first operator leading")
                standby = await standing_by(api)
                results: dict[str, tuple[list[float], list[float]]] = {}
                index = 0
                for how in (signal.SIGKILL, signal.SIGTERM):
                    for _ in range(args.rounds):
                        lease, reconcile = await fail_over(api, leader, how=how, index=index)
                        print(f"{how.name} round {index}: lease {lease:.1f} s, reconcile {reconcile:.1f} s",
                              flush=True)
                        results.setdefault(how.name, ([], []))[0].append(lease)
                        results[how.name][1].append(reconcile)
                        index += 1
                        leader, standby = standby, await standing_by(api)
                for name, (leases, reconciles) in results.items():
                    print(f"{name} of the leader ({args.rounds} rounds, min / median / max): Lease taken over "
                          f"{figures(leases)}; first reconcile {figures(reconciles)}")
            finally:
                for process in started:
                    process.cleanup()
    finally:
        await asyncio.to_thread(broker.stop)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", metavar="K8SREAL", required=True, help="a control plane's folder")
    parser.add_argument("--rounds", type=int, default=5, help="failovers per way (default: 5)")
    asyncio.run(main(parser.parse_args()))
