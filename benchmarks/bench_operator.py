"""Operator benchmark: N Agents (3 Tools each) converging, measured the way a real cluster would measure it.

The operator runs as its own process, as its pod runs it (tests/pod_process.py: the chart's
settings with JSON logs, uid 65532, read-only root), against the Kubernetes API emulator over HTTP
with a per-request latency and a deployment controller reporting pods ready on the kubelet's 1 s
cadence; a private RabbitMQ runs its scheduling unless --no-broker. Printed:
- converge: from the first Agent created until every Agent has its five children and a Ready=True
  status for its generation (and every Tool lists its users); the operator's CPU (its rusage) and
  API requests per Agent (its requests carry its own token) until it is quiet again;
- a no-op resync (ROCKBOT_RESYNC_SECONDS is shortened for this) and a restart: writes made (goal 0),
  how long SIGTERM took, how long the new process took to compare every Agent;
- memory: the operator's RSS once settled, and its peak.

    .venv/bin/python -m benchmarks.bench_operator --agents 500
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import kmock
import yaml

from rockbot.bus import OPERATOR, SCRIPTS_MANAGER
from rockbot.kube import AGENTS, NAMESPACES, SECRETS, TOOLS, KubeClient
from tests.chart.conftest import CHART, Helm, _fetch_helm
from tests.fixtures.kubeapi import CRDS_DIR, apply_crd, client_for
from tests.fixtures.rabbitmq import RabbitBroker, provision_on
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import DeploymentController, in_background
from tests.operator.deployed import NAMESPACE, DeployedOperator, converged, lagging, operator_requests, start_operator

NS = NAMESPACE
#: How long without a request from the operator counts as "it has nothing left to do".
QUIET_SECONDS = 2.0


def render_chart() -> list[dict[str, Any]]:
    helm = Helm(binary=_fetch_helm(), home=Path(tempfile.mkdtemp(prefix="bench-helm-")))
    out = helm.run("template", "rockbot", str(CHART), "--namespace", NS)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _secret(name: str, key: str, value: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "data": {key: base64.b64encode(value.encode()).decode()}}


def _agent(index: int, tools: int) -> dict[str, Any]:
    return {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent", "metadata": {"name": f"agent-{index}"},
            "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m",
                               "apiKeySecretRef": {"name": "llm", "key": "apiKey"}},
                     "tools": [f"tool-{t}" for t in range(tools)], "builtinTools": ["scripts", "scheduling"]}}


def writes(requests: list[Any]) -> list[Any]:
    return [r for r in requests if str(r.method.value).upper() in ("POST", "PUT", "PATCH", "DELETE")]


async def until(probe: Callable[[], bool | Awaitable[bool]], *, within: float, what: str) -> float:
    started = time.perf_counter()
    while True:
        result = probe()
        if not isinstance(result, bool):
            result = await result
        if result:
            return time.perf_counter() - started
        if time.perf_counter() - started > within:
            raise TimeoutError(f"not {what} within {within} s")
        await asyncio.sleep(0.05)


async def quiet(emulator: KubeApiEmulator) -> None:
    """Until the operator has made no request for QUIET_SECONDS."""
    while True:
        before = len(operator_requests(emulator, 0))
        await asyncio.sleep(QUIET_SECONDS)
        if len(operator_requests(emulator, 0)) == before:
            return


def compared_every_agent(operator: DeployedOperator, emulator: KubeApiEmulator, *, since: int, count: int) -> bool:
    """Evidence the operator compared every Agent: its log says so, or (older operators) it read every Deployment."""
    if "reconciled every Agent" in operator.process.output():
        return True
    read = {r.url.path.rsplit("/", 1)[-1] for r in operator_requests(emulator, since)
            if r.method == "GET" and "watch" not in r.params and "/deployments/" in r.url.path}
    return all(f"rockbot-agent-{index}" in read for index in range(count))


def summary(requests: list[Any]) -> str:
    kinds = collections.Counter(f"{r.method.value} {r.url.path.split('/namespaces/')[-1].split('/')[1]}"
                                + ("/status" if r.url.path.endswith("/status") else "")
                                for r in requests if "/namespaces/" in r.url.path)
    return ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())


async def main(args: argparse.Namespace) -> None:
    manifests = await asyncio.to_thread(render_chart)
    broker = None if args.no_broker else RabbitBroker(root=Path(tempfile.mkdtemp(prefix="bench-rabbit-")))
    if broker is not None:
        await asyncio.to_thread(broker.start)
    emulator = KubeApiEmulator(latency=args.latency_ms / 1000)
    started: list[Any] = []
    try:
        async with emulator, kmock.Server(emulator), client_for(emulator) as client:
            await prepare(client, tools=args.tools)
            env = {"ROCKBOT_RESYNC_SECONDS": str(args.resync_seconds)}
            if broker is not None:
                await provision_on(broker, OPERATOR, SCRIPTS_MANAGER)  # what the chart's Secrets give them

            def launch() -> DeployedOperator:
                return start_operator(lambda _: manifests, emulator, started, broker=broker, extra_env=env)

            try:
                async with in_background(DeploymentController(client=client, kubelet_period=1.0)):
                    await run_phases(args, emulator, client, launch)
            finally:
                for process in started:
                    process.cleanup()
                emulator.end_watches()
    finally:
        if broker is not None:
            await asyncio.to_thread(broker.stop)


async def prepare(client: KubeClient, *, tools: int) -> None:
    for path in sorted(CRDS_DIR.glob("*.yaml")):
        await apply_crd(client, yaml.safe_load(path.read_text()))
    await client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await client.create(SECRETS, namespace=NS, body=_secret("llm", "apiKey", "sk-bench"))
    for index in range(tools):
        await client.create(TOOLS, namespace=NS, body={
            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Tool", "metadata": {"name": f"tool-{index}"},
            "spec": {"description": f"Tool {index}", "script": {"source": "print(1)"}}})


async def run_phases(args: argparse.Namespace, emulator: KubeApiEmulator, client: KubeClient,
                     launch: Callable[[], DeployedOperator]) -> None:
    count, tools = args.agents, args.tools
    operator = launch()
    await until(operator.probes.live, within=60, what="live")
    await quiet(emulator)
    idle_rss, _ = operator.process.memory()

    mark, cpu_before, began = len(emulator.requests), operator.process.cpu_seconds(), time.perf_counter()
    pending = [client.create(AGENTS, namespace=NS, body=_agent(index, tools)) for index in range(count)]
    for batch in range(0, count, 25):
        await asyncio.gather(*pending[batch:batch + 25])
    names = [f"agent-{index}" for index in range(count)]
    try:
        await until(lambda: converged(emulator, names), within=args.within, what="converged")
    except TimeoutError:
        print(lagging(emulator, names), "\n--- the operator's last lines:\n", operator.process.output()[-3000:])
        raise
    converge_seconds = time.perf_counter() - began
    await quiet(emulator)
    cpu = operator.process.cpu_seconds() - cpu_before
    made = operator_requests(emulator, mark)
    rss, peak = operator.process.memory()
    timeouts = operator.process.output().count("no answer within")
    print(f"agents: {count}, tools per agent: {tools}, API latency {args.latency_ms:g} ms, "
          f"broker: {'no' if args.no_broker else 'yes'}")
    print(f"converge: {converge_seconds:.1f} s from the first create to every child and Ready status")
    print(f"operator CPU until quiet: {cpu:.1f} s = {1000 * cpu / count:.1f} ms per Agent")
    print(f"operator API requests: {len(made)} = {len(made) / count:.1f} per Agent ({len(writes(made))} writes)")
    print(f"  {summary(made)}")
    others = [r for r in writes(emulator.requests[mark:]) if r not in made]
    print(f"others' writes meanwhile (test client, deployment controller): {summary(others)}")
    warnings = sum(1 for record in operator.process.records() if record.get("level") in ("WARNING", "ERROR"))
    print(f"client-side timeouts in the operator's log: {timeouts}; warnings and errors logged: {warnings}")
    print(f"memory: RSS {rss / 2**20:.0f} MiB settled ({idle_rss / 2**20:.0f} MiB before the Agents), "
          f"peak {peak / 2**20:.0f} MiB")

    if args.resync_seconds < 3600:
        mark = len(emulator.requests)
        text = operator.process.output()
        passes = text.count("resync: compared")
        waited = await until(lambda: operator.process.output().count("resync: compared") > passes,
                             within=args.resync_seconds * 3 + 60, what="a resync pass")
        await quiet(emulator)
        resync = writes(operator_requests(emulator, mark))
        print(f"no-op resync (ROCKBOT_RESYNC_SECONDS={args.resync_seconds:g}, pass seen after {waited:.1f} s): "
              f"{len(resync)} writes {summary(resync)}")

    operator.process.terminate()
    stopping = time.perf_counter()
    code = await operator.process.exited(within=60)
    stop_seconds = time.perf_counter() - stopping
    mark, restarted = len(emulator.requests), time.perf_counter()
    operator = launch()
    compared = await until(lambda: compared_every_agent(operator, emulator, since=mark, count=count),
                           within=args.within, what="every Agent compared after the restart")
    await quiet(emulator)
    restart = operator_requests(emulator, mark)
    rss, peak = operator.process.memory()
    print(f"SIGTERM: exited {code} after {stop_seconds:.1f} s")
    print(f"restart: every Agent compared within {compared:.1f} s of the start "
          f"({time.perf_counter() - restarted:.1f} s until quiet); {len(restart)} requests, "
          f"{len(writes(restart))} writes {summary(writes(restart))}")
    print(f"memory after the restart: RSS {rss / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--tools", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=3.0, help="per API request (default: 3)")
    parser.add_argument("--resync-seconds", type=float, default=30.0,
                        help="the operator's resync period for the no-op resync (3600: skip it)")
    parser.add_argument("--within", type=float, default=600.0, help="give up waiting after this many seconds")
    parser.add_argument("--no-broker", action="store_true", help="run without RabbitMQ (scheduling off)")
    asyncio.run(main(parser.parse_args()))
