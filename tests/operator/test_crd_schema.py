"""On the real API server, the generated CRDs refuse what the operator could not reconcile, naming field and fix."""

from __future__ import annotations

import pytest

from rockbot.crdgen import crd_for
from rockbot.kube import AGENTS, Invalid, KubeClient
from rockbot.resources import Agent
from rockbot.resources.agent import MAX_AGENT_NAME
from tests.operator.samples import agent_body


def body(name: str = "analyst", **spec) -> dict:
    agent = agent_body(name, **spec)
    del agent["metadata"]["uid"], agent["metadata"]["generation"], agent["metadata"]["namespace"]
    return agent


async def refusal(kube: KubeClient, namespace: str, agent: dict) -> str:
    """The real API server's refusal of `agent`."""
    with pytest.raises(Invalid) as refused:
        await kube.create(AGENTS, namespace=namespace, body=agent)
    return str(refused.value)


async def test_agent_names_are_bounded_by_the_longest_child_name(real_kube_client: KubeClient, kube_namespace: str):
    assert await real_kube_client.create(AGENTS, namespace=kube_namespace, body=body("a" * MAX_AGENT_NAME))
    message = await refusal(real_kube_client, kube_namespace, body("a" * (MAX_AGENT_NAME + 1)))
    assert "metadata.name: Agent names are at most 44 characters" in message
    assert "choose a shorter name" in message
    dotted = await refusal(real_kube_client, kube_namespace, body("team.analyst"))
    assert "metadata.name: Agent names must be DNS labels (lowercase letters, digits and '-', no dots)" in dotted


@pytest.mark.parametrize(
    ("requirement", "expected"),
    [
        ({"key": "team", "operator": "In"}, "values must list at least one label value when operator is In or NotIn"),
        ({"key": "team", "operator": "NotIn", "values": []}, "values must list at least one label value"),
        (
            {"key": "team", "operator": "Exists", "values": ["data"]},
            "values must be empty when operator is Exists or DoesNotExist: remove values",
        ),
    ],
)
async def test_selector_values_must_fit_the_operator(
    real_kube_client: KubeClient, kube_namespace: str, requirement, expected
):
    message = await refusal(real_kube_client, kube_namespace, body(toolSelector={"matchExpressions": [requirement]}))
    assert f"spec.toolSelector.matchExpressions[0]: Invalid value: {expected}" in message


async def test_selector_requirements_that_fit_their_operator_are_accepted(
    real_kube_client: KubeClient, kube_namespace: str
):
    selector = {
        "matchExpressions": [
            {"key": "team", "operator": "In", "values": ["data"]},
            {"key": "tier", "operator": "DoesNotExist"},
        ]
    }
    assert await real_kube_client.create(AGENTS, namespace=kube_namespace, body=body(toolSelector=selector))


@pytest.mark.parametrize("quantity", ["1.2.3", "1..", "Mi", "1Mii", "1e"])
async def test_malformed_quantities_are_refused(real_kube_client: KubeClient, kube_namespace: str, quantity):
    message = await refusal(real_kube_client, kube_namespace, body(resources={"limits": {"memory": quantity}}))
    field = "spec.resources.limits.memory"
    assert f'{field}: Invalid value: "{quantity}": {field} in body should match' in message


async def test_real_quantities_are_accepted(real_kube_client: KubeClient, kube_namespace: str):
    resources = {"limits": {"memory": "1.5Gi", "cpu": "2"}, "requests": {"memory": "128974848", "cpu": ".5"}}
    limits = {"cpu": "250m", "memory": "1e9"}
    agent = body(resources=resources, scriptLimits=limits)
    assert await real_kube_client.create(AGENTS, namespace=kube_namespace, body=agent)
    assert Agent.model_validate(agent).spec.resources is not None


@pytest.mark.parametrize(
    "value_from",
    [
        {},
        {"secretKeyRef": {"name": "s", "key": "k"}, "fieldRef": {"fieldPath": "metadata.name"}},
    ],
)
async def test_value_from_needs_exactly_one_source(real_kube_client: KubeClient, kube_namespace: str, value_from):
    message = await refusal(real_kube_client, kube_namespace, body(env=[{"name": "X", "valueFrom": value_from}]))
    assert (
        "spec.env[0].valueFrom: Invalid value: valueFrom must set exactly one of "
        "secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef"
    ) in message


async def test_value_from_sources_are_checked_like_a_pods(real_kube_client: KubeClient, kube_namespace: str):
    missing_key = body(env=[{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s"}}}])
    message = await refusal(real_kube_client, kube_namespace, missing_key)
    assert "spec.env[0].valueFrom.secretKeyRef.key: Required value" in message
    sources = [
        {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
        {"configMapKeyRef": {"name": "c", "key": "k"}},
        {"fieldRef": {"fieldPath": "status.podIP"}},
        {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}},
    ]
    env = [{"name": f"X{index}", "valueFrom": source} for index, source in enumerate(sources)]
    created = await real_kube_client.create(AGENTS, namespace=kube_namespace, body=body(env=env))
    assert [entry["valueFrom"] for entry in created["spec"]["env"]] == sources


def test_function_names_are_bounded_and_tool_lists_are_sets_in_the_crd():
    spec = crd_for(Agent)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["toolBlacklist"]["items"]["maxLength"] == 64
    assert spec["subAgents"]["items"]["properties"]["toolName"]["maxLength"] == 64
    # The API server itself refuses a name listed twice ("Duplicate value"), as it does for any set.
    assert spec["tools"]["x-kubernetes-list-type"] == "set"
    assert spec["toolBlacklist"]["x-kubernetes-list-type"] == "set"
