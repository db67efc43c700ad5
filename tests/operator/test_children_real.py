"""Children on the real API server: what the builders make compares equal however the server returns it.

A restart lists the children, a watch streams them, a write answers with them: each shape must
compare equal to the desired manifest, or every reconcile after a restart writes every child
(seen at 200 Agents: 800 patches of unchanged objects). And a real change must still be seen.
"""

from __future__ import annotations

from typing import Any

from rockbot.kube import AGENTS, CONFIGMAPS, DEPLOYMENTS, SERVICEACCOUNTS, SERVICES, KubeClient
from rockbot.kube.resources import Resource
from rockbot.operator import builders
from rockbot.operator.children import Children, ensure
from rockbot.operator.handlers import MANAGED
from rockbot.operator.resolving import resolve_agent
from rockbot.operator.settings import OperatorSettings
from rockbot.resources import Agent
from rockbot.resources.common import SecretKeyRef
from tests.operator.samples import ALL_SECRETS, agent_body
from tests.operator.test_children import NoRequests

SETTINGS = OperatorSettings(agent_image="registry.example/rockbot:1.0", agent_otlp_endpoint="http://otel:4318")
#: Quantities as a person writes them, which the API server stores in its canonical form (500m, 512Mi, 1).
RESOURCES = {"requests": {"cpu": "0.5", "memory": "0.5Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}


async def stored_agent(kube: KubeClient, namespace: str, **spec: Any) -> Agent:
    """A stored Agent: children owned by a missing one are garbage-collected."""
    body = agent_body(namespace=namespace, builtinTools=["scripts"], resources=RESOURCES,
                      env=[{"name": "MODE", "value": "strict"}], **spec)
    del body["metadata"]["uid"], body["metadata"]["generation"]
    return Agent.model_validate(await kube.create(AGENTS, namespace=namespace, body=body))


def children_of(the_agent: Agent) -> list[tuple[Resource, dict[str, Any]]]:
    """Every child `ensure` writes, as the reconciler builds it."""
    resolution = resolve_agent(
        agent=the_agent, tools=[], agents={}, secret_keys=ALL_SECRETS,
        bus_secret=SecretKeyRef(name="rockbot-bus", key="amqp-url"),
        http_token_secret=SecretKeyRef(name="rockbot-analyst-http-token", key="token"),
    )  # fmt: skip
    text = builders.render_config(resolution.config)
    deployment = builders.build_deployment(the_agent, resolution, SETTINGS, text, token_checksum="c" * 64,
                                           bus_checksum="b" * 64)
    return [
        (SERVICEACCOUNTS, builders.build_service_account(the_agent)),
        (CONFIGMAPS, builders.build_config_map(the_agent, text)),
        (SERVICES, builders.build_service(the_agent, SETTINGS)),
        (DEPLOYMENTS, deployment),
    ]


async def test_every_child_read_back_from_the_real_server_matches_what_was_built(kube: KubeClient,
                                                                              kube_namespace: str):
    the_agent = await stored_agent(kube, kube_namespace)
    wanted = children_of(the_agent)
    created = Children()
    for resource, desired in wanted:
        await ensure(kube, created, resource, desired)
    for resource, desired in wanted:  # the write's answer, kept until its echo arrives
        await ensure(NoRequests(), created, resource, desired)  # type: ignore[arg-type]

    listed, watched, got = Children(), Children(), Children()
    for resource, desired in wanted:
        name = desired["metadata"]["name"]
        page = await kube.list(resource, namespace=kube_namespace, label_selector=MANAGED)
        for item in page.items:  # as on a restart: a list's items carry no kind nor apiVersion
            listed.seen(resource, item, listed=True)
        async for event in kube.watch(resource, namespace=kube_namespace, field_selector=f"metadata.name={name}",
                                      resource_version="0", timeout_seconds=5):
            watched.seen(resource, event.object)
            break
        got.seen(resource, await kube.get(resource, namespace=kube_namespace, name=name))
    for children in (listed, watched, got):
        for resource, desired in wanted:
            assert children.get(resource, kube_namespace, desired["metadata"]["name"]) is not None
            await ensure(NoRequests(), children, resource, desired)  # type: ignore[arg-type]
    deployment = listed.get(DEPLOYMENTS, kube_namespace, "rockbot-analyst")
    assert deployment is not None and deployment.rollout is not None  # Ready is judged on a listed one too


async def test_a_changed_child_is_written_once_and_then_matches(kube: KubeClient, kube_namespace: str):
    the_agent = await stored_agent(kube, kube_namespace)
    children = Children()
    for resource, desired in children_of(the_agent):
        await ensure(kube, children, resource, desired)
    changed = await kube.patch(AGENTS, namespace=kube_namespace, name="analyst",
                               body={"spec": {"resources": {"requests": {"cpu": "250m"}},
                                              "env": [{"name": "MODE", "value": "lax"}]}})
    _, deployment = children_of(Agent.model_validate(changed))[-1]
    before = children.get(DEPLOYMENTS, kube_namespace, "rockbot-analyst")
    written = await ensure(kube, children, DEPLOYMENTS, deployment)
    assert before is not None and written.resource_version != before.resource_version
    live = await kube.get(DEPLOYMENTS, namespace=kube_namespace, name="rockbot-analyst")
    (container,) = live["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"]["cpu"] == "250m"
    assert {"name": "MODE", "value": "lax"} in container["env"]
    await ensure(NoRequests(), children, DEPLOYMENTS, deployment)  # type: ignore[arg-type]
