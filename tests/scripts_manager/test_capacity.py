"""A full node: the isolation canary that could not run is tried again within seconds, and scripts are refused
saying when (canary.py); a pod with work the scheduler has no room for makes the manager give back its idle warm pods
(pods.py, pool.py); an ended pod nobody reads any more is deleted by the next sweep, whatever its deadline
(reaping.py).

On the real API server, where no pod here is ever scheduled: each asks for 64 CPUs, more than any node has (the
rig's node, when it is up, only adds the scheduler's verdict). So every canary fails ("could not run") once its
start bound passes, as it does on a node too full for it. Where a test needs the scheduler's verdict, it writes
it as the scheduler does (the pod's PodScheduled condition, in its status). Script pods carry
`scripts.priorityClassName`, which the API server resolves to its priority.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import ScriptInvokeError
from rockbot.kube import PODS, ApiError, KubeClient
from rockbot.scripts_manager.backends.pod_manifests import (
    POOL_LABEL,
    POOL_SELECTOR,
    REQUEST_ANNOTATION,
    job_pod,
    pool_pod,
)
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.canary import RETRY_FIRST_SECONDS, host_listeners, retry_wait
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.settings import PoolClass
from tests.fixtures.kube_real import KubeCluster
from tests.scripts_manager.conftest import MakeSettings, pod_backend
from tests.scripts_manager.test_canary import manager_with
from tests.scripts_manager.test_pods import job
from tests.waiting import eventually

#: More CPU than any node here has: the pods stay Pending (unschedulable), whatever node is up; the canary's too.
NO_NODE_FITS = {"scripts_cpu": "64", "scripts_max_cpu": "64", "scripts_isolation_cpu": "64"}


def canary(pod: dict[str, Any]) -> bool:
    return (pod["metadata"].get("annotations") or {}).get(REQUEST_ANNOTATION, "").startswith("isolation-canary-")


@contextlib.asynccontextmanager
async def pods_made(kube: KubeClient, namespace: str) -> AsyncIterator[dict[str, dict[str, Any]]]:
    """Every pod made in `namespace` while in use, by name (its last state seen), deleted ones too."""
    seen: dict[str, dict[str, Any]] = {}

    async def watch() -> None:
        listed = await kube.list(PODS, namespace=namespace)
        seen.update((pod["metadata"]["name"], pod) for pod in listed.items)
        version = listed.resource_version
        while True:
            async for event in kube.watch(PODS, namespace=namespace, resource_version=version, timeout_seconds=30):
                seen[event.object["metadata"]["name"]] = event.object
                version = event.object["metadata"]["resourceVersion"]

    watching = asyncio.create_task(watch())
    try:
        yield seen
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)


def test_a_canary_that_could_not_run_is_tried_again_after_seconds_doubling_up_to_a_minute() -> None:
    assert [retry_wait(failed) for failed in range(1, 7)] == [5, 10, 20, 40, 60, 60]


async def test_a_canary_that_could_not_run_is_tried_again_within_seconds_and_scripts_say_when(
    make_settings: MakeSettings, real_kube_client: KubeClient, real_kubeconfig: Path, kube_namespace: str,
) -> None:
    async with host_listeners() as targets, pods_made(real_kube_client, kube_namespace) as made:
        settings = make_settings(scripts_backend="pods", scripts_namespace=kube_namespace, **NO_NODE_FITS,
                                 scripts_isolation_targets=targets, scripts_pod_start_seconds=1)
        assert settings.scripts_isolation_interval_seconds == 600  # the default: a retry must not wait for it
        async with manager_with(settings) as (manager, sandbox):

            async def failed() -> None:
                assert manager.canary is not None and manager.canary.last is not None
                assert manager.canary.last.error is not None

            await eventually(failed, within=60)
            refused = await sandbox.execute_python_script(script="print('must not run')")

            async def tried_again() -> None:
                assert len([pod for pod in made.values() if canary(pod)]) >= 2

            # The first canary's pod waits its start bound (1 s + 10 s of slack), then the next comes 5 s later.
            await eventually(tried_again, within=RETRY_FIRST_SECONDS + 20)
    assert isinstance(refused, ScriptInvokeError), refused
    assert (refused.error.code, refused.error.retryable) == (ErrorCode.UNAVAILABLE, True)
    assert "the isolation canary could not run" in refused.error.message
    assert re.search(r"; (the next canary runs in [0-5] s|a canary runs now)", refused.error.message), refused


async def test_the_canary_pod_asks_for_little_cpu_so_that_a_node_full_of_script_pods_has_room_for_it(
    make_settings: MakeSettings, real_kube_client: KubeClient, real_kubeconfig: Path, kube_namespace: str,
) -> None:
    async with host_listeners() as targets, pods_made(real_kube_client, kube_namespace) as made:
        settings = make_settings(scripts_backend="pods", scripts_namespace=kube_namespace,
                                 scripts_isolation_targets=targets, scripts_pod_start_seconds=1)
        async with manager_with(settings):

            async def canary_pod() -> dict[str, Any]:
                canaries = [pod for pod in made.values() if canary(pod)]
                assert canaries, made
                return canaries[0]

            pod = await eventually(canary_pod, within=30)
    (container,) = pod["spec"]["containers"]
    assert settings.scripts_cpu == "500m"  # a script's
    assert container["resources"]["requests"]["cpu"] == container["resources"]["limits"]["cpu"] == "100m"


#: What the scheduler writes on a pod it found no node with room for.
NO_ROOM = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
           "message": "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available."}


async def test_a_script_pod_the_node_has_no_room_for_makes_the_manager_give_back_its_idle_warm_pods(
    make_settings: MakeSettings, real_kube_client: KubeClient, real_kubeconfig: Path, kube_namespace: str,
) -> None:
    settings = make_settings(scripts_backend="pods", scripts_namespace=kube_namespace, scripts_pool="64/256Mi=2",
                             **NO_NODE_FITS, scripts_pod_start_seconds=60)
    kube, ns = real_kube_client, kube_namespace
    async with pods_made(kube, ns) as made, pod_backend(settings) as backend:

        async def pool_made() -> None:  # unscheduled, so no job can claim them: its pod is made (cold)
            assert len((await kube.list(PODS, namespace=ns, label_selector=POOL_SELECTOR)).items) == 2

        await eventually(pool_made, within=30)
        running = asyncio.create_task(backend.run(job("print('waits for room')")))
        try:

            async def cold_pod() -> dict[str, Any]:
                cold = [pod for pod in made.values() if POOL_LABEL not in pod["metadata"]["labels"]]
                assert cold, "no cold pod yet"
                return cold[0]

            pod = await eventually(cold_pod)
            await kube.patch(PODS, namespace=ns, name=pod["metadata"]["name"], subresource="status",
                             body={"status": {"conditions": [NO_ROOM]}})

            async def given_back() -> None:
                assert (await kube.list(PODS, namespace=ns, label_selector=POOL_SELECTOR)).items == []

            await eventually(given_back)
            warm = [name for name, pod in made.items() if POOL_LABEL in pod["metadata"]["labels"]]
            assert not running.done()  # the job's pod waits for the room they leave
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    assert len(warm) == 2, warm  # the pool made none in their place


async def ended_pod(kube: KubeClient, namespace: str, body: dict[str, Any], *, phase: str = "Failed",
                    reason: str = "DeadlineExceeded") -> str:
    """`body` made, then ended as its node reports it (a deadline, an error)."""
    name = (await kube.create(PODS, namespace=namespace, body=body))["metadata"]["name"]
    await kube.patch(PODS, namespace=namespace, name=name, subresource="status",
                     body={"status": {"phase": phase, "reason": reason}})
    return name


async def test_the_sweep_deletes_ended_pods_nobody_reads_long_before_their_deadline(
    make_settings: MakeSettings, real_kube_client: KubeClient, real_kubeconfig: Path, kube_namespace: str,
) -> None:
    settings = make_settings(scripts_backend="pods", scripts_namespace=kube_namespace, **NO_NODE_FITS,
                             scripts_sweep_grace_seconds=3600)
    backend = PodBackend(kube=await KubeClient.from_environment(), settings=settings,
                         metrics=ScriptMetrics(backend="pods"))
    me = backend.reaper.instance
    now = datetime.now(UTC)
    kube, ns = real_kube_client, kube_namespace
    try:
        deadline = await ended_pod(kube, ns, job_pod(job=job("1"), settings=settings, now=now, manager=me))
        failed = await ended_pod(kube, ns, job_pod(job=job("2"), settings=settings, now=now, manager=me),
                                 reason="Error")
        read = await ended_pod(kube, ns, job_pod(job=job("3"), settings=settings, now=now, manager=me))
        backend.reaper.in_use.add(read)  # a job of this instance's reads its end state and log: kept
        running = (await kube.create(PODS, namespace=ns, body=job_pod(job=job("4"), settings=settings, now=now,
                                                                      manager=me)))["metadata"]["name"]
        idle = await ended_pod(kube, ns, pool_pod(pool=PoolClass(cpu="64", memory="256Mi", size=1), owner=me,
                                                  settings=settings, now=now), phase="Succeeded", reason="")
        assert await backend.sweep() == 3
        names = {pod["metadata"]["name"] for pod in (await kube.list(PODS, namespace=ns)).items}
        assert names == {read, running}, (deadline, failed, idle)
    finally:
        await backend.close()


async def test_script_pods_carry_the_priority_class_and_get_its_priority(
    make_settings: MakeSettings, kube_cluster: KubeCluster, real_kube_client: KubeClient, kube_namespace: str,
) -> None:
    name = f"rockbot-test-scripts-{secrets.token_hex(3)}"
    status, body = kube_cluster.request("POST", "/apis/scheduling.k8s.io/v1/priorityclasses", body={
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": 100000,
        "description": "rockbot test: script pods above batch work"})
    assert status == 201, body
    try:
        settings = make_settings(scripts_backend="pods", scripts_namespace=kube_namespace, **NO_NODE_FITS,
                                 scripts_priority_class=name)
        created = await real_kube_client.create(PODS, namespace=kube_namespace, body=job_pod(
            job=job("1"), settings=settings, now=datetime.now(UTC), manager="m1"))
        missing = make_settings(scripts_namespace=kube_namespace, scripts_priority_class=f"{name}-missing")
        with pytest.raises(ApiError, match="no PriorityClass with name"):
            await real_kube_client.create(PODS, namespace=kube_namespace, body=job_pod(
                job=job("2"), settings=missing, now=datetime.now(UTC), manager="m1"))
    finally:
        kube_cluster.request("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")
    assert (created["spec"]["priorityClassName"], created["spec"]["priority"]) == (name, 100000)
