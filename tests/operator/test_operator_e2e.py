"""The operator end to end: kopf in its own thread, the emulated API server over HTTP, assertions on
what the API server holds, as `kubectl get` would show it."""

from __future__ import annotations

import base64
import json
import logging

import pytest

from rockbot.kube import (
    AGENTS,
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    TOOLS,
    KubeClient,
    NotFound,
)
from rockbot.operator.settings import OperatorSettings
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body, tool_body
from tests.waiting import eventually

NS = "default"
SETTINGS = OperatorSettings(namespaces=[NS], agent_image="registry.example/rockbot:test", resync_seconds=3600)


def secret(name: str, **data: str) -> dict:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "data": encoded}


async def create_basics(kube: KubeClient) -> None:
    await kube.create(SECRETS, namespace=NS, body=secret("llm", apiKey="sk-test"))
    await kube.create(SECRETS, namespace=NS, body=secret("rockbot-bus", **{"amqp-url": "amqp://u:p@bus/"}))


async def mark_deployment_ready(kube: KubeClient, name: str) -> None:
    """Play kube-controller-manager: the Deployment rolled out and its pods are ready."""
    deployment = await kube.get(DEPLOYMENTS, namespace=NS, name=name)
    replicas = deployment["spec"]["replicas"]
    status = {
        "observedGeneration": deployment["metadata"]["generation"],
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }
    await kube.patch(DEPLOYMENTS, namespace=NS, name=name, body={"status": status}, subresource="status")


async def config_of(kube: KubeClient, agent: str) -> dict:
    config_map = await kube.get(CONFIGMAPS, namespace=NS, name=f"rockbot-{agent}-config")
    return json.loads(config_map["data"]["agent.json"])


@pytest.fixture
async def ready_agent(kube_client: KubeClient):
    await create_basics(kube_client)
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("weather"))
    await kube_client.create(AGENTS, namespace=NS, body=agent_body(tools=["weather"], builtinTools=["scripts"]))
    async with operator_running(SETTINGS):
        await eventually(lambda: kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst"))
        await mark_deployment_ready(kube_client, "rockbot-analyst")

        async def is_ready():
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "Ready")["status"] == "True"
            return agent

        yield await eventually(is_ready)


async def test_agent_becomes_children_and_a_ready_status(kube_client: KubeClient, ready_agent):
    status = ready_agent["status"]
    assert condition(ready_agent, "ToolsResolved") | {"lastTransitionTime": None} == {
        "type": "ToolsResolved",
        "status": "True",
        "reason": "AllResolved",
        "message": "2 tools offered to the model",
        "lastTransitionTime": None,
        "observedGeneration": 1,
    }
    assert status["tools"] == [
        {
            "name": "execute_python_script",
            "source": "builtin:scripts",
            "description": status["tools"][0]["description"],
        },
        {"name": "weather", "source": "tool:weather", "description": "The weather tool."},
    ]
    assert status["toolCount"] == 2  # what `kubectl get agents` prints under TOOLS
    assert status["observedGeneration"] == 1 and status["readyReplicas"] == 1
    sa = await kube_client.get(SERVICEACCOUNTS, namespace=NS, name="rockbot-analyst")
    assert sa["automountServiceAccountToken"] is False
    assert (await kube_client.get(SERVICES, namespace=NS, name="rockbot-analyst"))["spec"]["ports"][0]["port"] == 8080
    token = await kube_client.get(SECRETS, namespace=NS, name="rockbot-analyst-http-token")
    assert len(base64.b64decode(token["data"]["token"])) >= 32
    config = await config_of(kube_client, "analyst")
    assert config["tools"][0]["definition"]["function"]["name"] == "weather"
    assert "sk-test" not in json.dumps(config) and "sk-test" not in json.dumps(ready_agent)


    async def transitions_posted():
        events = (await kube_client.list(EVENTS, namespace=NS)).items
        reasons = {e["reason"] for e in events if e["involvedObject"].get("name") == "analyst"}
        assert {"AllResolved", "DeploymentReady"} <= reasons

    await eventually(transitions_posted)


async def test_a_settled_agent_costs_no_writes_even_across_an_operator_restart(kube_client: KubeClient, kube_api,
                                                                               caplog):
    caplog.set_level(logging.INFO, logger="rockbot.operator")
    await create_basics(kube_client)
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("weather"))
    await kube_client.create(AGENTS, namespace=NS, body=agent_body(tools=["weather"]))
    async with operator_running(SETTINGS):
        await eventually(lambda: kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst"))
        await mark_deployment_ready(kube_client, "rockbot-analyst")

        async def settled():
            assert condition(await kube_client.get(AGENTS, namespace=NS, name="analyst"), "Ready")["status"] == "True"
            tool = await kube_client.get(TOOLS, namespace=NS, name="weather")
            assert tool["status"]["usedBy"] == ["analyst"]

        await eventually(settled)

    async def logged(text: str, *, after: int) -> None:
        """The operator said `text` after its first `after` log records."""
        assert [r for r in caplog.records[after:] if text in r.getMessage()], f"no log record saying {text!r} yet"

    mark = len(kube_api.requests)
    records = len(caplog.records)
    async with operator_running(SETTINGS.model_copy(update={"resync_seconds": 1.0})):
        await eventually(lambda: logged("reconciled every Agent once since start", after=records))
        await kube_client.patch(
            AGENTS, namespace=NS, name="analyst", body={"metadata": {"labels": {"poke": "1"}}}
        )  # news: the Agent and its Secrets are looked at again
        poked = len(caplog.records)
        await eventually(lambda: logged("resync: compared 1 Agents", after=poked))  # and a no-op resync pass
    writes = [f"{r.method.value} {r.url.path}" for r in kube_api.writes_since(mark)]
    assert writes == [f"PATCH /apis/rockbot.dev/v1alpha1/namespaces/{NS}/agents/analyst"]  # the test's own poke
    agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
    # kopf keeps no state on the object: no finalizer (deletable while the operator is down), no annotations.
    assert "finalizers" not in agent["metadata"]
    assert not [key for key in agent["metadata"].get("annotations") or {} if "kopf" in key or "rockbot.dev" in key]


async def test_children_deleted_or_edited_by_hand_are_put_back(kube_client: KubeClient, ready_agent):
    await kube_client.delete(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")
    await kube_client.patch(
        CONFIGMAPS, namespace=NS, name="rockbot-analyst-config", body={"data": {"agent.json": "{}"}}
    )

    async def repaired():
        deployment = await kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")
        assert (await config_of(kube_client, "analyst")).get("name") == "analyst"  # not the hand-edited {}
        return deployment

    deployment = await eventually(repaired)
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


async def test_a_tool_change_reaches_every_agent_that_uses_it(kube_client: KubeClient, ready_agent):
    await kube_client.patch(TOOLS, namespace=NS, name="weather", body={"spec": {"description": "Forecasts."}})

    async def updated():
        config = await config_of(kube_client, "analyst")
        assert config["tools"][0]["definition"]["function"]["description"] == "Forecasts."
        tool = await kube_client.get(TOOLS, namespace=NS, name="weather")
        assert tool["status"]["usedBy"] == ["analyst"]
        assert condition(tool, "Accepted")["status"] == "True"

    await eventually(updated)

    await kube_client.delete(TOOLS, namespace=NS, name="weather")

    async def unresolved():
        agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
        tools = condition(agent, "ToolsResolved")
        assert tools["status"] == "False"
        assert (
            tools["message"] == 'Tool "weather" not found in namespace default: create it or remove it from spec.tools'
        )
        assert [t["name"] for t in agent["status"]["tools"]] == ["execute_python_script"]

    await eventually(unresolved)


async def test_bad_references_are_reported_in_conditions(kube_client: KubeClient):
    await kube_client.create(SECRETS, namespace=NS, body=secret("rockbot-bus", **{"amqp-url": "amqp://bus/"}))
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("bad", parameters={"type": "string"}))
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("one", functionName="same"))
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("two", functionName="same"))
    await kube_client.create(AGENTS, namespace=NS, body=agent_body(tools=["bad", "one", "two", "ghost"]))
    async with operator_running(SETTINGS):

        async def reported():
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "ToolsResolved")["message"].split("; ") == [
                'Tool "ghost" not found in namespace default: create it or remove it from spec.tools',
                'Tool "bad" is not accepted: spec.parameters must be an object schema '
                '({"type": "object", "properties": {...}}): tool arguments are always a JSON object',
                "tool:two and tool:one both offer a tool named 'same', so tool:two is not offered (tool:one keeps "
                "it: built-in tools first, then declared ones in the Agent's order, then MCP server listings): give "
                "one of them another name (spec.functionName on its Tool, or subAgents[].toolName)",
            ]
            assert ("same", "tool:one") in [(t["name"], t["source"]) for t in agent["status"]["tools"]]
            ready = condition(agent, "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "ConfigurationIncomplete")
            assert ready["message"] == (
                "spec.model.apiKeySecretRef: Secret \"llm\" not found in namespace default: create it with key 'apiKey'"
            )
            bad = await kube_client.get(TOOLS, namespace=NS, name="bad")
            assert condition(bad, "Accepted")["status"] == "False"

        await eventually(reported)
        # Degraded, not down: the agent deploys with what resolved (nothing here but built-ins).
        assert await kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")

        await kube_client.create(SECRETS, namespace=NS, body=secret("llm", apiKey="sk"))
        await kube_client.patch(AGENTS, namespace=NS, name="analyst", body={"spec": {"tools": ["one"]}})

        async def fixed():
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "ToolsResolved")["status"] == "True"
            assert condition(agent, "Ready")["reason"] == "DeploymentProgressing"
            assert agent["status"]["observedGeneration"] == 2

        await eventually(fixed)


async def test_an_object_owned_by_someone_else_is_not_taken_over(kube_client: KubeClient):
    await create_basics(kube_client)
    owner = await kube_client.create(
        CONFIGMAPS,
        namespace=NS,
        body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-else", "namespace": NS}},
    )
    foreign = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "rockbot-analyst",
            "namespace": NS,
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "name": "someone-else",
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
    }
    await kube_client.create(SERVICEACCOUNTS, namespace=NS, body=foreign)
    await kube_client.create(AGENTS, namespace=NS, body=agent_body())
    async with operator_running(SETTINGS):

        async def refused():
            ready = condition(await kube_client.get(AGENTS, namespace=NS, name="analyst"), "Ready")
            assert ready["message"] == (
                "ServiceAccount default/rockbot-analyst exists and is controlled by another "
                "owner: delete or rename it so the operator can manage it"
            )

        await eventually(refused)
    sa = await kube_client.get(SERVICEACCOUNTS, namespace=NS, name="rockbot-analyst")
    assert sa["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]


async def test_deleting_an_agent_garbage_collects_its_children(kube_client: KubeClient, ready_agent):
    tool = await eventually(lambda: used_by(kube_client, "weather", ["analyst"]))
    assert tool["status"]["usedBy"] == ["analyst"]
    await kube_client.delete(AGENTS, namespace=NS, name="analyst")

    async def gone():
        for resource, name in [
            (DEPLOYMENTS, "rockbot-analyst"),
            (CONFIGMAPS, "rockbot-analyst-config"),
            (SERVICEACCOUNTS, "rockbot-analyst"),
            (SERVICES, "rockbot-analyst"),
            (SECRETS, "rockbot-analyst-http-token"),
        ]:
            try:
                await kube_client.get(resource, namespace=NS, name=name)
            except NotFound:
                continue
            raise AssertionError(f"{resource.kind} {name} still exists")

    await eventually(gone)
    await eventually(lambda: used_by(kube_client, "weather", []))


async def used_by(kube: KubeClient, tool: str, agents: list[str]) -> dict:
    body = await kube.get(TOOLS, namespace=NS, name=tool)
    assert (body.get("status") or {}).get("usedBy", []) == agents
    return body


async def test_an_unowned_child_of_the_same_name_is_adopted(kube_client: KubeClient):
    await create_basics(kube_client)
    unowned = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rockbot-analyst", "namespace": NS}}
    await kube_client.create(SERVICEACCOUNTS, namespace=NS, body=unowned)
    await kube_client.create(AGENTS, namespace=NS, body=agent_body())
    async with operator_running(SETTINGS):

        async def adopted():
            sa = await kube_client.get(SERVICEACCOUNTS, namespace=NS, name="rockbot-analyst")
            assert [ref["kind"] for ref in sa["metadata"].get("ownerReferences", [])] == ["Agent"]
            assert sa["automountServiceAccountToken"] is False

        await eventually(adopted)


async def test_a_failed_reconcile_is_reported_on_the_agent_and_retried_with_backoff(kube_client: KubeClient, kube_api):
    await create_basics(kube_client)
    await kube_client.create(AGENTS, namespace=NS, body=agent_body())
    kube_api.fail(method="POST", path_suffix=f"/namespaces/{NS}/deployments", code=503, times=4)
    async with operator_running(SETTINGS):

        async def reported():
            ready = condition(await kube_client.get(AGENTS, namespace=NS, name="analyst"), "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "ReconcileFailed")
            assert ready["message"] == (
                "reconcile failed, retrying with backoff: "
                "the API server answered 503 ServiceUnavailable: injected by the test"
            )

        await eventually(reported)

        async def warned():
            message = condition(await kube_client.get(AGENTS, namespace=NS, name="analyst"), "Ready")["message"]
            events = (await kube_client.list(EVENTS, namespace=NS)).items
            assert [
                (e["type"], e["message"])
                for e in events
                if e["reason"] == "ReconcileFailed" and e["involvedObject"].get("name") == "analyst"
            ] == [("Warning", message)]

        await eventually(warned)
        # Retries back off (1, 2, 5, 10 s): the fifth try, which works, comes 18 s after the first.
        await eventually(lambda: kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst"), within=30)
        await mark_deployment_ready(kube_client, "rockbot-analyst")

        async def ready():
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "Ready")["status"] == "True"

        await eventually(ready, within=30)
    creates = [r for r in kube_api.requests if r.method.value == "POST" and r.url.path.endswith("/deployments")]
    assert len(creates) == 5  # refused four times, then created


async def test_a_throttled_status_write_is_retried_after_a_backoff(kube_client: KubeClient, kube_api, caplog):
    await create_basics(kube_client)
    await kube_client.create(AGENTS, namespace=NS, body=agent_body())
    status_path = f"/namespaces/{NS}/agents/analyst/status"
    async with operator_running(SETTINGS):

        async def progressing():
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "Ready")["reason"] == "DeploymentProgressing"

        await eventually(progressing)
        # Refuse the status write and the failure report: no write, so no event brings the Agent back;
        # only the backoff retry can.
        kube_api.fail(method="PATCH", path_suffix=status_path, code=429, times=2)
        mark = len(kube_api.requests)
        await mark_deployment_ready(kube_client, "rockbot-analyst")

        async def ready():
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "Ready")["status"] == "True"

        await eventually(ready, within=30)
    patches = [r for r in kube_api.requests[mark:] if r.method.value == "PATCH" and r.url.path.endswith(status_path)]
    assert len(patches) == 3  # the status and the failure report refused, then the status written by the retry
    assert any("429 TooManyRequests" in r.getMessage() and "retrying in 1s" in r.getMessage() for r in caplog.records)


async def test_a_sub_agent_created_or_changed_later_reaches_the_agents_using_it(kube_client: KubeClient):
    await create_basics(kube_client)
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("ask-helper", agent={"name": "helper"}))
    boss = agent_body("boss", tools=["ask-helper"], subAgents=[{"name": "helper", "toolName": "helper"}])
    await kube_client.create(AGENTS, namespace=NS, body=boss)
    async with operator_running(SETTINGS):  # resync_seconds=3600: only events can bring the news

        async def missing():
            tools = condition(await kube_client.get(AGENTS, namespace=NS, name="boss"), "ToolsResolved")
            assert 'sub-agent "helper" not found' in tools["message"]

        await eventually(missing)
        helper = agent_body("helper", description="Knows the archive.")
        await kube_client.create(AGENTS, namespace=NS, body=helper)

        async def offered(description: str):
            agent = await kube_client.get(AGENTS, namespace=NS, name="boss")
            assert condition(agent, "ToolsResolved")["status"] == "True"
            definitions = [tool["definition"]["function"] for tool in (await config_of(kube_client, "boss"))["tools"]]
            tools = {function["name"]: function for function in definitions}
            assert tools["helper"]["description"] == description
            assert set(tools) == {"helper", "ask-helper"}

        await eventually(lambda: offered("Knows the archive."))
        await kube_client.patch(AGENTS, namespace=NS, name="helper", body={"spec": {"description": "Knows all."}})
        await eventually(lambda: offered("Knows all."))
        await kube_client.delete(AGENTS, namespace=NS, name="helper")
        await eventually(missing)


async def test_a_recreated_http_token_rolls_the_agent_pods(kube_client: KubeClient, ready_agent):
    def template_checksum(deployment: dict) -> str:
        return deployment["spec"]["template"]["metadata"]["annotations"]["rockbot.dev/http-token-checksum"]

    before = await kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")
    old_token = (await kube_client.get(SECRETS, namespace=NS, name="rockbot-analyst-http-token"))["data"]["token"]
    await kube_client.delete(SECRETS, namespace=NS, name="rockbot-analyst-http-token")
    await kube_client.patch(AGENTS, namespace=NS, name="analyst", body={"metadata": {"labels": {"poke": "1"}}})

    async def rolled() -> None:
        token = await kube_client.get(SECRETS, namespace=NS, name="rockbot-analyst-http-token")
        assert token["data"]["token"] != old_token
        deployment = await kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")
        assert template_checksum(deployment) != template_checksum(before)  # env from a Secret needs new pods

    await eventually(rolled)


async def test_an_agent_scaled_to_zero_is_not_ready_and_says_why(kube_client: KubeClient, deployment_controller):
    await create_basics(kube_client)
    await kube_client.create(AGENTS, namespace=NS, body=agent_body(replicas=0))
    async with operator_running(SETTINGS):

        async def scaled_to_zero() -> None:
            ready = condition(await kube_client.get(AGENTS, namespace=NS, name="analyst"), "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero")
            assert ready["message"] == (
                "spec.replicas is 0: no pod serves the agent or reads its inbox, and its ScheduledTasks skip "
                "their slots; set spec.replicas to 1 or more to use it"
            )
            deployment = await kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")
            assert deployment["spec"]["replicas"] == 0 and deployment.get("status")  # rolled out: zero pods

        await eventually(scaled_to_zero)
        await kube_client.patch(AGENTS, namespace=NS, name="analyst", body={"spec": {"replicas": 1}})

        async def ready() -> None:
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert condition(agent, "Ready")["status"] == "True" and agent["status"]["readyReplicas"] == 1

        await eventually(ready)


async def test_each_reconcile_of_an_agent_is_a_span_named_by_the_agent(kube_client: KubeClient, spans):
    await create_basics(kube_client)
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("weather"))
    await kube_client.create(AGENTS, namespace=NS, body=agent_body(tools=["weather"]))
    async with operator_running(SETTINGS):
        reconciles = await spans.ended("reconcile Agent")
    attributes = dict(reconciles[0].attributes)
    assert attributes == {"k8s.namespace.name": NS, "gen_ai.agent.name": "analyst", "rockbot.agent.generation": 1}
    assert reconciles[0].parent is None  # a trace of its own, as a timer or a watch event starts it
