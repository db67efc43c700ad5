"""No Agent may name the Secrets rockbot keeps for other agents or for itself (issue 13 §5, first bullet)."""

from __future__ import annotations

from rockbot.kube import AGENTS, DEPLOYMENTS, SECRETS, KubeClient, NotFound
from rockbot.operator.secret_refs import forbidden_references, secret_references
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent, agent_body, tool_body
from tests.operator.test_operator_e2e import secret, settings
from tests.waiting import eventually

BROKER_ADMIN = {"metadata": {"name": "rockbot-rabbitmq", "labels": {"app.kubernetes.io/part-of": "rockbot"}}}


def problems(the_agent, tools=(), secrets=None) -> list[str]:
    return forbidden_references(
        the_agent, secret_references(the_agent, tools=list(tools)), secrets=secrets or {}
    )


def test_another_agents_bus_or_token_secret_is_refused_wherever_it_is_named():
    env = [{"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": "rockbot-victim-bus", "key": "amqp-url"}}}]
    assert problems(agent(env=env)) == [
        'spec.env[0].valueFrom.secretKeyRef names Secret "rockbot-victim-bus", which holds Agent victim\'s '
        "credentials: an Agent may use only Secrets of its own, not those rockbot keeps; point it at another Secret"
    ]
    token = tool_body("wx", rest={"url": "https://wx.example/", "auth": {
        "type": "bearer", "secretRef": {"name": "rockbot-victim-http-token", "key": "token"}}})
    assert [p.split(" names ")[0] for p in problems(agent(tools=["wx"]), [token])] == [
        'Tool "wx" spec.rest.auth.secretRef']
    model = agent(model={"baseUrl": "https://llm.example/v1", "name": "m",
                         "apiKeySecretRef": {"name": "rockbot-victim-bus", "key": "amqp-url"}})
    assert [p.split(" names ")[0] for p in problems(model)] == ["spec.model.apiKeySecretRef"]


def test_its_own_credentials_and_ordinary_secrets_are_fine():
    env = [{"name": "MINE", "valueFrom": {"secretKeyRef": {"name": "rockbot-analyst-bus", "key": "amqp-url"}}},
           {"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "wx-key", "key": "k"}}}]
    assert problems(agent(env=env)) == []


def test_a_secret_labelled_as_part_of_rockbot_is_refused_unless_the_agent_owns_it():
    env = [{"name": "ADMIN", "valueFrom": {"secretKeyRef": {"name": "rockbot-rabbitmq", "key": "password"}}}]
    assert "credentials rockbot keeps for its own parts" in problems(agent(env=env), secrets={
        "rockbot-rabbitmq": BROKER_ADMIN})[0]
    own = agent(env=env)
    owned = {"metadata": {**BROKER_ADMIN["metadata"], "ownerReferences": [{"uid": own.metadata["uid"]}]}}
    assert problems(own, secrets={"rockbot-rabbitmq": owned}) == []


async def test_an_agent_naming_another_agents_login_is_refused_in_status_and_never_deployed(
    kube: KubeClient, kube_namespace: str, as_operator: str
) -> None:
    ns = kube_namespace
    await kube.create(SECRETS, namespace=ns, body=secret("llm", apiKey="sk-test"))
    env = [{"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": "rockbot-analyst-bus", "key": "amqp-url"}}}]
    await kube.create(AGENTS, namespace=ns, body=agent_body("mallory", namespace=ns, env=env))
    async with operator_running(settings(ns)):
        async def refused() -> dict:
            ready = condition(await kube.get(AGENTS, namespace=ns, name="mallory"), "Ready")
            assert ready["status"] == "False"
            return ready

        ready = await eventually(refused, within=30)
    assert ready["message"].startswith('spec.env[0].valueFrom.secretKeyRef names Secret "rockbot-analyst-bus"')
    for name in ("rockbot-mallory", "rockbot-mallory-http-token"):
        try:
            await kube.get(DEPLOYMENTS if name == "rockbot-mallory" else SECRETS, namespace=ns, name=name)
        except NotFound:
            continue
        raise AssertionError(f"{name} was made for a refused Agent")
