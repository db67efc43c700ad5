"""Deletion: finalizers, garbage collection through ownerReferences, namespaces."""

import asyncio

from tests.kubeapi.http import CM, JSON_PATCH, MERGE, call


async def eventually_gone(kube_api, path: str) -> None:
    async with asyncio.timeout(5):
        while True:
            if (await call(kube_api, "GET", path))[0] == 404:
                return
            await asyncio.sleep(0.01)


def owned_by(*owners: dict) -> list[dict]:
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}
            for o in owners]


async def test_finalizers_hold_the_object_until_the_last_is_removed(kube_api):
    await call(kube_api, "POST", CM, {"metadata": {"name": "f", "finalizers": ["a.example.com/x", "b.example.com/y"]}})
    status, deleting = await call(kube_api, "DELETE", f"{CM}/f")
    assert status == 202 and deleting["metadata"]["deletionTimestamp"]
    status, body = await call(kube_api, "PATCH", f"{CM}/f",
                              {"metadata": {"finalizers": ["a.example.com/x", "b.example.com/y", "c.example.com/z"]}},
                              content_type=MERGE)
    assert status == 422 and "no new finalizers" in body["message"]
    rv = deleting["metadata"]["resourceVersion"]
    ops = [{"op": "test", "path": "/metadata/resourceVersion", "value": rv},
           {"op": "replace", "path": "/metadata/finalizers", "value": ["b.example.com/y"]}]
    status, _ = await call(kube_api, "PATCH", f"{CM}/f", ops, content_type=JSON_PATCH)
    assert status == 200
    assert (await call(kube_api, "GET", f"{CM}/f"))[0] == 200
    await call(kube_api, "PATCH", f"{CM}/f", {"metadata": {"finalizers": None}}, content_type=MERGE)
    assert (await call(kube_api, "GET", f"{CM}/f"))[0] == 404


async def test_background_deletion_cascades_to_dependents(kube_api):
    _, owner = await call(kube_api, "POST", CM, {"metadata": {"name": "owner"}})
    _, other = await call(kube_api, "POST", CM, {"metadata": {"name": "other"}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "child", "ownerReferences": owned_by(owner)}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "shared", "ownerReferences": owned_by(owner, other)}})
    status, _ = await call(kube_api, "DELETE", f"{CM}/owner")
    assert status == 200
    await eventually_gone(kube_api, f"{CM}/child")
    _, shared = await call(kube_api, "GET", f"{CM}/shared")
    assert [ref["name"] for ref in shared["metadata"]["ownerReferences"]] == ["other"]


async def test_foreground_deletion_removes_dependents_first(kube_api):
    _, owner = await call(kube_api, "POST", CM, {"metadata": {"name": "owner"}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "child", "ownerReferences": owned_by(owner)}})
    status, deleting = await call(kube_api, "DELETE", f"{CM}/owner", {"propagationPolicy": "Foreground"})
    assert status == 202 and "foregroundDeletion" in deleting["metadata"]["finalizers"]
    await eventually_gone(kube_api, f"{CM}/owner")
    assert (await call(kube_api, "GET", f"{CM}/child"))[0] == 404


async def test_orphan_deletion_strips_the_references(kube_api):
    _, owner = await call(kube_api, "POST", CM, {"metadata": {"name": "owner"}})
    _, witness = await call(kube_api, "POST", CM, {"metadata": {"name": "witness"}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "child", "ownerReferences": owned_by(owner)}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "collected", "ownerReferences": owned_by(witness)}})
    await call(kube_api, "DELETE", f"{CM}/owner", {"propagationPolicy": "Orphan"})
    await call(kube_api, "DELETE", f"{CM}/witness")
    await eventually_gone(kube_api, f"{CM}/collected")  # the collector has run since the orphaning delete
    status, child = await call(kube_api, "GET", f"{CM}/child")
    assert status == 200 and "ownerReferences" not in child["metadata"]


async def test_deleting_a_namespace_deletes_its_content(kube_api):
    await call(kube_api, "POST", "/api/v1/namespaces", {"metadata": {"name": "team"}})
    await call(kube_api, "POST", "/api/v1/namespaces/team/configmaps", {"metadata": {"name": "c"}})
    status, ns = await call(kube_api, "DELETE", "/api/v1/namespaces/team")
    assert status == 202 and ns["status"]["phase"] == "Terminating"
    status, body = await call(kube_api, "POST", "/api/v1/namespaces/team/configmaps", {"metadata": {"name": "d"}})
    assert status in (403, 404), body
    await eventually_gone(kube_api, "/api/v1/namespaces/team")
    assert (await call(kube_api, "GET", "/api/v1/namespaces/team/configmaps/c"))[0] == 404
