"""Make one child object match its desired manifest, writing only when it does not."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from rockbot.kube import errors
from rockbot.kube.client import KubeClient
from rockbot.kube.resources import Resource
from rockbot.operator.diffing import contains

K8sObject = dict[str, Any]
logger = logging.getLogger(__name__)


class ForeignOwner(Exception):
    """A same-named object exists but another controller owns it: we do not take it over."""


def _owned_by_other(live: K8sObject, metadata: K8sObject) -> bool:
    ours = {ref["uid"] for ref in metadata.get("ownerReferences", [])}
    return any(
        ref.get("controller") and ref.get("uid") not in ours for ref in live["metadata"].get("ownerReferences", [])
    )


async def _fetch_or_create(
    kube: KubeClient, resource: Resource, *, namespace: str, name: str, build: Callable[[], K8sObject]
) -> tuple[K8sObject, bool]:
    """The live object and False, or the object `build()` made and True when it had to be created."""
    try:
        return await kube.get(resource, namespace=namespace, name=name), False
    except errors.NotFound:
        pass
    try:
        created = await kube.create(resource, namespace=namespace, body=build())
    except errors.Conflict:  # created meanwhile (another reconcile, a person): compare with that one
        return await kube.get(resource, namespace=namespace, name=name), False
    logger.info("created %s %s/%s", resource.kind, namespace, name)
    return created, True


def _check_owner(resource: Resource, live: K8sObject, metadata: K8sObject) -> None:
    if _owned_by_other(live, metadata):
        raise ForeignOwner(
            f"{resource.kind} {metadata['namespace']}/{metadata['name']} exists and is controlled by another owner: "
            "delete or rename it so the operator can manage it"
        )


async def ensure(kube: KubeClient, resource: Resource, desired: K8sObject) -> K8sObject:
    """Create the object, or merge-patch the fields that differ; a no-op when it already matches."""
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    live, created = await _fetch_or_create(kube, resource, namespace=namespace, name=name, build=lambda: desired)
    if created:
        return live
    _check_owner(resource, live, desired["metadata"])
    if contains(live, desired):
        return live
    patch = {key: value for key, value in desired.items() if key not in {"apiVersion", "kind"}}
    patched = await kube.patch(resource, namespace=namespace, name=name, body=patch)
    logger.info("updated %s %s/%s to match its Agent", resource.kind, namespace, name)
    return patched


async def ensure_created(
    kube: KubeClient, resource: Resource, *, metadata: K8sObject, build: Callable[[], K8sObject]
) -> K8sObject:
    """Create the object once and never rewrite it (generated secrets): `build` runs only to create it.

    `metadata` is the object's desired metadata (name, namespace, owner), known without building it.
    """
    live, created = await _fetch_or_create(
        kube, resource, namespace=metadata["namespace"], name=metadata["name"], build=build
    )
    if not created:
        _check_owner(resource, live, metadata)
    return live
