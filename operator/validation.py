"""Checks on a Tool that a CRD schema cannot express; each problem names the field and the fix."""

from __future__ import annotations

import re
from typing import Any

import jsonschema
import pydantic
from packaging.requirements import InvalidRequirement, Requirement

from rockbot.resources import Tool
from rockbot.resources.checking import describe

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def parse_tool(body: dict[str, Any]) -> Tool:
    """The Tool model of a raw object; raises `pydantic.ValidationError`."""
    return Tool.model_validate({key: body.get(key) for key in ("apiVersion", "metadata", "spec") if key in body})


#: Problems of Tools already checked, by (uid, resourceVersion): a stored version never changes, and the
#: JSON Schema check is the dearest part of every reconcile of every Agent that uses the Tool.
_CHECKED: dict[tuple[str, str], list[str]] = {}
_CHECKED_LIMIT = 4096


def tool_problems(body: dict[str, Any]) -> list[str]:
    """Everything wrong with a Tool, as sentences a person can act on; empty when it is acceptable."""
    metadata = body.get("metadata") or {}
    version = (metadata.get("uid"), metadata.get("resourceVersion"))
    if None in version:
        return _problems(body)
    key = (str(version[0]), str(version[1]))
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_LIMIT:
            del _CHECKED[next(iter(_CHECKED))]
        _CHECKED[key] = _problems(body)
    return list(_CHECKED[key])


def _problems(body: dict[str, Any]) -> list[str]:
    try:
        tool = parse_tool(body)
    except pydantic.ValidationError as error:
        return describe(error)
    problems: list[str] = []
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", tool.function_name):
        problems.append(
            f"the function name {tool.function_name!r} breaks the OpenAI rule ^[a-zA-Z0-9_-]{{1,64}}$: "
            "set spec.functionName"
        )
    problems.extend(_parameter_problems(tool.spec.parameters))
    if tool.spec.rest is not None:
        declared = set(tool.spec.parameters.get("properties", {}))
        for placeholder in _PLACEHOLDER.findall(tool.spec.rest.url):
            if placeholder not in declared:
                problems.append(
                    f"spec.rest.url uses {{{placeholder}}} but spec.parameters.properties has no {placeholder!r}: "
                    "declare it or remove it from the URL"
                )
    if tool.spec.script is not None:
        for package in tool.spec.script.pip_packages:
            try:
                Requirement(package)
            except InvalidRequirement as error:
                problems.append(f"spec.script.pipPackages: {package!r} is not a PEP 508 requirement ({error})")
    return problems


def _parameter_problems(parameters: dict[str, Any]) -> list[str]:
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as error:
        where = "/".join(map(str, error.absolute_path)) or "(root)"
        return [f"spec.parameters is not a valid JSON Schema at {where}: {error.message}"]
    if parameters.get("type") != "object":
        return [
            'spec.parameters must be an object schema ({"type": "object", "properties": {...}}): '
            "tool arguments are always a JSON object"
        ]
    return []
