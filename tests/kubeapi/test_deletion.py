"""Deletion: at once, dependents garbage-collected through ownerReferences; the rest on the real server."""

import asyncio

from tests.kubeapi.http import CM, call


async def eventually_gone(kube_api, path: str) -> None:
    async with asyncio.timeout(5):
        while True:
            if (await call(kube_api, "GET", path))[0] == 404:
                return
            await asyncio.sleep(0.01)


def owned_by(*owners: dict) -> list[dict]:
    return [{"apiVersion": "v1", "kind": "ConfigMap", "name": o["metadata"]["name"], "uid": o["metadata"]["uid"]}
            for o in owners]


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


async def test_what_only_the_real_server_does_is_refused_clearly(kube_api):
    """Other propagation policies and namespace deletion: tests/kube_real has them on the real API server."""
    await call(kube_api, "POST", CM, {"metadata": {"name": "owner"}})
    for policy in ("Foreground", "Orphan"):
        status, body = await call(kube_api, "DELETE", f"{CM}/owner", {"propagationPolicy": policy})
        assert status == 400 and "real API server" in body["message"], body
    status, body = await call(kube_api, "DELETE", "/api/v1/namespaces/default")
    assert status == 400 and "real API server" in body["message"], body
