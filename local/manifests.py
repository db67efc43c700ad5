"""Read the YAML a user would `kubectl apply`, and check every document against the resource models."""

from __future__ import annotations

import base64
import pathlib
from dataclasses import dataclass, field
from typing import Any

import yaml

from rockbot.gateway.catalog import compile_entry
from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.resources import Agent, ScheduledTask, Tool, Trigger, validate

MODELS: dict[str, type[Agent] | type[Tool] | type[ScheduledTask] | type[Trigger]] = {
    "Agent": Agent,
    "Tool": Tool,
    "ScheduledTask": ScheduledTask,
    "Trigger": Trigger,
}
NAMESPACE = "local"


class ManifestError(Exception):
    """A document that cannot be used; the message names the file, the object and the field."""


@dataclass
class Manifests:
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Webhook Triggers (event Triggers need a cluster: a warning says so).
    triggers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Secret name -> key -> value, from `kind: Secret` documents (`data` or `stringData`).
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    #: What was left out and why (a task for an Agent that is not there), naming the file and the fix.
    warnings: list[str] = field(default_factory=list)


def load(paths: list[pathlib.Path]) -> Manifests:
    """Every `*.yaml`/`*.yml` under the paths (files or folders), in name order; other kinds are skipped."""
    found = Manifests()
    files: dict[tuple[str, str], pathlib.Path] = {}
    for path in _files(paths):
        try:
            documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        except yaml.YAMLError as error:
            raise ManifestError(f"{path}: not valid YAML: {error}") from None
        for document in documents:
            _add(found, document, path=path)
            if document.get("kind") in ("ScheduledTask", "Trigger"):
                files[(document["kind"], document["metadata"]["name"])] = path
    for kind, bucket in (("ScheduledTask", found.tasks), ("Trigger", found.triggers)):
        for name, body in list(bucket.items()):
            agent = body["spec"]["agentRef"]["name"]
            if agent not in found.agents:  # the operator would say AgentReady=False; here nothing can create it
                del bucket[name]
                found.warnings.append(
                    f"{files[(kind, name)]}: {kind} {name!r}: spec.agentRef.name: no Agent {agent!r} in these files "
                    f"(there are: {', '.join(found.agents) or 'none'}), so it will not fire: add the Agent or fix "
                    "agentRef"
                )
            elif kind == "Trigger" and "kubernetesEvents" in body["spec"]:
                del bucket[name]
                found.warnings.append(f"{files[(kind, name)]}: Trigger {name!r} watches Kubernetes Events, which "
                                      "need a cluster: it is left out here")  # fmt: skip
    return found


def _files(paths: list[pathlib.Path]) -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in {".yaml", ".yml"})
        elif path.is_file():
            files.append(path)
        else:
            raise ManifestError(f"{path}: no such file or folder")
    return files


def _add(found: Manifests, document: dict[str, Any], *, path: pathlib.Path) -> None:
    kind = document.get("kind")
    name = (document.get("metadata") or {}).get("name")
    if kind == "Secret":
        data = {key: base64.b64decode(value).decode() for key, value in (document.get("data") or {}).items()}
        found.secrets[name] = {**data, **(document.get("stringData") or {})}
        return
    model = MODELS.get(kind or "")
    if model is None:
        return
    if not name:
        raise ManifestError(f"{path}: a {kind} without metadata.name: give it a name")
    body = {**document, "metadata": {**document["metadata"], "namespace": NAMESPACE, "uid": f"local-{name}"}}
    problems = validate(body)
    if not problems and kind == "ScheduledTask":  # what the operator reports as Valid=False
        try:
            CronSchedule.parse(schedule=body["spec"]["schedule"], time_zone=body["spec"].get("timeZone", "UTC"))
        except InvalidSchedule as error:
            problems = [f"spec.{error}"]
    if not problems and kind == "Trigger":  # what the gateway reports as Ready=False
        problem = compile_entry(Trigger.model_validate(body), cross_namespace_events=False, watched=[]).problem
        problems = [] if problem is None else [problem[1]]
    if problems:
        raise ManifestError(f"{path}: {kind} {name!r} is invalid: {'; '.join(problems)}")
    bucket = {"Agent": found.agents, "Tool": found.tools, "ScheduledTask": found.tasks, "Trigger": found.triggers}[kind]
    if name in bucket:
        raise ManifestError(f"{path}: a second {kind} named {name!r}: names are unique per kind")
    bucket[name] = body
