"""The API server's object semantics, independent of HTTP: create, read, update, patch, delete, collect garbage.

All methods are synchronous on purpose (see store.py): each request's effect is atomic.
The garbage collector runs a moment later (scheduled on the loop), as its controller does in a real
cluster: callers must not expect dependents gone on return. No client of the emulator sets finalizers
or deletes namespaces or CRDs (the real API server judges those, tests/kube_real): a delete removes the
object at once, and its dependents follow in the background.
"""

import asyncio
import base64
import copy
import json
import random
import re
import uuid
from typing import Any

import kmock

from tests.kubeapi import builtins, crds
from tests.kubeapi.clock import now
from tests.kubeapi.errors import (
    StatusError,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
    stale,
)
from tests.kubeapi.patching import apply_patch
from tests.kubeapi.registry import Registry, ResourceType
from tests.kubeapi.selectors import FieldSelector, LabelSelector
from tests.kubeapi.store import Obj, Store, Watcher

NAMESPACES = ("", "namespaces")
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_KINDS = {("", "namespaces")}
_DNS_1035_KINDS = {("", "services")}
_IMMUTABLE_META = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")


class ApiServer:
    """The objects and the rules that govern them."""

    def __init__(self, *, discovery: kmock.ResourcesArray, history_limit: int) -> None:
        self.registry = Registry(discovery=discovery)
        self.store = Store(history_limit=history_limit)
        self._gc_scheduled = False
        for name in ("default", "kube-system", "kube-public"):
            self._store_new(self.registry.get(NAMESPACES), {"metadata": {"name": name}})

    # ---- reading

    def get(self, rtype: ResourceType, *, namespace: str | None, name: str) -> Obj:
        obj = self.store.get(rtype.key, namespace, name)
        if obj is None:
            raise not_found(group=rtype.group, plural=rtype.plural, name=name)
        return obj

    def list_objects(
        self,
        rtype: ResourceType,
        *,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[list[Obj], str, str | None]:
        """Matching objects, the list's resourceVersion, and a continue token when `limit` cut the list."""
        matches = self.matcher(rtype, namespace=namespace, label_selector=label_selector,
                               field_selector=field_selector)
        items = [obj for obj in self.store.items(rtype.key, namespace) if matches(obj)]
        start = 0
        if continue_token:
            try:
                start = int(json.loads(base64.b64decode(continue_token))["start"])
            except (ValueError, KeyError, TypeError) as exc:
                raise bad_request("continue key is not valid: decode failed") from exc
        end = len(items) if limit is None or limit <= 0 else start + limit
        token = None
        if end < len(items):
            token = base64.b64encode(json.dumps({"start": end}).encode()).decode()
        return items[start:end], str(self.store.rv), token

    def matcher(
        self,
        rtype: ResourceType,
        *,
        namespace: str | None,
        label_selector: str | None,
        field_selector: str | None,
    ) -> Any:
        labels = LabelSelector(label_selector)
        fields = FieldSelector(field_selector, key=rtype.key)

        def matches(obj: Obj) -> bool:
            meta = obj["metadata"]
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and labels.matches(meta.get("labels"))
                and fields.matches(obj)
            )

        return matches

    def watch(self, watcher: Watcher, *, resource_version: str | None) -> list[tuple[str, Obj]]:
        """Subscribe; returns the events to send first (ADDED for current objects, or the replay)."""
        since = None if resource_version in (None, "", "0") else _parse_rv(resource_version)
        replay = self.store.subscribe(watcher, since=since)
        return [event for change in replay if (event := watcher.translate(change)) is not None]

    # ---- writing

    def create(self, rtype: ResourceType, *, version: str, namespace: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request("the body of a create must be a JSON object")
        obj = copy.deepcopy(body)
        self._check_type(rtype, version=version, obj=obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rtype.namespaced:
            if namespace is None:
                raise StatusError(code=404, reason="NotFound",
                                  message=f"{rtype.kind} is namespaced: create it under /namespaces/<name>/")
            if meta.get("namespace") not in (None, "", namespace):
                raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                                  "request")
            meta["namespace"] = namespace
            ns = self.store.get(NAMESPACES, None, namespace)
            if ns is None:
                raise not_found(group="", plural="namespaces", name=namespace)
        else:
            meta.pop("namespace", None)
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise invalid(kind=rtype.kind, group=rtype.group, name="",
                              causes=[("metadata.name", "FieldValueRequired",
                                       "Required value: name or generateName is required")])
            meta["name"] = meta["generateName"] + "".join(random.choices("bcdfghjklmnpqrstvwxz2456789", k=5))
        self._check_name(rtype, meta["name"])
        if self.store.get(rtype.key, meta.get("namespace"), meta["name"]) is not None:
            raise already_exists(group=rtype.group, plural=rtype.plural, name=meta["name"])
        for field in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                      "generation", "managedFields", "selfLink"):
            meta.pop(field, None)
        if rtype.has_status:
            obj.pop("status", None)
        self._admit(rtype, version=version, obj=obj, old=None)
        return self._store_new(rtype, obj)

    def _store_new(self, rtype: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        if rtype.tracks_generation:
            meta["generation"] = 1
        obj["apiVersion"] = rtype.api_version(rtype.versions[0])
        obj["kind"] = rtype.kind
        builtins.on_create(rtype, obj)
        stored = self.store.write(rtype.key, obj, type="ADDED")
        if rtype.key == CRDS:
            asyncio.get_running_loop().call_soon(self._establish, meta["name"])
        if meta.get("ownerReferences"):
            self.schedule_gc()
        return stored

    def replace(
        self,
        rtype: ResourceType,
        *,
        version: str,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None,
    ) -> Obj:
        """PUT: the body must carry the resourceVersion it was read at."""
        if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
            raise bad_request("the body of an update must be an object with metadata")
        if not body["metadata"].get("resourceVersion"):
            raise invalid(kind=rtype.kind, group=rtype.group, name=name,
                          causes=[("metadata.resourceVersion", "FieldValueInvalid",
                                   "Invalid value: 0x0: must be specified for an update")])
        old = self.get(rtype, namespace=namespace, name=name)
        return self._update(rtype, version=version, old=old, new=copy.deepcopy(body), subresource=subresource)

    def patch(
        self,
        rtype: ResourceType,
        *,
        version: str,
        namespace: str | None,
        name: str,
        content_type: str,
        patch: Any,
        subresource: str | None,
    ) -> Obj:
        old = self.get(rtype, namespace=namespace, name=name)
        new = apply_patch(content_type=content_type, target=self._render(rtype, version, old), patch=patch)
        if not isinstance(new.get("metadata"), dict):
            raise bad_request("a patch must not remove metadata")
        return self._update(rtype, version=version, old=old, new=new, subresource=subresource)

    def _update(self, rtype: ResourceType, *, version: str, old: Obj, new: Obj, subresource: str | None) -> Obj:
        old_meta, meta = old["metadata"], new["metadata"]
        name = old_meta["name"]
        if meta.get("resourceVersion") not in (None, "", old_meta["resourceVersion"]):
            raise stale(group=rtype.group, plural=rtype.plural, name=name)
        if meta.get("name", name) != name:
            raise bad_request(f"the name of the object ({meta.get('name')}) does not match the name on the URL "
                              f"({name})")
        if meta.get("namespace", old_meta.get("namespace")) != old_meta.get("namespace"):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the "
                              "request")
        if meta.get("uid", old_meta["uid"]) != old_meta["uid"]:
            raise invalid(kind=rtype.kind, group=rtype.group, name=name,
                          causes=[("metadata.uid", "FieldValueInvalid",
                                   f'Invalid value: "{meta.get("uid")}": field is immutable')])
        self._check_type(rtype, version=version, obj=new)
        if subresource == "status":
            # A status write changes .status only; the rest, metadata included, stays as it was.
            result = copy.deepcopy(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            if rtype.has_status:
                if "status" in old:
                    result["status"] = copy.deepcopy(old["status"])
                else:
                    result.pop("status", None)
        result["apiVersion"], result["kind"] = old["apiVersion"], old["kind"]
        result_meta = result["metadata"]
        result_meta["name"] = name
        if "namespace" in old_meta:
            result_meta["namespace"] = old_meta["namespace"]
        for field in _IMMUTABLE_META:
            if field in old_meta:
                result_meta[field] = old_meta[field]
            else:
                result_meta.pop(field, None)
        result_meta["resourceVersion"] = old_meta["resourceVersion"]
        result_meta.pop("managedFields", None)
        self._admit(rtype, version=version, obj=result, old=self._render(rtype, version, old))
        if rtype.tracks_generation and _spec_of(result, rtype) != _spec_of(old, rtype):
            result_meta["generation"] = old_meta.get("generation", 1) + 1
        if result == old:
            return old  # a no-op write: no new resourceVersion, no event
        stored = self.store.write(rtype.key, result, type="MODIFIED", old=old)
        if rtype.key == CRDS:
            asyncio.get_running_loop().call_soon(self._establish, name)
        if result_meta.get("ownerReferences") != old_meta.get("ownerReferences"):
            self.schedule_gc()
        return stored

    def bind(self, rtype: ResourceType, *, namespace: str, name: str, body: Any) -> Obj:
        """`pods/{name}/binding`, the scheduler's write: the pod's `spec.nodeName`, set once."""
        target = body.get("target") if isinstance(body, dict) else None
        node = target.get("name") if isinstance(target, dict) else None
        if not node:
            raise invalid(kind="Binding", group="", name=name,
                          causes=[("target.name", "FieldValueRequired", "Required value")])
        old = self.get(rtype, namespace=namespace, name=name)
        assigned = (old.get("spec") or {}).get("nodeName")
        if assigned:
            raise conflict(group=rtype.group, plural=rtype.plural, name=name,
                           why=f"pod {name} is already assigned to node \"{assigned}\"")
        bound = copy.deepcopy(old)
        bound["spec"]["nodeName"] = node
        return self.store.write(rtype.key, bound, type="MODIFIED", old=old)

    def delete(
        self,
        rtype: ResourceType,
        *,
        namespace: str | None,
        name: str,
        options: dict[str, Any],
    ) -> Obj:
        """Delete an object; returns its last state."""
        obj = self.get(rtype, namespace=namespace, name=name)
        meta = obj["metadata"]
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid") not in (None, meta["uid"]):
            raise conflict(group=rtype.group, plural=rtype.plural, name=name,
                           why=f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                               f"UID in object meta: {meta['uid']}")
        if preconditions.get("resourceVersion") not in (None, meta["resourceVersion"]):
            raise conflict(group=rtype.group, plural=rtype.plural, name=name,
                           why=f"Precondition failed: ResourceVersion in precondition: "
                               f"{preconditions['resourceVersion']}, ResourceVersion in object meta: "
                               f"{meta['resourceVersion']}")
        policy = options.get("propagationPolicy") or "Background"
        if policy != "Background" or options.get("orphanDependents") is True:
            raise bad_request(f'propagationPolicy: the emulator deletes dependents only in the background, not '
                              f'"{policy}": test other policies on the real API server (tests/kube_real)')
        if rtype.key in (NAMESPACES, CRDS):
            raise bad_request(f"the emulator does not delete {rtype.plural}: test that on the real API server")
        return self._remove(rtype, obj)

    def _remove(self, rtype: ResourceType, obj: Obj) -> Obj:
        final = self.store.remove(rtype.key, obj)
        self.schedule_gc()
        return final

    # ---- controllers of the control plane: the garbage collector

    def schedule_gc(self) -> None:
        if not self._gc_scheduled:
            self._gc_scheduled = True
            asyncio.get_running_loop().call_soon(self._collect_garbage)

    def _collect_garbage(self) -> None:
        self._gc_scheduled = False
        while self._gc_round():
            pass

    def _gc_round(self) -> bool:
        """One pass of the garbage collector; True if it changed anything."""
        changed = False
        live = {obj["metadata"]["uid"]: (key, obj) for key, obj in self.store.everything()}
        for key, obj in list(live.values()):
            refs = obj["metadata"].get("ownerReferences") or []
            if not refs:
                continue
            if self.store.get(key, obj["metadata"].get("namespace"), obj["metadata"]["name"]) is not obj:
                changed = True  # changed earlier in this round: look again in the next one
                continue
            solid = [ref for ref in refs if self._owner_present(ref, obj, live)]
            rtype = self.registry.get(key)
            if rtype is None:
                continue
            if not solid:
                self._remove(rtype, obj)
                changed = True
            elif len(solid) < len(refs):
                new = copy.deepcopy(obj)
                new["metadata"]["ownerReferences"] = solid
                self.store.write(key, new, type="MODIFIED", old=obj)
                changed = True
        return changed

    def _owner_present(self, ref: dict[str, Any], dependent: Obj, live: dict[str, tuple[Any, Obj]]) -> bool:
        found = live.get(ref.get("uid", ""))
        if found is None:
            return False
        owner_ns = found[1]["metadata"].get("namespace")
        return owner_ns is None or owner_ns == dependent["metadata"].get("namespace")

    def _establish(self, name: str) -> None:
        """The CRD controller's part: serve the resource and report the CRD Established."""
        crd = self.store.get(CRDS, None, name)
        if crd is None:
            return
        rtype = crds.resource_type(crd)
        self.registry.add(rtype)
        new = copy.deepcopy(crd)
        new["status"] = crds.established_status(crd)
        if new != crd:
            self.store.write(CRDS, new, type="MODIFIED", old=crd)

    # ---- admission

    def _admit(self, rtype: ResourceType, *, version: str, obj: Obj, old: Obj | None) -> None:
        """Defaulting and pruning, as the API server does before storing (validation: tests/kube_real)."""
        if rtype.custom:
            crds.admit(rtype, version=version, obj=obj)
        else:
            builtins.admit(rtype, obj=obj, old=old)

    def _check_type(self, rtype: ResourceType, *, version: str, obj: Obj) -> None:
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if api_version not in (None, rtype.api_version(version)) or kind not in (None, rtype.kind):
            raise bad_request(f"the API version in the data ({api_version}) / kind ({kind}) does not match the "
                              f"expected API version ({rtype.api_version(version)}) / kind ({rtype.kind})")

    def _check_name(self, rtype: ResourceType, name: str) -> None:
        if rtype.key in _DNS_1035_KINDS:  # a Service name becomes a DNS label that must not start with a digit
            ok, limit = bool(_DNS_1035_LABEL.match(name)), 63
            rule = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
                    "alphabetic character, and end with an alphanumeric character")
        elif rtype.key in _DNS_LABEL_KINDS:
            ok, limit = bool(_DNS_LABEL.match(name)), 63
            rule = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
                    "must start and end with an alphanumeric character")
        else:
            ok, limit = bool(_DNS_SUBDOMAIN.match(name)), 253
            rule = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
                    "'.', and must start and end with an alphanumeric character")
        if not ok or len(name) > limit:
            raise invalid(kind=rtype.kind, group=rtype.group, name=name,
                          causes=[("metadata.name", "FieldValueInvalid",
                                   f'Invalid value: "{name}": {rule} (at most {limit} characters)')])

    def _render(self, rtype: ResourceType, version: str, obj: Obj) -> Obj:
        return render(rtype, version, obj)


def render(rtype: ResourceType, version: str, obj: Obj) -> Obj:
    """The object as served at the requested version (storage is version-agnostic: no conversion)."""
    out = copy.deepcopy(obj)
    out["apiVersion"] = rtype.api_version(version)
    return out


def _spec_of(obj: Obj, rtype: ResourceType) -> Obj:
    """What a change of bumps `generation`: all but metadata (and status when it is a subresource)."""
    skip = {"metadata", "apiVersion", "kind"} | ({"status"} if rtype.has_status else set())
    return {key: value for key, value in obj.items() if key not in skip}


def _parse_rv(value: str) -> int:
    try:
        return int(value)
    except ValueError as exc:
        raise bad_request(f'resourceVersion: Invalid value: "{value}": must be an integer') from exc
