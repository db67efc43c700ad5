"""Read the YAML a user would `kubectl apply`, and check every document against the resource models."""

from __future__ import annotations

import base64
import pathlib
from dataclasses import dataclass, field
from typing import Any

import yaml

from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.resources import Agent, ScheduledTask, Tool, validate

MODELS: dict[str, type[Agent] | type[Tool] | type[ScheduledTask]] = {
    "Agent": Agent,
    "Tool": Tool,
    "ScheduledTask": ScheduledTask,
}
NAMESPACE = "local"


class ManifestError(Exception):
    """A document that cannot be used; the message names the file, the object and the field."""


@dataclass
class Manifests:
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Secret name -> key -> value, from `kind: Secret` documents (`data` or `stringData`).
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    #: What was left out and why (a task for an Agent that is not there), naming the file and the fix.
    warnings: list[str] = field(default_factory=list)


def load(paths: list[pathlib.Path]) -> Manifests:
    """Every `*.yaml`/`*.yml` under the paths (files or folders), in name order; other kinds are skipped."""
    found = Manifests()
    task_files: dict[str, pathlib.Path] = {}
    for path in _files(paths):
        try:
            documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        except yaml.YAMLError as error:
            raise ManifestError(f"{path}: not valid YAML: {error}") from None
        for document in documents:
            _add(found, document, path=path)
            if document.get("kind") == "ScheduledTask":
                task_files[document["metadata"]["name"]] = path
    for name, body in list(found.tasks.items()):
        agent = body["spec"]["agentRef"]["name"]
        if agent not in found.agents:  # the operator would say AgentReady=False; here nothing can create it
            del found.tasks[name]
            found.warnings.append(
                f"{task_files[name]}: ScheduledTask {name!r}: spec.agentRef.name: no Agent {agent!r} in these files "
                f"(there are: {', '.join(found.agents) or 'none'}), so it will not fire: add the Agent or fix agentRef"
            )
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
    if problems:
        raise ManifestError(f"{path}: {kind} {name!r} is invalid: {'; '.join(problems)}")
    bucket = {"Agent": found.agents, "Tool": found.tools, "ScheduledTask": found.tasks}[kind]
    if name in bucket:
        raise ManifestError(f"{path}: a second {kind} named {name!r}: names are unique per kind")
    bucket[name] = body
