"""rockbot.kube.KubeClient against the emulated API server, over HTTP."""

import asyncio
import socket

import aiohttp
import pytest
from kubernetes_asyncio import client as k8s_client

from rockbot.kube import (
    CONFIGMAPS,
    DEPLOYMENTS,
    NAMESPACES,
    PODS,
    ApiError,
    Gone,
    KubeClient,
    KubeConfigError,
    NotFound,
    Unavailable,
)
from rockbot.kube.client import DEFAULT_MAX_IN_FLIGHT
from tests.kubeapi import KubeApiEmulator


def client_to(url: str, *, request_timeout: float, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> KubeClient:
    return KubeClient(api_client=k8s_client.ApiClient(k8s_client.Configuration(host=url)),
                      request_timeout=request_timeout, max_in_flight=max_in_flight)


def test_resource_paths_for_core_grouped_and_subresources():
    assert PODS.path() == "/api/v1/pods"
    assert PODS.path(namespace="ns", name="p", subresource="log") == "/api/v1/namespaces/ns/pods/p/log"
    assert DEPLOYMENTS.path(namespace="ns", name="d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert NAMESPACES.path(name="ns") == "/api/v1/namespaces/ns"
    assert DEPLOYMENTS.api_version == "apps/v1"


def test_resource_path_refuses_a_namespace_for_cluster_scoped_kinds():
    with pytest.raises(ValueError, match="cluster-scoped"):
        NAMESPACES.path(namespace="x", name="y")


async def test_read_log_returns_what_the_kubelet_has(kube_api, kube_client: KubeClient):
    pod = {"metadata": {"name": "logs"}, "spec": {"containers": [{"name": "main", "image": "busybox:1"}]}}
    await kube_client.create(PODS, namespace="default", body=pod)
    with pytest.raises(ApiError) as waiting:
        await kube_client.read_log(namespace="default", name="logs")
    assert waiting.value.status == 400
    kube_api.set_pod_log(namespace="default", name="logs", text="hello\nworld\n")
    assert await kube_client.read_log(namespace="default", name="logs", container="main") == "hello\nworld\n"
    with pytest.raises(NotFound):
        await kube_client.read_log(namespace="default", name="absent")


async def test_a_hung_request_times_out_as_unavailable_and_the_next_one_works(kube_api: KubeApiEmulator):
    kube_api.hang(method="GET", path_suffix="/configmaps/stuck")
    async with client_to(str(kube_api.url).rstrip("/"), request_timeout=2) as kube:
        with pytest.raises(Unavailable) as hung:
            await kube.get(CONFIGMAPS, namespace="default", name="stuck")
        assert (hung.value.status, hung.value.reason) == (504, "Timeout")
        assert isinstance(hung.value, ApiError)  # callers' `except ApiError` retry paths see it
        with pytest.raises(NotFound):
            await kube.get(CONFIGMAPS, namespace="default", name="stuck")


async def test_a_hung_watch_ends_with_a_client_error_after_its_timeout_seconds(kube_api: KubeApiEmulator):
    kube_api.hang(method="GET", path_suffix="/namespaces/default/configmaps")
    async with client_to(str(kube_api.url).rstrip("/"), request_timeout=2) as kube:
        with pytest.raises(aiohttp.ClientError) as hung:  # as a broken stream: callers resume watches
            async for _ in kube.watch(CONFIGMAPS, namespace="default", timeout_seconds=1):
                pass
        assert isinstance(hung.value, TimeoutError)


async def test_an_unreachable_server_is_unavailable():
    with socket.socket() as listener:  # a port nobody listens on once closed
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    async with client_to(f"http://127.0.0.1:{port}", request_timeout=5) as kube:
        with pytest.raises(Unavailable) as refused:
            await kube.list(CONFIGMAPS, namespace="default")
    assert refused.value.status == 503


async def test_configuration_errors_name_the_file_or_variable_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(KubeConfigError, match=f"no kubeconfig file at {tmp_path / 'absent'}: set KUBECONFIG"):
        await KubeClient.from_environment()
    (tmp_path / "broken").write_text("clusters: [")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "broken"))
    with pytest.raises(KubeConfigError, match=r"is not usable .*: fix it, or set KUBECONFIG"):
        await KubeClient.from_environment()
    monkeypatch.setenv("ROCKBOT_KUBE_TIMEOUT_SECONDS", "soon")
    with pytest.raises(KubeConfigError, match="ROCKBOT_KUBE_TIMEOUT_SECONDS='soon' is not a positive number"):
        await KubeClient.from_environment()


async def test_no_request_times_out_while_the_server_answers_each_in_time(kube_api: KubeApiEmulator):
    """Requests queued behind one another in the client: each is answered in 0.1 s, a thirtieth of the 3 s limit,
    so none may fail, although the last waits 4 s for its turn (a deadline counting the wait fails the last
    ten). One request on the wire at a time makes the wait long from the emulator's latency alone, not from
    how busy the machine is: only a stall of the test's own event loop near 3 s could fail a request here."""
    client = client_to(str(kube_api.url).rstrip("/"), request_timeout=3.0, max_in_flight=1)
    async with client as kube:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "busy"}}
        await kube.create(CONFIGMAPS, namespace="default", body=body)
        kube_api.latency = 0.1
        answers = await asyncio.gather(*(kube.get(CONFIGMAPS, namespace="default", name="busy") for _ in range(40)),
                                       return_exceptions=True)
    failures = [answer for answer in answers if isinstance(answer, BaseException)]
    assert not failures, f"{len(failures)} of 40 failed, e.g. {failures[0]!r}"


async def test_requests_do_not_hop_to_worker_threads(kube_api: KubeApiEmulator, monkeypatch):
    """Each thread hop costs CPU on every request; aiohttp made two (netrc, proxy variables) when trusting the env."""
    hops: list[object] = []
    loop = asyncio.get_running_loop()
    original = loop.run_in_executor
    monkeypatch.setattr(loop, "run_in_executor", lambda *args: hops.append(args[1]) or original(*args))
    async with client_to(str(kube_api.url).rstrip("/"), request_timeout=5) as kube:
        for _ in range(3):
            await kube.list(CONFIGMAPS, namespace="default")
    assert hops == []


async def test_watch_raises_gone_for_an_expired_resource_version(kube_api, kube_client: KubeClient):
    # A compaction on demand, which a real API server cannot be made to do (its window of changes varies).
    listed = await kube_client.list(CONFIGMAPS, namespace="default")
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "g"}})
    kube_api.compact()
    with pytest.raises(Gone, match="too old resource version"):
        async for _ in kube_client.watch(CONFIGMAPS, namespace="default", resource_version=listed.resource_version,
                                         timeout_seconds=1):
            pass
