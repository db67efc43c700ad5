"""Local validation applies exactly the rules the CRDs apply.

Each manifest below is admitted twice: by the real API server (a dry-run create of the generated
CRD's kind: the OpenAPI schema, then its CEL rules, with strict field validation as `kubectl apply`
asks) and by `rockbot.resources.validate`, which `rockbot local` uses. Both must accept it, or both
refuse it, and a CEL refusal must carry the same message: each rule is declared once with its CEL and
its Python form (`rockbot.resources.common.Rule`), and this is where the two are held together.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from rockbot import crdgen
from rockbot.resources import GROUP, VERSION, validate
from tests.fixtures.kube_real import KubeCluster

DELETE = object()

AGENT = {
    "apiVersion": "rockbot.dev/v1alpha1",
    "kind": "Agent",
    "metadata": {"name": "analyst", "namespace": "team-a"},
    "spec": {"model": {"baseUrl": "https://openrouter.ai/api/v1", "name": "openai/gpt-4o-mini"}},
}
TOOL = {
    "apiVersion": "rockbot.dev/v1alpha1",
    "kind": "Tool",
    "metadata": {"name": "rates", "namespace": "team-a"},
    "spec": {"description": "Rates.", "rest": {"url": "https://api.example/rates"}},
}
TASK = {
    "apiVersion": "rockbot.dev/v1alpha1",
    "kind": "ScheduledTask",
    "metadata": {"name": "daily", "namespace": "team-a"},
    "spec": {"agentRef": {"name": "analyst"}, "schedule": "0 8 * * *", "prompt": "Report."},
}
TRIGGER = {
    "apiVersion": "rockbot.dev/v1alpha1",
    "kind": "Trigger",
    "metadata": {"name": "issues", "namespace": "team-a"},
    "spec": {"agentRef": {"name": "analyst"}, "prompt": "Triage {{ payload.issue.title }}.",
             "webhook": {"secretKeyRef": {"name": "github-webhook", "key": "secret"}}},
}
EVALUATION = {
    "apiVersion": "rockbot.dev/v1alpha1",
    "kind": "Evaluation",
    "metadata": {"name": "basics", "namespace": "team-a"},
    "spec": {"agentRef": {"name": "analyst"}, "cases": [{"name": "sum", "input": "1 + 2?",
                                                         "expect": {"contains": ["3"]}}]},
}
BASES = {"Agent": AGENT, "Tool": TOOL, "ScheduledTask": TASK, "Trigger": TRIGGER, "Evaluation": EVALUATION}
RUBRIC = {"criteria": "Says 3.", "threshold": 0.5}
JUDGE = {"baseUrl": "https://openrouter.ai/api/v1", "name": "openai/gpt-4o-mini"}
MCP_HTTP = {"server": "rocks", "url": "http://rocks/mcp", "tool": "add"}
MCP_STDIO = {"server": "rocks", "transport": "stdio", "command": ["rocks"], "tool": "add"}
SECRET_HEADER = {"name": "Authorization", "prefix": "Bearer ", "secretKeyRef": {"name": "rocks", "key": "token"}}
SECRET_ENV = {"name": "ROCKS_TOKEN", "secretKeyRef": {"name": "rocks", "key": "token"}}

#: (kind, {dotted path: value}) — each changes a valid base; DELETE removes the field.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("Agent", {}),
    ("Agent", {"spec.model.baseUrl": "ftp://models.example/v1"}),
    ("Agent", {"spec.model.apiKey": "sk-literal"}),
    ("Agent", {"spec.model.apiKeySecretRef": {"name": "llm", "key": "apiKey"}}),
    ("Agent", {"metadata.name": "a" * 45}),
    ("Agent", {"metadata.name": "a" * 44}),
    ("Agent", {"metadata.name": "team.analyst"}),
    ("Agent", {"spec.tools": ["rates"], "spec.toolBlacklist": ["rates"]}),
    ("Agent", {"spec.tools": ["rates"], "spec.toolBlacklist": ["other"]}),
    ("Agent", {"spec.tools": ["rates", "rates"]}),
    ("Agent", {"spec.toolBlacklist": ["web_browse", "web_browse"]}),
    ("Agent", {"spec.toolSelector": {"matchExpressions": [{"key": "team", "operator": "In"}]}}),
    ("Agent", {"spec.toolSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]}}),
    ("Agent", {"spec.toolSelector": {"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["a"]}]}}),
    ("Agent", {"spec.toolSelector": {"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}}),
    ("Agent", {"spec.webSearch": {"provider": "searxng"}}),
    ("Agent", {"spec.webSearch": {"provider": "searxng", "url": "http://searx"}}),
    ("Agent", {"spec.webSearch": {"provider": "brave"}}),
    ("Agent", {"spec.webSearch": {"provider": "brave", "apiKeySecretRef": {"name": "brave", "key": "k"}}}),
    ("Agent", {"spec.memory": {"longTerm": {"enabled": True}}}),
    ("Agent", {"spec.memory": {"longTerm": {"enabled": False}}}),
    ("Agent", {"spec.memory": {"longTerm": {"enabled": True, "embeddings": {"model": "text-embedding-3-small"}}}}),
    ("Agent", {"spec.memory": {"longTerm": {"enabled": True, "scope": "Agent", "autoRecall": {"maxTokens": 300},
                                            "embeddings": {"model": "e", "baseUrl": "ftp://e/v1"}}}}),
    ("Agent", {"spec.memory": {"longTerm": {"enabled": True, "scope": "Everyone", "embeddings": {"model": "e"}}}}),
    ("Agent", {"spec.memory": {"longTerm": {"enabled": True, "maxItemsPerScope": 1_000_000,
                                            "embeddings": {"model": "e"}}}}),
    ("Agent", {"spec.env": [{"name": "ROCKBOT_AMQP_URL", "value": "amqp://x"}]}),
    ("Agent", {"spec.env": [{"name": "A", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
    ("Agent", {"spec.env": [{"name": "A", "valueFrom": {}}]}),
    ("Agent", {"spec.env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"},
                                                        "fieldRef": {"fieldPath": "metadata.name"}}}]}),
    ("Agent", {"spec.env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}),
    ("Agent", {"spec.webBrowse": {"githubApiUrl": "ftp://api.example"}}),
    ("Agent", {"spec.webBrowse": {"githubApiUrl": "https://ghe.example/api/v3", "allowedNetworks": ["10.0.0.0/8"]}}),
    ("Agent", {"spec.maxIterations": 0}),
    ("Agent", {"spec.builtinTools": ["scripts", "telepathy"]}),
    ("Agent", {"spec.scriptLimits": {"cpu": "1.2.3"}}),
    ("Agent", {"spec.scriptSessions": {"mode": "PerConversation", "idleSeconds": 600, "maxSeconds": 300}}),
    ("Tool", {}),
    ("Tool", {"spec.rest.url": "ftp://files.example/rates"}),
    ("Tool", {"spec.rest": DELETE}),
    ("Tool", {"spec.script": {"source": "print(1)"}}),
    ("Tool", {"spec.rest": DELETE, "spec.script": {"source": "print(1)", "pipPackages": ["numpy==2.1.0"]}}),
    ("Tool", {"spec.rest": DELETE, "spec.script": {"source": "print(1)",
                                                   "pipPackages": ["numpy @ https://files.example/numpy.whl"]}}),
    ("Tool", {"spec.rest.auth": {"type": "header", "secretRef": {"name": "s", "key": "k"}}}),
    ("Tool", {"spec.rest.auth": {"type": "header", "headerName": "X-Api-Key", "secretRef": {"name": "s", "key": "k"}}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": MCP_HTTP}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {"server": "rocks", "tool": "add"}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {"server": "rocks", "transport": "stdio", "tool": "add"}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {"server": "rocks", "transport": "stdio", "command": [], "tool": "*"}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {"server": "rocks", "transport": "stdio", "command": ["rocks"],
                                                "tool": "*"}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {**MCP_HTTP, "headersFrom": [SECRET_HEADER]}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {**MCP_HTTP, "envFrom": [SECRET_ENV]}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {**MCP_STDIO, "envFrom": [SECRET_ENV]}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {**MCP_STDIO, "headersFrom": [SECRET_HEADER]}}),
    ("Tool", {"spec.rest": DELETE, "spec.mcp": {**MCP_HTTP, "headersFrom": [{**SECRET_HEADER, "name": "X Y"}]}}),
    ("Tool", {"metadata.name": "rates.v2"}),
    ("Tool", {"metadata.name": "rates.v2", "spec.functionName": "rates_v2"}),
    ("Tool", {"spec.timeoutSeconds": 0}),
    ("ScheduledTask", {}),
    ("ScheduledTask", {"spec.schedule": "every morning"}),
    ("ScheduledTask", {"spec.concurrencyPolicy": "Sometimes"}),
    ("ScheduledTask", {"spec.prompt": ""}),
    ("Trigger", {}),
    ("Trigger", {"spec.webhook": DELETE}),
    ("Trigger", {"spec.webhook": DELETE, "spec.kubernetesEvents": {"reason": "BackOff"}}),
    ("Trigger", {"spec.kubernetesEvents": {"reason": "BackOff"}}),
    ("Trigger", {"spec.webhook.contentTypes": ["application/json", "application/json"]}),
    ("Trigger", {"spec.webhook.signature": {"header": "X Signature"}}),
    ("Trigger", {"spec.maxRunsPerMinute": 0}),
    ("Evaluation", {}),
    ("Evaluation", {"spec.cases": [{"name": "sum", "input": "1 + 2?"}, {"name": "sum", "input": "2 + 2?"}]}),
    ("Evaluation", {"spec.cases": [{"name": "sum", "input": "1 + 2?", "expect": {"rubric": RUBRIC}}]}),
    ("Evaluation", {"spec.judge": JUDGE, "spec.cases": [{"name": "sum", "input": "1 + 2?",
                                                         "expect": {"rubric": RUBRIC}}]}),
    ("Evaluation", {"spec.cases": [{"name": "sum", "input": "1 + 2?",
                                    "expect": {"mustCall": ["calc"], "mustNotCall": ["calc"]}}]}),
    ("Evaluation", {"spec.cases": [{"name": "sum", "input": "1 + 2?", "expect": {"maxLatencySeconds": 0}}]}),
]


def manifest(kind: str, changes: dict[str, Any]) -> dict[str, Any]:
    body = copy.deepcopy(BASES[kind])
    for path, value in changes.items():
        *parents, last = path.split(".")
        node = body
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = copy.deepcopy(value)
    return body


CRDS = {crd["spec"]["names"]["kind"]: crd for crd in map(yaml.safe_load, crdgen.render_all().values())}


def api_server_refusals(cluster: KubeCluster, namespace: str, body: dict[str, Any]) -> list[str]:
    """The causes' messages the real API server gives for creating `body` (empty: admitted)."""
    body = copy.deepcopy(body)
    body["metadata"]["namespace"] = namespace
    plural = CRDS[body["kind"]]["spec"]["names"]["plural"]
    status, answer = cluster.request(
        "POST", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{plural}?dryRun=All&fieldValidation=Strict",
        body=body,
    )
    if status == 201:
        return []
    assert status == 422, f"{status}: {answer}"
    return [cause["message"] for cause in answer["details"]["causes"]]


def cel_messages() -> set[str]:
    """Every CEL rule's message in the generated CRDs."""
    found: set[str] = set()

    def walk(node: dict[str, Any]) -> None:
        found.update(rule["message"] for rule in node.get("x-kubernetes-validations") or [])
        for child in (node.get("properties") or {}).values():
            walk(child)
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key])

    for crd in CRDS.values():
        walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    return found


@pytest.mark.parametrize(("kind", "changes"), CASES, ids=[f"{k}:{','.join(c) or 'valid'}" for k, c in CASES])
def test_local_validation_accepts_and_refuses_what_the_api_server_does(
    kube_cluster: KubeCluster, kube_module_namespace: str, kind, changes
):
    body = manifest(kind, changes)
    refused = api_server_refusals(kube_cluster, kube_module_namespace, body)
    problems = validate(body)
    assert bool(problems) == bool(refused), f"API server: {refused or 'admitted'}; local: {problems or 'accepted'}"
    for message in refused:
        rule_message = message.removeprefix("Invalid value: ")  # how Kubernetes 1.36 words a CEL refusal
        if rule_message in cel_messages():
            assert any(rule_message in problem for problem in problems), (rule_message, problems)


def test_every_cel_rule_of_the_crds_is_exercised_by_a_refused_case(
    kube_cluster: KubeCluster, kube_module_namespace: str
):
    refused = {message for kind, changes in CASES
               for message in api_server_refusals(kube_cluster, kube_module_namespace, manifest(kind, changes))}
    unexercised = {rule for rule in cel_messages() if f"Invalid value: {rule}" not in refused}
    assert not unexercised, "add a case that breaks each of these rules"


def test_a_literal_api_key_is_refused_naming_the_secret_reference():
    [problem] = validate(manifest("Agent", {"spec.model.apiKey": "sk-literal"}))
    assert problem.startswith("spec.model: ") and "apiKeySecretRef" in problem


def test_a_url_requirement_in_pip_packages_is_refused_where_it_is_declared():
    body = manifest("Tool", {"spec.rest": DELETE, "spec.script": {
        "source": "print(1)", "pipPackages": ["numpy @ https://files.example/numpy.whl"]}})
    [problem] = validate(body)
    assert problem.startswith("spec.script: ") and "URL requirements" in problem
