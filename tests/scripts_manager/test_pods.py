"""The pod backend's cold path against the Kubernetes API emulator, with a node running the pods.

The node (tests/kubeapi/kubelet.py) runs each pod's own command, the real runner, the way a
restricted pod runs it; other behaviours play OOM kills, deadlines and images that cannot be pulled.
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from agent.sandbox import ScriptSandbox
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.scripts import ScriptInvokeError, ScriptInvokeResponse
from rockbot.kube import PODS, KubeClient
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable, ScriptJob
from rockbot.scripts_manager.backends.pod_manifests import (
    DEADLINE_SLACK_SECONDS,
    SANDBOX_SELECTOR,
    job_pod,
)
from rockbot.scripts_manager.backends.pods import PodBackend
from tests.buses import manager_and_agent
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.kubelet import FakeKubelet, RunningPod, timestamp
from tests.scripts_manager.conftest import NS, MakeSettings, node, pod_backend
from tests.waiting import eventually


def job(script: str, *, timeout: float = 10.0, input_data: str | None = None) -> ScriptJob:
    return ScriptJob(request_id="call-7", script=script, input_data=input_data, timeout_seconds=timeout)


async def oom_killed(kubelet: FakeKubelet, pod: RunningPod) -> None:
    await kubelet.report(pod, state={"running": {"startedAt": timestamp()}}, phase="Running")
    await kubelet.report(pod, state={"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": timestamp(),
                                                    "finishedAt": timestamp()}}, phase="Failed")


async def deadline_before_start(kubelet: FakeKubelet, pod: RunningPod) -> None:
    """A cold image pull outlasts the pod's deadline: the container never ran."""
    await kubelet.report(pod, state={"waiting": {"reason": "ContainerCreating"}}, phase="Failed",
                         reason="DeadlineExceeded")


async def image_pull_fails(kubelet: FakeKubelet, pod: RunningPod) -> None:
    await kubelet.report(pod, state={"waiting": {"reason": "ImagePullBackOff",
                                                 "message": 'Back-off pulling image "nope:1"'}})


async def never_starts(kubelet: FakeKubelet, pod: RunningPod) -> None:
    return None


@pytest.fixture
async def backend(kube: KubeClient, make_settings: MakeSettings) -> PodBackend:
    settings = make_settings(scripts_backend="pods", scripts_runtime_class="gvisor", scripts_sweep_grace_seconds=30)
    async with pod_backend(settings) as backend:
        yield backend


async def nothing_left(kube: KubeClient) -> None:
    async def empty() -> None:
        assert (await kube.list(PODS, namespace=NS, label_selector=SANDBOX_SELECTOR)).items == []

    await eventually(empty)


def test_script_pod_passes_pod_security_restricted_and_carries_no_job(
    make_settings: MakeSettings, restricted_violations
) -> None:
    settings = make_settings(scripts_runtime_class="gvisor", scripts_image="python:3.12-slim")
    pod = job_pod(job=job("print('the-script-itself')", timeout=42, input_data="the-input-itself"), settings=settings,
                  now=datetime.now(UTC), manager="m1")
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
    assert (container["stdin"], container["stdinOnce"]) == (True, True) and "env" not in container
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
                               {"name": "input", "emptyDir": {"sizeLimit": "64Mi"}},  # the conversation's files
                               {"name": "output", "emptyDir": {"sizeLimit": "64Mi"}}]  # what the script gives back
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}, {"name": "input", "mountPath": "/input"},
                                         {"name": "output", "mountPath": "/output"}]
    assert "the-script-itself" not in str(pod) and "the-input-itself" not in str(pod)  # over stdin, never to etcd


def test_restricted_admission_refuses_a_script_pod_loosened(make_settings: MakeSettings, restricted_violations) -> None:
    pod = job_pod(job=job("print(1)"), settings=make_settings(), now=datetime.now(UTC), manager="m1")
    loose = copy.deepcopy(pod)
    container = loose["spec"]["containers"][0]
    container["securityContext"]["capabilities"] = {"add": ["NET_RAW"]}
    container["securityContext"]["allowPrivilegeEscalation"] = True
    loose["spec"]["hostNetwork"] = True
    loose["spec"]["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    del loose["spec"]["securityContext"]["seccompProfile"]
    del container["securityContext"]["seccompProfile"]
    problems = " | ".join(restricted_violations(loose))
    for fragment in ("hostNetwork", "hostPath", "allowPrivilegeEscalation", 'capabilities.drop=["ALL"]',
                     "seccompProfile", "NET_RAW"):
        assert fragment in problems


async def test_script_runs_in_a_pod_with_streams_apart_and_the_answer_comes_from_the_attach_stream(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator, restricted_violations
) -> None:
    async with node(kube_api, kube) as kubelet:
        result = await backend.run(job(
            "import sys\nprint('out', sys.stdin.read())\nprint('err', file=sys.stderr)\nsys.exit(3)", input_data="in"
        ))
    assert (result.stdout, result.stderr, result.exit_code, result.timed_out) == ("out in\n", "err\n", 3, False)
    (pod,) = kubelet.seen
    assert restricted_violations(pod) == []
    name = pod["metadata"]["name"]
    attaches = [r for r in kube_api.requests if str(r.url.path).endswith(f"/pods/{name}/attach")]
    logs = [r for r in kube_api.requests if str(r.url.path).endswith("/log")]
    # The answer came on the stream, never re-read from the log: a log is read only after an attach tried
    # before the container ran (to be sure its runner never got the job), never after the one that worked.
    assert attaches and len(logs) <= len(attaches) - 1
    await nothing_left(kube)


async def test_a_script_runs_as_its_own_main_module_as_python_script_py_would(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The script's interpreter was started before its job (runner.py): nothing of that shows to the script."""
    script = ("import os, sys\n"
              "print(__name__, os.path.basename(sys.argv[0]), sys.path[0] == os.path.dirname(__file__), __spec__)\n"
              "print(sorted(name for name in globals() if not name.startswith('__')), sys.stdin.read())\n"
              "def fail():\n    1 / 0\n"
              "fail()\n")
    async with node(kube_api, kube):
        result = await backend.run(job(script, input_data="its input"))
    assert result.stdout == "__main__ script.py True None\n['os', 'sys'] its input\n"
    assert result.exit_code == 1
    frames = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("File ")]
    assert len(frames) == 2 and all(frame.startswith('File "/tmp/') and "script.py" in frame for frame in frames)
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


async def test_the_answer_does_not_wait_for_the_kubelet_to_report_the_container_ended(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The kubelet reports container states on its relist; here it reports only when the test says."""
    async with node(kube_api, kube, relist_seconds=float("inf")) as kubelet:
        run = asyncio.create_task(backend.run(job("print(6 * 7)")))

        async def created() -> None:
            assert kubelet.pods and "running" in next(iter(kubelet.pods.values())).state

        await eventually(created)
        kubelet.relist()  # the one relist: the container is running
        result = await run
        (pod,) = kubelet.seen
    assert result.stdout == "42\n"
    statuses = [r for r in kube_api.requests if str(r.url.path).endswith(f"/pods/{pod['metadata']['name']}/status")]
    assert all("terminated" not in r.text for r in statuses)  # answered before any report of the end


async def test_a_stream_broken_mid_run_is_answered_from_the_pods_log_and_the_script_runs_once(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube) as kubelet:
        script = "import time\nprint('begun', flush=True)\ntime.sleep(1)\nprint('done')"
        run = asyncio.create_task(backend.run(job(script)))

        async def started() -> None:
            pods = list(kubelet.history.values())
            assert len(pods) == 1 and pods[0].streams is not None and b"rockbot_script_started" in pods[0].streams.log

        await eventually(started)
        kube_api.end_watches()  # the API server restarts: every stream drops, the attach session too
        result = await run
    assert (result.stdout, result.exit_code) == ("begun\ndone\n", 0)
    assert [pod.stdin_received.count(b"\n") for pod in kubelet.history.values()] == [1]


async def test_the_runner_enforces_the_timeout_and_keeps_what_was_printed(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube):
        result = await backend.run(job("import time\nprint('begun', flush=True)\ntime.sleep(30)", timeout=1))
    assert (result.timed_out, result.exit_code, result.stdout) == (True, None, "begun\n")
    await nothing_left(kube)


async def test_an_oom_kill_of_the_whole_container_is_reported_as_such(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube, oom_killed):
        result = await backend.run(job("x = bytearray(10**10)"))
    assert (result.oom_killed, result.timed_out, result.exit_code) == (True, False, 137)
    await nothing_left(kube)


async def test_a_deadline_reached_before_the_script_started_is_unavailable_not_a_timeout(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube, deadline_before_start):
        with pytest.raises(SandboxUnavailable, match="before the script started"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


def test_the_pods_deadline_leaves_room_for_start_up_before_the_timeout(make_settings: MakeSettings) -> None:
    settings = make_settings(scripts_pod_start_seconds=120)
    pod = job_pod(job=job("print(1)", timeout=42), settings=settings, now=datetime.now(UTC), manager="m1")
    assert pod["spec"]["activeDeadlineSeconds"] == 120 + 42 + DEADLINE_SLACK_SECONDS


async def test_an_image_that_cannot_be_pulled_fails_the_run_and_cleans_up(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube, image_pull_fails):
        with pytest.raises(SandboxFailure, match="ImagePullBackOff"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


@pytest.mark.parametrize("code", [429, 500, 503])
async def test_a_throttled_or_failing_api_after_the_pod_runs_is_retryable_and_cleans_up(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator, code: int
) -> None:
    kube_api.fail(method="GET", path_suffix="/attach", code=code, times=1000)
    async with node(kube_api, kube):
        with pytest.raises(SandboxUnavailable, match="overloaded or failing"):
            await backend.run(job("print(1)"))
    await nothing_left(kube)


async def test_a_job_reaches_its_pod_before_the_kubelet_reports_it_running_and_runs_once(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The kubelet reports a container running on its relist, up to a second late, and refuses an attach
    until it runs (500 on a real node): refused attaches wrote nothing, and are tried again."""
    kube_api.fail(method="GET", path_suffix="/attach", code=500, times=2)
    async with node(kube_api, kube, relist_seconds=math.inf) as kubelet:  # no report that it runs, ever
        result = await backend.run(job("print(6 * 7)"))
    assert result.stdout == "42\n"
    (pod,) = kubelet.history.values()
    assert pod.stdin_received.count(b"\n") == 1
    await nothing_left(kube)


async def test_a_pod_deleted_by_someone_else_while_starting_is_a_failure_not_a_retry(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube, never_starts) as kubelet:
        run = asyncio.create_task(backend.run(job("print(1)")))
        await eventually(lambda: _one(kubelet))
        await kube.delete(PODS, namespace=NS, name=kubelet.seen[0]["metadata"]["name"], grace_period_seconds=0)
        with pytest.raises(SandboxFailure, match="was deleted"):
            await run
    await nothing_left(kube)


async def _one(kubelet: FakeKubelet) -> None:
    assert kubelet.seen


async def test_cancelling_a_run_deletes_its_pod(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube, never_starts) as kubelet:
        run = asyncio.create_task(backend.run(job("print(1)")))
        await eventually(lambda: _one(kubelet))
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
    await nothing_left(kube)


async def test_sweeper_reaps_pods_past_their_deadline_and_keeps_live_ones(
    backend: PodBackend, kube: KubeClient, make_settings: MakeSettings
) -> None:
    settings = make_settings()
    now = datetime.now(UTC)
    manager = backend.reaper.instance  # a live one: its pods are swept by their deadline alone
    old = job_pod(job=job("1"), settings=settings, now=now - timedelta(hours=1), manager=manager)
    live = job_pod(job=job("1"), settings=settings, now=now, manager=manager)
    unrelated = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "someone-else", "annotations": {
        "rockbot.dev/deadline": old["metadata"]["annotations"]["rockbot.dev/deadline"]}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    for pod in (old, live, unrelated):
        await kube.create(PODS, namespace=NS, body=pod)

    await backend.sweep()  # (it also sweeps by itself on start)
    names = [p["metadata"]["name"] for p in (await kube.list(PODS, namespace=NS)).items]
    assert sorted(names) == sorted([live["metadata"]["name"], "someone-else"])


async def test_the_manager_with_the_pod_backend_answers_an_agent(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with manager_and_agent() as (manager_bus, bus), node(kube_api, kube) as kubelet:
        manager = ScriptsManager(settings=make_settings(scripts_backend="pods"), bus=manager_bus)
        await manager.start()
        try:
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=30)
            ok = await sandbox.execute_python_script(script="print(2 ** 10)")
            refused = await sandbox.execute_python_script(script="print(1)", pip_packages=["numpy"])
        finally:
            await manager.stop()
    assert isinstance(ok, ScriptInvokeResponse) and ok.stdout == "1024\n", ok
    assert ok.backend == "pods" and json.loads(kubelet.history[ok.pod].stdin_received)["script"] == "print(2 ** 10)"
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
            sandbox = ScriptSandbox(bus=bus, namespace="default", agent="alice", start_ceiling_seconds=30)
            result = await sandbox.execute_python_script(script="print(1)")
        finally:
            await manager.stop()
    assert isinstance(result, ScriptInvokeError), result
    assert (result.error.code, result.error.retryable) == (ErrorCode.UNAVAILABLE, True)
    assert "cannot take its Lease in the scripts namespace 'nowhere'" in result.error.message
    assert 'namespaces "nowhere" not found' in result.error.message
