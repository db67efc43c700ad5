"""CustomResourceDefinitions: serving what they declare, and admitting custom resources by their schemas.

Admission follows the API server's order: drop non-nullable nulls and prune unknown fields,
apply `default`s, then validate with the OpenAPI schema (via `jsonschema`) and the
`x-kubernetes-validations` CEL rules (via `cel-python`). Messages are worded as the real
server words them: `Agent.rockbot.dev "x" is invalid: spec.model.name: Required value`.
"""

import copy
import functools
import json
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema
from celpy import celtypes

from tests.kubeapi.clock import now
from tests.kubeapi.errors import invalid
from tests.kubeapi.registry import Registry, ResourceType

CLEANUP_FINALIZER = "customresourcecleanup.apiextensions.k8s.io"
_BUILTIN_GROUPS = {"", "apps", "batch", "policy", "networking.k8s.io", "apiextensions.k8s.io", "events.k8s.io",
                   "coordination.k8s.io", "rbac.authorization.k8s.io", "storage.k8s.io"}

Cause = tuple[str, str, str]  # (field path, reason, message)


def served_key(crd: dict[str, Any]) -> tuple[str, str]:
    spec = crd.get("spec") or {}
    return (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))


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


# ---- validating the CRD itself


def validate_crd(crd: dict[str, Any], *, registry: Registry, name: str) -> None:
    causes: list[Cause] = []
    spec = crd.get("spec")
    if not isinstance(spec, dict):
        raise invalid(kind="CustomResourceDefinition", group="apiextensions.k8s.io", name=name,
                      causes=[("spec", "FieldValueRequired", "Required value")])
    group = spec.get("group") or ""
    names = spec.get("names") or {}
    if not group or "." not in group:
        causes.append(("spec.group", "FieldValueInvalid", f'Invalid value: "{group}": should be a domain with at '
                                                          "least one dot"))
    elif group in _BUILTIN_GROUPS or group.endswith(".k8s.io"):
        causes.append(("spec.group", "FieldValueInvalid", f'Invalid value: "{group}": is a built-in API group'))
    for field in ("plural", "kind"):
        if not names.get(field):
            causes.append((f"spec.names.{field}", "FieldValueRequired", "Required value"))
    if names.get("plural") and group and name != f"{names['plural']}.{group}":
        causes.append(("metadata.name", "FieldValueInvalid",
                       f'Invalid value: "{name}": must be spec.names.plural+"."+spec.group'))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(("spec.scope", "FieldValueNotSupported",
                       f'Unsupported value: "{spec.get("scope")}": supported values: "Cluster", "Namespaced"'))
    versions = spec.get("versions") or []
    if not versions or sum(bool(v.get("storage")) for v in versions) != 1:
        causes.append(("spec.versions", "FieldValueInvalid", "Invalid value: must have exactly one version "
                                                              "marked as storage version"))
    for index, version in enumerate(versions):
        path = f"spec.versions[{index}]"
        if not version.get("name"):
            causes.append((f"{path}.name", "FieldValueRequired", "Required value"))
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(schema, dict):
            causes.append((f"{path}.schema.openAPIV3Schema", "FieldValueRequired",
                           "Required value: schemas are required"))
            continue
        if schema.get("type") != "object":
            causes.append((f"{path}.schema.openAPIV3Schema.type", "FieldValueInvalid",
                           'Invalid value: must be "object" at the root'))
        try:
            jsonschema.Draft4Validator.check_schema(_to_jsonschema(schema))
        except jsonschema.SchemaError as exc:
            causes.append((f"{path}.schema.openAPIV3Schema", "FieldValueInvalid", f"Invalid value: {exc.message}"))
        for node_path, node, in_array in _walk(schema, f"{path}.schema.openAPIV3Schema"):
            for rule_index, rule in enumerate(node.get("x-kubernetes-validations") or []):
                rule_path = f"{node_path}.x-kubernetes-validations[{rule_index}].rule"
                text = rule.get("rule", "")
                try:
                    _program(text)
                except Exception as exc:
                    causes.append((rule_path, "FieldValueInvalid", f"Invalid value: {json.dumps(text)}: "
                                                                    f"compilation failed: {exc}"))
                    continue
                if "oldSelf" in text and in_array:
                    causes.append((rule_path, "FieldValueForbidden",
                                   "Forbidden: the emulator does not correlate array items for transition "
                                   "rules (oldSelf); move the rule above the array"))
    if not causes and registry.names_taken(group=group, plural=names["plural"]):
        existing = registry.get((group, names["plural"]))
        if existing is not None and not existing.custom:
            causes.append(("spec.names.plural", "FieldValueInvalid", "Invalid value: served by a built-in"))
    if causes:
        raise invalid(kind="CustomResourceDefinition", group="apiextensions.k8s.io", name=name, causes=causes)


def _walk(schema: dict[str, Any], path: str, in_array: bool = False) -> Iterator[tuple[str, dict[str, Any], bool]]:
    yield path, schema, in_array
    for key, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.properties[{key}]", in_array)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from _walk(schema["additionalProperties"], f"{path}.additionalProperties", in_array)
    if isinstance(schema.get("items"), dict):
        yield from _walk(schema["items"], f"{path}.items", True)


# ---- admitting custom resources


def admit(rtype: ResourceType, *, version: str, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
    """Prune, default and validate `obj` in place; raise 422 naming every failing field."""
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
    causes = _schema_causes(schema, obj)
    if not causes:
        causes = _cel_causes(schema, obj, old, path="", top=True)
    if causes:
        raise invalid(kind=rtype.kind, group=rtype.group, name=obj["metadata"].get("name", ""), causes=causes)


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


def _to_jsonschema(schema: Any) -> Any:
    """OpenAPI v3 (Kubernetes dialect) to a JSON Schema draft 4 that `jsonschema` checks the same way."""
    if isinstance(schema, list):
        return [_to_jsonschema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _to_jsonschema(value) for key, value in schema.items()
           if not key.startswith("x-kubernetes-") and key not in ("nullable", "default", "example", "format")}
    for key in ("properties", "patternProperties", "definitions"):
        if isinstance(schema.get(key), dict):
            out[key] = {name: _to_jsonschema(sub) for name, sub in schema[key].items()}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-list-type") == "set":
        out["uniqueItems"] = True
    return out


@functools.lru_cache(maxsize=64)
def _validator(schema_json: str) -> jsonschema.Draft4Validator:
    return jsonschema.Draft4Validator(_to_jsonschema(json.loads(schema_json)))


def _schema_causes(schema: dict[str, Any], obj: dict[str, Any]) -> list[Cause]:
    body = {key: value for key, value in obj.items() if key != "metadata"}
    trimmed = {**schema, "properties": {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}}
    validator = _validator(json.dumps(trimmed, sort_keys=True))
    causes: list[Cause] = []
    for error in sorted(validator.iter_errors(body), key=lambda e: [str(p) for p in e.absolute_path]):
        causes.extend(_describe(error))
    return causes


def _describe(error: jsonschema.ValidationError) -> list[Cause]:
    path = _format_path(error.absolute_path)
    value, kind, expected = error.instance, error.validator, error.validator_value
    shown = _show(value)
    if kind == "required":
        return [(_join(path, missing), "FieldValueRequired", "Required value")
                for missing in expected if missing not in value]
    if kind == "type":
        name = _type_name(value)
        return [(path, "FieldValueTypeInvalid",
                 f'Invalid value: "{name}": {path or "body"} in body must be of type {expected}: "{name}"')]
    if kind == "enum":
        options = ", ".join(json.dumps(option) for option in expected)
        return [(path, "FieldValueNotSupported", f"Unsupported value: {shown}: supported values: {options}")]
    messages = {
        "pattern": f"should match '{expected}'",
        "minimum": f"should be greater than or equal to {expected}",
        "maximum": f"should be less than or equal to {expected}",
        "minLength": f"should be at least {expected} chars long",
        "minItems": f"should have at least {expected} items",
        "minProperties": f"should have at least {expected} properties",
        "maxProperties": f"should have at most {expected} properties",
    }
    if kind in messages:
        return [(path, "FieldValueInvalid", f"Invalid value: {shown}: {path or 'body'} in body {messages[kind]}")]
    if kind == "uniqueItems":  # an `x-kubernetes-list-type: set` with a repeated item
        seen: list[Any] = []
        causes: list[Cause] = []
        for index, item in enumerate(value):
            if item in seen:
                causes.append((f"{path}[{index}]", "FieldValueDuplicate", f"Duplicate value: {_show(item)}"))
            seen.append(item)
        return causes
    if kind == "maxLength":
        return [(path, "FieldValueTooLong", f"Too long: may not be more than {expected} bytes")]
    if kind == "maxItems":
        return [(path, "FieldValueTooMany", f"Too many: {len(value)}: must have at most {expected} items")]
    return [(path, "FieldValueInvalid", f"Invalid value: {shown}: {error.message}")]


def _cel_causes(schema: dict[str, Any], value: Any, old: Any, *, path: str, top: bool = False) -> list[Cause]:
    causes: list[Cause] = []
    if value is None:
        return causes
    for rule in schema.get("x-kubernetes-validations") or []:
        text = rule["rule"]
        if "oldSelf" in text and old is None:
            continue  # a transition rule: checked on updates only
        activation = {"self": celpy.json_to_cel(_without_metadata(value) if top else value)}
        if old is not None:
            activation["oldSelf"] = celpy.json_to_cel(_without_metadata(old) if top else old)
        try:
            result = _program(text).evaluate(activation)
        except Exception as exc:  # celpy raises its own evaluation errors
            result = exc
        if isinstance(result, celtypes.BoolType) and bool(result):
            continue
        field = path + (rule.get("fieldPath") or "")
        field = field.lstrip(".")
        if isinstance(result, celtypes.BoolType):
            message = rule.get("message") or f"failed rule: {text}"
        else:
            message = f"failed rule: {text}: evaluation error: {result}"
        reason = rule.get("reason") or "FieldValueInvalid"
        prefix = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required value",
                  "FieldValueDuplicate": "Duplicate value"}.get(reason)
        text_out = f"{prefix}: {message}" if prefix else f'Invalid value: "{_type_name(value)}": {message}'
        causes.append((field, reason, text_out))
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if top and key == "metadata":
                continue
            sub = properties.get(key) or (additional if isinstance(additional, dict) else None)
            if sub is not None:
                before = old.get(key) if isinstance(old, dict) else None
                causes += _cel_causes(sub, item, before, path=_join(path, key))
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            causes += _cel_causes(schema["items"], item, None, path=f"{path}[{index}]")
    return causes


@functools.lru_cache(maxsize=256)
def _program(rule: str) -> Any:
    environment = celpy.Environment()
    return environment.program(environment.compile(rule))


def _without_metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The root as CEL rules see it: only `name` and `generateName` of the metadata are visible."""
    meta = obj.get("metadata") or {}
    visible = {key: meta[key] for key in ("name", "generateName") if key in meta}
    return {**{key: value for key, value in obj.items() if key != "metadata"}, "metadata": visible}


def _format_path(parts: Any) -> str:
    path = ""
    for part in parts:
        path = f"{path}[{part}]" if isinstance(part, int) else _join(path, str(part))
    return path


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    return "object"


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        return f'"{_type_name(value)}"'
    return json.dumps(value)
