"""The Grafana dashboard and the PodMonitor: every query names a metric and labels the code exports."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client import CollectorRegistry

from rockbot.agent.metrics import AgentMetrics
from rockbot.gateway.metrics import GatewayMetrics
from rockbot.operator.scheduling.metrics import SchedulingMetrics
from rockbot.scripts_manager.metrics import ScriptMetrics
from tests.chart.conftest import CHART, NAMESPACE, HelmError
from tests.chart.test_render import Render, env_of, find

DASHBOARD = CHART / "dashboards" / "rockbot.json"
#: Labels the scrape adds (the PodMonitor's target labels) or PromQL's histograms use.
SCRAPE_LABELS = {"namespace", "pod", "le"}
TELEMETRY = {"telemetry": {"otlpEndpoint": "http://otel-collector.monitoring:4318", "collectorEgressTo": [
    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]}}


def exported() -> dict[str, set[str]]:
    """Every sample name the processes' registries export, with the labels it carries."""
    registries: list[CollectorRegistry] = [
        AgentMetrics(agent="a").registry, ScriptMetrics(backend="pods").registry, GatewayMetrics().registry,
        SchedulingMetrics().registry,
    ]
    names: dict[str, set[str]] = {}
    for registry in registries:
        for name, collector in registry._names_to_collectors.items():
            names[name] = set(getattr(collector, "_labelnames", ()))
    return names


def queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] if panel["type"] != "row"
            for target in panel["targets"]]


def test_the_dashboard_is_valid_json_with_a_query_in_every_panel() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "rockbot-overview" and dashboard["title"] == "rockbot"
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert len(panels) >= 10
    for panel in panels:
        assert panel["targets"] and all(target["expr"].strip() for target in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    variables = {variable["name"] for variable in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "agent"}


@pytest.mark.parametrize(("title", "expr"), queries())
def test_every_query_names_metrics_and_labels_the_code_exports(title: str, expr: str) -> None:
    known = exported()
    metrics = set(re.findall(r"\brockbot_[a-z_]+\b", expr))
    assert metrics, f"{title}: no rockbot metric in {expr}"
    for metric in metrics:
        assert metric in known, f"{title}: {metric} is not exported by any rockbot process"
    grouped = {label.strip() for group in re.findall(r"\bby \(([^)]*)\)", expr) for label in group.split(",")}
    matched = {label for selector in re.findall(r"\{([^}]*)\}", expr)
               for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector)}
    labels = set().union(*(known[metric] for metric in metrics)) | SCRAPE_LABELS
    assert grouped | matched <= labels, f"{title}: labels {sorted((grouped | matched) - labels)} are not exported"


def test_the_panels_the_issue_asks_for_are_there() -> None:
    text = " ".join(expr for _, expr in queries())
    for metric in ("rockbot_tool_invoke_duration_seconds_bucket", "rockbot_tool_invocations_total",
                   "rockbot_llm_request_duration_seconds_bucket", "rockbot_llm_tokens_total",
                   "rockbot_scripts_runs_total", "rockbot_scripts_queue_wait_seconds_bucket",
                   "rockbot_scripts_pod_time_to_first_instruction_seconds_bucket", "rockbot_scheduled_runs_total",
                   "rockbot_scheduled_run_lag_seconds_bucket"):
        assert metric in text


def test_the_dashboard_ships_in_a_configmap_for_grafanas_sidecar(render: Render) -> None:
    configmap = find(render(), "ConfigMap", "rockbot-dashboard", NAMESPACE)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["rockbot.json"]) == json.loads(DASHBOARD.read_text())
    elsewhere = render({"monitoring": {"grafanaDashboard": {"namespace": "grafana", "labels": {"dash": "yes"},
                                                            "annotations": {"grafana_folder": "rockbot"}}}})
    moved = find(elsewhere, "ConfigMap", "rockbot-dashboard", "grafana")
    assert moved["metadata"]["labels"]["dash"] == "yes" and moved["metadata"]["annotations"] == {
        "grafana_folder": "rockbot"}
    assert not [m for m in render({"monitoring": {"grafanaDashboard": {"enabled": False}}})
                if m["metadata"]["name"] == "rockbot-dashboard"]


def test_the_pod_monitor_is_off_by_default_and_scrapes_every_namespace_agents_run_in(render: Render) -> None:
    assert not [m for m in render() if m["kind"] == "PodMonitor"]
    monitor = find(render({"agentNamespaces": ["team-a"], "monitoring": {"podMonitor": {
        "enabled": True, "labels": {"release": "prometheus"}}}}), "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE, "team-a"]}
    assert monitor["spec"]["selector"]["matchExpressions"][0]["values"] == [
        "agent", "scripts-manager", "gateway", "operator"]
    assert [(e["port"], e["path"]) for e in monitor["spec"]["podMetricsEndpoints"]] == [
        ("http", "/metrics"), ("health", "/metrics")]  # the operator serves its metrics beside its probes
    everywhere = find(render({"operator": {"watchAllNamespaces": True}, "monitoring": {"podMonitor": {
        "enabled": True}}}), "PodMonitor")
    assert everywhere["spec"]["namespaceSelector"] == {"any": True}


def test_one_value_sends_every_process_traces_to_the_collector_and_opens_the_way(render: Render) -> None:
    manifests = render(TELEMETRY)
    for name in ("rockbot-operator", "rockbot-scripts-manager", "rockbot-gateway"):
        env = env_of(find(manifests, "Deployment", name))
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318", name
    operator = env_of(find(manifests, "Deployment", "rockbot-operator"))
    assert operator["ROCKBOT_AGENT_OTLP_ENDPOINT"] == "http://otel-collector.monitoring:4318"  # for the agents' pods
    assert "ROCKBOT_AGENT_CAPTURE_CONTENT" not in operator and "ROCKBOT_AGENT_CONSOLE_URL" not in operator
    linked = render({"console": {"publicUrl": "https://console.example.com"}})
    assert env_of(find(linked, "Deployment", "rockbot-operator"))["ROCKBOT_AGENT_CONSOLE_URL"] == (
        "https://console.example.com")  # for the links in agents' answers to a turn's files
    opted_in = render({"telemetry": {**TELEMETRY["telemetry"], "captureContent": True}})
    assert env_of(find(opted_in, "Deployment", "rockbot-operator"))["ROCKBOT_AGENT_CAPTURE_CONTENT"] == "true"
    for policy in (find(manifests, "NetworkPolicy", "rockbot-agent-egress"),
                   find(manifests, "NetworkPolicy", "rockbot-gateway")):
        rule = {"to": TELEMETRY["telemetry"]["collectorEgressTo"], "ports": [{"protocol": "TCP", "port": 4318}]}
        assert rule in policy["spec"]["egress"]
    defaults = render()
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env_of(find(defaults, "Deployment", "rockbot-operator"))
    assert all(rule.get("ports") != [{"protocol": "TCP", "port": 4318}]
               for rule in find(defaults, "NetworkPolicy", "rockbot-agent-egress")["spec"]["egress"])


def test_a_collector_agents_cannot_reach_is_refused_naming_the_value(render: Render) -> None:
    with pytest.raises(HelmError, match=r"telemetry\.collectorEgressTo is empty"):
        render({"telemetry": {"otlpEndpoint": "http://otel-collector.monitoring:4318"}})
