"""Operator benchmark: N Agents with Tools against the emulated API server over HTTP.

Prints the time until every Agent is Ready, API requests per Agent, and the writes made by a full
no-op resync (an operator restart that re-reconciles everything; the target is 0).

    .venv/bin/python -m benchmarks.bench_operator --agents 200
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import collections
import contextlib
import os
import pathlib
import tempfile
import time

import kmock
import yaml

from rockbot.kube import AGENTS, SECRETS, TOOLS
from rockbot.operator.settings import OperatorSettings
from tests.fixtures.kubeapi import CRDS_DIR, apply_crd, client_for
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import DeploymentController
from tests.operator.harness import operator_running

NS = "default"


def _secret(name: str, key: str, value: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS},
            "data": {key: base64.b64encode(value.encode()).decode()}}


async def _all_ready(client, count: int) -> None:
    while True:
        agents = (await client.list(AGENTS, namespace=NS)).items
        ready = [a for a in agents if any(c["type"] == "Ready" and c["status"] == "True"
                                          for c in (a.get("status") or {}).get("conditions", []))]
        if len(ready) == count:
            return
        await asyncio.sleep(0.2)


async def _every_deployment_read(emulator: KubeApiEmulator, count: int, *, since: int) -> None:
    """Evidence that the restarted operator compared every Agent: it read each Deployment (compared last)."""
    wanted = {f"/deployments/rockbot-agent-{index}" for index in range(count)}
    seen = since
    while wanted:
        requests = emulator.requests
        for request in requests[seen:]:
            if request.method == "GET" and "watch" not in request.params:
                wanted.discard("/deployments/" + request.url.path.rsplit("/deployments/", 1)[-1])
        seen = len(requests)
        await asyncio.sleep(0.05)


async def _quiet(emulator: KubeApiEmulator, *, for_seconds: float = 1.0) -> None:
    """Wait until no request has arrived for `for_seconds`: the operator has nothing left to do."""
    while True:
        before = len(emulator.requests)
        await asyncio.sleep(for_seconds)
        if len(emulator.requests) == before:
            return


async def main(count: int, tools_per_agent: int) -> None:
    emulator = KubeApiEmulator()
    async with emulator, kmock.Server(emulator), client_for(emulator) as client:
        for path in sorted(CRDS_DIR.glob("*.yaml")):
            await apply_crd(client, yaml.safe_load(path.read_text()))
        with tempfile.TemporaryDirectory() as folder:
            kubeconfig = os.path.join(folder, "kubeconfig")
            text = yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "current-context": "e",
                                   "clusters": [{"name": "e", "cluster": {"server": str(emulator.url).rstrip("/")}}],
                                   "users": [{"name": "u", "user": {"token": "t"}}],
                                   "contexts": [{"name": "e", "context": {"cluster": "e", "user": "u"}}]})
            await asyncio.to_thread(pathlib.Path(kubeconfig).write_text, text)
            os.environ["KUBECONFIG"] = kubeconfig
            import kubernetes_asyncio.config.kube_config as kube_config

            kube_config.KUBE_CONFIG_DEFAULT_LOCATION = kubeconfig
            await client.create(SECRETS, namespace=NS, body=_secret("llm", "apiKey", "sk-bench"))
            await client.create(SECRETS, namespace=NS, body=_secret("rockbot-bus", "amqp-url", "amqp://bus/"))
            for index in range(tools_per_agent):
                await client.create(TOOLS, namespace=NS, body={
                    "apiVersion": "rockbot.dev/v1alpha1", "kind": "Tool", "metadata": {"name": f"tool-{index}"},
                    "spec": {"description": f"Tool {index}", "script": {"source": "print(1)"}}})
            controller = asyncio.create_task(DeploymentController(client=client).run())
            settings = OperatorSettings(namespaces=[NS], agent_image="rockbot:bench", resync_seconds=3600)
            try:
                async with operator_running(settings):
                    mark = len(emulator.requests)
                    started = time.perf_counter()
                    for index in range(count):
                        await client.create(AGENTS, namespace=NS, body={
                            "apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent",
                            "metadata": {"name": f"agent-{index}"},
                            "spec": {"model": {"baseUrl": "https://llm.example/v1", "name": "m",
                                               "apiKeySecretRef": {"name": "llm", "key": "apiKey"}},
                                     "tools": [f"tool-{t}" for t in range(tools_per_agent)]}})
                    await _all_ready(client, count)
                    elapsed = time.perf_counter() - started
                    requests = len(emulator.requests) - mark
                    await _quiet(emulator)  # trailing events handled before the restart
                resync_mark = len(emulator.requests)
                async with operator_running(settings):
                    restarted = time.perf_counter()
                    await _every_deployment_read(emulator, count, since=resync_mark)
                    compared = time.perf_counter() - restarted
                    await _quiet(emulator)  # a write following the last comparison is counted too
                resync_writes = emulator.writes_since(resync_mark)
            finally:
                controller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await controller
                emulator.end_watches()
    print(f"agents: {count}, tools per agent: {tools_per_agent}")
    print(f"time until all Ready: {elapsed:.1f} s ({count / elapsed:.1f} agents/s)")
    print(f"API requests per Agent (operator, controller and test together): {requests / count:.1f}")
    print(f"restart: every Agent compared within {compared:.1f} s ({count / compared:.1f} agents/s)")
    print(f"writes made by a full no-op resync (operator restart): {len(resync_writes)}")
    kinds = collections.Counter(f"{r.method.value} {r.url.path.rsplit('/', 2)[-2]}" for r in resync_writes)
    for kind, number in kinds.most_common():
        print(f"  {number} x {kind}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--tools", type=int, default=3)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.agents, arguments.tools))
