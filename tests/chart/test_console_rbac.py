"""The console's rights in the chart: exactly what it uses (reviews of tokens and rights, reading the rockbot
resources of its pages, Events on Agents), no Secret; and the example ClusterRoles speak the console's verbs."""

from __future__ import annotations

from collections.abc import Callable

from tests.chart.conftest import Manifest
from tests.chart.rbac import expand, grants_of, rule_set

CONSOLE_SA = "rockbot-console"
READ = expand("rockbot.dev", ["agents", "tools", "scheduledtasks", "triggers"], ["get", "list", "watch"])
EVENTS = {("", "events", "create")}
REVIEWS = {("authentication.k8s.io", "tokenreviews", "create"),
           ("authorization.k8s.io", "subjectaccessreviews", "create")}

Render = Callable[..., list[Manifest]]


def test_the_console_may_review_and_read_and_nothing_else(render: Render) -> None:
    grants = grants_of(render({"operator": {"watchAllNamespaces": True}}), account=CONSOLE_SA)
    assert {g.namespace for g in grants} == {None}
    assert set().union(*(g.rights for g in grants)) == REVIEWS | READ | EVENTS


def test_watching_some_namespaces_reads_only_there(render: Render) -> None:
    grants = grants_of(render({"agentNamespaces": ["team-a"]}), account=CONSOLE_SA)
    cluster_wide = set().union(*(g.rights for g in grants if g.namespace is None))
    assert cluster_wide == REVIEWS
    assert {g.namespace: g.rights for g in grants if g.namespace} == {"rockbot": READ | EVENTS, "team-a": READ | EVENTS}


def test_example_roles_grant_the_console_verbs(render: Render) -> None:
    roles = {m["metadata"]["name"]: rule_set(m["rules"]) for m in render() if m["kind"] == "ClusterRole"}
    assert roles["rockbot-console-viewer"] == READ
    assert roles["rockbot-console-agent-operator"] == READ | {("rockbot.dev", "agents/chat", "create")}
    assert roles["rockbot-console-approver"] == {("rockbot.dev", "agents/approve", "create")}
    assert "rockbot-console-viewer" not in {m["metadata"]["name"] for m in render({"console": {"exampleRoles": False}})}


def test_no_console_no_rights(render: Render) -> None:
    manifests = render({"console": {"enabled": False}})
    assert grants_of(manifests, account=CONSOLE_SA) == []
    assert not [m for m in manifests if "console" in m["metadata"]["name"]]


def test_the_ingress_is_optional(render: Render) -> None:
    assert not [m for m in render() if m["kind"] == "Ingress" and "console" in m["metadata"]["name"]]
    ingress = next(m for m in render({"console": {"ingress": {"enabled": True, "host": "console.example.com"}}})
                   if m["kind"] == "Ingress" and m["metadata"]["name"] == "rockbot-console")
    assert ingress["spec"]["rules"][0]["host"] == "console.example.com"


def test_the_tracing_ui_link_reaches_the_console(render: Render) -> None:
    template = "https://jaeger.example.com/trace/{trace_id}"
    deployment = next(m for m in render({"console": {"traceUrlTemplate": template}})
                      if m["kind"] == "Deployment" and m["metadata"]["name"] == "rockbot-console")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ROCKBOT_TRACE_URL_TEMPLATE"] == template
