"""The pod backend against the Kubernetes API emulator; the test plays the kubelet.

The fake kubelet runs the real runner from the pod's ConfigMap as a subprocess (so the framed
result is the runner's own), serves its output as the pod log and moves the pod through its
phases; other behaviours play OOM kills, deadlines and images that cannot be pulled.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from agent.sandbox import ScriptSandbox
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeResponse
from rockbot.kube import CONFIGMAPS, NAMESPACES, PODS, KubeClient, NotFound
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable, ScriptJob
from rockbot.scripts_manager.backends.pod_manifests import (
    DEADLINE_SLACK_SECONDS,
    SANDBOX_LABELS,
    SANDBOX_SELECTOR,
    build_pod,
)
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.metrics import ScriptMetrics
from tests.buses import manager_and_agent
from tests.kubeapi import KubeApiEmulator
from tests.pod_security import restricted_violations
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually

NS = "rockbot-scripts"
Behaviour = Callable[["FakeKubelet", dict[str, Any], dict[str, str]], Awaitable[None]]


def job(script: str, *, timeout: float = 10.0, input_data: str | None = None) -> ScriptJob:
    return ScriptJob(request_id="call-7", script=script, input_data=input_data, timeout_seconds=timeout)


class FakeKubelet:
    """Watches script pods; for each one, waits for its ConfigMap and applies `behaviour`."""

    def __init__(self, *, emulator: KubeApiEmulator, kube: KubeClient, behaviour: Behaviour) -> None:
        self.emulator = emulator
        self.kube = kube
        self.behaviour = behaviour
        self.seen: list[dict[str, Any]] = []
        self._pods: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """List, then watch from the list's version, like an informer: a pod created before the
        list is in it, one created after is an event, and a watch that ends is listed again."""
        while True:
            listed = await self.kube.list(PODS, namespace=NS)
            for pod in listed.items:
                self._admit(pod)
            async for event in self.kube.watch(PODS, namespace=NS, resource_version=listed.resource_version):
                if event.type == "ADDED":
                    self._admit(event.object)

    def _admit(self, pod: dict[str, Any]) -> None:
        if any(known["metadata"]["uid"] == pod["metadata"]["uid"] for known in self.seen):
            return
        self.seen.append(pod)
        task = asyncio.create_task(self._start(pod))
        self._pods.add(task)
        task.add_done_callback(self._pods.discard)

    async def _start(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]

        async def config_map() -> dict[str, Any]:
            return await self.kube.get(CONFIGMAPS, namespace=NS, name=name)

        data = (await eventually(config_map))["data"]
        await self.behaviour(self, pod, data)

    async def set_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        with contextlib.suppress(NotFound):
            await self.kube.patch(PODS, namespace=NS, name=pod["metadata"]["name"], subresource="status",
                                  body={"status": status})

    async def running(self, pod: dict[str, Any]) -> None:
        await self.set_status(pod, {"phase": "Running", "containerStatuses": [
            {"name": "script", "state": {"running": {"startedAt": _now()}}}]})

    async def terminated(self, pod: dict[str, Any], *, exit_code: int, reason: str, phase: str,
                         pod_reason: str | None = None) -> None:
        status: dict[str, Any] = {"phase": phase, "containerStatuses": [{"name": "script", "state": {"terminated": {
            "exitCode": exit_code, "reason": reason, "startedAt": _now(), "finishedAt": _now()}}}]}
        if pod_reason:
            status["reason"] = pod_reason
        await self.set_status(pod, status)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def run_runner(kubelet: FakeKubelet, pod: dict[str, Any], data: dict[str, str]) -> None:
    """Run the pod's command for real: the runner from the ConfigMap, on the ConfigMap's files."""
    await kubelet.running(pod)
    with tempfile.TemporaryDirectory() as job_dir:
        await asyncio.to_thread(_write_files, job_dir, data)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", f"{job_dir}/runner.py", job_dir, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await process.communicate()
    kubelet.emulator.set_pod_log(namespace=NS, name=pod["metadata"]["name"], text=out.decode())
    await kubelet.terminated(pod, exit_code=0, reason="Completed", phase="Succeeded")


def _write_files(directory: str, data: dict[str, str]) -> None:
    for key, value in data.items():
        Path(directory, key).write_text(value)


async def oom_killed(kubelet: FakeKubelet, pod: dict[str, Any], data: dict[str, str]) -> None:
    await kubelet.running(pod)
    kubelet.emulator.set_pod_log(namespace=NS, name=pod["metadata"]["name"], text="")
    await kubelet.terminated(pod, exit_code=137, reason="OOMKilled", phase="Failed")


async def deadline_exceeded(kubelet: FakeKubelet, pod: dict[str, Any], data: dict[str, str]) -> None:
    await kubelet.running(pod)
    kubelet.emulator.set_pod_log(namespace=NS, name=pod["metadata"]["name"], text="")
    await kubelet.terminated(pod, exit_code=137, reason="Error", phase="Failed", pod_reason="DeadlineExceeded")


async def deadline_before_start(kubelet: FakeKubelet, pod: dict[str, Any], data: dict[str, str]) -> None:
    """A cold image pull outlasts the pod's deadline: the container never ran."""
    await kubelet.set_status(pod, {"phase": "Failed", "reason": "DeadlineExceeded", "containerStatuses": [
        {"name": "script", "state": {"waiting": {"reason": "ContainerCreating"}}}]})


async def image_pull_fails(kubelet: FakeKubelet, pod: dict[str, Any], data: dict[str, str]) -> None:
    await kubelet.set_status(pod, {"phase": "Pending", "containerStatuses": [{"name": "script", "state": {
        "waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope:1\""}}}]})


async def never_starts(kubelet: FakeKubelet, pod: dict[str, Any], data: dict[str, str]) -> None:
    return None


@pytest.fixture
async def kube(kube_api: KubeApiEmulator, kubeconfig: Path) -> AsyncIterator[KubeClient]:
    async with await KubeClient.from_environment() as client:
        await client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
        yield client


@contextlib.asynccontextmanager
async def kubelet_playing(
    behaviour: Behaviour, *, emulator: KubeApiEmulator, kube: KubeClient
) -> AsyncIterator[FakeKubelet]:
    kubelet = FakeKubelet(emulator=emulator, kube=kube, behaviour=behaviour)
    task = asyncio.create_task(kubelet.run())
    try:
        yield kubelet
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def backend(kube: KubeClient, make_settings: MakeSettings) -> AsyncIterator[PodBackend]:
    settings = make_settings(scripts_backend="pods", scripts_runtime_class="gvisor", scripts_sweep_grace_seconds=30)
    backend = PodBackend(kube=await KubeClient.from_environment(), settings=settings,
                         metrics=ScriptMetrics(backend="pods"))
    yield backend
    await backend.close()


async def nothing_left(kube: KubeClient) -> None:
    async def empty() -> None:
        for resource in (PODS, CONFIGMAPS):
            names = [o["metadata"]["name"] for o in (await kube.list(resource, namespace=NS)).items]
            assert [n for n in names if n.startswith("rockbot-script-")] == [], (resource.kind, names)

    await eventually(empty)


def test_script_pod_passes_pod_security_restricted_and_is_locked_down(make_settings: MakeSettings) -> None:
    settings = make_settings(scripts_runtime_class="gvisor", scripts_image="python:3.12-slim")
    pod = build_pod(job=job("print(1)", timeout=42), name="rockbot-script-x", settings=settings, now=datetime.now(UTC))
    assert restricted_violations(pod) == []
    spec = pod["spec"]
    assert (spec["automountServiceAccountToken"], spec["enableServiceLinks"], spec["restartPolicy"]) == (
        False, False, "Never")
    assert spec["runtimeClassName"] == "gvisor"
    assert spec["activeDeadlineSeconds"] >= 42 and spec["terminationGracePeriodSeconds"] <= 2
    container = spec["containers"][0]
    assert container["resources"]["requests"] == container["resources"]["limits"] == {
        "cpu": "500m", "memory": "256Mi", "ephemeral-storage": "128Mi"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "env" not in container and all("print" not in part for part in container["command"])
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    assert pod["metadata"]["labels"] == SANDBOX_LABELS


def test_restricted_check_catches_what_the_standard_forbids(make_settings: MakeSettings) -> None:
    pod = build_pod(job=job("print(1)"), name="rockbot-script-x", settings=make_settings(), now=datetime.now(UTC))
    loose = copy.deepcopy(pod)
    container = loose["spec"]["containers"][0]
    container["securityContext"]["capabilities"] = {"add": ["NET_RAW"]}
    container["securityContext"]["allowPrivilegeEscalation"] = True
    loose["spec"]["hostNetwork"] = True
    loose["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    del loose["spec"]["securityContext"]["seccompProfile"]
    del container["securityContext"]["seccompProfile"]
    problems = " | ".join(restricted_violations(loose))
    for fragment in ("hostNetwork", "hostPath", "allowPrivilegeEscalation", "drop must include ALL",
                     "seccompProfile", "NET_RAW"):
        assert fragment in problems


async def test_script_runs_in_a_pod_with_streams_apart_and_everything_is_deleted(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with kubelet_playing(run_runner, emulator=kube_api, kube=kube) as kubelet:
        result = await backend.run(job(
            "import sys\nprint('out', sys.stdin.read())\nprint('err', file=sys.stderr)\nsys.exit(3)", input_data="in"
        ))
    assert (result.stdout, result.stderr, result.exit_code, result.timed_out) == ("out in\n", "err\n", 3, False)
    pod = kubelet.seen[0]
    assert restricted_violations(pod) == []
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == pod["metadata"]["name"]
    # Completion came from a watch on the pod's name, not from re-reading the pod.
    name = pod["metadata"]["name"]
    gets = [r for r in kube_api.requests if str(r.method.value).upper() == "GET" and str(r.url.path).endswith(
        f"/pods/{name}")]
    watches = [r for r in kube_api.requests if r.params.get("fieldSelector") == f"metadata.name={name}"]
    assert gets == [] and watches
    await nothing_left(kube)


async def test_the_runner_enforces_the_timeout_and_keeps_what_was_printed(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with kubelet_playing(run_runner, emulator=kube_api, kube=kube):
        result = await backend.run(job("import time\nprint('begun', flush=True)\ntime.sleep(30)", timeout=1))
    assert (result.timed_out, result.exit_code, result.stdout) == (True, None, "begun\n")
    await nothing_left(kube)


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [(oom_killed, {"oom_killed": True, "timed_out": False, "exit_code": 137}),
     (deadline_exceeded, {"oom_killed": False, "timed_out": True, "exit_code": None})],
)
async def test_oom_kill_and_deadline_are_reported_as_such(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator, behaviour: Behaviour, expected: dict
) -> None:
    async with kubelet_playing(behaviour, emulator=kube_api, kube=kube):
        result = await backend.run(job("x = bytearray(10**10)"))
    assert {key: getattr(result, key) for key in expected} == expected
    await nothing_left(kube)


async def test_a_deadline_reached_before_the_script_started_is_unavailable_not_a_timeout(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with kubelet_playing(deadline_before_start, emulator=kube_api, kube=kube):
        with pytest.raises(SandboxUnavailable, match="before the script started"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


def test_the_pods_deadline_leaves_room_for_start_up_before_the_timeout(make_settings: MakeSettings) -> None:
    settings = make_settings(scripts_pod_start_seconds=120)
    pod = build_pod(job=job("print(1)", timeout=42), name="rockbot-script-x", settings=settings, now=datetime.now(UTC))
    assert pod["spec"]["activeDeadlineSeconds"] == 120 + 42 + DEADLINE_SLACK_SECONDS


async def test_an_image_that_cannot_be_pulled_fails_the_run_and_cleans_up(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with kubelet_playing(image_pull_fails, emulator=kube_api, kube=kube):
        with pytest.raises(SandboxFailure, match="ImagePullBackOff"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


@pytest.mark.parametrize("code", [429, 500, 503])
async def test_a_throttled_or_failing_api_after_the_pod_exists_is_retryable_and_cleans_up(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator, code: int
) -> None:
    kube_api.fail(method="POST", path_suffix="/configmaps", code=code)
    async with kubelet_playing(never_starts, emulator=kube_api, kube=kube):
        with pytest.raises(SandboxUnavailable, match="overloaded or failing"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


async def test_a_conflict_after_the_pod_exists_is_a_failure_not_a_retry(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    kube_api.fail(method="POST", path_suffix="/configmaps", code=409)
    async with kubelet_playing(never_starts, emulator=kube_api, kube=kube):
        with pytest.raises(SandboxFailure, match="refused a step"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


async def test_cancelling_a_run_deletes_its_pod(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with kubelet_playing(never_starts, emulator=kube_api, kube=kube) as kubelet:
        run = asyncio.create_task(backend.run(job("print(1)")))

        async def pod_exists() -> None:
            assert kubelet.seen

        await eventually(pod_exists)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    await nothing_left(kube)


async def test_sweeper_reaps_orphans_past_their_deadline_and_keeps_live_ones(
    backend: PodBackend, kube: KubeClient, make_settings: MakeSettings
) -> None:
    settings = make_settings()
    now = datetime.now(UTC)
    old = build_pod(job=job("1"), name="rockbot-script-old", settings=settings, now=now - timedelta(hours=1))
    live = build_pod(job=job("1"), name="rockbot-script-live", settings=settings, now=now)
    for pod in (old, live):
        await kube.create(PODS, namespace=NS, body=pod)
    orphan_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "rockbot-script-lost", "labels": dict(SANDBOX_LABELS),
        "annotations": {"rockbot.dev/deadline": (now - timedelta(hours=1)).isoformat()}}, "data": {}}
    await kube.create(CONFIGMAPS, namespace=NS, body=orphan_map)
    unrelated = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-else"}, "data": {}}
    await kube.create(CONFIGMAPS, namespace=NS, body=unrelated)

    assert await backend.sweep() == 2
    pods = [p["metadata"]["name"] for p in (await kube.list(PODS, namespace=NS, label_selector=SANDBOX_SELECTOR)).items]
    maps = [c["metadata"]["name"] for c in (await kube.list(CONFIGMAPS, namespace=NS)).items]
    assert pods == ["rockbot-script-live"]
    assert "rockbot-script-lost" not in maps and "someone-else" in maps


async def test_the_manager_with_the_pod_backend_answers_an_agent(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with manager_and_agent() as (manager_bus, bus), kubelet_playing(run_runner, emulator=kube_api, kube=kube):
        manager = ScriptsManager(settings=make_settings(scripts_backend="pods"), bus=manager_bus)
        await manager.start()
        try:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", reply_grace_seconds=30)
            ok = await sandbox.execute_python_script(script="print(2 ** 10)")
            refused = await sandbox.execute_python_script(script="print(1)", pip_packages=["numpy"])
        finally:
            await manager.stop()
    assert isinstance(ok, ScriptInvokeResponse) and ok.stdout == "1024\n", ok
    assert isinstance(refused, ScriptInvokeError) and refused.error.code == ErrorCode.REJECTED
    await nothing_left(kube)


async def test_a_missing_scripts_namespace_is_a_retryable_unavailable_for_the_agent(
    kube_api: KubeApiEmulator, kubeconfig: Path, make_settings: MakeSettings
) -> None:
    async with manager_and_agent() as (manager_bus, bus):
        manager = ScriptsManager(
            settings=make_settings(scripts_backend="pods", scripts_namespace="nowhere"), bus=manager_bus
        )
        await manager.start()
        try:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", reply_grace_seconds=30)
            result = await sandbox.execute_python_script(
                script="print(1)"
            )
        finally:
            await manager.stop()
    assert isinstance(result, ScriptInvokeError), result
    assert (result.error.code, result.error.retryable) == (ErrorCode.UNAVAILABLE, True)
    assert "cannot create the script pod in 'nowhere'" in result.error.message
