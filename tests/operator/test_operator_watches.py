"""The operator across an API server restart: every watch ends and the history is compacted (410 Gone on
resume), as after an etcd compaction and a rolling upgrade of the control plane. Changes made afterwards
must still be reconciled. On the emulator: a real API server cannot be made to end every watch and compact its
history at a chosen moment."""

from __future__ import annotations

import base64
import json

from rockbot.kube import AGENTS, CONFIGMAPS, DEPLOYMENTS, SECRETS, TOOLS, KubeClient
from rockbot.operator.settings import OperatorSettings
from tests.kubeapi import KubeApiEmulator
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body, tool_body
from tests.waiting import eventually

NS = "default"
SETTINGS = OperatorSettings(namespaces=[NS], agent_image="registry.example/rockbot:test", resync_seconds=3600)


def secret(name: str, **data: str) -> dict:
    encoded = {key: base64.b64encode(value.encode()).decode() for key, value in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": NS}, "data": encoded}


async def config_of(kube: KubeClient, agent: str) -> dict:
    config_map = await kube.get(CONFIGMAPS, namespace=NS, name=f"rockbot-{agent}-config")
    return json.loads(config_map["data"]["agent.json"])


def tool_names(config: dict) -> list[str]:
    return [tool["definition"]["function"]["name"] for tool in config["tools"]]


async def test_changes_after_all_watches_end_and_history_is_compacted_are_reconciled(
    kube_client: KubeClient, kube_api: KubeApiEmulator
):
    await kube_client.create(SECRETS, namespace=NS, body=secret("llm", apiKey="sk-test"))
    await kube_client.create(SECRETS, namespace=NS, body=secret("rockbot-bus", **{"amqp-url": "amqp://u:p@bus/"}))
    await kube_client.create(TOOLS, namespace=NS, body=tool_body("weather"))
    await kube_client.create(AGENTS, namespace=NS, body=agent_body(tools=["weather"], systemPrompt="Be brief."))
    async with operator_running(SETTINGS):

        async def deployed():
            assert tool_names(await config_of(kube_client, "analyst")) == ["weather"]
            await kube_client.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst")

        await eventually(deployed)
        mark = len(kube_api.requests)
        kube_api.compact()  # every resourceVersion the operator has seen is now too old to resume from
        compacted = kube_api.api.store.rv
        kube_api.end_watches()

        await kube_client.create(TOOLS, namespace=NS, body=tool_body("clock"))
        await kube_client.patch(AGENTS, namespace=NS, name="analyst",
                                body={"spec": {"tools": ["weather", "clock"], "systemPrompt": "Be thorough."}})

        async def reconciled():
            config = await config_of(kube_client, "analyst")
            assert sorted(tool_names(config)) == ["clock", "weather"]
            assert "Be thorough." in json.dumps(config)
            agent = await kube_client.get(AGENTS, namespace=NS, name="analyst")
            assert agent["status"]["observedGeneration"] == agent["metadata"]["generation"]
            assert condition(agent, "ToolsResolved")["status"] == "True"
            clock = await kube_client.get(TOOLS, namespace=NS, name="clock")
            assert condition(clock, "Accepted")["status"] == "True"
            assert clock["status"]["usedBy"] == ["analyst"]

        await eventually(reconciled, within=30)

    def watches(kind: str) -> list[int]:
        return [int(r.params.get("resourceVersion") or 0) for r in kube_api.requests[mark:]
                if r.method == "GET" and r.params.get("watch") and r.url.path.endswith(f"/{kind}")]

    # The newest resourceVersion belongs to one object, so at least one of the two kinds resumed from
    # before the compaction and met 410 Gone; both then watched again from a fresh list.
    assert any(version < compacted for version in watches("agents") + watches("tools"))
    assert any(version >= compacted for version in watches("agents"))
    assert any(version >= compacted for version in watches("tools"))
