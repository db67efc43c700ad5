"""Sessions in the pod backend (`scriptSessions: PerConversation`) against the Kubernetes API emulator, with a node
running the pods for real (the real runner becoming the real kernel.py under bubblewrap): the warm pool serves a
session's first call, later calls reuse its pod on the same attach session; never shared; ended, and said so, when
the script kills its interpreter, on a timeout, when idle, when the Agent's limits change; reaped with its dead
manager; one holder across two managers."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from collections.abc import AsyncIterator

import pytest

from rockbot.kube import PODS, KubeClient
from rockbot.scripts_manager.backends import Asker, InputFile, ScriptJob, SessionTerms
from rockbot.scripts_manager.backends.pod_manifests import (
    ASKER_ANNOTATION,
    REQUEST_ANNOTATION,
    REQUEST_LABEL,
    SANDBOX_SELECTOR,
    SESSION_LABEL,
)
from rockbot.scripts_manager.backends.pods import PodBackend
from tests.kubeapi import KubeApiEmulator
from tests.scripts_manager.conftest import NS, MakeSettings, node, pod_backend
from tests.scripts_manager.test_pool import jobs_run_by, pooled, the_idle_pod
from tests.waiting import eventually

ANN = SessionTerms(owner="agent.team.helper", session="a" * 32, idle_seconds=300, max_seconds=3600)
BOB = ANN.model_copy(update={"session": "b" * 32})


def call(script: str, *, session: SessionTerms = ANN, timeout: float = 10.0, memory: str | None = None,
         files: tuple[InputFile, ...] = ()) -> ScriptJob:
    request_id = uuid.uuid4().hex
    return ScriptJob(request_id=request_id, script=textwrap.dedent(script), input_data="in", timeout_seconds=timeout,
                     session=session, memory=memory, files=files,
                     asker=Asker(user=session.owner, reply_to="agent.team.helper.replies.1",
                                 correlation_id=request_id))  # fmt: skip


@pytest.fixture
async def warm(kube: KubeClient, make_settings: MakeSettings) -> AsyncIterator[PodBackend]:
    async with pod_backend(pooled(make_settings, 1)) as backend:
        yield backend


async def session_pods(kube: KubeClient) -> list[dict]:
    pods = (await kube.list(PODS, namespace=NS, label_selector=f"{SANDBOX_SELECTOR},{SESSION_LABEL}")).items
    return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]


async def test_a_warm_pod_serves_the_first_call_and_later_calls_reuse_it_on_the_same_attach(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube) as kubelet:
        name = await the_idle_pod(kube, warm)
        first = await warm.run(call("""
            import json, sys
            rows = [1, 2, 3]
            open("kept.txt", "w").write("made in call one")
            print(sys.stdin.read())
        """))
        second = await warm.run(call("print(sum(rows), open('kept.txt').read())"))
        third = await warm.run(call("import sys; print('err', file=sys.stderr); sys.exit(3)"))
        fourth = await warm.run(call("raise ValueError('boom')"))
        fifth = await warm.run(call("print(len(rows))"))
        streams = kubelet.pods[name].streams
        assert streams is not None and streams.attached == 1  # the pool's held session, kept for every call
        (pod,) = await session_pods(kube)
        assert pod["metadata"]["name"] == name
        assert pod["spec"]["activeDeadlineSeconds"] <= 3600  # the pool pod's lifetime, never raised
    assert (first.session, first.exit_code, first.stdout, first.pod) == ("new", 0, "in\n", name), first
    assert (second.session, second.stdout, second.pod) == ("kept", "6 made in call one\n", name), second
    assert (third.session, third.exit_code, third.stderr) == ("kept", 3, "err\n"), third
    assert (fourth.session, fourth.exit_code) == ("kept", 1) and "ValueError: boom" in fourth.stderr, fourth
    assert (fifth.session, fifth.stdout) == ("kept", "3\n"), fifth
    assert jobs_run_by(kubelet)[name] == 6  # the runner's one job (the kernel), then five calls


async def test_two_callers_at_once_never_share_a_session(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        other_agent = ANN.model_copy(update={"owner": "agent.other.helper"})  # the same digest from another sender
        answers = await asyncio.gather(*(
            warm.run(call("import os, time; print(globals().get('secret')); secret = os.urandom(4).hex(); "
                          "time.sleep(0.5); print(secret)", session=terms))
            for terms in (ANN, BOB, other_agent)
        ))  # fmt: skip
        assert len({answer.pod for answer in answers}) == 3  # three pods, at once
        again = await asyncio.gather(*(warm.run(call("print(secret)", session=terms))
                                       for terms in (ANN, BOB, other_agent)))  # fmt: skip
    for answer, later in zip(answers, again, strict=True):
        assert answer.session == "new" and answer.stdout.startswith("None\n"), answer
        assert (later.session, later.stdout, later.pod) == ("kept", answer.stdout.split("\n")[1] + "\n", answer.pod)


async def test_a_script_that_kills_its_interpreter_ends_the_session_and_its_pod_and_the_next_call_says_so(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        await warm.run(call("x = 1"))
        # PID 1 (the kernel's supervisor) ignores what its own namespace sends it; the script can only end its own
        # interpreter, and with it the session's pod.
        init = await warm.run(call("import os, signal; os.kill(1, signal.SIGKILL); print(x)"))
        killed = await warm.run(call("import os; print('bye', flush=True); os.kill(os.getpid(), 9)"))
        after = await warm.run(call("print(globals().get('x'))"))
        exited = await warm.run(call("import os; os._exit(4)"))
        assert (await warm.run(call("print('fresh')"))).session == "restarted"

        async def one_left() -> None:
            assert len(await session_pods(kube)) == 1

        await eventually(one_left)
    assert (init.session, init.stdout) == ("kept", "1\n"), init
    assert (killed.session, killed.stdout, killed.exit_code) == ("ended", "bye\n", 137), killed
    assert (after.session, after.stdout) == ("restarted", "None\n"), after
    assert after.pod != killed.pod
    assert (exited.session, exited.exit_code, exited.oom_killed) == ("ended", 4, False), exited


async def test_a_timeout_ends_the_session_with_what_it_printed_and_deletes_its_pod(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        slow = await warm.run(call("import time; print('so far', flush=True); time.sleep(30)", timeout=1))

        async def gone() -> None:
            assert slow.pod not in {pod["metadata"]["name"] for pod in await session_pods(kube)}

        await eventually(gone)
        after = await warm.run(call("print('next')"))
    assert (slow.session, slow.timed_out, slow.exit_code, slow.stdout) == ("ended", True, None, "so far\n"), slow
    assert after.session == "restarted"


async def test_idle_or_other_limits_end_the_session_and_the_next_call_says_restarted(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    brief = ANN.model_copy(update={"idle_seconds": 1})
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        first = await warm.run(call("x = 1", session=brief))

        async def ended() -> None:
            assert first.pod not in {pod["metadata"]["name"] for pod in await session_pods(kube)}
            assert len(warm.sessions) == 0

        await eventually(ended)
        after = await warm.run(call("print(globals().get('x'))", session=brief))
        bigger = await warm.run(call("print(globals().get('x'))", session=brief, memory="128Mi"))
    assert (after.session, after.stdout) == ("restarted", "None\n")
    assert bigger.session == "restarted" and bigger.pod != after.pod  # another limits class: a cold pod of its own


async def test_a_call_marks_its_pod_while_it_runs_and_a_dead_managers_session_pod_is_reaped(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    settings = pooled(make_settings, 1, scripts_lease_seconds=3)
    async with node(kube_api, kube), pod_backend(settings) as survivor:
        dead = PodBackend(kube=await KubeClient.from_environment(), settings=settings, metrics=survivor.metrics)
        await dead.start()
        await dead.run(call("x = 1"))
        sleeping = call("import time; time.sleep(30)", timeout=60)
        marked = asyncio.create_task(dead.run(sleeping))

        async def marked_now() -> None:
            (pod,) = await session_pods(kube)
            assert REQUEST_LABEL in pod["metadata"]["labels"] and ASKER_ANNOTATION in pod["metadata"]["annotations"]
            assert pod["metadata"]["annotations"][REQUEST_ANNOTATION] == sleeping.request_id

        await eventually(marked_now)
        (pod,) = await session_pods(kube)
        # The manager dies: its Lease is no longer renewed (its tasks stop, nothing is cleaned up).
        for task in dead._tasks:
            task.cancel()
        orphan = await asyncio.wait_for(survivor.orphans.get(), timeout=30)
        assert (orphan.pod, orphan.request_id) == (pod["metadata"]["name"], sleeping.request_id)

        async def reaped() -> None:
            assert await session_pods(kube) == []

        await eventually(reaped)
        marked.cancel()
        await asyncio.gather(marked, return_exceptions=True)
        await dead.close()


async def test_a_call_that_reaches_another_manager_ends_the_first_ones_session_and_says_restarted(
    kube: KubeClient, kube_api: KubeApiEmulator, make_settings: MakeSettings
) -> None:
    async with node(kube_api, kube), pod_backend(pooled(make_settings, 1)) as one, \
            pod_backend(pooled(make_settings, 1)) as two:  # fmt: skip
        first = await one.run(call("x = 1"))
        elsewhere = await two.run(call("print(globals().get('x')); x = 2"))

        async def first_pod_gone() -> None:  # the second's delete ends the first's stream once the kubelet kills it
            assert all(session.gone() for session in one.sessions._live.values())

        await eventually(first_pod_gone)  # a call sent before then is in a dying pod: it says `ended` instead
        back = await one.run(call("print(globals().get('x'))"))
        assert len(await session_pods(kube)) == 1  # never two live sessions of one conversation
    assert first.session == "new"
    assert (elsewhere.session, elsewhere.stdout) == ("restarted", "None\n"), elsewhere
    assert (back.session, back.stdout) == ("restarted", "None\n"), back


async def test_the_first_calls_files_are_under_input_and_what_a_session_pod_does_not_carry_is_said(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    sales = InputFile(name="sales.csv", content=b"month,revenue\n1,10\n")
    later = InputFile(name="later.csv", content=b"x\n")
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        first = await warm.run(call("print(open('/input/sales.csv').read().splitlines()[1])", files=(sales,)))
        second = await warm.run(call("import os; print(sorted(os.listdir('/input')))", files=(sales, later)))
    assert (first.session, first.stdout) == ("new", "1,10\n"), first
    assert (second.session, second.stdout) == ("kept", "['sales.csv']\n"), second
    assert any("gives no files back" in said for said in first.artifacts_dropped)
    assert any("later.csv" in said for said in second.artifacts_dropped)
    assert not any("later.csv" in said for said in first.artifacts_dropped)
