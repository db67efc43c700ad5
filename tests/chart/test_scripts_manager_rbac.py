"""The scripts-manager's RBAC from evidence: run its pod backend and its mirror of the Agents (whose
scriptLimits it applies) against the API emulator through every path that touches the API, and check on the
real API server, as the chart's scripts-manager ServiceAccount with its own token, that every request it made
is allowed by the chart's Roles, and that they grant nothing it did not use.

The manager's requests are told apart by identity, as RBAC does: it logs in with the kubeconfig's token;
the test's client and the node (the fake kubelet) send none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rockbot.bus import Principal
from rockbot.kube import AGENTS, NAMESPACES, NETWORKPOLICIES, PODS, KubeClient
from rockbot.scripts_manager.backends import SandboxFailure, ScriptJob
from rockbot.scripts_manager.backends.pod_manifests import job_pod
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.limits import MirroredAgents
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.policy_watch import PolicyWatch
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from rockbot.tasks import cancel_and_wait
from tests.chart.conftest import Manifest
from tests.chart.rbac import SCRIPTS_MANAGER_SA, Right, grants_of, refused_by_the_api_server
from tests.chart.test_operator_rbac import Used, used_right
from tests.fixtures.kube_real import KubeCluster, fresh_namespace
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.containers import Container
from tests.kubeapi.kubelet import FakeKubelet, RunningPod, run_command, timestamp
from tests.operator.samples import agent_body
from tests.scripts_manager.conftest import NS, MakeSettings, kube, make_settings, node, pod_backend  # noqa: F401
from tests.scripts_manager.test_pods import image_pull_fails
from tests.scripts_manager.test_pool import pool_full
from tests.waiting import bounded, eventually

Render = Callable[..., list[Manifest]]
#: The namespace of the emulated Agents (the release's namespace stands for it on the real API server).
AGENTS_NS = "team-a"


def manager_right(request: Any) -> Used | None:
    """The right a request of the manager's needs (it alone sends a token), or None."""
    if not request.headers.get("Authorization", "").startswith("Bearer "):
        return None
    return used_right(request)


def manager_rights(emulator: KubeApiEmulator) -> set[Used]:
    used = set()
    for request in emulator.requests:
        right = manager_right(request)
        if right is None:
            continue
        used.add(right)
        if right.right[1] == "pods/attach":  # a WebSocket GET, which Kubernetes 1.35+ also authorises as create
            used.add(Used(right=("", "pods/attach", "create"), namespace=right.namespace))
    return used


def job(script: str, request_id: str) -> ScriptJob:
    return ScriptJob(request_id=request_id, script=script, input_data=None, timeout_seconds=10)


async def exercise_the_manager(
    *, client: KubeClient, emulator: KubeApiEmulator, settings: ScriptsManagerSettings
) -> None:
    """Every path of the pod backend that talks to the API, once."""
    holding, released = asyncio.Event(), asyncio.Event()
    held_name = ""

    async def held_then_run(kubelet: FakeKubelet, pod: RunningPod) -> None:
        nonlocal held_name
        if pod.pod["metadata"]["annotations"].get("rockbot.dev/request-id") == "held":
            held_name = pod.name
            holding.set()  # its binding and status are written: nothing of it changes until released
            await released.wait()
        await run_command(kubelet, pod)

    async def killed_by_the_job(kubelet: FakeKubelet, pod: RunningPod) -> None:
        arrived = asyncio.Event()

        async def job_arrives(data: bytes) -> None:
            arrived.set()

        streams = Container(write_stdin=job_arrives)
        emulator.run_container(namespace=NS, name=pod.name, container="script", streams=streams)
        await kubelet.report(pod, state={"running": {"startedAt": timestamp()}}, phase="Running")
        await arrived.wait()
        streams.exited()
        await kubelet.report(pod, state={"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                        "startedAt": timestamp(), "finishedAt": timestamp()}},
                             phase="Failed")

    expired = job_pod(job=job("1", "expired"), settings=settings, now=datetime.now(UTC) - timedelta(hours=1),
                      manager="gone")  # an instance without a Lease: reaped
    await client.create(PODS, namespace=NS, body=expired)
    async with pod_backend(settings) as backend:
        async with node(emulator, client, held_then_run):
            await backend.run(job("print(1)", "plain"))  # create, watch, attach, delete
            held = asyncio.create_task(backend.run(job("print(1)", "held")))
            await bounded(holding.wait(), within=15, what="the held pod bound and its status written")
            # A change after the held pod's last one: the version its watch resumes from is then older than the
            # compacted one (a status write of the node's landing after this bump made the resume valid, no 410).
            await client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})
            emulator.compact()  # the held pod's watch resumes from a compacted version: 410, then a get
            emulator.end_watches()

            async def reread() -> None:  # before the pod runs: once it does, the job's attach may end the watch first
                assert any(manager_right(request) == Used(right=("", "pods", "get"), namespace=NS)
                           and request.url.path.endswith(f"/pods/{held_name}") for request in emulator.requests)

            await eventually(reread)
            released.set()
            await held
        async with node(emulator, client, killed_by_the_job):
            killed = await backend.run(job("print(1)", "killed"))  # its end, from a new watch and the log
            assert killed.oom_killed
        async with node(emulator, client, image_pull_fails):
            with pytest.raises(SandboxFailure, match="ImagePullBackOff"):  # a Warning Event on the pod
                await backend.run(job("print(1)", "unpullable"))
        await backend.sweep()  # list, delete
    await exercise_a_restart(settings=settings)
    await exercise_the_policy_watch(client=client)
    await exercise_the_agent_mirror(client=client)


async def exercise_a_restart(*, settings: ScriptsManagerSettings) -> None:
    """A process restarted in its pod takes over the Lease of the one before, killed (create, get, update), and
    cleans up after it; a clean stop deletes its Lease."""
    in_pod = settings.model_copy(update={"pod_name": "scripts-manager-0"})
    killed = PodBackend(kube=await KubeClient.from_environment(), settings=in_pod,
                        metrics=ScriptMetrics(backend="pods"))
    await killed.start()
    await bounded(killed.reaper.held.wait(), within=15, what="the first process's Lease")
    await cancel_and_wait(*killed._tasks)  # as if SIGKILLed: nothing cleaned up
    await killed._kube.close()
    async with pod_backend(in_pod) as restarted:
        await bounded(restarted.reaper.held.wait(), within=15, what="the Lease taken over")
        assert await restarted.reaper.lease.renew()


async def exercise_the_policy_watch(*, client: KubeClient) -> None:
    """The isolation canary's watch of the scripts namespace's NetworkPolicies (list, watch), as the manager."""
    changed = asyncio.Event()
    async with await KubeClient.from_environment() as own:  # the manager's identity: the kubeconfig's token
        watch = PolicyWatch(kube=own, namespace=NS)
        watching = asyncio.create_task(watch.run(lambda why: changed.set()))
        try:
            await bounded(watch.listed.wait(), within=15, what="the NetworkPolicies listed")
            await client.create(NETWORKPOLICIES, namespace=NS, body={
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "deny"},
                "spec": {"podSelector": {}, "policyTypes": ["Egress"]}})  # fmt: skip
            await bounded(changed.wait(), within=15, what="the watch seeing the new NetworkPolicy")
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def exercise_the_agent_mirror(*, client: KubeClient) -> None:
    """The Agents' scriptLimits: listed, then followed by a watch (an Agent made after the list is seen)."""
    await client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": AGENTS_NS}})
    agents = MirroredAgents(kube=await KubeClient.from_environment(), namespaces=[AGENTS_NS])
    await agents.start()
    try:
        await client.create(AGENTS, namespace=AGENTS_NS, body=agent_body("late", AGENTS_NS))

        async def seen() -> None:
            assert agents.of(Principal.agent(namespace=AGENTS_NS, name="late")) is not None

        await eventually(seen)
    finally:
        await agents.stop()
        await agents.kube.close()


async def exercise_the_pool(*, client: KubeClient, emulator: KubeApiEmulator, settings: ScriptsManagerSettings) -> None:
    """The warm pool's paths: its cache (list, watch), pods made, a claim (a JSON patch), release at the end."""
    async with node(emulator, client), pod_backend(settings) as backend:
        assert backend.pool is not None
        await pool_full(client, backend, 1)
        result = await backend.run(job("print(1)", "warm"))
        assert sample_path(backend) == 1 and result.stdout == "1\n"


def sample_path(backend: PodBackend) -> float:
    return backend.metrics.registry.get_sample_value(
        "rockbot_scripts_pod_run_duration_seconds_count", {"path": "warm"}) or 0.0


async def test_every_request_the_scripts_manager_makes_is_granted_by_the_chart(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings, render: Render,  # noqa: F811
    kube_cluster: KubeCluster, kube_namespace: str,
) -> None:
    settings = make_settings(scripts_backend="pods", scripts_sweep_grace_seconds=0)
    await exercise_the_manager(client=kube, emulator=kube_api, settings=settings)
    check(manager_rights(kube_api), render=render, values={}, cluster=kube_cluster, release=kube_namespace)


async def test_with_a_warm_pool_every_request_is_granted_by_the_chart_and_patch_is_used(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings, render: Render,  # noqa: F811
    kube_cluster: KubeCluster, kube_namespace: str,
) -> None:
    cold = make_settings(scripts_backend="pods", scripts_sweep_grace_seconds=0)
    await exercise_the_manager(client=kube, emulator=kube_api, settings=cold)
    warm = make_settings(scripts_backend="pods", scripts_pool="500m/256Mi=1")
    await exercise_the_pool(client=kube, emulator=kube_api, settings=warm)
    values = {"scripts": {"pool": [{"cpu": "500m", "memory": "256Mi", "size": 1}]}}
    check(manager_rights(kube_api), render=render, values=values, cluster=kube_cluster, release=kube_namespace)


def check(used: set[Used], *, render: Render, values: dict, cluster: KubeCluster, release: str) -> None:
    """The real API server judges the rights used (the scripts-manager's ServiceAccount asking with its token, the
    chart installed in `release` with a scripts namespace of this test's own); the chart grants nothing unused."""
    with fresh_namespace(cluster, purpose="scripts") as scripts:
        own = {**values, "scripts": {**values.get("scripts", {}), "namespace": scripts}, "agentNamespaces": [release]}
        manifests = render(own, namespace=release)
        real = {NS: scripts, AGENTS_NS: release}
        refused = refused_by_the_api_server(
            cluster, manifests, account=SCRIPTS_MANAGER_SA, namespace=release,
            rights={(u.right, real[u.namespace]) for u in used},
        )
    assert refused == [], "the scripts-manager needs rights the chart does not grant"
    grants = grants_of(render(values), account=SCRIPTS_MANAGER_SA)
    granted: set[Right] = set().union(*(grant.rights for grant in grants))
    assert sorted(granted - {u.right for u in used}) == [], "the chart grants rights the scripts-manager never used"
    assert {u.namespace for u in used} == {NS, AGENTS_NS}
