"""Checks on a Tool that a CRD schema cannot express; each problem names the field and the fix."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pydantic
from packaging.requirements import InvalidRequirement, Requirement

from rockbot.addresses import IPNetwork, internal_name_reason, literal_address, non_public_reason
from rockbot.resources import Tool
from rockbot.resources.checking import describe

_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def parse_tool(body: dict[str, Any]) -> Tool:
    """The Tool model of a raw object; raises `pydantic.ValidationError`."""
    return Tool.model_validate({key: body.get(key) for key in ("apiVersion", "metadata", "spec") if key in body})


#: Problems of Tools already checked, by (uid, resourceVersion, the private networks allowed): a stored version never
#: changes, and the JSON Schema check is the dearest part of every reconcile of every Agent that uses the Tool.
_CHECKED: dict[tuple[str, str, str], list[str]] = {}
_CHECKED_LIMIT = 4096
#: Where a cluster administrator opens non-public networks to Tools and Agents.
PRIVATE_NETWORKS_SETTING = "the chart's agents.privateNetworks (ROCKBOT_PRIVATE_NETWORKS of the operator)"


def tool_problems(body: dict[str, Any], *, private_networks: Sequence[IPNetwork] | None = None) -> list[str]:
    """Everything wrong with a Tool, as sentences a person can act on; empty when it is acceptable.

    `private_networks`: the non-public networks a cluster administrator lets Tools reach; a REST Tool whose URL
    names another non-public address, or a name inside the cluster while none is open, is refused. None: no such
    check (`rockbot local`, where the person running it decides)."""
    metadata = body.get("metadata") or {}
    version = (metadata.get("uid"), metadata.get("resourceVersion"))
    if None in version:
        return _problems(body, private_networks)
    key = (str(version[0]), str(version[1]), repr(None if private_networks is None else sorted(map(str,
                                                                                                 private_networks))))
    if key not in _CHECKED:
        if len(_CHECKED) >= _CHECKED_LIMIT:
            del _CHECKED[next(iter(_CHECKED))]
        _CHECKED[key] = _problems(body, private_networks)
    return list(_CHECKED[key])


def rest_url_problem(url: str, *, private_networks: Sequence[IPNetwork]) -> str | None:
    """Why a REST Tool's URL may not be called, by its host as written (its addresses are checked again where the
    agent connects, also for names and redirects): a non-public address outside `private_networks`, or a name
    inside the node or the cluster while no private network is open."""
    host = urlsplit(url).hostname or ""
    address = literal_address(host)
    if address is not None:
        reason = non_public_reason(address)
        if reason is None or any(address in network for network in private_networks):
            return None
        prefix = 32 if address.version == 4 else 128
        return (f"spec.rest.url: {address} is {reason}, which no Tool may reach unless a cluster administrator opens "
                f"its network in {PRIVATE_NETWORKS_SETTING}, e.g. {address}/{prefix}: use a public address, or ask "
                "them to")
    reason = internal_name_reason(host)
    if reason is None or private_networks:
        return None
    return (f"spec.rest.url: {host!r} is {reason}, and a cluster administrator has opened no private network to "
            f"Tools: ask them to add the networks it may reach (e.g. the cluster's Service range) to "
            f"{PRIVATE_NETWORKS_SETTING}, or use a public address")


def _problems(body: dict[str, Any], private_networks: Sequence[IPNetwork] | None) -> list[str]:
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
        if private_networks is not None:
            refused = rest_url_problem(tool.spec.rest.url, private_networks=private_networks)
            if refused is not None:
                problems.append(refused)
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
