"""`pods/attach` as the API server serves it to a WebSocket client, the pod subresources a node writes,
and the pod update rules script pods rely on; through `KubeClient` and, for the wire itself, a raw
WebSocket (the emulator's fake kubelet runs the containers).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from rockbot.kube import NAMESPACES, PODS, ApiError, Conflict, Invalid, KubeClient, NotFound
from rockbot.kube.attach import ERROR, PROTOCOL, STDERR, STDOUT
from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.controllers import in_background
from tests.kubeapi.kubelet import FakeKubelet, RunningPod
from tests.waiting import eventually

NS = "nodes"
# Echoes stdin lines to stdout (upper-cased) and stderr, until end of file.
ECHO = ("import sys\nprint('before', flush=True)\nfor line in sys.stdin:\n"
        "    print(line.strip().upper(), flush=True); print('err', file=sys.stderr, flush=True)\nprint('eof')")


def pod(name: str, *, stdin: bool = True, command: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": {
        "restartPolicy": "Never", "activeDeadlineSeconds": 60, **spec,
        "containers": [{"name": "main", "image": "python:3.12-slim", "stdin": stdin, "stdinOnce": stdin,
                        "command": command or ["python3", "-c", ECHO]}]}}


@pytest.fixture
async def kube(kube_client: KubeClient) -> AsyncIterator[KubeClient]:
    await kube_client.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    yield kube_client


@pytest.fixture
async def node(kube: KubeClient, kube_api: KubeApiEmulator) -> AsyncIterator[FakeKubelet]:
    async with in_background(FakeKubelet(emulator=kube_api, kube=kube, namespace=NS)) as kubelet:
        yield kubelet


async def running(kube: KubeClient, name: str) -> dict[str, Any]:
    async def probe() -> dict[str, Any]:
        current = await kube.get(PODS, namespace=NS, name=name)
        assert current["status"]["phase"] == "Running", current["status"]
        return current

    return await eventually(probe)


async def test_attach_carries_stdin_and_both_outputs_and_ends_with_a_success_status(
    kube: KubeClient, node: FakeKubelet
) -> None:
    await kube.create(PODS, namespace=NS, body=pod("echo"))
    await running(kube, "echo")

    async def said_before() -> None:
        assert await kube.read_log(namespace=NS, name="echo", container="main") == "before\n"

    await eventually(said_before)
    out, err = bytearray(), bytearray()
    async with kube.attach(namespace=NS, name="echo", container="main") as session:
        await session.write(b"hello\nworld\n")
        await session.close_stdin()
        async for piece in session:
            (out if piece.channel == STDOUT else err).extend(piece.data)
    # Output written before the attach ("before") is in the log only.
    assert (bytes(out), bytes(err)) == (b"HELLO\nWORLD\neof\n", b"err\nerr\n")
    assert session.succeeded and session.status == {"metadata": {}, "status": "Success"}
    log = await kube.read_log(namespace=NS, name="echo", container="main")
    assert log.startswith("before\n") and "HELLO" in log
    assert await kube.read_log(namespace=NS, name="echo", container="main", limit_bytes=3) == "bef"


async def test_the_wire_opens_with_an_empty_stdout_message_and_ends_with_the_status_on_channel_3(
    kube: KubeClient, node: FakeKubelet, kube_api: KubeApiEmulator
) -> None:
    await kube.create(PODS, namespace=NS, body=pod("wire"))
    await running(kube, "wire")
    url = f"{str(kube_api.url).rstrip('/')}/api/v1/namespaces/{NS}/pods/wire/attach?container=main&stdin=true" \
          "&stdout=true&stderr=true"
    async with aiohttp.ClientSession() as http, http.ws_connect(url, protocols=(PROTOCOL,)) as ws:
        assert ws.protocol == PROTOCOL
        first = await ws.receive_bytes()
        await ws.send_bytes(b"\x00x\n")
        await ws.send_bytes(b"\xff\x00")  # v5: close stdin
        frames = [bytes(message.data) async for message in ws if message.type == aiohttp.WSMsgType.BINARY]
    assert first == bytes([STDOUT])
    assert frames[-1][0] == ERROR and json.loads(frames[-1][1:]) == {"metadata": {}, "status": "Success"}
    assert {frame[0] for frame in frames[:-1]} <= {STDOUT, STDERR}


async def test_stdin_once_closes_stdin_when_the_first_session_ends(kube: KubeClient, node: FakeKubelet) -> None:
    await kube.create(PODS, namespace=NS, body=pod("once"))
    await running(kube, "once")
    async with kube.attach(namespace=NS, name="once", container="main") as session:
        await session.write(b"one\n")
        async for piece in session:
            if b"ONE" in piece.data:
                break
    # The client left without closing stdin: the runtime closes it, and the program reads to its end.
    async def finished() -> None:
        assert (await kube.get(PODS, namespace=NS, name="once"))["status"]["phase"] == "Succeeded"

    await eventually(finished)
    lines = (await kube.read_log(namespace=NS, name="once", container="main")).splitlines()
    assert "eof" in lines and "ONE" in lines


async def test_attach_to_a_container_that_is_not_running_fails_in_the_status(
    kube: KubeClient, node: FakeKubelet
) -> None:
    await kube.create(PODS, namespace=NS, body=pod("done", stdin=False, command=["python3", "-c", "print(1)"]))

    async def ended() -> None:
        assert (await kube.get(PODS, namespace=NS, name="done"))["status"]["phase"] == "Succeeded"

    await eventually(ended)
    async with kube.attach(namespace=NS, name="done", container="main") as session:
        pieces = [piece async for piece in session]
    assert pieces == [] and not session.succeeded
    assert session.status is not None and 'container not found ("main")' in session.status["message"]


async def test_attach_is_refused_before_the_upgrade_for_a_missing_pod_container_or_node(
    kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    with pytest.raises(NotFound):
        async with kube.attach(namespace=NS, name="nobody", container="main"):
            pass
    await kube.create(PODS, namespace=NS, body=pod("unscheduled"))  # no kubelet: never bound to a node
    for container in ("main", "other"):
        with pytest.raises(ApiError) as refused:
            async with kube.attach(namespace=NS, name="unscheduled", container=container):
                pass
        assert refused.value.status == 400
    url = f"{str(kube_api.url).rstrip('/')}/api/v1/namespaces/{NS}/pods/unscheduled/attach?container="
    async with aiohttp.ClientSession() as http:  # the Status messages, with plain GETs (no upgrade)
        assert "container other is not valid" in (await (await http.get(url + "other")).json())["message"]
        assert "does not have a host assigned" in (await (await http.get(url + "main")).json())["message"]
        await kube.create(PODS, namespace=NS, name="unscheduled", subresource="binding", body={
            "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "unscheduled"}, "target": {"name": "n1"}})
        plain = await http.get(url + "main")
        assert plain.status == 400 and "Upgrade request required" in (await plain.json())["message"]


async def test_a_pod_is_bound_once_and_its_deadline_may_only_come_closer(kube: KubeClient) -> None:
    await kube.create(PODS, namespace=NS, body=pod("bound"))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "bound"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"}}
    await kube.create(PODS, namespace=NS, name="bound", subresource="binding", body=binding)
    assert (await kube.get(PODS, namespace=NS, name="bound"))["spec"]["nodeName"] == "n1"
    with pytest.raises(Conflict, match="already assigned"):
        await kube.create(PODS, namespace=NS, name="bound", subresource="binding", body=binding)
    lowered = await kube.patch(PODS, namespace=NS, name="bound", body={"spec": {"activeDeadlineSeconds": 30}})
    assert lowered["spec"]["activeDeadlineSeconds"] == 30
    with pytest.raises(Invalid, match="must be less than or equal to previous value"):
        await kube.patch(PODS, namespace=NS, name="bound", body={"spec": {"activeDeadlineSeconds": 31}})
    with pytest.raises(Invalid, match="pod updates may not change fields"):
        await kube.patch(PODS, namespace=NS, name="bound", body={"spec": {"nodeName": "n2"}})


async def test_the_node_stops_a_pod_at_its_lowered_deadline(kube: KubeClient, node: FakeKubelet) -> None:
    await kube.create(PODS, namespace=NS, body=pod("late"))
    await running(kube, "late")
    await kube.patch(PODS, namespace=NS, name="late", body={"spec": {"activeDeadlineSeconds": 1}})

    async def stopped() -> None:
        status = (await kube.get(PODS, namespace=NS, name="late"))["status"]
        assert (status["phase"], status.get("reason")) == ("Failed", "DeadlineExceeded")

    await eventually(stopped)


async def test_a_node_stopped_while_a_pod_starts_stops_without_waiting_for_that_pods_deadline(
    kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    """The pod's first status write answers only after the node began to stop; the deadline it then sets must
    not keep the node's teardown (and its test) waiting for an hour."""
    kube_api.hang(method="PATCH", path_suffix="/pods/starting/status")
    kubelet = FakeKubelet(emulator=kube_api, kube=kube, namespace=NS)
    running_node = asyncio.create_task(kubelet.run())
    await kube.create(PODS, namespace=NS, body=pod("starting", stdin=False, activeDeadlineSeconds=3600,
                                                   command=["python3", "-c", "pass"]))
    await eventually(lambda: _bound(kube, "starting"))
    running_node.cancel()
    await asyncio.sleep(0.1)  # the node's teardown has begun
    kube_api.end_watches()  # the hung status write answers (503): the pod's start goes on to set its deadline
    done, _ = await asyncio.wait([running_node], timeout=60)
    assert done, "the node's teardown waited for a pod's deadline set while it stopped"


async def _bound(kube: KubeClient, name: str) -> None:
    assert (await kube.get(PODS, namespace=NS, name=name))["spec"].get("nodeName")


async def test_with_a_held_relist_container_states_are_reported_only_at_the_relist(
    kube: KubeClient, kube_api: KubeApiEmulator
) -> None:
    held = FakeKubelet(emulator=kube_api, kube=kube, namespace=NS, relist_seconds=float("inf"))
    async with in_background(held):
        await kube.create(PODS, namespace=NS, body=pod("quiet", stdin=False, command=["python3", "-c", "print(1)"]))

        async def ran() -> RunningPod:
            known = held.pods["quiet"]
            assert "terminated" in known.state
            return known

        await eventually(ran)
        assert "running" not in (await kube.get(PODS, namespace=NS, name="quiet"))["status"]["containerStatuses"][0][
            "state"] and (await kube.read_log(namespace=NS, name="quiet", container="main")) == "1\n"
        held.relist()
        await eventually(lambda: _phase_is(kube, "quiet", "Succeeded"))


async def _phase_is(kube: KubeClient, name: str, phase: str) -> None:
    assert (await kube.get(PODS, namespace=NS, name=name))["status"]["phase"] == phase
