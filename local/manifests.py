"""Read the YAML a user would `kubectl apply`, and check every document as the API server and the operator would.

Every mistake is found at load, not at the first request that needs the object, and all of them are
reported together, one line each, naming the file (and the document or line) and using the YAML's own
field names: a document that is no object, a duplicate key, an apiVersion or kind the cluster would
not serve, a Secret whose data is not base64 text, objects of several namespaces (the operator never
resolves across them), a Trigger whose Secret is missing, a schedule the scheduler cannot read.
Kinds of other APIs are skipped with a warning; a `kind: List` is read as its items.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import pathlib
from dataclasses import dataclass, field
from typing import Any

import yaml

from rockbot.gateway.catalog import compile_entry
from rockbot.operator.scheduling.cron import CronSchedule, InvalidSchedule
from rockbot.resources import GROUP, VERSION, Agent, Evaluation, ScheduledTask, Tool, Trigger, validate
from rockbot.scripts_manager.settings import cpu_millicores, quantity_bytes

MODELS: dict[str, type[Agent] | type[Tool] | type[ScheduledTask] | type[Trigger] | type[Evaluation]] = {
    "Agent": Agent,
    "Tool": Tool,
    "ScheduledTask": ScheduledTask,
    "Trigger": Trigger,
    "Evaluation": Evaluation,
}
NAMESPACE = "local"
API_VERSION = f"{GROUP}/{VERSION}"
_SHAPE = "not an object with apiVersion, kind and metadata"


class ManifestError(Exception):
    """Documents that cannot be used: `problems` has one line each, naming the file, the object and the field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass
class Manifests:
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Webhook Triggers (event Triggers need a cluster: a warning says so).
    triggers: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Evaluations (run by `rockbot eval run`; the chat leaves them be).
    evaluations: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Secret name -> key -> value, from `kind: Secret` documents (`data` or `stringData`).
    secrets: dict[str, dict[str, str]] = field(default_factory=dict)
    #: What was left out and why (a task for an Agent that is not there), naming the file and the fix.
    warnings: list[str] = field(default_factory=list)
    #: (kind, name) -> the file it came from, for messages about it.
    files: dict[tuple[str, str], pathlib.Path] = field(default_factory=dict)


def load(paths: list[pathlib.Path]) -> Manifests:
    """Every `*.yaml`/`*.yml` under the paths (files or folders), in name order; raises with every problem."""
    found = Manifests()
    problems: list[str] = []
    namespaces: dict[str, tuple[str, str]] = {}  # namespace -> the first object that named it
    for path in _files(paths, problems):
        for number, line, document in _documents(path, problems):
            for label, item in _items(document, where=f"document {number} (line {line})"):
                problem = _add(found, item, path=path, label=label, namespaces=namespaces)
                if problem:
                    problems.append(f"{path}: {problem}")
    problems += _missing_secrets(found)
    if problems:
        raise ManifestError(problems)
    _leave_out_orphans(found)
    return found


def script_limit_problems(found: Manifests, *, max_cpu: str, max_memory: str) -> list[str]:
    """Agents whose `spec.scriptLimits` the scripts-manager would refuse at their first script."""
    problems = []
    for name, body in found.agents.items():
        limits = Agent.model_validate(body).spec.script_limits
        where = f"{found.files[('Agent', name)]}: Agent {name!r}: spec.scriptLimits"
        if cpu_millicores(limits.cpu) > cpu_millicores(max_cpu):
            problems.append(f"{where}.cpu: {limits.cpu} is over the scripts-manager's maximum of {max_cpu}: lower it")
        if quantity_bytes(limits.memory) > quantity_bytes(max_memory):
            problems.append(f"{where}.memory: {limits.memory} is over the scripts-manager's maximum of {max_memory}: "
                            "lower it")  # fmt: skip
    return problems


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key that appears twice in one mapping (it would keep the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            line = key_node.start_mark.line + 1
            if isinstance(key, str) and key in seen:
                raise yaml.constructor.ConstructorError(
                    problem=f"duplicate key {key!r} (line {seen[key]} has it too): keep one",
                    problem_mark=key_node.start_mark,
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _documents(path: pathlib.Path, problems: list[str]) -> list[tuple[int, int, Any]]:
    """(number, first line, content) of each non-empty document; a YAML error is one problem at its line."""
    loader = _Loader(path.read_text())
    documents = []
    try:
        while loader.check_node():
            node = loader.get_node()
            content = loader.construct_document(node)
            if content is not None:
                documents.append((len(documents) + 1, node.start_mark.line + 1, content))
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        if isinstance(error, yaml.constructor.ConstructorError) and error.problem and "duplicate key" in error.problem:
            problems.append(f"{path}:{mark.line + 1}: {error.problem}")
        else:
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            detail = " ".join(str(getattr(error, "problem", None) or error).split())
            problems.append(f"{where}: not valid YAML: {detail}")
        return []
    finally:
        loader.dispose()
    return documents


def _items(document: Any, *, where: str) -> list[tuple[str, Any]]:
    """A `kind: List` as its items (as kubectl reads it), anything else as itself."""
    if isinstance(document, dict) and document.get("kind") == "List" and isinstance(document.get("items"), list):
        return [(f"{where} items[{n}]", item) for n, item in enumerate(document["items"])]
    return [(where, document)]


def _files(paths: list[pathlib.Path], problems: list[str]) -> list[pathlib.Path]:
    files: list[pathlib.Path] = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.iterdir() if p.suffix in {".yaml", ".yml"})
        elif path.is_file():
            files.append(path)
        else:
            problems.append(f"{path}: no such file or folder")
    return files


def _add(
    found: Manifests, document: Any, *, path: pathlib.Path, label: str, namespaces: dict[str, tuple[str, str]]
) -> str | None:
    """File the object; what is wrong with it, if anything, as one line (without the file)."""
    if not isinstance(document, dict):
        return f"{label} is a {_type_name(document)}, {_SHAPE}"
    kind, api_version = document.get("kind"), document.get("apiVersion")
    metadata = document.get("metadata")
    if not isinstance(kind, str) or not isinstance(metadata, dict):
        return f"{label} has no {'kind' if not isinstance(kind, str) else 'metadata'}: it is {_SHAPE}"
    name = metadata.get("name")
    if not name or not isinstance(name, str):
        return f"{label}: a {kind} without metadata.name: give it a name"
    if kind == "Secret":
        return _add_secret(found, document, name=name)
    model = MODELS.get(kind)
    if model is None:
        if isinstance(api_version, str) and api_version.split("/")[0] == GROUP:
            guess = difflib.get_close_matches(kind, MODELS, n=1)
            hint = f" (did you mean {guess[0]}?)" if guess else ""
            return f"{label}: kind: {kind!r} is not a kind of {GROUP}{hint}: use one of {', '.join(MODELS)}"
        found.warnings.append(f"{path}: {kind} {name!r} is skipped: rockbot local runs Agents, Tools, "
                              "ScheduledTasks, Triggers, Evaluations and Secrets only")  # fmt: skip
        return None
    if api_version != API_VERSION:
        return f"{kind} {name!r}: apiVersion: {api_version} is not served: use {API_VERSION}"
    namespace = metadata.get("namespace")
    if namespace:
        first = next(iter(namespaces.items()), None)
        if first is not None and first[0] != namespace:
            return (f"{kind} {name!r} is in namespace {namespace!r}, {first[1][0]} {first[1][1]!r} in {first[0]!r}: "
                    "the operator resolves an Agent's Tools in its own namespace only; run one namespace's files "
                    "at a time")  # fmt: skip
        namespaces.setdefault(namespace, (kind, name))
    body = {**document, "metadata": {**metadata, "namespace": NAMESPACE, "uid": f"local-{name}"}}
    problems = _problems(body, kind=kind)
    if problems:
        return f"{kind} {name!r} is invalid: {'; '.join(problems)}"
    bucket = {"Agent": found.agents, "Tool": found.tools, "ScheduledTask": found.tasks, "Trigger": found.triggers,
              "Evaluation": found.evaluations}[kind]
    if name in bucket:
        return f"a second {kind} named {name!r}: names are unique per kind"
    bucket[name] = body
    found.files[(kind, name)] = path
    return None


def _problems(body: dict[str, Any], *, kind: str) -> list[str]:
    """What the API server would refuse, then what the scheduler and the gateway would report as not valid."""
    spec = body.get("spec") if isinstance(body.get("spec"), dict) else {}
    if kind == "ScheduledTask" or (kind == "Evaluation" and spec.get("schedule")):
        # the scheduler's words for a schedule it cannot read, not the CRD's regex
        try:
            CronSchedule.parse(schedule=str(spec.get("schedule", "")), time_zone=str(spec.get("timeZone", "UTC")))
        except InvalidSchedule as error:
            problems = [p for p in validate(body) if not p.startswith(f"spec.{error.field}:")]
            return [*problems, f"spec.{error}"]
    problems = validate(body)
    if not problems and kind == "Trigger":  # what the gateway reports as Ready=False
        problem = compile_entry(Trigger.model_validate(body), cross_namespace_events=False, watched=[]).problem
        problems = [] if problem is None else [problem[1]]
    return problems


def _add_secret(found: Manifests, document: dict[str, Any], *, name: str) -> str | None:
    values: dict[str, str] = {}
    for key, value in (document.get("data") or {}).items():
        try:
            values[key] = base64.b64decode(str(value), validate=True).decode()
        except (binascii.Error, ValueError) as error:
            kind = "UTF-8 text" if isinstance(error, UnicodeDecodeError) else "base64"
            return f"Secret {name!r}: data.{key} is not {kind}: put plain text under stringData instead"
    for key, value in (document.get("stringData") or {}).items():
        values[key] = str(value)
    found.secrets[name] = values
    return None


def _missing_secrets(found: Manifests) -> list[str]:
    """Webhook Triggers whose signing key is not among the Secret documents (the gateway would answer 503)."""
    problems = []
    for name, body in found.triggers.items():
        ref = (body["spec"].get("webhook") or {}).get("secretKeyRef")
        if ref and ref["key"] not in found.secrets.get(ref["name"], {}):
            problems.append(
                f"{found.files[('Trigger', name)]}: Trigger {name!r}: spec.webhook.secretKeyRef: no Secret "
                f"{ref['name']!r} with key {ref['key']!r} in these files: add a kind: Secret document with it"
            )
    return problems


def _leave_out_orphans(found: Manifests) -> None:
    for kind, bucket in (("ScheduledTask", found.tasks), ("Trigger", found.triggers),
                         ("Evaluation", found.evaluations)):
        for name, body in list(bucket.items()):
            agent = body["spec"]["agentRef"]["name"]
            file = found.files[(kind, name)]
            if agent not in found.agents:  # the operator would say AgentReady=False; here nothing can create it
                del bucket[name]
                found.warnings.append(
                    f"{file}: {kind} {name!r}: spec.agentRef.name: no Agent {agent!r} in these files "
                    f"(there are: {', '.join(found.agents) or 'none'}), so it will not "
                    f"{'run' if kind == 'Evaluation' else 'fire'}: add the Agent or fix agentRef"
                )
            elif kind == "Trigger" and "kubernetesEvents" in body["spec"]:
                del bucket[name]
                found.warnings.append(f"{file}: Trigger {name!r} watches Kubernetes Events, which need a cluster: "
                                      "it is left out here")  # fmt: skip


def _type_name(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(type(value), "value")
