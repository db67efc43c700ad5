"""kopf really works against the emulator: discovery, watches, merge patches, finalizers, events."""

import threading

import kopf
import pytest

from rockbot.kube import EVENTS, KubeClient, NotFound, Resource
from tests.fixtures.kubeapi import apply_crd, run_kopf
from tests.waiting import eventually

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


async def called(calls: list[tuple[str, int | None]], call: tuple[str, int | None]) -> None:
    assert call in calls


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
        await eventually(lambda: called(calls, ("create", 1)))

        # kopf adds its finalizer (a JSON patch with a `test` op) and records the result in the status.
        async def finalized_and_recorded() -> None:
            widget = await kube_client.get(WIDGETS, namespace="default", name="w")
            assert widget["metadata"]["finalizers"]
            assert widget["status"]["created"] == {"seen": 1}

        await eventually(finalized_and_recorded)

        await kube_client.patch(WIDGETS, namespace="default", name="w", body={"spec": {"size": 2}})
        await eventually(lambda: called(calls, ("update", 2)))

        await kube_client.delete(WIDGETS, namespace="default", name="w")
        await eventually(lambda: called(calls, ("delete", 2)))

        async def gone() -> None:
            try:
                await kube_client.get(WIDGETS, namespace="default", name="w")
            except NotFound:
                return
            raise AssertionError("the widget is still there: its finalizer was not removed")

        await eventually(gone)

        # kopf posted the handler's event about the object.
        async def posted():
            events = await kube_client.list(EVENTS, namespace="default", field_selector="involvedObject.name=w")
            assert events.items
            return events

        events = await eventually(posted)
    assert [(e["reason"], e["message"]) for e in events.items] == [("Created", "the widget was seen")]
    with lock:
        kinds = [kind for kind, _ in calls]
    assert kinds == ["create", "update", "delete"]
    assert not [r for r in kube_api.requests if r.method.value.upper() == "PATCH" and "strategic" in
                r.headers.get("Content-Type", "")]
