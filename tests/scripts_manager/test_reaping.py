"""A dead scripts-manager's work is cleaned up within seconds by whoever is alive (backends/reaping.py).

On the real API server and the real broker: the manager that dies is a real `rockbot scripts-manager` process
killed with SIGKILL while a job waits on its pod. No node runs the pods (each asks for more CPU than a node here
has, so none is ever scheduled, even while the rig's node is up): a job stays on its pod until somebody cleans up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rockbot.bus import SCRIPTS_MANAGER, AmqpBus, Delivery
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, ScriptInvokeError, ScriptInvokeRequest
from rockbot.kube import LEASES, PODS, KubeClient
from rockbot.kube.leases import LeaseObserver
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends.pod_manifests import MANAGER_LABEL, REQUEST_LABEL, job_pod, request_key
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.backends.reaping import lease_name
from rockbot.scripts_manager.metrics import ScriptMetrics
from rockbot.scripts_manager.service import STOPPED
from tests.buses import ALICE
from tests.fixtures.rabbitmq import Vhost
from tests.ports import free_port
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.test_over_rabbitmq import _answered_and_drained, _send_collecting_answers
from tests.scripts_manager.test_pods import job
from tests.waiting import eventually

#: More CPU than any node here has: the pods stay Pending (unschedulable), whatever node is up.
UNSCHEDULABLE = {"scripts_cpu": "64", "scripts_max_cpu": "64"}
#: No pod ever runs, so neither does the isolation canary: every probe off (the broker's too).
CANARY_OFF = {"broker": []}
CLI = [str(Path(sys.executable).parent / "rockbot"), "scripts-manager", "--log-format", "text"]


def manager_settings(*, namespace: str, amqp_url: str, pod: str, lease_seconds: int) -> dict[str, Any]:
    return {"scripts_backend": "pods", "scripts_namespace": namespace, "amqp_url": amqp_url, "pod_name": pod,
            "scripts_lease_seconds": lease_seconds, "scripts_isolation_targets": CANARY_OFF, **UNSCHEDULABLE}


@dataclass
class Manager:
    """A `rockbot scripts-manager` process, the port of its health server, and its log."""

    process: asyncio.subprocess.Process
    health_port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.asynccontextmanager
async def manager_process(settings: dict[str, Any], *, kubeconfig: Path, log_format: str = "text"
                          ) -> AsyncIterator[Manager]:  # fmt: skip
    """`rockbot scripts-manager` as a process of its own (SIGKILLed, if still running, on exit), its health server on
    `settings`' `health_port` or a free one; its log (beside `kubeconfig`) is printed when the test fails."""
    port = int(settings.get("health_port") or free_port())
    env = {"PATH": os.environ["PATH"], "KUBECONFIG": str(kubeconfig), "ROCKBOT_HEALTH_HOST": "127.0.0.1",
           "ROCKBOT_HEALTH_PORT": str(port),
           **{f"ROCKBOT_{key.upper()}": str(value) for key, value in settings.items()},
           "ROCKBOT_SCRIPTS_ISOLATION_TARGETS": json.dumps(CANARY_OFF)}
    path = kubeconfig.parent / f"manager-{uuid.uuid4().hex[:6]}.log"
    with path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(*CLI[:-1], log_format, env=env, stdout=log,
                                                       stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    manager = Manager(process=process, health_port=port, log_path=path)
    try:
        yield manager
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        sys.stdout.write(manager.log()[-5000:])


async def pods_of(kube: KubeClient, namespace: str, request: ScriptInvokeRequest) -> list[dict[str, Any]]:
    key = request_key(user=ALICE.user, request_id=request.request_id)
    return (await kube.list(PODS, namespace=namespace, label_selector=f"{REQUEST_LABEL}={key}")).items


async def watch_pods_made(kube: KubeClient, namespace: str, made: set[str]) -> None:
    """Every pod ever seen in `namespace`, by name (until cancelled)."""
    version = None
    while True:
        if version is None:
            listed = await kube.list(PODS, namespace=namespace)
            made.update(pod["metadata"]["name"] for pod in listed.items)
            version = listed.resource_version
        async for event in kube.watch(PODS, namespace=namespace, resource_version=version, timeout_seconds=30):
            made.add(event.object["metadata"]["name"])
            version = event.object["metadata"]["resourceVersion"]


def request(name: str) -> ScriptInvokeRequest:
    return ScriptInvokeRequest(request_id=f"{name}-{uuid.uuid4().hex[:8]}", agent="alice",
                               script="print('never runs: no node takes its pod')", timeout_seconds=30)


async def kill_mid_job_and_answer(
    *, survivor: dict[str, Any], dead: dict[str, Any], kube: KubeClient, namespace: str, vhost: Vhost,
    real_kubeconfig: Path, make_settings: MakeSettings,
) -> tuple[list[Delivery], ScriptsManager, set[str]]:
    """A job waits on the pod of a manager process that is then SIGKILLed, while the `survivor` manager (started
    after the kill) lives: the answers the agent got, the survivor, and every pod ever made in the namespace."""
    asked = request("killed")
    made: set[str] = set()
    alive = ScriptsManager(settings=make_settings(**survivor))
    watching = asyncio.create_task(watch_pods_made(kube, namespace, made))
    try:
        async with await AmqpBus.connect(url=await vhost.url(ALICE)) as agent:
            async with manager_process(dead, kubeconfig=real_kubeconfig) as doomed:
                replies, answers = await _send_collecting_answers(agent, asked)

                async def on_its_pod() -> None:
                    assert await pods_of(kube, namespace, asked), [answer.body for answer in answers]

                await eventually(on_its_pod, within=60)
                doomed.process.kill()
                await doomed.process.wait()
            await alive.start()
            await eventually(lambda: _answered_and_drained(vhost, replies, answers), within=60)

            async def pod_gone() -> None:
                assert await pods_of(kube, namespace, asked) == []

            await eventually(pod_gone)
    except BaseException:
        await alive.stop()
        raise
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    for answer in answers:
        reply = answer.decode(SCRIPT_INVOKE_REPLY)
        assert isinstance(reply, ScriptInvokeError), reply
        assert (reply.request_id, reply.error.code, reply.error.retryable) == (asked.request_id,
                                                                               ErrorCode.UNAVAILABLE, True)
        assert reply.error.message == STOPPED
        assert answer.user_id == SCRIPTS_MANAGER.user  # only the scripts-manager may answer on an agent's queue
    return answers, alive, made


async def test_a_manager_restarted_in_its_pod_cleans_up_after_its_killed_predecessor_at_once(
    vhost: Vhost, make_settings: MakeSettings, real_kube_client: KubeClient, real_kubeconfig: Path,
    kube_namespace: str,
) -> None:
    # The Lease lasts five minutes: only the restarted process knowing its pod's Lease can clean up within the wait.
    common = {"namespace": kube_namespace, "amqp_url": await vhost.url(SCRIPTS_MANAGER), "lease_seconds": 300}
    settings = manager_settings(pod="scripts-manager-7f9c-abcde", **common)
    answers, restarted, made = await kill_mid_job_and_answer(
        survivor=settings, dead=settings, kube=real_kube_client, namespace=kube_namespace, vhost=vhost,
        real_kubeconfig=real_kubeconfig, make_settings=make_settings,
    )
    try:
        assert len(made) == 1, made  # the job's one pod: the redelivered request made no other
        assert 1 <= len(answers) <= 2, answers  # the reaper's answer, and the same for a copy taken after the reap
        assert restarted.metrics.registry.get_sample_value("rockbot_scripts_reaped_pods_total", {"kind": "job"}) == 1
        lease = await real_kube_client.get(LEASES, namespace=kube_namespace,
                                           name=lease_name("scripts-manager-7f9c-abcde"))
        assert lease["spec"]["holderIdentity"] == restarted_instance(restarted)
        assert lease["spec"]["leaseTransitions"] == 1
    finally:
        await restarted.stop()
    # a clean stop leaves no Lease behind
    assert await lease_named(real_kube_client, kube_namespace, lease_name("scripts-manager-7f9c-abcde")) is None


async def test_another_manager_cleans_up_after_a_killed_one_once_its_lease_expires(
    vhost: Vhost, make_settings: MakeSettings, real_kube_client: KubeClient, real_kubeconfig: Path,
    kube_namespace: str,
) -> None:
    common = {"namespace": kube_namespace, "amqp_url": await vhost.url(SCRIPTS_MANAGER), "lease_seconds": 3}
    answers, other, made = await kill_mid_job_and_answer(
        survivor=manager_settings(pod="scripts-manager-2", **common),
        dead=manager_settings(pod="scripts-manager-1", **common),
        kube=real_kube_client, namespace=kube_namespace, vhost=vhost, real_kubeconfig=real_kubeconfig,
        make_settings=make_settings,
    )
    try:
        assert len(made) == 1, made
        assert len(answers) == 1, answers  # the copy the broker redelivered found the pod there and left it be
        assert other.metrics.registry.get_sample_value("rockbot_scripts_reaped_pods_total", {"kind": "job"}) == 1

        async def lease_gone() -> None:  # the dead one's Lease goes once its pods are gone
            assert await lease_named(real_kube_client, kube_namespace, lease_name("scripts-manager-1")) is None

        await eventually(lease_gone)
    finally:
        await other.stop()


def restarted_instance(manager: ScriptsManager) -> str:
    backend = manager._backend
    assert isinstance(backend, PodBackend)
    return backend.reaper.instance


async def lease_named(kube: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    leases = (await kube.list(LEASES, namespace=namespace)).items
    return next((lease for lease in leases if lease["metadata"]["name"] == name), None)


async def test_a_pod_claimed_by_a_live_instance_meanwhile_is_not_reaped_but_one_of_no_lease_is(
    make_settings: MakeSettings, real_kube_client: KubeClient, kube_namespace: str,
) -> None:
    settings = make_settings(scripts_backend="pods", scripts_namespace=kube_namespace, **UNSCHEDULABLE)
    backend = PodBackend(kube=await KubeClient.from_environment(), settings=settings,
                         metrics=ScriptMetrics(backend="pods"))
    seen = await real_kube_client.create(PODS, namespace=kube_namespace, body=job_pod(
        job=job("1"), settings=settings, now=datetime.now(UTC), manager="dead-one"))
    orphaned = await real_kube_client.create(PODS, namespace=kube_namespace, body=job_pod(
        job=job("2"), settings=settings, now=datetime.now(UTC), manager="no-lease"))
    name = seen["metadata"]["name"]
    await real_kube_client.patch(PODS, namespace=kube_namespace, name=name,
                                 body={"metadata": {"labels": {MANAGER_LABEL: backend.reaper.instance}}})
    try:
        assert await backend.reaper.reap_instance("dead-one") == 0
        assert not await backend.reaper._reap(seen, dead="dead-one")  # as listed before the claim: re-read, kept
        assert await backend.sweep() == 1  # `no-lease` has no Lease: reaped; the live instance's kept
        names = {pod["metadata"]["name"] for pod in (await real_kube_client.list(PODS, namespace=kube_namespace)).items}
        assert names == {name}
        assert orphaned["metadata"]["name"] not in names
    finally:
        await backend.close()


def test_a_lease_is_expired_only_once_seen_unchanged_for_its_duration_on_the_observers_clock() -> None:
    now = [1000.0]
    observer = LeaseObserver(clock=lambda: now[0])
    lease = {"metadata": {"name": "a", "resourceVersion": "1"}, "spec": {"leaseDurationSeconds": 15,
                                                                         "renewTime": "1970-01-01T00:00:00.000000Z"}}
    assert not observer.expired(lease)  # first seen: however old its renewTime, it gets a whole duration
    now[0] += 14
    assert not observer.expired(lease)
    now[0] += 2
    assert observer.expired(lease)
    renewed = {**lease, "metadata": {"name": "a", "resourceVersion": "2"}}
    assert not observer.expired(renewed)
    now[0] += 16
    assert observer.expired(renewed)
    observer.keep_only([])
    assert not observer.expired(renewed)  # forgotten (gone from the list): a new first sight
