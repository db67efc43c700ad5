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
    Conflict,
    Gone,
    Invalid,
    KubeClient,
    KubeConfigError,
    NotFound,
    Resource,
    Unavailable,
    WatchEvent,
)
from tests.kubeapi import KubeApiEmulator


def client_to(url: str, *, request_timeout: float) -> KubeClient:
    return KubeClient(api_client=k8s_client.ApiClient(k8s_client.Configuration(host=url)),
                      request_timeout=request_timeout)


def test_resource_paths_for_core_grouped_and_subresources():
    assert PODS.path() == "/api/v1/pods"
    assert PODS.path(namespace="ns", name="p", subresource="log") == "/api/v1/namespaces/ns/pods/p/log"
    assert DEPLOYMENTS.path(namespace="ns", name="d") == "/apis/apps/v1/namespaces/ns/deployments/d"
    assert NAMESPACES.path(name="ns") == "/api/v1/namespaces/ns"
    assert DEPLOYMENTS.api_version == "apps/v1"


def test_resource_path_refuses_a_namespace_for_cluster_scoped_kinds():
    with pytest.raises(ValueError, match="cluster-scoped"):
        NAMESPACES.path(namespace="x", name="y")


async def test_from_environment_reads_the_kubeconfig(kube_client: KubeClient, kube_api):
    assert kube_client.host == str(kube_api.url).rstrip("/")


async def test_create_get_list_with_selectors(kube_client: KubeClient):
    body = {"metadata": {"name": "one", "labels": {"app": "a"}}, "data": {"k": "v"}}
    created = await kube_client.create(CONFIGMAPS, namespace="default", body=body)
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "two"}})
    assert created["metadata"]["uid"]
    fetched = await kube_client.get(CONFIGMAPS, namespace="default", name="one")
    assert fetched["data"] == {"k": "v"}
    listed = await kube_client.list(CONFIGMAPS, namespace="default", label_selector="app=a")
    assert [item["metadata"]["name"] for item in listed.items] == ["one"]
    assert int(listed.resource_version) >= int(created["metadata"]["resourceVersion"])
    by_field = await kube_client.list(CONFIGMAPS, field_selector="metadata.name=two")
    assert [item["metadata"]["name"] for item in by_field.items] == ["two"]


async def test_create_takes_the_namespace_from_the_body(kube_client: KubeClient):
    created = await kube_client.create(CONFIGMAPS, body={"metadata": {"name": "c", "namespace": "default"}})
    assert created["metadata"]["namespace"] == "default"
    with pytest.raises(ValueError, match="namespaced"):
        await kube_client.create(CONFIGMAPS, body={"metadata": {"name": "c"}})


async def test_errors_map_to_exceptions(kube_client: KubeClient):
    with pytest.raises(NotFound) as not_found:
        await kube_client.get(CONFIGMAPS, namespace="default", name="missing")
    assert not_found.value.status == 404
    assert 'configmaps "missing" not found' in str(not_found.value)

    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "dup"}})
    with pytest.raises(Conflict) as exists:
        await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "dup"}})
    assert exists.value.reason == "AlreadyExists"

    with pytest.raises(Invalid) as bad_name:
        await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "Bad_Name"}})
    assert "metadata.name" in bad_name.value.message

    with pytest.raises(NotFound):
        await kube_client.create(CONFIGMAPS, namespace="nowhere", body={"metadata": {"name": "x"}})

    unknown = Resource(group="example.com", version="v1", plural="widgets", kind="Widget")
    with pytest.raises(NotFound, match="could not find the requested resource"):
        await kube_client.list(unknown, namespace="default")


async def test_merge_patch_and_stale_resource_version(kube_client: KubeClient):
    created = await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "p"},
                                                                             "data": {"a": "1", "b": "2"}})
    patched = await kube_client.patch(CONFIGMAPS, namespace="default", name="p", body={"data": {"a": None, "c": "3"}})
    assert patched["data"] == {"b": "2", "c": "3"}
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "data": {"d": "4"}}
    with pytest.raises(Conflict) as conflict:
        await kube_client.patch(CONFIGMAPS, namespace="default", name="p", body=stale)
    assert conflict.value.reason == "Conflict"


async def test_json_patch_with_a_failing_test_is_invalid(kube_client: KubeClient):
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "j"}, "data": {"a": "1"}})
    ops = [{"op": "test", "path": "/data/a", "value": "1"}, {"op": "replace", "path": "/data/a", "value": "2"}]
    patched = await kube_client.patch(CONFIGMAPS, namespace="default", name="j", body=ops, patch_type="json")
    assert patched["data"] == {"a": "2"}
    with pytest.raises(Invalid):
        await kube_client.patch(CONFIGMAPS, namespace="default", name="j", body=ops, patch_type="json")


async def test_replace_needs_the_current_resource_version(kube_client: KubeClient):
    created = await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "r"}})
    created["data"] = {"x": "y"}
    replaced = await kube_client.replace(CONFIGMAPS, namespace="default", name="r", body=created)
    assert replaced["data"] == {"x": "y"}
    with pytest.raises(Conflict):
        await kube_client.replace(CONFIGMAPS, namespace="default", name="r", body=created)


async def test_status_subresource_patch(kube_client: KubeClient):
    pod = {"metadata": {"name": "pod"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}
    await kube_client.create(PODS, namespace="default", body=pod)
    patched = await kube_client.patch(PODS, namespace="default", name="pod", subresource="status",
                                      body={"status": {"phase": "Running"}})
    assert patched["status"]["phase"] == "Running"


async def test_delete_with_preconditions(kube_client: KubeClient):
    created = await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "d"}})
    with pytest.raises(Conflict, match="Precondition failed"):
        await kube_client.delete(CONFIGMAPS, namespace="default", name="d", preconditions_uid="other")
    await kube_client.delete(CONFIGMAPS, namespace="default", name="d", grace_period_seconds=0,
                             preconditions_uid=created["metadata"]["uid"])
    with pytest.raises(NotFound):
        await kube_client.get(CONFIGMAPS, namespace="default", name="d")


async def test_watch_from_a_list_sees_later_changes_and_ends_at_the_timeout(kube_client: KubeClient):
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "before"}})
    listed = await kube_client.list(CONFIGMAPS, namespace="default")
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "after"}})
    await kube_client.delete(CONFIGMAPS, namespace="default", name="after")
    events = [event async for event in kube_client.watch(
        CONFIGMAPS, namespace="default", resource_version=listed.resource_version, timeout_seconds=1)]
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", "after"), ("DELETED", "after")]
    assert all(isinstance(e, WatchEvent) for e in events)


async def test_watch_raises_gone_for_an_expired_resource_version(kube_api, kube_client: KubeClient):
    listed = await kube_client.list(CONFIGMAPS, namespace="default")
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "g"}})
    kube_api.compact()
    with pytest.raises(Gone, match="too old resource version"):
        async for _ in kube_client.watch(CONFIGMAPS, namespace="default", resource_version=listed.resource_version,
                                         timeout_seconds=1):
            pass


async def test_watch_streams_live_events(kube_client: KubeClient):
    seen: list[str] = []

    since = (await kube_client.list(CONFIGMAPS, namespace="default")).resource_version

    async def consume() -> None:
        async for event in kube_client.watch(
            CONFIGMAPS, namespace="default", resource_version=since, timeout_seconds=5
        ):
            seen.append(f'{event.type}:{event.object["metadata"]["name"]}')
            if event.type == "DELETED":
                return

    task = asyncio.create_task(consume())  # it sees every change after `since`, however late it starts
    await kube_client.create(CONFIGMAPS, namespace="default", body={"metadata": {"name": "live"}})
    await kube_client.patch(CONFIGMAPS, namespace="default", name="live", body={"data": {"a": "b"}})
    await kube_client.delete(CONFIGMAPS, namespace="default", name="live")
    await asyncio.wait_for(task, 5)
    assert seen == ["ADDED:live", "MODIFIED:live", "DELETED:live"]


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
    """A burst of requests larger than the connection pool: each is answered in 0.25 s, well within the 0.75 s
    limit, so none may fail, however long it waited for its turn in the client."""
    async with client_to(str(kube_api.url).rstrip("/"), request_timeout=0.75) as kube:
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "busy"}}
        await kube.create(CONFIGMAPS, namespace="default", body=body)
        kube_api.latency = 0.25
        answers = await asyncio.gather(*(kube.get(CONFIGMAPS, namespace="default", name="busy") for _ in range(400)),
                                       return_exceptions=True)
    failures = [answer for answer in answers if isinstance(answer, BaseException)]
    assert not failures, f"{len(failures)} of 400 failed, e.g. {failures[0]!r}"


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


async def test_a_list_read_a_page_at_a_time_sees_every_object_once(kube_client: KubeClient):
    for index in range(7):
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"page-{index}"}}
        await kube_client.create(CONFIGMAPS, namespace="default", body=body)
    pages = [page async for page in kube_client.list_pages(CONFIGMAPS, namespace="default", limit=3)]
    assert [len(page.items) for page in pages] == [3, 3, 1]
    assert sorted(item["metadata"]["name"] for page in pages for item in page.items) == [f"page-{i}" for i in range(7)]
    assert all(page.resource_version for page in pages)
