"""rockbot.kube.KubeClient against the real API server: what it answers (404, 409, 422, watches that end) is what
the processes meet in a cluster. (410 Gone needs a compaction on demand: the emulator's, tests/kubeapi.)"""

import asyncio

import pytest

from rockbot.kube import CONFIGMAPS, PODS, Conflict, Invalid, KubeClient, NotFound, Resource, WatchEvent
from tests.fixtures.kube_real import KubeCluster


@pytest.fixture
def kube_client(real_kube_client: KubeClient) -> KubeClient:
    return real_kube_client


@pytest.fixture
def ns(kube_namespace: str) -> str:
    return kube_namespace


async def test_from_environment_reads_the_kubeconfig(kube_client: KubeClient, kube_cluster: KubeCluster):
    assert kube_client.host == kube_cluster.server.rstrip("/")


async def test_create_get_list_with_selectors(kube_client: KubeClient, ns: str):
    body = {"metadata": {"name": "one", "labels": {"app": "a"}}, "data": {"k": "v"}}
    created = await kube_client.create(CONFIGMAPS, namespace=ns, body=body)
    await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "two"}})
    assert created["metadata"]["uid"]
    fetched = await kube_client.get(CONFIGMAPS, namespace=ns, name="one")
    assert fetched["data"] == {"k": "v"}
    listed = await kube_client.list(CONFIGMAPS, namespace=ns, label_selector="app=a")
    assert [item["metadata"]["name"] for item in listed.items] == ["one"]
    assert int(listed.resource_version) >= int(created["metadata"]["resourceVersion"])
    by_field = await kube_client.list(CONFIGMAPS, namespace=ns, field_selector="metadata.name=two")
    assert [item["metadata"]["name"] for item in by_field.items] == ["two"]


async def test_create_takes_the_namespace_from_the_body(kube_client: KubeClient, ns: str):
    created = await kube_client.create(CONFIGMAPS, body={"metadata": {"name": "c", "namespace": ns}})
    assert created["metadata"]["namespace"] == ns
    with pytest.raises(ValueError, match="namespaced"):
        await kube_client.create(CONFIGMAPS, body={"metadata": {"name": "c"}})


async def test_errors_map_to_exceptions(kube_client: KubeClient, ns: str):
    with pytest.raises(NotFound) as not_found:
        await kube_client.get(CONFIGMAPS, namespace=ns, name="missing")
    assert not_found.value.status == 404
    assert 'configmaps "missing" not found' in str(not_found.value)

    await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "dup"}})
    with pytest.raises(Conflict) as exists:
        await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "dup"}})
    assert exists.value.reason == "AlreadyExists"

    with pytest.raises(Invalid) as bad_name:
        await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "Bad_Name"}})
    assert "metadata.name" in bad_name.value.message

    with pytest.raises(NotFound):
        await kube_client.create(CONFIGMAPS, namespace="nowhere", body={"metadata": {"name": "x"}})

    unknown = Resource(group="example.com", version="v1", plural="widgets", kind="Widget")
    with pytest.raises(NotFound, match="404 page not found"):  # an unserved kind: no Status, a plain 404
        await kube_client.list(unknown, namespace=ns)


async def test_merge_patch_and_stale_resource_version(kube_client: KubeClient, ns: str):
    created = await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "p"},
                                                                             "data": {"a": "1", "b": "2"}})
    patched = await kube_client.patch(CONFIGMAPS, namespace=ns, name="p", body={"data": {"a": None, "c": "3"}})
    assert patched["data"] == {"b": "2", "c": "3"}
    stale = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "data": {"d": "4"}}
    with pytest.raises(Conflict) as conflict:
        await kube_client.patch(CONFIGMAPS, namespace=ns, name="p", body=stale)
    assert conflict.value.reason == "Conflict"


async def test_json_patch_with_a_failing_test_is_invalid(kube_client: KubeClient, ns: str):
    await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "j"}, "data": {"a": "1"}})
    ops = [{"op": "test", "path": "/data/a", "value": "1"}, {"op": "replace", "path": "/data/a", "value": "2"}]
    patched = await kube_client.patch(CONFIGMAPS, namespace=ns, name="j", body=ops, patch_type="json")
    assert patched["data"] == {"a": "2"}
    with pytest.raises(Invalid):
        await kube_client.patch(CONFIGMAPS, namespace=ns, name="j", body=ops, patch_type="json")


async def test_replace_needs_the_current_resource_version(kube_client: KubeClient, ns: str):
    created = await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "r"}})
    created["data"] = {"x": "y"}
    replaced = await kube_client.replace(CONFIGMAPS, namespace=ns, name="r", body=created)
    assert replaced["data"] == {"x": "y"}
    with pytest.raises(Conflict):
        await kube_client.replace(CONFIGMAPS, namespace=ns, name="r", body=created)


async def test_status_subresource_patch(kube_client: KubeClient, ns: str):
    pod = {"metadata": {"name": "pod"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}}
    await kube_client.create(PODS, namespace=ns, body=pod)
    patched = await kube_client.patch(PODS, namespace=ns, name="pod", subresource="status",
                                      body={"status": {"phase": "Running"}})
    assert patched["status"]["phase"] == "Running"


async def test_delete_with_preconditions(kube_client: KubeClient, ns: str):
    created = await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "d"}})
    with pytest.raises(Conflict, match="the UID in the precondition"):
        await kube_client.delete(CONFIGMAPS, namespace=ns, name="d", preconditions_uid="other")
    await kube_client.delete(CONFIGMAPS, namespace=ns, name="d", grace_period_seconds=0,
                             preconditions_uid=created["metadata"]["uid"])
    with pytest.raises(NotFound):
        await kube_client.get(CONFIGMAPS, namespace=ns, name="d")


async def test_watch_from_a_list_sees_later_changes_and_ends_at_the_timeout(kube_client: KubeClient, ns: str):
    mine = {"labels": {"watched": "yes"}}  # the namespace's controllers add ConfigMaps of their own meanwhile
    await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "before", **mine}})
    listed = await kube_client.list(CONFIGMAPS, namespace=ns, label_selector="watched")
    await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "after", **mine}})
    await kube_client.delete(CONFIGMAPS, namespace=ns, name="after")
    events = [event async for event in kube_client.watch(
        CONFIGMAPS, namespace=ns, label_selector="watched", resource_version=listed.resource_version,
        timeout_seconds=1)]
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [("ADDED", "after"), ("DELETED", "after")]
    assert all(isinstance(e, WatchEvent) for e in events)


async def test_watch_streams_live_events(kube_client: KubeClient, ns: str):
    seen: list[str] = []

    since = (await kube_client.list(CONFIGMAPS, namespace=ns)).resource_version

    async def consume() -> None:
        async for event in kube_client.watch(
            CONFIGMAPS, namespace=ns, field_selector="metadata.name=live", resource_version=since, timeout_seconds=5
        ):
            seen.append(f'{event.type}:{event.object["metadata"]["name"]}')
            if event.type == "DELETED":
                return

    task = asyncio.create_task(consume())  # it sees every change after `since`, however late it starts
    await kube_client.create(CONFIGMAPS, namespace=ns, body={"metadata": {"name": "live"}})
    await kube_client.patch(CONFIGMAPS, namespace=ns, name="live", body={"data": {"a": "b"}})
    await kube_client.delete(CONFIGMAPS, namespace=ns, name="live")
    await asyncio.wait_for(task, 5)
    assert seen == ["ADDED:live", "MODIFIED:live", "DELETED:live"]


async def test_a_list_read_a_page_at_a_time_sees_every_object_once(kube_client: KubeClient, ns: str):
    for index in range(7):
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"page-{index}", "labels": {"page": "y"}}}
        await kube_client.create(CONFIGMAPS, namespace=ns, body=body)
    pages = [page async for page in kube_client.list_pages(CONFIGMAPS, namespace=ns, limit=3, label_selector="page")]
    assert [len(page.items) for page in pages] == [3, 3, 1]
    assert sorted(item["metadata"]["name"] for page in pages for item in page.items) == [f"page-{i}" for i in range(7)]
    assert all(page.resource_version for page in pages)
