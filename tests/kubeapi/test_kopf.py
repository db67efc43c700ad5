"""kopf really works against the emulator: discovery, watches, merge patches, finalizers, events."""

import asyncio
import threading

import kopf
import pytest

from rockbot.kube import EVENTS, KubeClient, NotFound, Resource
from tests.fixtures.kubeapi import apply_crd, run_kopf

WIDGETS = Resource(group="kopf.example.com", version="v1", plural="widgets", kind="Widget")
WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.kopf.example.com"},
    "spec": {
        "group": "kopf.example.com",
        "names": {"kind": "Widget", "plural": "widgets", "singular": "widget"},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1",
            "served": True,
            "storage": True,
            "subresources": {"status": {}},
            "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            }},
        }],
    },
}


async def wait_for(predicate, *, within: float = 10.0) -> None:
    async with asyncio.timeout(within):
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)


@pytest.fixture
def widget_registry() -> tuple[kopf.OperatorRegistry, list[tuple[str, int | None]], threading.Lock]:
    registry = kopf.OperatorRegistry()
    calls: list[tuple[str, int | None]] = []
    lock = threading.Lock()

    @kopf.on.create("kopf.example.com", "v1", "widgets", registry=registry, id="created")
    def created(body, spec, **_):
        with lock:
            calls.append(("create", spec.get("size")))
        kopf.info(body, reason="Created", message="the widget was seen")
        return {"seen": spec.get("size")}

    @kopf.on.update("kopf.example.com", "v1", "widgets", registry=registry)
    def updated(spec, **_):
        with lock:
            calls.append(("update", spec.get("size")))

    @kopf.on.delete("kopf.example.com", "v1", "widgets", registry=registry)
    def deleted(spec, **_):
        with lock:
            calls.append(("delete", spec.get("size")))

    return registry, calls, lock


async def test_kopf_handles_create_update_and_delete_with_its_finalizer(kube_api, kube_client: KubeClient,
                                                                        widget_registry):
    registry, calls, lock = widget_registry
    await apply_crd(kube_client, WIDGET_CRD)
    async with run_kopf(registry=registry, namespaces=["default"]):
        await kube_client.create(WIDGETS, namespace="default", body={"metadata": {"name": "w"}, "spec": {"size": 1}})
        await wait_for(lambda: ("create", 1) in calls)

        # kopf adds its finalizer (a JSON patch with a `test` op) and records the result in the status.
        async with asyncio.timeout(10):
            while True:
                widget = await kube_client.get(WIDGETS, namespace="default", name="w")
                if widget["metadata"].get("finalizers") and (widget.get("status") or {}).get("created"):
                    break
                await asyncio.sleep(0.02)
        assert widget["status"]["created"] == {"seen": 1}

        await kube_client.patch(WIDGETS, namespace="default", name="w", body={"spec": {"size": 2}})
        await wait_for(lambda: ("update", 2) in calls)

        await kube_client.delete(WIDGETS, namespace="default", name="w")
        await wait_for(lambda: ("delete", 2) in calls)
        async with asyncio.timeout(10):
            while True:
                try:
                    await kube_client.get(WIDGETS, namespace="default", name="w")
                except NotFound:
                    break
                await asyncio.sleep(0.02)

        # kopf posted the handler's event about the object.
        async with asyncio.timeout(10):
            while True:
                events = await kube_client.list(EVENTS, namespace="default",
                                                field_selector="involvedObject.name=w")
                if events.items:
                    break
                await asyncio.sleep(0.05)
    assert [(e["reason"], e["message"]) for e in events.items] == [("Created", "the widget was seen")]
    with lock:
        kinds = [kind for kind, _ in calls]
    assert kinds == ["create", "update", "delete"]
    assert not [r for r in kube_api.requests if r.method.value.upper() == "PATCH" and "strategic" in
                r.headers.get("Content-Type", "")]
