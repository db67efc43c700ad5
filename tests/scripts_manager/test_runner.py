"""Hostile scripts against the runner as a script pod runs it (issue 13 §4).

The node runs each pod's own command like runc would for a restricted pod: uid 65534 without
capabilities, the runner as PID 1 of its own PID namespace, no network, a read-only root. The
runner gets its job (with the run's nonce) on stdin from the backend's attach session; the scripts
below try to forge its answer, learn the nonce, flood the log and read another job.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from rockbot.kube import KubeClient
from rockbot.scripts_manager.backends import SandboxFailure, ScriptJob
from rockbot.scripts_manager.backends.outputs import OutputBounds
from rockbot.scripts_manager.backends.pod_jobs import output_limit
from rockbot.scripts_manager.backends.pods import PodBackend
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.containers import Container
from tests.kubeapi.kubelet import FakeKubelet, RunningPod, timestamp
from tests.scripts_manager.conftest import MakeSettings, node, pod_backend

CAP = 64 * 1024

FORGE = r"""
import json, os, signal, sys, time
forged = ("\n" + json.dumps({"rockbot_script_result": "x" * 32, "rockbot_script_started": "x" * 32,
          "stdout": "FORGED", "stderr": "", "exit_code": 0, "timed_out": False, "oom_killed": False,
          "output_truncated": False, "duration_seconds": 0.1}) + "\n").encode()
for path in ("/proc/1/fd/1", "/proc/1/fd/2"):
    try:
        os.write(os.open(path, os.O_WRONLY), forged)
        print(path, "written")
    except OSError as exc:
        print(path, exc.strerror)
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL, signal.SIGSTOP):
    try:
        os.kill(1, number)
    except OSError as exc:
        print("kill", number, exc.strerror)
if os.fork() == 0:  # a daemon outside the script's process group, hammering the runner's stdout
    os.setsid()
    if os.fork() == 0:
        os.close(1); os.close(2)
        while True:
            try:
                fd = os.open("/proc/1/fd/1", os.O_WRONLY)
                while True:
                    os.write(fd, forged)
            except OSError:
                time.sleep(0.001)
    os._exit(0)
sys.stdout.buffer.write(forged)
print("honest output")
"""

SNOOP = r"""
import ctypes, os, sys
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
for path in ("/proc/1/environ", "/proc/1/mem", "/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/maps", "/proc/1/cmdline"):
    try:
        with open(path, "rb") as handle:
            print(path, "read", handle.read(1 << 20).decode("latin-1"))
    except OSError as exc:
        print(path, exc.strerror)
libc = ctypes.CDLL(None, use_errno=True)
print("ptrace", libc.ptrace(16, 1, 0, 0), os.strerror(ctypes.get_errno()))
for root, _, files in os.walk("/tmp"):
    for name in files:
        with open(os.path.join(root, name), "rb") as handle:
            print(os.path.join(root, name), handle.read().decode("latin-1"))
print("stdin", sys.stdin.read())
"""

FLOOD = r"""
import os, sys
chunk = b"y" * (1 << 20)
for _ in range(30):
    sys.stdout.buffer.write(chunk)
    sys.stderr.buffer.write(chunk)
    try:
        os.write(os.open("/proc/1/fd/1", os.O_WRONLY), chunk)
    except OSError:
        pass
"""


def job(script: str, *, request_id: str = "hostile", input_data: str | None = None, timeout: float = 10) -> ScriptJob:
    return ScriptJob(request_id=request_id, script=script, input_data=input_data, timeout_seconds=timeout)


@pytest.fixture
async def backend(kube: KubeClient, make_settings: MakeSettings) -> AsyncIterator[PodBackend]:
    async with pod_backend(make_settings(scripts_backend="pods", scripts_max_output_bytes=CAP)) as backend:
        yield backend


async def test_a_script_cannot_write_the_runners_answer(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube):
        result = await backend.run(job(FORGE))
    assert result.exit_code == 0 and result.stdout.endswith("honest output\n"), result
    assert "/proc/1/fd/1 Permission denied" in result.stdout and "/proc/1/fd/2 Permission denied" in result.stdout
    assert '"stdout": "FORGED"' in result.stdout  # its own forged line is just its output


async def test_a_script_cannot_learn_the_nonce_or_read_the_runner(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube) as kubelet:
        result = await backend.run(job(SNOOP, input_data="its own input"))
    (pod,) = kubelet.history.values()
    nonce = json.loads(pod.stdin_received)["nonce"]
    assert nonce not in result.stdout + result.stderr
    for path in ("/proc/1/environ", "/proc/1/mem", "/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/maps"):
        assert f"{path} Permission denied" in result.stdout, path
    assert "ptrace -1 Operation not permitted" in result.stdout
    assert "stdin its own input" in result.stdout


async def test_a_flood_is_cut_at_the_cap_and_never_reaches_the_pods_log(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube) as kubelet:
        result = await backend.run(job(FLOOD))
    (pod,) = kubelet.history.values()
    assert pod.streams is not None
    log = pod.streams.log
    assert result.output_truncated and len(result.stdout) == len(result.stderr) == CAP
    assert len(log) <= output_limit(CAP, OutputBounds())  # the runner's answer at its bounds, nothing of the 90 MB


async def test_a_script_cannot_see_another_job(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    other = "import sys, time\ndata = sys.stdin.read()\ntime.sleep(3)\nprint(len(data))"
    async with node(kube_api, kube):
        quiet = asyncio.create_task(backend.run(job(other, request_id="other", input_data="the-other-jobs-input")))
        await asyncio.sleep(0)  # the other job first, so it holds its input while the snoop runs
        snoop = await backend.run(job(SNOOP, request_id="snoop"))
        await quiet
    assert "the-other-jobs-input" not in snoop.stdout
    pids = json.loads(snoop.stdout.splitlines()[0].removeprefix("pids "))
    assert max(pids) < 10, pids  # its own PID namespace: the runner, the script and what it started


async def test_the_pods_log_is_read_with_a_byte_limit(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async def huge_log_no_answer(kubelet: FakeKubelet, pod: RunningPod) -> None:
        """A container whose log holds far more than a runner writes, and that ends when the job arrives."""
        arrived = asyncio.Event()

        async def job_arrives(data: bytes) -> None:
            arrived.set()

        streams = Container(write_stdin=job_arrives)
        streams.output(1, b"z" * (5 * output_limit(CAP, OutputBounds())))
        kube_api.run_container(namespace=kubelet.namespace, name=pod.name, container="script", streams=streams)
        await kubelet.report(pod, state={"running": {"startedAt": timestamp()}}, phase="Running")
        await arrived.wait()
        streams.exited()
        await kubelet.report(pod, state={"terminated": {"exitCode": 1, "reason": "Error", "startedAt": timestamp(),
                                                        "finishedAt": timestamp()}}, phase="Failed")

    async with node(kube_api, kube, huge_log_no_answer):
        with pytest.raises(SandboxFailure, match="broke its runner's protocol"):
            await backend.run(job("print(1)"))
    logs = [request for request in kube_api.requests if str(request.url.path).endswith("/log")]
    limit = output_limit(CAP, OutputBounds())
    assert logs and all(0 < int(request.params["limitBytes"]) <= limit + 1 for request in logs)
