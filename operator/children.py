"""Make one child object match its desired manifest, writing only when it does not."""

from __future__ import annotations

import logging
from typing import Any

from rockbot.kube import errors
from rockbot.kube.client import KubeClient
from rockbot.kube.resources import Resource
from rockbot.operator.diffing import contains

K8sObject = dict[str, Any]
logger = logging.getLogger(__name__)


class ForeignOwner(Exception):
    """A same-named object exists but another controller owns it: we do not take it over."""


def _owned_by_other(live: K8sObject, desired: K8sObject) -> bool:
    ours = {ref["uid"] for ref in desired["metadata"].get("ownerReferences", [])}
    return any(
        ref.get("controller") and ref.get("uid") not in ours for ref in live["metadata"].get("ownerReferences", [])
    )


async def ensure(kube: KubeClient, resource: Resource, desired: K8sObject, *, create_only: bool = False) -> K8sObject:
    """Create the object, or merge-patch the fields that differ; a no-op when it already matches.

    `create_only` objects (generated secrets) are created once and never rewritten.
    """
    namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
    try:
        live = await kube.get(resource, namespace=namespace, name=name)
    except errors.NotFound:
        try:
            created = await kube.create(resource, namespace=namespace, body=desired)
            logger.info("created %s %s/%s", resource.kind, namespace, name)
            return created
        except errors.Conflict:  # created meanwhile (another reconcile, a person): compare with that one
            live = await kube.get(resource, namespace=namespace, name=name)
    if _owned_by_other(live, desired):
        raise ForeignOwner(
            f"{resource.kind} {namespace}/{name} exists and is controlled by another owner: "
            "delete or rename it so the operator can manage it"
        )
    if create_only or contains(live, _comparable(desired)):
        return live
    patch = {key: value for key, value in desired.items() if key not in {"apiVersion", "kind"}}
    patched = await kube.patch(resource, namespace=namespace, name=name, body=patch)
    logger.info("updated %s %s/%s to match its Agent", resource.kind, namespace, name)
    return patched


def _comparable(desired: K8sObject) -> K8sObject:
    """What must match: `stringData` is write-only (the server folds it into `data`)."""
    return {key: value for key, value in desired.items() if key != "stringData"}
