"""Child manifests built from an Agent, with no API at all."""

from __future__ import annotations

import json

import pytest

from rockbot.contracts.agent_config import AgentConfig
from rockbot.operator import builders
from rockbot.operator.resolving import resolve_agent
from rockbot.operator.settings import OperatorSettings
from rockbot.resources.common import SecretKeyRef
from tests.operator.samples import ALL_SECRETS, agent

SETTINGS = OperatorSettings(agent_image="registry.example/rockbot:1.0")


TOKEN_CHECKSUM = builders.secret_checksum({"data": {"token": "dG9rZW4="}})


def build(the_agent=None):
    the_agent = the_agent or agent(builtinTools=["scripts"])
    resolution = resolve_agent(
        agent=the_agent,
        tools=[],
        agents={},
        secret_keys=ALL_SECRETS,
        bus_secret=SecretKeyRef(name="rockbot-bus", key="amqp-url"),
        http_token_secret=SecretKeyRef(name="rockbot-analyst-http-token", key="token"),
    )
    text = builders.render_config(resolution.config)
    deployment = builders.build_deployment(the_agent, resolution, SETTINGS, text, token_checksum=TOKEN_CHECKSUM)
    return the_agent, resolution, text, deployment


def test_service_account_has_no_token():
    sa = builders.build_service_account(agent())
    assert sa["automountServiceAccountToken"] is False
    assert sa["metadata"]["name"] == "rockbot-analyst"


def test_every_child_is_owned_and_labelled():
    the_agent, _resolution, text, deployment = build()
    children = [
        builders.build_service_account(the_agent),
        builders.build_config_map(the_agent, text),
        builders.build_service(the_agent, SETTINGS),
        builders.build_http_token_secret(the_agent, "t"),
        deployment,
    ]
    for child in children:
        (owner,) = child["metadata"]["ownerReferences"]
        assert owner == {
            "apiVersion": "rockbot.dev/v1alpha1",
            "kind": "Agent",
            "name": "analyst",
            "uid": "uid-analyst",
            "controller": True,
            "blockOwnerDeletion": True,
        }
        assert child["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "rockbot-operator"
        assert child["metadata"]["labels"]["app.kubernetes.io/instance"] == "analyst"


def test_pod_has_no_token_and_a_restricted_security_context():
    _, _, _, deployment = build()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert container["image"] == "registry.example/rockbot:1.0"


@pytest.mark.parametrize(
    "spec",
    [
        {"builtinTools": ["scripts"]},
        {"image": "mine:2", "env": [{"name": "LOG_LEVEL", "value": "debug"}], "replicas": 3,
         "resources": {"requests": {"cpu": "1"}, "limits": {"cpu": "2", "memory": "1Gi"}}},
    ],
    ids=["defaults", "everything-a-user-sets"],
)
def test_the_agent_pod_is_admitted_by_pod_security_restricted(spec, restricted_violations):
    """The real admission, as for the chart's and the script pods': agents run in namespaces enforcing `restricted`."""
    _, _, _, deployment = build(agent(**spec))
    assert restricted_violations(deployment["spec"]["template"]) == []


def test_secrets_reach_the_pod_only_through_value_from():
    _the_agent, _resolution, text, deployment = build()
    env = {item["name"]: item for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["ROCKBOT_MODEL_API_KEY"] == {
        "name": "ROCKBOT_MODEL_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "llm", "key": "apiKey"}},
    }
    assert env["ROCKBOT_AMQP_URL"]["valueFrom"]["secretKeyRef"] == {"name": "rockbot-bus", "key": "amqp-url"}
    assert env["ROCKBOT_HTTP_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "rockbot-analyst-http-token"
    assert all("value" not in item for item in env.values())
    config = json.loads(text)
    assert config["model"]["api_key"] == {"env": "ROCKBOT_MODEL_API_KEY"}


def test_config_map_holds_the_resolved_config_in_openai_format():
    the_agent, resolution, text, _ = build()
    config_map = builders.build_config_map(the_agent, text)
    config = AgentConfig.model_validate_json(config_map["data"]["agent.json"])
    assert config == resolution.config
    assert config.builtin_tools == ["scripts"]


def test_a_config_change_changes_the_pod_template_checksum():
    _, _, _, first = build(agent(systemPrompt="You are terse."))
    _, _, _, second = build(agent(systemPrompt="You are verbose."))
    key = builders.CHECKSUM_ANNOTATION
    assert (
        first["spec"]["template"]["metadata"]["annotations"][key]
        != second["spec"]["template"]["metadata"]["annotations"][key]
    )


def test_a_new_http_token_changes_the_pod_template_and_its_value_stays_out_of_it():
    the_agent, resolution, text, first = build()
    second = builders.build_deployment(
        the_agent, resolution, SETTINGS, text,
        token_checksum=builders.secret_checksum({"data": {"token": "b3RoZXI="}}),
    )  # fmt: skip
    key = builders.TOKEN_CHECKSUM_ANNOTATION
    assert first["spec"]["template"]["metadata"]["annotations"][key] == TOKEN_CHECKSUM
    assert second["spec"]["template"]["metadata"]["annotations"][key] != TOKEN_CHECKSUM
    assert "dG9rZW4=" not in json.dumps(first)


def test_user_env_and_image_override_are_applied():
    _, _, _, deployment = build(agent(image="mine:2", env=[{"name": "LOG_LEVEL", "value": "debug"}]))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "mine:2"
    assert {"name": "LOG_LEVEL", "value": "debug"} in container["env"]


def test_the_longest_agent_name_the_crd_allows_gives_valid_child_names():
    from rockbot.resources.agent import CHILD_SUFFIXES, MAX_AGENT_NAME

    assert MAX_AGENT_NAME == 44  # 63 - len("rockbot-") - len("-http-token")
    longest = agent("a" * MAX_AGENT_NAME)
    for suffix in CHILD_SUFFIXES:
        name = builders.child_name(longest, suffix)
        assert len(name) <= 63 and SecretKeyRef(name=name, key="k").name == name  # a checked DNS label
    with pytest.raises(ValueError):  # one more character and the token Secret's name is not a DNS label
        SecretKeyRef(name=builders.child_name(agent("a" * (MAX_AGENT_NAME + 1)), "-http-token"), key="token")


SPEC_VARIANTS = [
    {},
    {"resources": {}},
    {"resources": {"limits": {"memory": "1Gi"}}},
    {"resources": {"requests": {"cpu": "250m"}}},
    {"resources": {"requests": {}, "limits": {}}},
    {"env": []},
    {"env": [{"name": "EMPTY", "value": ""}]},
    {"env": [{"name": "PLAIN", "value": "x"}, {"name": "NONE"}]},
    {"env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    {"image": ""},
    {"systemPrompt": "", "description": "", "tools": [], "toolBlacklist": []},
    {"model": {"baseUrl": "http://llm.local/v1", "name": "m"}},  # no API key: no key env entry
    {"builtinTools": []},
    {"replicas": 0, "subAgents": [], "toolSelector": {}},
]


def _empty_values(value, path="") -> list[str]:
    if value in ({}, [], ""):
        return [path]
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in _empty_values(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [found for index, item in enumerate(value) for found in _empty_values(item, f"{path}[{index}]")]
    return []


@pytest.mark.parametrize("spec", SPEC_VARIANTS, ids=lambda spec: json.dumps(spec)[:60])
def test_no_child_holds_an_empty_map_list_or_string_a_real_server_would_drop(spec):
    """The API server omits them (Go omitempty): a desired `limits: {}` would never match, so every reconcile wrote."""
    base = agent().model_dump(by_alias=True, exclude_none=True)["spec"]
    the_agent, _, text, deployment = build(agent(**{**base, **spec}))
    children = [
        deployment,
        builders.build_service_account(the_agent),
        builders.build_config_map(the_agent, text),
        builders.build_service(the_agent, SETTINGS),
        builders.build_http_token_secret(the_agent, "token"),
    ]
    for child in children:
        assert _empty_values(child) == [], child["kind"]


def env_names(deployment) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_agent_pods_export_traces_only_when_the_operator_is_given_a_collector():
    the_agent, resolution, text, deployment = build()
    assert not [name for name in env_names(deployment) if name.startswith("OTEL_")]  # settled Agents stay unchanged

    traced = SETTINGS.model_copy(update={"agent_otlp_endpoint": "http://collector:4318"})
    env = env_names(builders.build_deployment(the_agent, resolution, traced, text, token_checksum=TOKEN_CHECKSUM))
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318"
    assert env["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.namespace.name=default,k8s.deployment.name=rockbot-analyst"
    assert "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT" not in env

    opted_in = traced.model_copy(update={"agent_capture_content": True})
    env = env_names(builders.build_deployment(the_agent, resolution, opted_in, text, token_checksum=TOKEN_CHECKSUM))
    assert env["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] == "true"


def test_agent_pods_link_a_turns_files_to_the_console_only_when_the_operator_knows_its_address():
    the_agent, resolution, text, deployment = build()
    assert "ROCKBOT_CONSOLE_URL" not in env_names(deployment)  # settled Agents stay unchanged
    linked = SETTINGS.model_copy(update={"agent_console_url": "https://console.example.com"})
    env = env_names(builders.build_deployment(the_agent, resolution, linked, text, token_checksum=TOKEN_CHECKSUM))
    assert env["ROCKBOT_CONSOLE_URL"] == "https://console.example.com"
