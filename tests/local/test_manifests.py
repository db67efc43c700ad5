"""Manifests as people really write them: every mistake reported at load, one line each, in YAML's words."""

from __future__ import annotations

import base64
import pathlib

import pytest

from rockbot.local.manifests import ManifestError, load, script_limit_problems

AGENT = """apiVersion: rockbot.dev/v1alpha1
kind: Agent
metadata: {{name: {name}{namespace}}}
spec:
  model: {{baseUrl: "http://127.0.0.1:9/v1", name: m}}
{extra}"""
TOOL = """apiVersion: rockbot.dev/v1alpha1
kind: {kind}
metadata: {{name: {name}{namespace}}}
spec: {{description: x, script: {{source: "print(1)"}}}}
"""


def agent(name: str = "analyst", *, namespace: str | None = None, extra: str = "") -> str:
    return AGENT.format(name=name, namespace=f", namespace: {namespace}" if namespace else "", extra=extra)


def tool(name: str = "rates", *, kind: str = "Tool", namespace: str | None = None) -> str:
    return TOOL.format(name=name, kind=kind, namespace=f", namespace: {namespace}" if namespace else "")


def problems_of(tmp_path: pathlib.Path, text: str) -> list[str]:
    path = tmp_path / "all.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as refused:
        load([path])
    assert "Traceback" not in str(refused.value)
    return refused.value.problems


def secret(data: dict[str, str]) -> str:
    lines = "".join(f"  {key}: {value!r}\n" for key, value in data.items())
    return f"apiVersion: v1\nkind: Secret\nmetadata: {{name: keys}}\ndata:\n{lines}"


@pytest.mark.parametrize(("document", "expected"), [
    ("- a\n- list\n", "document 2 (line 7) is a list, not an object with apiVersion, kind and metadata"),
    ("just words\n", "document 2 (line 7) is a string, not an object with apiVersion, kind and metadata"),
    (secret({"token": "not base64!"}), "Secret 'keys': data.token is not base64"),
    (secret({"token": base64.b64encode(b"\xff\xfe").decode()}), "Secret 'keys': data.token is not UTF-8 text"),
])
def test_a_document_that_is_no_object_is_one_line_naming_file_and_document(tmp_path, document, expected):
    [problem] = problems_of(tmp_path, agent() + "---\n" + document)
    assert problem.startswith(f"{tmp_path / 'all.yaml'}: {expected}")


def test_every_invalid_object_is_reported_not_only_the_first(tmp_path):
    text = "---\n".join([
        agent(extra="  maxIterations: 0\n"),
        tool(kind="Tol"),
        AGENT.format(name="other", namespace="", extra="").replace("rockbot.dev/v1alpha1", "rockbot.dev/v1"),
    ])
    problems = problems_of(tmp_path, text)
    file = tmp_path / "all.yaml"
    assert problems == [
        f"{file}: Agent 'analyst' is invalid: spec.maxIterations: Input should be greater than or equal to 1",
        f"{file}: document 2 (line 8): kind: 'Tol' is not a kind of rockbot.dev (did you mean Tool?): use one of "
        "Agent, Tool, ScheduledTask, Trigger, Evaluation",
        f"{file}: Agent 'other': apiVersion: rockbot.dev/v1 is not served: use rockbot.dev/v1alpha1",
    ]


def test_a_yaml_error_and_a_duplicate_key_name_the_file_and_line(tmp_path):
    [problem] = problems_of(tmp_path, agent() + "  maxIterations: [1\n")
    assert problem.startswith(f"{tmp_path / 'all.yaml'}:7: not valid YAML: ") and "\n" not in problem
    [problem] = problems_of(tmp_path, agent(extra="  maxIterations: 3\n  maxIterations: 4\n"))
    assert problem == f"{tmp_path / 'all.yaml'}:7: duplicate key 'maxIterations' (line 6 has it too): keep one"


def test_a_list_is_read_as_its_items_and_other_kinds_are_skipped_with_a_warning(tmp_path):
    items = "\n".join("  - " + doc.replace("\n", "\n    ").rstrip() for doc in (agent(), tool()))
    path = tmp_path / "list.yaml"
    path.write_text(f"apiVersion: v1\nkind: List\nitems:\n{items}\n---\napiVersion: v1\nkind: ConfigMap\n"
                    "metadata: {name: settings}\n")
    found = load([path])
    assert list(found.agents) == ["analyst"] and list(found.tools) == ["rates"]
    assert found.warnings == [f"{path}: ConfigMap 'settings' is skipped: rockbot local runs Agents, Tools, "
                              "ScheduledTasks, Triggers, Evaluations and Secrets only"]


def test_objects_of_different_namespaces_are_not_resolved_together(tmp_path):
    [problem] = problems_of(tmp_path, agent(namespace="team-a") + "---\n" + tool(namespace="team-b"))
    assert problem == (f"{tmp_path / 'all.yaml'}: Tool 'rates' is in namespace 'team-b', Agent 'analyst' in "
                       "'team-a': the operator resolves an Agent's Tools in its own namespace only; run one "
                       "namespace's files at a time")


def test_a_trigger_whose_secret_is_missing_is_refused_at_load(tmp_path):
    trigger = """apiVersion: rockbot.dev/v1alpha1
kind: Trigger
metadata: {name: issues}
spec:
  agentRef: {name: analyst}
  webhook: {secretKeyRef: {name: github-webhook, key: secret}}
  prompt: hi
"""
    [problem] = problems_of(tmp_path, agent() + "---\n" + trigger)
    assert problem == (f"{tmp_path / 'all.yaml'}: Trigger 'issues': spec.webhook.secretKeyRef: no Secret "
                       "'github-webhook' with key 'secret' in these files: add a kind: Secret document with it")


def test_a_cron_schedule_with_seven_fields_is_explained_without_a_regex(tmp_path):
    task = ("apiVersion: rockbot.dev/v1alpha1\nkind: ScheduledTask\nmetadata: {name: nightly}\n"
            "spec: {agentRef: {name: analyst}, schedule: '* * * * * * *', prompt: hi}\n")
    [problem] = problems_of(tmp_path, agent() + "---\n" + task)
    assert problem == (f"{tmp_path / 'all.yaml'}: ScheduledTask 'nightly' is invalid: spec.schedule: '* * * * * * *' "
                       "has 7 fields; use 5 (minute hour day month weekday) or 6 (second first)")


def test_script_limits_over_the_managers_maximum_are_refused_at_load(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(agent(extra='  scriptLimits: {cpu: "2", memory: 4Gi}\n'))
    assert script_limit_problems(load([path]), max_cpu="1", max_memory="1Gi") == [
        f"{path}: Agent 'analyst': spec.scriptLimits.cpu: 2 is over the scripts-manager's maximum of 1: lower it",
        f"{path}: Agent 'analyst': spec.scriptLimits.memory: 4Gi is over the scripts-manager's maximum of 1Gi: "
        "lower it",
    ]
