"""CustomResourceDefinitions: serving what they declare, pruning unknown fields and applying defaults.

Validation (the OpenAPI schema, CEL rules, the CRD itself) is not emulated: tests of what the API
server refuses run against the real one (tests/kube_real). The emulator stores what is well formed.
"""

import copy
from typing import Any

from tests.kubeapi.clock import now
from tests.kubeapi.registry import ResourceType


def resource_type(crd: dict[str, Any]) -> ResourceType:
    """The resource a (validated) CRD serves."""
    spec = crd["spec"]
    names = spec["names"]
    versions = [v for v in spec["versions"] if v.get("served", True)]
    subresources: set[str] = set()
    for version in versions:
        subresources |= set((version.get("subresources") or {}).keys())
    return ResourceType(
        group=spec["group"],
        versions=[v["name"] for v in versions],
        plural=names["plural"],
        kind=names["kind"],
        singular=names.get("singular") or names["kind"].lower(),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        subresources=subresources & {"status"},
        short_names=set(names.get("shortNames") or []),
        categories=set(names.get("categories") or []),
        custom=True,
        schemas={v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or {} for v in versions},
    )


def established_status(crd: dict[str, Any]) -> dict[str, Any]:
    """The status the CRD controllers write once names are accepted; stable across calls."""
    spec = crd["spec"]
    names = dict(spec["names"])
    names.setdefault("singular", names["kind"].lower())
    names.setdefault("listKind", names["kind"] + "List")
    old = {c["type"]: c for c in (crd.get("status") or {}).get("conditions") or []}
    conditions = []
    for type_, reason, message in (
        ("NamesAccepted", "NoConflicts", "no conflicts found"),
        ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
    ):
        since = old.get(type_, {}).get("lastTransitionTime") or now()
        conditions.append({"type": type_, "status": "True", "reason": reason, "message": message,
                           "lastTransitionTime": since})
    storage = [v["name"] for v in spec["versions"] if v.get("storage")]
    stored = list((crd.get("status") or {}).get("storedVersions") or [])
    return {"conditions": conditions, "acceptedNames": names,
            "storedVersions": stored + [v for v in storage if v not in stored]}


# ---- admitting custom resources


def admit(rtype: ResourceType, *, version: str, obj: dict[str, Any]) -> None:
    """Prune unknown fields and apply defaults to `obj` in place, as the API server does before storing."""
    schema = rtype.schemas.get(version) or {}
    for key in list(obj):
        if key in ("apiVersion", "kind", "metadata"):
            continue
        sub = (schema.get("properties") or {}).get(key)
        unknown = sub is None and not schema.get("x-kubernetes-preserve-unknown-fields")
        if unknown or (obj[key] is None and not (sub or {}).get("nullable")):
            del obj[key]
        elif sub is not None:
            obj[key] = _prune(sub, obj[key])
    _default(schema, obj, top=True)


def _prune(schema: dict[str, Any], value: Any) -> Any:
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields")
        embedded = schema.get("x-kubernetes-embedded-resource")
        result = {}
        for key, item in value.items():
            sub = properties.get(key)
            if sub is None and isinstance(additional, dict):
                sub = additional
            if sub is None:
                if preserve or additional is True or (embedded and key in ("apiVersion", "kind", "metadata")):
                    result[key] = item
                continue
            if item is None and not sub.get("nullable"):
                continue
            result[key] = _prune(sub, item)
        return result
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune(schema["items"], item) for item in value]
    return value


def _default(schema: dict[str, Any], value: Any, *, top: bool = False) -> None:
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if top and key == "metadata":
                continue
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default(sub, value[key])
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key, item in value.items():
                if key not in (schema.get("properties") or {}):
                    _default(additional, item)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)
