"""Turn the resource models into CustomResourceDefinitions with structural OpenAPI schemas.

Pydantic emits JSON Schema; Kubernetes wants a *structural* schema: no `$ref`, a `type` on every
node, no `additionalProperties: false` beside `properties`, and free-form objects marked with
`x-kubernetes-preserve-unknown-fields`. This module does that translation and nothing else.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import yaml

from rockbot.resources import GROUP, VERSION, Agent, Evaluation, ScheduledTask, Tool, Trigger
from rockbot.resources.common import CATEGORY, Resource

RESOURCES: list[type[Resource]] = [Agent, Tool, ScheduledTask, Trigger, Evaluation]
_DROPPED_KEYS = {"title", "$defs"}
#: Pydantic writes `gt=0` as JSON Schema's `exclusiveMinimum: 0`; a CRD's OpenAPI 3.0 schema wants `minimum: 0` with
#: `exclusiveMinimum: true` (the API server refuses a number there).
_EXCLUSIVE = {"exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}


def crd_for(resource: type[Resource]) -> dict[str, Any]:
    """The CustomResourceDefinition manifest of one resource model."""
    raw = resource.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(raw, definitions=raw.get("$defs", {}))
    properties = schema["properties"]
    properties.update(apiVersion={"type": "string"}, kind={"type": "string"}, metadata={"type": "object"})
    schema["required"] = ["spec"]
    schema.pop("description", None)
    schema["description"] = f"{resource.kind} of {GROUP}: {(resource.__doc__ or '').strip() or resource.kind}"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{resource.plural}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "rockbot"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": resource.kind,
                "listKind": f"{resource.kind}List",
                "plural": resource.plural,
                "singular": resource.kind.lower(),
                "shortNames": resource.short_names,
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        column.model_dump(by_alias=True, exclude_defaults=True) for column in resource.printer_columns
                    ],
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _structural(node: Any, *, definitions: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(item, definitions=definitions) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = definitions[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{key: value for key, value in node.items() if key != "$ref"}}
        return _structural(merged, definitions=definitions)
    options = node.get("anyOf")
    if options is not None:
        non_null = [option for option in options if option.get("type") != "null"]
        if len(non_null) == 1:  # Optional[X]: absence is how Kubernetes says "null"
            rest = {key: value for key, value in node.items() if key not in {"anyOf", "default"} or value is not None}
            rest.pop("anyOf")
            return _structural({**non_null[0], **rest}, definitions=definitions)
    result: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            result[key] = {name: _structural(prop, definitions=definitions) for name, prop in value.items()}
        elif key in {"items", "additionalProperties"} and isinstance(value, dict):
            result[key] = _structural(value, definitions=definitions)
        elif key == "const":
            result["enum"] = [value]
        elif key in _EXCLUSIVE and not isinstance(value, bool):  # JSON Schema's bound -> OpenAPI 3.0's flag
            result[_EXCLUSIVE[key]] = value
            result[key] = True
        else:
            result[key] = value
    if result.get("additionalProperties") is False:
        del result["additionalProperties"]
    if (
        result.get("type") == "object"
        and "properties" not in result
        and result.get("additionalProperties")
        in (
            None,
            True,
            {},
        )
    ):
        result.pop("additionalProperties", None)
        result["x-kubernetes-preserve-unknown-fields"] = True
    return result


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: a reader of a CRD should not chase `*id001`."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_all() -> dict[str, str]:
    """File name -> YAML text of every CRD, as committed in `crds/`."""
    header = "# Generated by `rockbot crds --write` from rockbot/resources: do not edit by hand.\n"
    return {
        f"{resource.plural}.{GROUP}.yaml": header
        + yaml.dump(crd_for(resource), Dumper=_PlainDumper, sort_keys=False, width=120)
        for resource in RESOURCES
    }


def write_all(directory: pathlib.Path) -> list[pathlib.Path]:
    """Write every CRD into `directory`; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in render_all().items():
        path = directory / filename
        path.write_text(text)
        written.append(path)
    return written


def reference_table() -> str:
    """A Markdown table of every resource's spec fields, for docs/concepts/resources.md (a test keeps it current)."""
    rows = ["| Kind | Field | Type | Default | Description |", "| --- | --- | --- | --- | --- |"]
    for resource in RESOURCES:
        spec = crd_for(resource)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        required = set(spec.get("required", []))
        for name, field in spec["properties"].items():
            kind = field.get("type", "")
            if "enum" in field:
                kind = " \\| ".join(f"`{value}`" for value in field["enum"])
            default = f"`{json.dumps(field['default'])}`" if "default" in field else ""
            if name in required:
                default = "required"
            description = (field.get("description") or "").replace("|", "\\|").replace("\n", " ")
            rows.append(f"| {resource.kind} | `{name}` | {kind} | {default} | {description} |")
    return "\n".join(rows)
