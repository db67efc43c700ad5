"""The operator end to end on the real API server: kopf in its own thread, each test in its own namespace,
the real controllers (Deployments, garbage collection), assertions on what the server holds, as `kubectl get`
would show it. No node runs pods: `pods_ready` reports them Ready where a test needs a Ready Agent."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rockbot.kube import (
    AGENTS,
    CONFIGMAPS,
    DEPLOYMENTS,
    EVENTS,
    PODS,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    TOOLS,
    KubeClient,
    NotFound,
)
from rockbot.operator.settings import OperatorSettings
from tests.fixtures.kube_real import KubeCluster
from tests.operator.audit import AuditLog
from tests.operator.harness import condition, operator_running
from tests.operator.kubelet import pods_ready
from tests.operator.samples import agent_body, tool_body
from tests.ports import free_port
from tests.waiting import eventually


def settings(namespace: str, *, resync_seconds: float = 3600) -> OperatorSettings:
    return OperatorSettings(namespaces=[namespace], agent_image="registry.example/rockbot:test",
                            resync_seconds=resync_seconds)


def secret(name: str, **data: str) -> dict:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


async def create_basics(kube: KubeClient, ns: str = "default") -> None:
    await kube.create(SECRETS, namespace=ns, body=secret("llm", apiKey="sk-test"))
    await kube.create(SECRETS, namespace=ns, body=secret("rockbot-bus", **{"amqp-url": "amqp://u:p@bus/"}))


async def config_of(kube: KubeClient, ns: str, agent: str) -> dict:
    config_map = await kube.get(CONFIGMAPS, namespace=ns, name=f"rockbot-{agent}-config")
    return json.loads(config_map["data"]["agent.json"])


async def is_ready(kube: KubeClient, ns: str, name: str = "analyst") -> dict:
    agent = await kube.get(AGENTS, namespace=ns, name=name)
    assert condition(agent, "Ready")["status"] == "True", condition(agent, "Ready")
    return agent


@pytest.fixture
async def ready_agent(kube: KubeClient, kube_namespace: str, as_operator: str) -> AsyncIterator[dict]:
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(TOOLS, namespace=ns, body=tool_body("weather", namespace=ns))
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns, tools=["weather"], builtinTools=["scripts"]))
    async with operator_running(settings(ns)), pods_ready(kube, ns):
        yield await eventually(lambda: is_ready(kube, ns), within=60)


async def test_agent_becomes_children_and_a_ready_status(kube: KubeClient, kube_namespace: str, ready_agent):
    ns = kube_namespace
    status = ready_agent["status"]
    assert condition(ready_agent, "ToolsResolved") | {"lastTransitionTime": None} == {
        "type": "ToolsResolved",
        "status": "True",
        "reason": "AllResolved",
        "message": "3 tools offered to the model",
        "lastTransitionTime": None,
        "observedGeneration": 1,
    }
    assert status["tools"] == [
        {
            "name": "execute_python_script",
            "source": "builtin:scripts",
            "description": status["tools"][0]["description"],
        },
        {"name": "save_result_as_file", "source": "builtin:scripts", "description": status["tools"][1]["description"]},
        {"name": "weather", "source": "tool:weather", "description": "The weather tool."},
    ]
    assert status["toolCount"] == 3  # what `kubectl get agents` prints under TOOLS
    assert status["observedGeneration"] == 1 and status["readyReplicas"] == 1
    sa = await kube.get(SERVICEACCOUNTS, namespace=ns, name="rockbot-analyst")
    assert sa["automountServiceAccountToken"] is False
    assert (await kube.get(SERVICES, namespace=ns, name="rockbot-analyst"))["spec"]["ports"][0]["port"] == 8080
    token = await kube.get(SECRETS, namespace=ns, name="rockbot-analyst-http-token")
    assert len(base64.b64decode(token["data"]["token"])) >= 32
    config = await config_of(kube, ns, "analyst")
    assert config["tools"][0]["definition"]["function"]["name"] == "weather"
    assert "sk-test" not in json.dumps(config) and "sk-test" not in json.dumps(ready_agent)

    async def transitions_posted():
        events = (await kube.list(EVENTS, namespace=ns)).items
        reasons = {e["reason"] for e in events if e["involvedObject"].get("name") == "analyst"}
        assert {"AllResolved", "DeploymentReady"} <= reasons

    await eventually(transitions_posted)


async def test_a_settled_agent_costs_no_writes_even_across_an_operator_restart(
    kube: KubeClient, kube_namespace: str, kube_cluster: KubeCluster, as_operator: str, caplog
):
    ns = kube_namespace
    caplog.set_level(logging.INFO, logger="rockbot.operator")
    await create_basics(kube, ns)
    await kube.create(TOOLS, namespace=ns, body=tool_body("weather", namespace=ns))
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns, tools=["weather"]))
    async with pods_ready(kube, ns):
        async with operator_running(settings(ns)):

            async def settled():
                await is_ready(kube, ns)
                tool = await kube.get(TOOLS, namespace=ns, name="weather")
                assert tool["status"]["usedBy"] == ["analyst"]
                events = (await kube.list(EVENTS, namespace=ns)).items  # posted after the status that says Ready
                assert "DeploymentReady" in {e["reason"] for e in events if e["involvedObject"]["name"] == "analyst"}

            await eventually(settled, within=60)

        async def logged(text: str, *, after: int) -> None:
            """The operator said `text` after its first `after` log records."""
            assert [r for r in caplog.records[after:] if text in r.getMessage()], f"no log record saying {text!r} yet"

        audit = AuditLog(kube_cluster.kubeconfig.parent / "logs" / "audit.log", namespace=ns)
        records = len(caplog.records)
        async with operator_running(settings(ns, resync_seconds=1.0)):
            await eventually(lambda: logged("reconciled every Agent once since start", after=records), within=60)
            await kube.patch(
                AGENTS, namespace=ns, name="analyst", body={"metadata": {"labels": {"poke": "1"}}}
            )  # news: the Agent and its Secrets are looked at again
            poked = len(caplog.records)
            await eventually(lambda: logged("resync: compared 1 Agents", after=poked), within=60)  # a no-op pass
    # The API server's word (its audit log, written before it answers): the operator wrote nothing.
    writes = [f"{e.verb} {e.resource} {e.name}" for e in audit.read() if e.user == as_operator and e.write]
    agent = await kube.get(AGENTS, namespace=ns, name="analyst")
    assert writes == [], (writes, agent["status"])
    # kopf keeps no state on the object: no finalizer (deletable while the operator is down), no annotations.
    assert "finalizers" not in agent["metadata"]
    assert not [key for key in agent["metadata"].get("annotations") or {} if "kopf" in key or "rockbot.dev" in key]


async def test_a_new_agent_creates_its_generated_secret_without_reading_it_first(
    kube: KubeClient, kube_namespace: str, kube_cluster: KubeCluster, as_operator: str
):
    """A read before the create is for a restart, when the Secret exists: an Agent with no children yet has none."""
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns))
    audit = AuditLog(kube_cluster.kubeconfig.parent / "logs" / "audit.log", namespace=ns)
    async with operator_running(settings(ns)), pods_ready(kube, ns):
        await eventually(lambda: is_ready(kube, ns), within=60)
    reads = [e for e in audit.read() if e.user == as_operator and e.verb == "get" and e.resource == "secrets"
             and e.name == "rockbot-analyst-http-token"]  # fmt: skip
    assert reads == []
    await kube.get(SECRETS, namespace=ns, name="rockbot-analyst-http-token")  # made all the same


async def test_children_deleted_or_edited_by_hand_are_put_back(kube: KubeClient, kube_namespace: str, ready_agent):
    ns = kube_namespace
    await kube.delete(DEPLOYMENTS, namespace=ns, name="rockbot-analyst")
    await kube.patch(CONFIGMAPS, namespace=ns, name="rockbot-analyst-config", body={"data": {"agent.json": "{}"}})

    async def repaired():
        deployment = await kube.get(DEPLOYMENTS, namespace=ns, name="rockbot-analyst")
        assert (await config_of(kube, ns, "analyst")).get("name") == "analyst"  # not the hand-edited {}
        return deployment

    deployment = await eventually(repaired, within=30)
    assert deployment["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


async def test_a_tool_change_reaches_every_agent_that_uses_it(kube: KubeClient, kube_namespace: str, ready_agent):
    ns = kube_namespace
    await kube.patch(TOOLS, namespace=ns, name="weather", body={"spec": {"description": "Forecasts."}})

    async def updated():
        config = await config_of(kube, ns, "analyst")
        assert config["tools"][0]["definition"]["function"]["description"] == "Forecasts."
        tool = await kube.get(TOOLS, namespace=ns, name="weather")
        assert tool["status"]["usedBy"] == ["analyst"]
        assert condition(tool, "Accepted")["status"] == "True"

    await eventually(updated, within=30)

    await kube.delete(TOOLS, namespace=ns, name="weather")

    async def unresolved():
        agent = await kube.get(AGENTS, namespace=ns, name="analyst")
        tools = condition(agent, "ToolsResolved")
        assert tools["status"] == "False"
        assert tools["message"] == f'Tool "weather" not found in namespace {ns}: create it or remove it from spec.tools'
        assert [t["name"] for t in agent["status"]["tools"]] == ["execute_python_script", "save_result_as_file"]

    await eventually(unresolved, within=30)


async def test_bad_references_are_reported_in_conditions(kube: KubeClient, kube_namespace: str, as_operator: str):
    ns = kube_namespace
    await kube.create(SECRETS, namespace=ns, body=secret("rockbot-bus", **{"amqp-url": "amqp://bus/"}))
    await kube.create(TOOLS, namespace=ns, body=tool_body("bad", namespace=ns, parameters={"type": "string"}))
    await kube.create(TOOLS, namespace=ns, body=tool_body("one", namespace=ns, functionName="same"))
    await kube.create(TOOLS, namespace=ns, body=tool_body("two", namespace=ns, functionName="same"))
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns, tools=["bad", "one", "two", "ghost"]))
    async with operator_running(settings(ns)):

        async def reported():
            agent = await kube.get(AGENTS, namespace=ns, name="analyst")
            assert condition(agent, "ToolsResolved")["message"].split("; ") == [
                f'Tool "ghost" not found in namespace {ns}: create it or remove it from spec.tools',
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
                f"spec.model.apiKeySecretRef: Secret \"llm\" not found in namespace {ns}: create it with key 'apiKey'"
            )
            bad = await kube.get(TOOLS, namespace=ns, name="bad")
            assert condition(bad, "Accepted")["status"] == "False"

        await eventually(reported, within=30)
        # Degraded, not down: the agent deploys with what resolved (nothing here but built-ins).
        assert await kube.get(DEPLOYMENTS, namespace=ns, name="rockbot-analyst")

        await kube.create(SECRETS, namespace=ns, body=secret("llm", apiKey="sk"))
        await kube.patch(AGENTS, namespace=ns, name="analyst", body={"spec": {"tools": ["one"]}})

        async def fixed():
            agent = await kube.get(AGENTS, namespace=ns, name="analyst")
            assert condition(agent, "ToolsResolved")["status"] == "True"
            assert condition(agent, "Ready")["reason"] == "DeploymentProgressing"  # no node runs its pod
            assert agent["status"]["observedGeneration"] == 2

        await eventually(fixed, within=30)


async def test_an_object_owned_by_someone_else_is_not_taken_over(kube: KubeClient, kube_namespace: str,
                                                                 as_operator: str):
    ns = kube_namespace
    await create_basics(kube, ns)
    owner = await kube.create(
        CONFIGMAPS, namespace=ns, body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "someone-else"}}
    )
    foreign = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {
            "name": "rockbot-analyst",
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
    await kube.create(SERVICEACCOUNTS, namespace=ns, body=foreign)
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns))
    async with operator_running(settings(ns)):

        async def refused():
            ready = condition(await kube.get(AGENTS, namespace=ns, name="analyst"), "Ready")
            assert ready["message"] == (
                f"ServiceAccount {ns}/rockbot-analyst exists and is controlled by another "
                "owner: delete or rename it so the operator can manage it"
            )

        await eventually(refused, within=30)
    sa = await kube.get(SERVICEACCOUNTS, namespace=ns, name="rockbot-analyst")
    assert sa["metadata"]["ownerReferences"][0]["uid"] == owner["metadata"]["uid"]


async def test_deleting_an_agent_garbage_collects_its_children(kube: KubeClient, kube_namespace: str, ready_agent):
    ns = kube_namespace
    tool = await eventually(lambda: used_by(kube, ns, "weather", ["analyst"]))
    assert tool["status"]["usedBy"] == ["analyst"]
    await kube.delete(AGENTS, namespace=ns, name="analyst")

    async def gone():  # the real garbage collector removes what the Agent owned
        for resource, name in [
            (DEPLOYMENTS, "rockbot-analyst"),
            (CONFIGMAPS, "rockbot-analyst-config"),
            (SERVICEACCOUNTS, "rockbot-analyst"),
            (SERVICES, "rockbot-analyst"),
            (SECRETS, "rockbot-analyst-http-token"),
        ]:
            try:
                await kube.get(resource, namespace=ns, name=name)
            except NotFound:
                continue
            raise AssertionError(f"{resource.kind} {name} still exists")

    await eventually(gone, within=60)
    await eventually(lambda: used_by(kube, ns, "weather", []), within=30)


async def used_by(kube: KubeClient, ns: str, tool: str, agents: list[str]) -> dict:
    body = await kube.get(TOOLS, namespace=ns, name=tool)
    assert (body.get("status") or {}).get("usedBy", []) == agents
    return body


async def test_an_unowned_child_of_the_same_name_is_adopted(kube: KubeClient, kube_namespace: str, as_operator: str):
    ns = kube_namespace
    await create_basics(kube, ns)
    unowned = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rockbot-analyst"}}
    await kube.create(SERVICEACCOUNTS, namespace=ns, body=unowned)
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns))
    async with operator_running(settings(ns)):

        async def adopted():
            sa = await kube.get(SERVICEACCOUNTS, namespace=ns, name="rockbot-analyst")
            assert [ref["kind"] for ref in sa["metadata"].get("ownerReferences", [])] == ["Agent"]
            assert sa["automountServiceAccountToken"] is False

        await eventually(adopted, within=30)


async def test_a_sub_agent_created_or_changed_later_reaches_the_agents_using_it(
    kube: KubeClient, kube_namespace: str, as_operator: str
):
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(TOOLS, namespace=ns, body=tool_body("ask-helper", namespace=ns, agent={"name": "helper"}))
    boss = agent_body("boss", namespace=ns, tools=["ask-helper"], subAgents=[{"name": "helper", "toolName": "helper"}])
    await kube.create(AGENTS, namespace=ns, body=boss)
    async with operator_running(settings(ns)):  # resync_seconds=3600: only events can bring the news

        async def missing():
            tools = condition(await kube.get(AGENTS, namespace=ns, name="boss"), "ToolsResolved")
            assert 'sub-agent "helper" not found' in tools["message"]

        await eventually(missing, within=30)
        helper = agent_body("helper", namespace=ns, description="Knows the archive.")
        await kube.create(AGENTS, namespace=ns, body=helper)

        async def offered(description: str):
            agent = await kube.get(AGENTS, namespace=ns, name="boss")
            assert condition(agent, "ToolsResolved")["status"] == "True"
            definitions = [tool["definition"]["function"] for tool in (await config_of(kube, ns, "boss"))["tools"]]
            tools = {function["name"]: function for function in definitions}
            assert tools["helper"]["description"] == description
            assert set(tools) == {"helper", "ask-helper"}

        await eventually(lambda: offered("Knows the archive."), within=30)
        await kube.patch(AGENTS, namespace=ns, name="helper", body={"spec": {"description": "Knows all."}})
        await eventually(lambda: offered("Knows all."), within=30)
        await kube.delete(AGENTS, namespace=ns, name="helper")
        await eventually(missing, within=30)


async def test_a_recreated_http_token_rolls_the_agent_pods(kube: KubeClient, kube_namespace: str, ready_agent):
    ns = kube_namespace

    def template_checksum(deployment: dict) -> str:
        return deployment["spec"]["template"]["metadata"]["annotations"]["rockbot.dev/http-token-checksum"]

    before = await kube.get(DEPLOYMENTS, namespace=ns, name="rockbot-analyst")
    old_token = (await kube.get(SECRETS, namespace=ns, name="rockbot-analyst-http-token"))["data"]["token"]
    await kube.delete(SECRETS, namespace=ns, name="rockbot-analyst-http-token")
    await kube.patch(AGENTS, namespace=ns, name="analyst", body={"metadata": {"labels": {"poke": "1"}}})

    async def rolled() -> None:
        token = await kube.get(SECRETS, namespace=ns, name="rockbot-analyst-http-token")
        assert token["data"]["token"] != old_token
        deployment = await kube.get(DEPLOYMENTS, namespace=ns, name="rockbot-analyst")
        assert template_checksum(deployment) != template_checksum(before)  # env from a Secret needs new pods

    await eventually(rolled, within=30)


async def test_an_agent_scaled_to_zero_is_not_ready_and_says_why(kube: KubeClient, kube_namespace: str,
                                                                 as_operator: str):
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns, replicas=0))
    async with operator_running(settings(ns)), pods_ready(kube, ns):

        async def scaled_to_zero() -> None:
            ready = condition(await kube.get(AGENTS, namespace=ns, name="analyst"), "Ready")
            assert (ready["status"], ready["reason"]) == ("False", "ScaledToZero")
            assert ready["message"] == (
                "spec.replicas is 0: no pod serves the agent or reads its inbox, and its ScheduledTasks skip "
                "their slots; set spec.replicas to 1 or more to use it"
            )
            deployment = await kube.get(DEPLOYMENTS, namespace=ns, name="rockbot-analyst")
            assert deployment["spec"]["replicas"] == 0 and deployment.get("status")  # rolled out: zero pods

        await eventually(scaled_to_zero, within=30)
        await kube.patch(AGENTS, namespace=ns, name="analyst", body={"spec": {"replicas": 1}})

        async def ready() -> None:
            agent = await is_ready(kube, ns)
            assert agent["status"]["readyReplicas"] == 1

        await eventually(ready, within=60)


async def test_each_reconcile_of_an_agent_is_a_span_named_by_the_agent(kube: KubeClient, kube_namespace: str,
                                                                       as_operator: str, spans):
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(TOOLS, namespace=ns, body=tool_body("weather", namespace=ns))
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns, tools=["weather"]))
    async with operator_running(settings(ns)):
        reconciles = await spans.ended("reconcile Agent")
    attributes = dict(reconciles[0].attributes)
    assert attributes == {"k8s.namespace.name": ns, "gen_ai.agent.name": "analyst", "rockbot.agent.generation": 1}
    assert reconciles[0].parent is None  # a trace of its own, as a timer or a watch event starts it


async def reconciles(port: int) -> dict[str, float]:
    """The operator's Agent reconciles so far, by work (its /metrics, as Prometheus reads them)."""
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as answer:
        text = await answer.text()
    return {sample.labels["work"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "rockbot_operator_agent_reconciles_total"}  # fmt: skip


async def test_a_lost_pod_changes_only_the_agents_status_without_comparing_its_children_again(
    kube: KubeClient, kube_namespace: str, as_operator: str
):
    """A Deployment's rollout moving (a pod lost, then replaced and Ready) is news for the Agent's status only: its
    children, Secrets and broker user were compared at its last reconcile and nothing of theirs changed since."""
    ns = kube_namespace
    await create_basics(kube, ns)
    await kube.create(AGENTS, namespace=ns, body=agent_body(namespace=ns))
    port = free_port()
    async with operator_running(settings(ns), health_endpoint=f"http://127.0.0.1:{port}/healthz"):
        async with pods_ready(kube, ns):
            await eventually(lambda: is_ready(kube, ns), within=60)
        settled = await reconciles(port)
        [pod] = (await kube.list(PODS, namespace=ns)).items
        await kube.delete(PODS, namespace=ns, name=pod["metadata"]["name"], grace_period_seconds=0)

        async def not_ready() -> None:
            agent = await kube.get(AGENTS, namespace=ns, name="analyst")
            assert condition(agent, "Ready")["reason"] == "DeploymentProgressing", condition(agent, "Ready")

        await eventually(not_ready, within=60)
        async with pods_ready(kube, ns):
            await eventually(lambda: is_ready(kube, ns), within=60)
        after = await reconciles(port)
    assert after["complete"] == settled["complete"]
    assert after["status"] >= settled.get("status", 0) + 2  # Ready False, then True again
