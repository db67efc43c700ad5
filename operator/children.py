"""The children the operator owns, as its watches last saw them, and making one match its desired manifest.

Children are known from watches (labelled `app.kubernetes.io/managed-by`), not read back with a GET
on every reconcile: each is kept as compact JSON (no status, resourceVersion or managedFields) with its
resourceVersion, its controller and, for a Deployment, the status figures Ready is made of. A
reconcile compares the desired manifest with that copy and writes only the difference; what the
write answers replaces the copy at once.

The comparison is containment (`diffing.contains`): every field we set must be in the live object
with an equal value, as the API server returns it. What the server adds (defaults, others' labels
and annotations) is no difference, quantities compare by value (`0.5` is stored as `500m`), and
kind and apiVersion are known from the resource, never compared: the items of a real server's list
carry neither (a watch event and a GET do), so comparing them made every child differ after a
restart (800 patches of unchanged objects at 200 Agents). tests/operator/test_children_real.py
proves on a real API server that what the builders make compares equal however it is read back.

Why merge patches and containment rather than server-side apply: a no-op reconcile must make no
request at all, so a local comparison is needed either way (an apply that changes nothing is still
a request), and containment is the one that needs no schema knowledge to ignore what the server
adds. What that costs: a key we stop setting (say an Agent's `resources.limits`) is no difference
by itself; it goes at the next write, since a merge patch replaces a list (the containers) whole.
A map only we may fill is compared exactly (`EXACT_FIELDS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rockbot.kube import errors
from rockbot.kube.client import KubeClient
from rockbot.kube.resources import CONFIGMAPS, Resource
from rockbot.operator.diffing import contains

K8sObject = dict[str, Any]
Key = tuple[str, str, str]  # (plural, namespace, name)
logger = logging.getLogger(__name__)

#: Fields a child holds only what we put there: a stranger's keys in an adopted ConfigMap are removed.
EXACT_FIELDS: dict[str, tuple[str, ...]] = {CONFIGMAPS.plural: ("data", "binaryData")}


#: Metadata that changes with every write, status included: not content a desired manifest is compared with.
_VOLATILE = {"resourceVersion", "managedFields"}
#: Known from the resource (a list's items lack them), or not content: never compared.
_IDENTITY = {"apiVersion", "kind", "status"}
#: A controller's bookkeeping on our children, written just after we create them: no news for their Agent.
_BOOKKEEPING = {"deployment.kubernetes.io/revision"}


class ForeignOwner(Exception):
    """A same-named object exists but another controller owns it: we do not take it over."""


@dataclass(frozen=True, slots=True)
class Rollout:
    """A Deployment's progress, as its controller reports it: what Ready is computed from."""

    generation: int
    observed_generation: int
    updated: int
    ready: int

    @classmethod
    def of(cls, deployment: K8sObject) -> Rollout:
        status = deployment.get("status") or {}
        return cls(
            generation=int(deployment["metadata"].get("generation") or 0),
            observed_generation=int(status.get("observedGeneration") or 0),
            updated=int(status.get("updatedReplicas") or 0),
            ready=int(status.get("readyReplicas") or 0),
        )


@dataclass(frozen=True, slots=True)
class Child:
    namespace: str
    resource_version: str
    controller: str | None  # the uid of the controlling owner
    owner: str | None  # the name of the controlling Agent
    content: bytes  # the object as JSON, without status, resourceVersion and managedFields
    rollout: Rollout | None  # Deployments only
    awaiting_echo: bool  # this came from our own write; its watch event has not arrived yet

    @classmethod
    def of(cls, resource: Resource, body: K8sObject, *, awaiting_echo: bool = False) -> Child:
        metadata = body["metadata"]
        controller = next((ref for ref in metadata.get("ownerReferences") or [] if ref.get("controller")), {})
        content = {key: value for key, value in body.items() if key not in _IDENTITY}
        content["metadata"] = {key: value for key, value in metadata.items() if key not in _VOLATILE}
        annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k not in _BOOKKEEPING}
        if annotations:
            content["metadata"]["annotations"] = annotations
        else:
            content["metadata"].pop("annotations", None)
        return cls(
            namespace=metadata["namespace"],
            resource_version=str(metadata.get("resourceVersion", "")),
            controller=controller.get("uid"),
            owner=controller.get("name") if controller.get("kind") == "Agent" else None,
            content=json.dumps(content, separators=(",", ":")).encode(),
            rollout=Rollout.of(body) if resource.kind == "Deployment" else None,
            awaiting_echo=awaiting_echo,
        )

    def body(self) -> K8sObject:
        return json.loads(self.content)


class Children:
    """What the watches show of every child, by (plural, namespace, name)."""

    def __init__(self) -> None:
        self._items: dict[Key, Child] = {}
        #: For each write in flight, the resourceVersions the watch delivered meanwhile.
        self._writing: dict[Key, set[str]] = {}
        #: Called with a child that changed while we wrote it (the watch showed more than our write), and whether
        #: only its status did (a Deployment's controller reporting on the write: news for its owner's status only).
        self.on_news: Callable[[Child, bool], None] | None = None

    def get(self, resource: Resource, namespace: str, name: str) -> Child | None:
        return self._items.get((resource.plural, namespace, name))

    def seen(self, resource: Resource, body: K8sObject, *, listed: bool = False) -> bool:
        """Take a watched object; whether it is news (not the echo of our own write, nor older than it)."""
        metadata = body["metadata"]
        key = (resource.plural, metadata["namespace"], metadata["name"])
        held = self._items.get(key)
        version = str(metadata.get("resourceVersion", ""))
        if key in self._writing:  # our own write's echo, most likely: its answer decides (see `writing`)
            self._writing[key].add(version)
            if held is None or not held.awaiting_echo:
                self._items[key] = Child.of(resource, body)
            return False
        if held is not None and held.resource_version == version:
            if held.awaiting_echo:  # the echo of the answer we keep: the same object, no need to take it again
                self._items[key] = dataclasses.replace(held, awaiting_echo=False)
            return False
        if held is not None and held.awaiting_echo and not listed:
            return False  # older than our write, whose echo is still on its way
        child = self._items[key] = Child.of(resource, body)
        # A status change that does not move the rollout (conditions' times...) concerns nobody.
        return held is None or (held.content, held.rollout, held.controller) != (child.content, child.rollout,
                                                                                 child.controller)

    @contextlib.contextmanager
    def writing(self, resource: Resource, namespace: str, name: str) -> Iterator[Callable[[K8sObject], Child]]:
        """Around our own create or patch: yields the function that takes the API server's answer.

        The watch may show the write (and later changes) before its answer arrives: then what the
        watch showed is kept, being as new or newer; else the answer is, until its echo arrives.
        """
        key = (resource.plural, namespace, name)
        delivered = self._writing[key] = set()

        def record(answer: K8sObject) -> Child:
            version = str(answer["metadata"].get("resourceVersion", ""))
            held = self._items.get(key)
            news = bool(delivered - {version}) and held is not None and self.on_news is not None
            if held is not None and version in delivered and not news:
                return held  # the watch showed our write already, and nothing since: nothing to take from the answer
            answered = Child.of(resource, answer, awaiting_echo=True)
            if news:  # someone else changed it too, meanwhile: its owner must look again
                assert held is not None and self.on_news is not None
                self.on_news(held, (held.content, held.controller) == (answered.content, answered.controller))
            if held is not None and version in delivered:
                return held
            self._items[key] = answered
            return answered

        try:
            yield record
        finally:
            self._writing.pop(key, None)

    def has_any(self, namespace: str, name: str, *, kinds: tuple[Resource, ...]) -> bool:
        """Whether a child of one of these kinds is named `name` in `namespace`."""
        return any((kind.plural, namespace, name) in self._items for kind in kinds)

    def forget(self, resource: Resource, namespace: str, name: str) -> None:
        self._items.pop((resource.plural, namespace, name), None)

    def __len__(self) -> int:
        return len(self._items)


def _check_owner(resource: Resource, controller: str | None, metadata: K8sObject) -> None:
    ours = {ref["uid"] for ref in metadata.get("ownerReferences", [])}
    if controller is not None and controller not in ours:
        raise ForeignOwner(
            f"{resource.kind} {metadata['namespace']}/{metadata['name']} exists and is controlled by another owner: "
            "delete or rename it so the operator can manage it"
        )


def _differs(resource: Resource, live: K8sObject, desired: K8sObject) -> bool:
    if not contains(live, {key: value for key, value in desired.items() if key not in _IDENTITY}):
        return True
    return any(live.get(field) != desired.get(field) for field in EXACT_FIELDS.get(resource.plural, ()))


def _patch(resource: Resource, live: K8sObject, desired: K8sObject) -> K8sObject:
    """A merge patch to the desired manifest; keys of exact fields that we did not put there are removed."""
    patch = {key: value for key, value in desired.items() if key not in {"apiVersion", "kind"}}
    for field in EXACT_FIELDS.get(resource.plural, ()):
        strangers = {key: None for key in live.get(field) or {} if key not in (desired.get(field) or {})}
        if strangers:
            patch[field] = strangers | (desired.get(field) or {})
    return patch


async def ensure(kube: KubeClient, children: Children, resource: Resource, desired: K8sObject) -> Child:
    """Create the object, or merge-patch what differs; no request at all when the watched copy matches."""
    metadata = desired["metadata"]
    namespace, name = metadata["namespace"], metadata["name"]
    held = children.get(resource, namespace, name)
    if held is None:
        with children.writing(resource, namespace, name) as record:
            try:
                created = await kube.create(resource, namespace=namespace, body=desired)
            except errors.Conflict:  # the name is taken by an object our watch does not show (or not yet)
                held = Child.of(resource, await kube.get(resource, namespace=namespace, name=name))
            else:
                logger.debug("created %s %s/%s", resource.kind, namespace, name)  # what the Agent asked for: no news
                return record(created)
    _check_owner(resource, held.controller, metadata)
    live = held.body()
    if not _differs(resource, live, desired):
        return held
    with children.writing(resource, namespace, name) as record:
        patched = await kube.patch(resource, namespace=namespace, name=name, body=_patch(resource, live, desired))
        logger.info("updated %s %s/%s to match its Agent", resource.kind, namespace, name)
        return record(patched)


async def ensure_created(
    kube: KubeClient,
    resource: Resource,
    *,
    metadata: K8sObject,
    build: Callable[[], K8sObject],
    likely_new: bool = False,
) -> K8sObject:
    """Create the object once and never rewrite it (generated secrets): `build` runs only to create it.

    Read first (these are not watched): on a restart the object exists, and a create refused with
    409 would still be a write. When it is `likely_new` (an Agent none of whose children exist yet),
    created first and read only if that create is refused: a new Agent costs no read. An object the
    Agent does not control is refused, never adopted: a token someone else chose must not guard the agent.
    """
    namespace, name = metadata["namespace"], metadata["name"]
    live = None if likely_new else await _read(kube, resource, namespace=namespace, name=name)
    if live is None:
        try:
            created = await kube.create(resource, namespace=namespace, body=build())
        except errors.Conflict:  # there already (or created meanwhile): use that one, if it is ours
            live = await kube.get(resource, namespace=namespace, name=name)
        else:
            logger.debug("created %s %s/%s", resource.kind, namespace, name)
            return created
    controller = Child.of(resource, live).controller
    ours = {ref["uid"] for ref in metadata.get("ownerReferences", [])}
    if controller not in ours:
        raise ForeignOwner(
            f"{resource.kind} {namespace}/{name} exists and is not controlled by this Agent: "
            "delete it so the operator can generate its own"
        )
    return live


async def _read(kube: KubeClient, resource: Resource, *, namespace: str, name: str) -> K8sObject | None:
    try:
        return await kube.get(resource, namespace=namespace, name=name)
    except errors.NotFound:
        return None
