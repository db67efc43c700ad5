"""The warm pool (issue 9) against the API emulator, with a node running the pods for real.

Two managers are two pod backends with their own clients, as two replicas would be.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rockbot.kube import PODS, Conflict, Invalid, KubeClient
from rockbot.scripts_manager.backends import SandboxFailure, ScriptJob
from rockbot.scripts_manager.backends import pool as pool_module
from rockbot.scripts_manager.backends.pod_manifests import (
    CLAIMED,
    DEADLINE_SLACK_SECONDS,
    IDLE,
    MANAGER_LABEL,
    POOL_SELECTOR,
    STATE_LABEL,
    claim_patch,
    now_utc,
    pool_pod,
)
from rockbot.scripts_manager.backends.pods import PodBackend
from rockbot.scripts_manager.runner import PRELUDE
from rockbot.scripts_manager.settings import PoolClass, ScriptsManagerSettings
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.kubelet import FakeKubelet, RunningPod
from tests.scripts_manager.conftest import NS, MakeSettings, node, pod_backend
from tests.waiting import eventually

DEFAULT_CLASS = "500m/256Mi"


def job(script: str = "print(6 * 7)", *, request_id: str = "call-1", timeout: float = 10, **limits: str) -> ScriptJob:
    return ScriptJob(request_id=request_id, script=script, input_data=None, timeout_seconds=timeout, **limits)


def pooled(make_settings: MakeSettings, size: int, **overrides: Any) -> ScriptsManagerSettings:
    return make_settings(scripts_backend="pods", scripts_pool=f"{DEFAULT_CLASS}={size}", **overrides)


async def idle_pods(kube: KubeClient, *, owner: str | None = None, ready: bool = True) -> list[dict[str, Any]]:
    pods = (await kube.list(PODS, namespace=NS, label_selector=f"{POOL_SELECTOR},{STATE_LABEL}={IDLE}")).items
    return [pod for pod in pods
            if (owner is None or pod["metadata"]["labels"][MANAGER_LABEL] == owner)
            and (not ready or (pod.get("status") or {}).get("phase") == "Running")
            and not pod["metadata"].get("deletionTimestamp")]


async def pool_full(kube: KubeClient, backend: PodBackend, size: int) -> None:
    async def full() -> None:
        assert backend.pool is not None
        assert len(await idle_pods(kube, owner=backend.pool.owner)) == size

    await eventually(full)


async def the_idle_pod(kube: KubeClient, backend: PodBackend) -> str:
    """The name of the one idle pod of a pool of 1, once it runs."""
    await pool_full(kube, backend, 1)
    (idle,) = await idle_pods(kube)
    return idle["metadata"]["name"]


async def gone(kube: KubeClient, name: str) -> None:
    async def deleted() -> None:
        assert name not in {pod["metadata"]["name"] for pod in (await kube.list(PODS, namespace=NS)).items}

    await eventually(deleted)


def sample(backend: PodBackend, name: str, **labels: str) -> float:
    return backend.metrics.registry.get_sample_value(name, labels) or 0.0


def jobs_run_by(kubelet: FakeKubelet) -> dict[str, int]:
    """How many job lines each pod's runner was given (a pod must never get two; blank lines are keepalives)."""
    return {name: sum(1 for line in pod.stdin_received.split(b"\n")[:-1] if line)
            for name, pod in kubelet.history.items()}


@pytest.fixture
async def one_warm(kube: KubeClient, make_settings: MakeSettings) -> AsyncIterator[PodBackend]:
    async with pod_backend(pooled(make_settings, 1)) as backend:
        yield backend


def test_a_warm_pod_is_as_locked_down_as_any_script_pod(make_settings: MakeSettings, restricted_violations) -> None:
    settings = pooled(make_settings, 1)
    pod = pool_pod(pool=settings.scripts_pool[0], owner="m1", settings=settings, now=datetime.now(UTC))
    assert restricted_violations(pod) == []
    spec = pod["spec"]
    container = spec["containers"][0]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert spec["automountServiceAccountToken"] is False and spec["activeDeadlineSeconds"] == 3600
    assert pod["metadata"]["labels"]["rockbot.dev/sandbox"] == "script"  # the default-deny NetworkPolicy's


def test_pool_classes_parse_and_must_fit_the_maximums(make_settings: MakeSettings) -> None:
    settings = make_settings(scripts_pool="500m/256Mi=2, 0.25/128Mi=1")
    assert settings.scripts_pool == [PoolClass(cpu="500m", memory="256Mi", size=2),
                                     PoolClass(cpu="0.25", memory="128Mi", size=1)]
    assert settings.scripts_pool[1].fits(cpu="250m", memory="134217728")
    with pytest.raises(ValueError, match="is not CPU/MEMORY=SIZE"):
        make_settings(scripts_pool="500m=2")
    with pytest.raises(ValueError, match="no job could use it"):
        make_settings(scripts_pool="4/256Mi=1")


async def test_a_job_runs_on_a_warm_pod_whose_deadline_is_lowered_and_which_is_replaced(
    one_warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube) as kubelet:
        await pool_full(kube, one_warm, 1)
        (warm,) = await idle_pods(kube)
        result = await one_warm.run(job(timeout=5))
        other_class = await one_warm.run(job(request_id="call-2", memory="128Mi"))
        await pool_full(kube, one_warm, 1)  # a new idle pod replaces the claimed one
    assert result.stdout == other_class.stdout == "42\n"
    used = kubelet.history[warm["metadata"]["name"]]
    assert (result.backend, result.pod) == ("pods", used.name)  # the answer names the pod it ran in
    assert json.loads(used.stdin_received)["script"] == "print(6 * 7)"
    assert used.pod["spec"]["activeDeadlineSeconds"] <= 5 + DEADLINE_SLACK_SECONDS + 5  # lowered from 3600
    assert used.name not in {pod["metadata"]["name"] for pod in (await kube.list(PODS, namespace=NS)).items}
    assert sample(one_warm, "rockbot_scripts_pool_claims_total", limits_class=one_warm.pool.classes[0].label) == 1
    assert sample(one_warm, "rockbot_scripts_pod_time_to_first_instruction_seconds_count", path="warm") == 1
    assert sample(one_warm, "rockbot_scripts_pod_run_duration_seconds_count", path="cold") == 1  # 128Mi: no pool


async def test_two_managers_never_share_a_pod_each_runs_jobs_only_on_pods_it_keeps(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with node(kube_api, kube) as kubelet, pod_backend(pooled(make_settings, 1)) as first:
        await pool_full(kube, first, 1)
        async with pod_backend(pooled(make_settings, 1)) as second:
            assert first.pool is not None and second.pool is not None
            await second.pool.cache.synced.wait()  # it sees the first one's idle pod; its own is still starting
            managers = (first, second, first, second)
            results = await asyncio.gather(*(manager.run(job(request_id=f"call-{i}"))
                                             for i, manager in enumerate(managers)))
            owners = [manager.pool.owner for manager in managers if manager.pool is not None]
    assert [result.stdout for result in results] == ["42\n"] * 4
    assert max(jobs_run_by(kubelet).values()) == 1
    ran_on = [kubelet.history[result.pod].pod["metadata"]["labels"][MANAGER_LABEL] for result in results]
    assert ran_on == owners  # each job in a pod its own manager made, warm or cold
    assert sample(first, "rockbot_scripts_pool_claims_total", limits_class=first.pool.classes[0].label) >= 1


async def test_a_job_is_written_to_its_warm_pod_before_the_api_hears_of_the_claim_which_lands_beside_it(
    one_warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator, caplog: pytest.LogCaptureFixture
) -> None:
    """Taking an idle pod writes nothing to the API first; a job arriving meanwhile never takes the same pod, and a
    mark the API does not answer, or refuses, fails no job."""
    async with node(kube_api, kube) as kubelet:
        name = await the_idle_pod(kube, one_warm)
        kube_api.hang(method="PATCH", path_suffix=f"/pods/{name}")  # its mark is never answered
        first, second = await asyncio.gather(one_warm.run(job(timeout=5)), one_warm.run(job(request_id="call-2")))
        assert kubelet.history[name].pod["metadata"]["labels"][STATE_LABEL] == IDLE  # as far as the API knows
        await gone(kube, name)  # deleted after its job, still labelled idle
        refused = await the_idle_pod(kube, one_warm)
        kube_api.fail(method="PATCH", path_suffix=f"/pods/{refused}", code=500)
        third = await one_warm.run(job(request_id="call-3"))
        await gone(kube, refused)
        marked = await the_idle_pod(kube, one_warm)
        fourth = await one_warm.run(job(request_id="call-4"))

        async def mark_landed() -> None:
            labels = kubelet.history[marked].pod["metadata"]["labels"]
            assert labels[STATE_LABEL] == CLAIMED and labels[MANAGER_LABEL] == one_warm.pool.owner

        await eventually(mark_landed)
    assert [first.pod, third.pod, fourth.pod] == [name, refused, marked]
    assert second.pod != name
    assert {answer.stdout for answer in (first, second, third, fourth)} == {"42\n"}
    assert max(jobs_run_by(kubelet).values()) == 1
    assert f"could not mark warm pod {refused}" in caplog.text


async def test_a_claim_holds_against_a_write_made_after_the_manager_looked_but_a_pod_is_claimed_once(
    one_warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The claim's condition is that the pod is still idle, not the version seen: a write landing in between (the
    node's status writes) must not send the job to a cold pod; a second claim must fail."""
    async with node(kube_api, kube):
        await pool_full(kube, one_warm, 1)
        (seen,) = await idle_pods(kube)
        name = seen["metadata"]["name"]
        meanwhile = [{"op": "add", "path": "/metadata/annotations/rockbot.dev~1written-by-test", "value": "1"}]
        await kube.patch(PODS, namespace=NS, name=name, body=meanwhile, patch_type="json")
        claim = claim_patch(pod=seen, job=job(), now=now_utc(), manager="m2")
        assert claim is not None
        claimed = await kube.patch(PODS, namespace=NS, name=name, body=claim, patch_type="json")
        assert claimed["metadata"]["labels"][STATE_LABEL] == CLAIMED
        with pytest.raises((Conflict, Invalid)):
            await kube.patch(PODS, namespace=NS, name=name, body=claim_patch(pod=seen, job=job(request_id="call-2"),
                                                                             now=now_utc(), manager="m3"),
                             patch_type="json")


async def test_a_pod_that_dies_as_the_job_arrives_hands_the_job_on_and_it_runs_once(
    one_warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async def first_warm_pod_dies(kubelet: FakeKubelet, pod: RunningPod) -> None:
        dies = pod.name.startswith("rockbot-script-warm-") and not any(
            p.name.startswith("rockbot-script-warm-") for p in kubelet.history.values() if p is not pod)
        await kubelet.run_container(pod, stdin=(lambda data: kubelet.kill(pod)) if dies else None)

    async with node(kube_api, kube, first_warm_pod_dies) as kubelet:
        await pool_full(kube, one_warm, 1)
        result = await one_warm.run(job())
    assert result.stdout == "42\n"
    runs = jobs_run_by(kubelet)
    assert sum(runs.values()) == 1, runs  # the dead pod never got it; one other pod ran it, once
    label = one_warm.pool.classes[0].label
    assert sample(one_warm, "rockbot_scripts_pool_misses_total", limits_class=label, reason="failed") == 1


async def test_a_pod_that_dies_while_the_script_runs_fails_the_job_and_it_is_not_run_again(
    one_warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube) as kubelet:
        await pool_full(kube, one_warm, 1)
        (warm,) = await idle_pods(kube)
        run = asyncio.create_task(one_warm.run(job("import time\nprint('begun', flush=True)\ntime.sleep(30)")))
        pod = kubelet.pods[warm["metadata"]["name"]]

        async def started() -> None:
            assert pod.streams is not None and b"rockbot_script_started" in pod.streams.log

        await eventually(started)
        kubelet.kill(pod)
        with pytest.raises(SandboxFailure, match="ended without a result"):
            await run
    assert sum(jobs_run_by(kubelet).values()) == 1


async def test_the_pool_refills_after_a_burst_and_is_released_at_shutdown(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with node(kube_api, kube) as kubelet, pod_backend(pooled(make_settings, 2)) as backend:
        await pool_full(kube, backend, 2)
        results = await asyncio.gather(*(backend.run(job(request_id=f"burst-{i}")) for i in range(5)))
        await pool_full(kube, backend, 2)
        label = backend.pool.classes[0].label
        assert sample(backend, "rockbot_scripts_pool_idle_pods", limits_class=label) == 2
        assert sample(backend, "rockbot_scripts_pool_size", limits_class=label) == 2
    assert [result.stdout for result in results] == ["42\n"] * 5
    # the 2 idle pods, and any replacement already starting when a request came (it is nearer than a new pod)
    assert 2 <= sample(backend, "rockbot_scripts_pool_claims_total", limits_class=label) <= 5
    assert max(jobs_run_by(kubelet).values()) == 1
    assert await idle_pods(kube, ready=False) == []  # a manager that stops deletes its idle pods


async def test_a_request_takes_a_warm_pod_still_starting_rather_than_making_a_new_one(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    """The kubelet reports a container running up to a second late (its relist): here, never."""
    async with node(kube_api, kube, relist_seconds=math.inf) as kubelet, \
            pod_backend(pooled(make_settings, 1)) as backend:
        assert backend.pool is not None

        async def on_its_node() -> None:
            assert any((pod.get("status") or {}).get("startTime") for pod in backend.pool.cache.pods.values())

        await eventually(on_its_node)
        result = await backend.run(job())
    assert result.stdout == "42\n"
    label = backend.pool.classes[0].label
    assert sample(backend, "rockbot_scripts_pool_claims_total", limits_class=label) == 1
    assert sample(backend, "rockbot_scripts_pod_run_duration_seconds_count", path="warm") == 1
    assert sample(backend, "rockbot_scripts_pod_run_duration_seconds_count", path="cold") == 0
    assert max(jobs_run_by(kubelet).values()) == 1


OWN_START = "print(open('/proc/self/stat').read().rpartition(')')[2].split()[19])"


def waiting_interpreters(kubelet: FakeKubelet) -> dict[int, str]:
    """The processes running the runner's prelude in the node's containers, by host pid: their start (in ticks).

    The prelude's process has a session of its own; its parent, the runner, is in its container's."""
    sessions = {pod.process.pid for pod in kubelet.pods.values() if pod.process is not None}
    processes = {}  # pid: (parent, session, start, runs the prelude)
    for process in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if process.name.isdigit():
                fields = (process / "stat").read_text().rpartition(")")[2].split()
                prelude = (process / "cmdline").read_bytes().split(b"\0")[-2] == PRELUDE.encode()
                processes[int(process.name)] = (int(fields[1]), int(fields[3]), fields[19], prelude)
    return {pid: start for pid, (parent, _, start, prelude) in processes.items()
            if prelude and processes.get(parent, (0, 0))[1] in sessions}


async def test_an_idle_warm_pod_already_runs_the_fresh_interpreter_its_one_script_then_runs_in(
    kube: KubeClient, kube_api: KubeApiEmulator, one_warm: PodBackend
) -> None:
    """A job costs no Python start: the script's process was started before any job existed, for this job alone."""
    async with node(kube_api, kube) as kubelet:
        await pool_full(kube, one_warm, 1)

        async def one_waiting() -> dict[int, str]:
            found = waiting_interpreters(kubelet)
            assert len(found) == 1, found
            return found

        (started,) = (await eventually(one_waiting)).values()
        result = await one_warm.run(job(OWN_START))
        await pool_full(kube, one_warm, 1)  # its replacement runs before the node stops
    assert result.stdout == f"{started}\n"  # the very process that waited before the job came
    assert max(jobs_run_by(kubelet).values()) == 1


async def test_a_job_writes_on_the_session_held_to_its_idle_pod_and_attaches_no_more(
    kube: KubeClient, kube_api: KubeApiEmulator, one_warm: PodBackend
) -> None:
    async with node(kube_api, kube) as kubelet:
        name = await the_idle_pod(kube, one_warm)

        async def held() -> None:
            streams = kubelet.pods[name].streams
            assert streams is not None and streams.attached == 1

        await eventually(held)
        result = await one_warm.run(job())
        await pool_full(kube, one_warm, 1)  # its replacement runs before the node stops
    assert result.stdout == "42\n" and result.pod == name
    streams = kubelet.history[name].streams
    assert streams is not None and streams.attached == 1  # the job's session was the one opened while idle
    assert jobs_run_by(kubelet)[name] == 1


async def test_a_held_session_sends_blank_lines_its_runner_skips_until_the_job(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So a kubelet's idle-stream timeout never ends an idle pod's session (and with it, its runner)."""
    monkeypatch.setattr(pool_module, "_KEEPALIVE_SECONDS", 0.05)
    async with node(kube_api, kube) as kubelet, pod_backend(pooled(make_settings, 1)) as backend:
        name = await the_idle_pod(kube, backend)

        async def kept_alive() -> None:
            assert kubelet.pods[name].stdin_received.count(b"\n") >= 3

        await eventually(kept_alive)
        result = await backend.run(job())
        await pool_full(kube, backend, 1)  # its replacement runs before the node stops
    assert result.stdout == "42\n" and result.pod == name
    assert jobs_run_by(kubelet)[name] == 1


def running_since(pod: dict[str, Any]) -> str:
    return pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]


async def test_the_idle_pod_running_longest_is_claimed_first(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    """A container reported running a moment ago may still be starting its runner; one running for long is not."""
    async with node(kube_api, kube), pod_backend(pooled(make_settings, 2)) as backend:
        await pool_full(kube, backend, 2)
        await asyncio.sleep(1.1)  # the replacement below starts in a later second (the API's precision)
        await backend.run(job(request_id="make-room"))
        await pool_full(kube, backend, 2)
        idle = sorted(await idle_pods(kube), key=running_since)
        assert running_since(idle[0]) < running_since(idle[1])
        await sessions_held(backend, idle)  # else the pod with a session would be preferred, whatever its age
        result = await backend.run(job(request_id="the-one"))
        await pool_full(kube, backend, 2)
    assert result.pod == idle[0]["metadata"]["name"]


async def sessions_held(backend: PodBackend, pods: list[dict[str, Any]]) -> None:
    async def held() -> None:
        assert backend.pool is not None
        for pod in pods:
            assert (holding := backend.pool._held.get(pod["metadata"]["name"])) and holding.session is not None

    await eventually(held)


async def test_a_dead_managers_idle_pods_are_reaped_by_another_manager_once_its_lease_expires(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    fast = {"scripts_lease_seconds": 3}
    async with node(kube_api, kube), contextlib.AsyncExitStack() as dead:
        gone = await dead.enter_async_context(pod_backend(pooled(make_settings, 2, **fast)))
        await pool_full(kube, gone, 2)
        for task in gone._tasks:  # as if its process died: its loops stop, nothing is cleaned up
            task.cancel()
        async with pod_backend(pooled(make_settings, 1, **fast)) as survivor:
            await pool_full(kube, survivor, 1)

            async def reaped() -> None:
                owners = {pod["metadata"]["labels"][MANAGER_LABEL] for pod in await idle_pods(kube, ready=False)}
                assert owners == {survivor.pool.owner}

            await eventually(reaped)
        gone.pool = None  # nothing left of it to release
