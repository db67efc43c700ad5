"""Script pods, warm and cold: the pod backend against the API emulator and a node that runs the pods.

The node (tests/kubeapi/kubelet.py) runs each pod's real runner as a restricted pod runs (bubblewrap,
uid 65534, PID 1 of its own namespace, no network) and reports container states on a relist period
like the kubelet's PLEG (--relist, 1 s; 0 reports at once). Each figure is request to answer as the
backend sees it (claim or create, attach, job, answer), for `print(1)`:

- warm: a pool of --concurrency idle pods, every request finding one ready (the pool is let refill
  between rounds: what a pool sized for the load gives);
- cold: no pool, a pod made per request; its container is reported running on the next relist tick,
  and the answer comes from the attach stream without waiting for the report of its end.

Sequentially (--runs runs) and --concurrency at once (--runs requests in rounds). What it cannot
show: a real node's container start, image cache, CPU quota and API server latency.

    python -m benchmarks.bench_pods [--runs 20] [--concurrency 4] [--relist 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import kmock
from kubernetes_asyncio import client as k8s_client

from benchmarks.bench_scripts import percentile
from rockbot.kube import NAMESPACES, KubeClient
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import in_background
from tests.kubeapi.kubelet import FakeKubelet

NS = "rockbot-scripts"


def client(emulator: KubeApiEmulator) -> KubeClient:
    return KubeClient(api_client=k8s_client.ApiClient(k8s_client.Configuration(host=str(emulator.url).rstrip("/"))))


@contextlib.asynccontextmanager
async def cluster(relist: float) -> AsyncIterator[KubeApiEmulator]:
    emulator = KubeApiEmulator()
    async with emulator, kmock.Server(emulator), client(emulator) as kube:
        await kube.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        async with in_background(FakeKubelet(emulator=emulator, kube=kube, namespace=NS,
                                               relist_seconds=relist or None)):
            try:
                yield emulator
            finally:
                emulator.end_watches()


async def measure(
    emulator: KubeApiEmulator, *, pool: int, runs: int, concurrency: int, relist: float
) -> list[float]:
    settings = ScriptsManagerSettings(scripts_backend="pods", scripts_namespace=NS,
                                      scripts_pool=f"500m/256Mi={pool}" if pool else "",
                                      scripts_package_cache=Path(tempfile.mkdtemp()))
    backend = PodBackend(kube=client(emulator), settings=settings, metrics=ScriptMetrics(backend="pods"))
    await backend.start()
    samples: list[float] = []

    async def one(number: int) -> None:
        job = ScriptJob(request_id=f"bench-{number}", script="print(1)", input_data=None, timeout_seconds=10)
        started = time.perf_counter()
        result = await backend.run(job)
        samples.append(time.perf_counter() - started)
        assert result.stdout == "1\n", result

    try:
        for first in range(0, runs, concurrency):
            if pool:
                await pool_ready(backend, concurrency)
            # Requests come at any moment of the node's relist, not just after a tick (as back-to-back
            # runs would, each answer following the tick that reported its pod running).
            await asyncio.sleep(random.uniform(0, relist))
            await asyncio.gather(*(one(first + i) for i in range(min(concurrency, runs - first))))
        if pool:
            claims = backend.metrics.registry.get_sample_value(
                "rockbot_scripts_pool_claims_total", {"limits_class": backend.pool.classes[0].label})
            assert claims == runs, f"only {claims} of {runs} requests found a warm pod"
    finally:
        await backend.close()
    return samples


async def pool_ready(backend: PodBackend, wanted: int) -> None:
    """Until `wanted` idle pods are running (the watch shows them so): a pool sized for the load."""
    assert backend.pool is not None
    label = backend.pool.classes[0].label
    while True:
        seen = backend.pool.cache.version
        if (backend.metrics.registry.get_sample_value("rockbot_scripts_pool_idle_pods", {"limits_class": label})
                or 0) >= wanted:
            return
        await backend.pool.cache.changed(since=seen, within=1.0)


def report(label: str, samples: list[float]) -> None:
    p50, p95 = statistics.median(samples) * 1000, percentile(samples, 0.95) * 1000
    print(f"  {label:20} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   ({len(samples)} runs)")


async def main(*, runs: int, concurrency: int, relist: float) -> None:
    async with cluster(relist) as emulator:
        print(f"script pods over the API emulator, node relist {relist:g} s, script print(1):")
        cases = (("warm, sequential", 1, 1), (f"warm, {concurrency} at once", concurrency, concurrency),
                 ("cold, sequential", 0, 1), (f"cold, {concurrency} at once", 0, concurrency))
        for label, pool, at_once in cases:
            report(label, await measure(emulator, pool=pool, runs=runs, concurrency=at_once, relist=relist))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--relist", type=float, default=1.0, help="the node's status relist period (0: at once)")
    arguments = parser.parse_args()
    asyncio.run(main(runs=arguments.runs, concurrency=arguments.concurrency, relist=arguments.relist))
