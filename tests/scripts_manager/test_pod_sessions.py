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
from rockbot.scripts_manager.backends.outputs import OutputBounds
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
from tests.scripts_manager.test_pod_files import LINKED
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


async def test_each_call_sees_its_files_under_input_and_gives_back_what_it_wrote_with_plt_show_figures(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The local backend's contract (test_local_sessions.py), with the runner's code in the pod's kernel: a later
    call's new or changed files are added to /input, those it no longer names removed; /output is emptied before each
    call, so a call gives back what it wrote, never an earlier call's files."""
    sales = InputFile(name="sales.csv", content=b"month,revenue\n1,10\n2,30\n")
    newer = InputFile(name="sales.csv", content=b"month,revenue\n1,10\n2,30\n3,20\n")
    later = InputFile(name="data/later.csv", content=b"x\n")
    listing = "import os; print(sorted(os.listdir('/input')), sorted(os.listdir('/output')))"
    async with node(kube_api, kube) as kubelet:
        name = await the_idle_pod(kube, warm)
        first = await warm.run(call("""
            rows = open("/input/sales.csv").read().splitlines()
            open("/output/clean.csv", "w").write("\\n".join(rows).upper())
            print(len(rows))
        """, files=(sales,)))
        second = await warm.run(call(listing + "; print(open('/input/data/later.csv').read(), len(rows))",
                                     files=(sales, later)))
        third = await warm.run(call(listing + "; print(open('/input/sales.csv').read().count('\\n'))",
                                    files=(newer,)))
        probe = await warm.run(call("import matplotlib", files=(newer,)))
        if probe.exit_code != 0:
            pytest.fail(f"the node's Python has no matplotlib ({probe.stderr.strip()[-200:]}): install it, e.g. "
                        "apt-get install -y python3-matplotlib")
        figure = await warm.run(call("""
            import matplotlib.pyplot as plt
            plt.bar([r.split(",")[0] for r in rows[1:]], [int(r.split(",")[1]) for r in rows[1:]])
            plt.show()
        """, files=(newer,)))
        assert kubelet.pods[name].streams.attached == 1  # type: ignore[union-attr]
    assert (first.session, first.stdout) == ("new", "3\n"), first
    assert [(a.name, a.content) for a in first.artifacts] == [("clean.csv", b"MONTH,REVENUE\n1,10\n2,30")], first
    assert (second.session, second.stdout) == ("kept", "['data', 'sales.csv'] []\nx\n 3\n"), second
    assert (second.artifacts, second.artifacts_dropped) == ((), ()), second
    assert (third.session, third.stdout) == ("kept", "['data', 'sales.csv'] []\n4\n"), third
    assert (figure.session, figure.exit_code) == ("kept", 0), figure.stderr
    assert [(a.name, a.media_type) for a in figure.artifacts] == [("figure-1.png", "image/png")], figure


async def test_a_session_drops_links_out_of_output_and_files_over_the_bound_says_so_and_goes_on(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    bounds = OutputBounds(files=3, file_bytes=1000, total_bytes=1500)
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        hostile = await warm.run(call("""
            import os
            os.symlink("/etc/passwd", "/output/passwd")
            os.symlink("/input", "/output/inputs")
            open("/output/big.bin", "wb").write(b"x" * 1001)
            open("/output/ok.txt", "w").write("fine")
            os.mkdir("/output/closed"); open("/output/closed/x.txt", "w").write("x"); os.chmod("/output/closed", 0)
            kept = 1
        """).model_copy(update={"output_bounds": bounds}))
        after = await warm.run(call("import os; print(kept, sorted(os.listdir('/output')))"))
    assert (hostile.session, hostile.exit_code) == ("new", 0), hostile.stderr
    assert [(a.name, a.content) for a in hostile.artifacts] == [("ok.txt", b"fine")], hostile
    assert sorted(hostile.artifacts_dropped) == [
        "big.bin: 1,001 bytes, over the bound of 1,000 bytes per file",
        f"inputs: a symbolic link {LINKED}", f"passwd: a symbolic link {LINKED}",
    ], hostile
    assert (after.session, after.stdout, after.artifacts) == ("kept", "1 []\n", ()), after


async def test_a_forged_kernel_line_ends_the_session_and_says_so(
    warm: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The script runs in the kernel's process and could find its call's marker: a line after it that no kernel
    writes (here over the bound of its call's files) ends that session, only its own, and the answer says so."""
    async with node(kube_api, kube):
        await the_idle_pod(kube, warm)
        forged = await warm.run(call("""
            import gc, os
            line = next(o for o in gc.get_objects() if isinstance(o, dict) and "marker" in o and "script" in o)
            os.write(1, line["marker"].encode() + b'{"exit_code": 0, "artifacts": "' + b"A" * 8_000_000 + b'"}\\n')
        """, memory="512Mi").model_copy(update={"output_bounds": OutputBounds(files=1, file_bytes=10, total_bytes=10)}))
        after = await warm.run(call("print(globals().get('gc'))", memory="512Mi"))
    assert forged.session == "ended" and forged.artifacts == (), forged
    assert any("the session was ended" in said for said in forged.artifacts_dropped), forged
    assert (after.session, after.stdout) == ("restarted", "None\n"), after
