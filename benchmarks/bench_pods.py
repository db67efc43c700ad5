"""Script pods on the real node: the pod backend against the rig of ../shared/k8s (API server + kubelet).

The real pod backend (claim or create, attach, job, answer) runs in this process with the rig's
admin kubeconfig, in a namespace of its own named `*-scripts` (the rig gives such pods no network,
as the chart's scripts namespace) with Pod Security `restricted` enforced. Each figure is request to
answer for `print(1)`, as the scripts-manager sees it (the bus round trip to an agent adds ~2 ms, see
bench_scripts.py):

- warm, sequential: one request at a time, the pool let refill between requests;
- warm, back to back: one request at a time, the next as soon as the last answered;
- warm, N at once: rounds of N requests, the next round as soon as the last answered;
- cold, sequential and N at once: no pool, a pod made per request; and cold one a second (each
  pod's teardown done before the next request, as when scripts are not back to back).

It also counts how many warm requests found no idle pod and went cold (misses), and prints where the
time went: the p50 and p95 of each step's time since the request (the backend's span events:
claimed or pod created, scheduled, container running, attach refused/attached, job written, the
runner's own steps on the pod's clock, script started, answered), the used pod's delete, and how
long the pool's replacement pods took from create to running. Before the first case it also prints
what one pod start costs the machine, in CPU-seconds by component (the pool's first pods, started
with nothing else running): the bound on how fast a 2-CPU node can refill a pool. Needs the rig up
(`$K8SREAL/up.sh && $K8SREAL/node-up.sh`, or scripts/e2e-real) and the script image on the node.

    python -m benchmarks.bench_pods [--runs 20] [--concurrency 4] [--pool 6] [--cpu 250m] [--memory 128Mi]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from benchmarks.bench_scripts import percentile
from rockbot.kube import NAMESPACES, KubeClient, NotFound
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import ScriptsManagerSettings

K8SREAL = Path(os.environ.get("K8SREAL", "/var/tmp/k8s"))
REQUEST = "bench request"
SPANS = InMemorySpanExporter()
tracer = trace.get_tracer(__name__)


async def measure(
    *, namespace: str, pool: int, runs: int, concurrency: int, wait_for_pool: bool, cpu: str, memory: str,
    pause: float = 0.0, cost: bool = False,
) -> tuple[list[float], float]:
    """Request-to-answer seconds of `runs` requests, and how many warm requests missed the pool."""
    backend = await pod_backend(namespace=namespace, pool=pool, cpu=cpu, memory=memory)
    before = await quiet_node_cpu() if cost and pool else None  # the pool's first pods start with the backend
    await backend.start()
    samples: list[float] = []

    async def one(number: int) -> None:
        job = ScriptJob(request_id=f"bench-{number}", script="print(1)", input_data=None, timeout_seconds=10)
        with tracer.start_as_current_span(REQUEST):
            started = time.perf_counter()
            result = await backend.run(job)
            samples.append(time.perf_counter() - started)
        assert result.stdout == "1\n", result

    try:
        if pool:
            await idle(backend, pool)
            if before is not None:
                await asyncio.sleep(2.0)  # the last pods' status writes and held sessions settle
                report_node_cost(before, node_cpu(), pods=pool)
        for first in range(0, runs, concurrency):
            if pool and wait_for_pool:
                await idle(backend, pool)
            await asyncio.gather(*(one(first + i) for i in range(min(concurrency, runs - first))))
            await asyncio.sleep(pause)
        misses = 0.0
        if pool:
            label = backend.pool.classes[0].label
            misses = sum(backend.metrics.registry.get_sample_value(
                "rockbot_scripts_pool_misses_total", {"limits_class": label, "reason": reason}) or 0
                for reason in ("empty", "failed"))  # fmt: skip
    finally:
        await backend.close()
    return samples, misses


@contextlib.asynccontextmanager
async def scripts_namespace() -> AsyncIterator[tuple[KubeClient, str]]:
    """The rig's API server (its admin kubeconfig unless $KUBECONFIG names another) and a namespace of its own named
    `*-scripts` (the rig gives such pods no network, as the chart's scripts namespace) with Pod Security
    `restricted` enforced; deleted after."""
    os.environ.setdefault("KUBECONFIG", str(K8SREAL / "kubeconfig"))
    namespace = f"bench-{secrets.token_hex(3)}-scripts"
    async with await KubeClient.from_environment() as kube:
        await kube.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        try:
            yield kube, namespace
        finally:
            with contextlib.suppress(NotFound):
                await kube.delete(NAMESPACES, name=namespace)


async def pod_backend(*, namespace: str, pool: int, cpu: str, memory: str) -> PodBackend:
    """The real pod backend in `namespace`, with a pool of `pool` idle pods of the one class `cpu`/`memory` (none:
    0), not started."""
    settings = ScriptsManagerSettings(
        scripts_backend="pods", scripts_namespace=namespace, scripts_cpu=cpu, scripts_memory=memory,
        scripts_pool=f"{cpu}/{memory}={pool}" if pool else "", scripts_package_cache=Path(tempfile.mkdtemp()),
    )  # fmt: skip
    return PodBackend(kube=await KubeClient.from_environment(), settings=settings,
                      metrics=ScriptMetrics(backend="pods"))  # fmt: skip


def trace_to_spans() -> None:
    """Keep this process's spans (the backend's among them) in SPANS, for `report` to read their events."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(SPANS))
    trace.set_tracer_provider(provider)


async def idle(backend: PodBackend, wanted: int) -> None:
    """Until `wanted` idle pods are running (as the pool's own watch shows them)."""
    assert backend.pool is not None
    label = backend.pool.classes[0].label
    async with asyncio.timeout(120):
        while (backend.metrics.registry.get_sample_value("rockbot_scripts_pool_idle_pods", {"limits_class": label})
               or 0) < wanted:
            seen = backend.pool.cache.version
            await backend.pool.cache.changed(since=seen, within=1.0)


#: The machine's processes in the components a pod start costs, by name (`comm`); what runs under a containerd shim
#: is the pods' own; what containerd ran and reaped (the CNI plugins, a shim's start) is counted apart from it, what a
#: shim reaped (runc) with the shims.
COMPONENTS = {"containerd": "containerd", "containerd-shim": "shims and runc", "kubelet": "kubelet",
              "kube-apiserver": "kube-apiserver", "etcd": "etcd", "kube-controller": "controllers and scheduler",
              "kube-scheduler": "controllers and scheduler"}


def node_cpu() -> dict[str, float]:
    """CPU-seconds so far by component: the rig's processes by name, the pods' own processes, the kernel's threads,
    containerd's reaped children (the CNI plugins), and the machine's total (every CPU's busy time)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[str, int, float, float]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = (entry / "stat").read_text()
            name, fields = text[text.index("(") + 1 : text.rindex(")")], text[text.rindex(")") + 2 :].split()
            stats[int(entry.name)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / tick,
                                      (int(fields[13]) + int(fields[14])) / tick)  # fmt: skip
    spent: dict[str, float] = defaultdict(float)
    for pid, (name, _, own, reaped) in stats.items():
        spent[_component(pid, stats)] += own
        if name == "containerd":
            spent["containerd's plugins (CNI, shim starts)"] += reaped
        elif name == "containerd-shim":
            spent["shims and runc"] += reaped  # runc's calls (a pod's processes too, once they ended)
    busy = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    spent["machine"] = (sum(busy) - busy[3] - busy[4]) / tick  # all but idle and iowait
    return spent


async def quiet_node_cpu(*, busy_below: float = 0.25, within: float = 120.0) -> dict[str, float]:
    """`node_cpu()` once the machine is quiet (under `busy_below` CPUs busy for a second: an earlier run's pods are
    torn down, say), so that what follows counts the pool's first pods' start alone."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        before = node_cpu()
        await asyncio.sleep(1.0)
        after = node_cpu()
        if after["machine"] - before["machine"] < busy_below or loop.time() > deadline:
            return after


def _component(pid: int, stats: dict[int, tuple[str, int, float, float]]) -> str:
    name, parent = stats[pid][0], stats[pid][1]
    if name in COMPONENTS:
        return COMPONENTS[name]
    if parent == 2 or pid == 2:
        return "kernel threads"
    while parent in stats:
        if stats[parent][0] == "containerd-shim":
            return "the pods' own processes"
        parent = stats[parent][1]
    return "other processes"


def report_node_cost(before: dict[str, float], after: dict[str, float], *, pods: int) -> None:
    spent = {name: (after.get(name, 0.0) - before.get(name, 0.0)) / pods for name in after}
    total = spent.pop("machine")
    parts = ", ".join(f"{name} {seconds:.2f}" for name, seconds in sorted(spent.items(), key=lambda item: -item[1])
                      if seconds >= 0.005)
    print(f"  node CPU per pod start (the pool's first {pods} pods, nothing else running): {total:.2f} CPU-s; "
          f"{parts} (processes that ended without a parent that counts them are in the machine's figure only)",
          flush=True)


def report(label: str, samples: list[float], misses: float) -> None:
    p50, p95 = statistics.median(samples) * 1000, percentile(samples, 0.95) * 1000
    missed = f", {misses:g} went cold" if misses else ""
    print(f"  {label:24} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms   ({len(samples)} runs{missed})", flush=True)
    for step, offsets in phases(SPANS.get_finished_spans()):
        print(f"    {step:30} p50 {statistics.median(offsets):7.1f} ms   p95 {percentile(offsets, 0.95):7.1f} ms"
              f"   (n={len(offsets)})", flush=True)
    SPANS.clear()


def phases(spans: tuple[ReadableSpan, ...]) -> list[tuple[str, list[float]]]:
    """Each step's milliseconds since its request began (its first event in the request's trace), in the order
    they happen; then the delete of the used pod and the pool's pod starts, as durations."""
    requests = {span.context.trace_id: span.start_time for span in spans if span.name == REQUEST}
    firsts: dict[tuple[int, str], float] = {}
    durations: dict[str, list[float]] = defaultdict(list)
    for span in spans:
        begun = requests.get(span.context.trace_id)
        if span.name in ("cleanup", "warm pod start"):
            durations[f"({span.name}: duration)"].append((span.end_time - span.start_time) / 1e6)
        if begun is None:
            continue
        for event in span.events:
            key = (span.context.trace_id, event.name)
            firsts[key] = min(firsts.get(key, float("inf")), (event.timestamp - begun) / 1e6)
    steps: dict[str, list[float]] = defaultdict(list)
    for (_, name), offset in firsts.items():
        steps[name].append(offset)
    ordered = sorted(steps.items(), key=lambda item: statistics.median(item[1]))
    return ordered + sorted(durations.items())


async def main(*, runs: int, concurrency: int, pool: int, cpu: str, memory: str) -> None:
    trace_to_spans()
    async with scripts_namespace() as (kube, namespace):
        print(f"script pods on the real node ({kube.host}), namespace {namespace}, class {cpu}/{memory}, "
              f"pool {pool}, script print(1):", flush=True)
        cases = (
            ("warm, sequential", pool, 1, True, 0.0), ("warm, back to back", pool, 1, False, 0.0),
            (f"warm, {concurrency} at once", pool, concurrency, False, 0.0),
            ("cold, sequential", 0, 1, False, 0.0), ("cold, one a second", 0, 1, False, 1.0),
            (f"cold, {concurrency} at once", 0, concurrency, False, 0.0),
        )  # fmt: skip
        for number, (label, size, at_once, wait, pause) in enumerate(cases):
            samples, misses = await measure(namespace=namespace, pool=size, runs=runs, concurrency=at_once,
                                            wait_for_pool=wait, cpu=cpu, memory=memory, pause=pause,
                                            cost=number == 0)  # fmt: skip
            report(label, samples, misses)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--pool", type=int, default=6, help="idle pods of the class kept warm")
    parser.add_argument("--cpu", default="250m", help="the script pods' CPU (requests = limits)")
    parser.add_argument("--memory", default="128Mi")
    arguments = parser.parse_args()
    asyncio.run(main(runs=arguments.runs, concurrency=arguments.concurrency, pool=arguments.pool,
                     cpu=arguments.cpu, memory=arguments.memory))
