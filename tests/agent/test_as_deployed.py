"""An agent as its pod runs it (tests/pod_process.py), from the Deployment and ConfigMap the operator wrote:
a broker that comes late or goes away, SIGTERM."""

from __future__ import annotations

import asyncio
import base64
from dataclasses import dataclass
from typing import Any

import pytest
from yarl import URL

from rockbot.bus import OPERATOR, Principal
from rockbot.bus.admin import ensure_principal
from rockbot.kube import AGENTS, CONFIGMAPS, DEPLOYMENTS, SECRETS, KubeClient
from rockbot.operator.settings import OperatorSettings
from tests.fixtures.rabbitmq import RabbitBroker, provisioned
from tests.operator.harness import operator_running
from tests.operator.samples import agent_body
from tests.operator.test_operator_e2e import secret
from tests.pod_process import (
    PodProcess,
    Probes,
    late_rabbitmq,
    pods,
    start,
    wait_until,
    waiting_for_the_broker,
)
from tests.ports import free_port
from tests.waiting import eventually

__all__ = ["late_rabbitmq", "pods"]  # fixtures
NS = "default"
ANALYST = Principal.agent(namespace=NS, name="analyst")
#: How long SIGTERM may take to stop a process: a pod is killed 30 s after it by default.
STOP_WITHIN = 10.0


@dataclass
class AgentPod:
    """What the kubelet would start for the Agent: the pod spec, its Secrets' values, its config volume."""

    spec: dict[str, Any]
    values_from: dict[str, str]
    config: dict[str, str]
    port: int

    def start(self, pods: list[PodProcess]) -> tuple[PodProcess, Probes]:
        process = start(self.spec, values_from=self.values_from, volumes={"config": self.config})
        pods.append(process)
        return process, Probes(self.port)


async def deployed_agent(kube: KubeClient, *, broker: RabbitBroker) -> AgentPod:
    """Let the operator deploy an Agent (its login on `broker`, not started yet, in its own Secret); read back
    what it wrote."""
    await kube.create(SECRETS, namespace=NS, body=secret("llm", apiKey="sk-test"))
    await kube.create(AGENTS, namespace=NS, body=agent_body())
    port = free_port()
    settings = OperatorSettings(
        namespaces=[NS], agent_port=port, resync_seconds=3600, broker_management_url=broker.management_url,
        broker_admin_username="guest", broker_admin_password="guest",
        broker_agent_url=f"amqp://127.0.0.1:{broker.port}/",
    )  # fmt: skip
    async with operator_running(settings):
        deployment = await eventually(lambda: kube.get(DEPLOYMENTS, namespace=NS, name="rockbot-analyst"))
    config_map = await kube.get(CONFIGMAPS, namespace=NS, name="rockbot-analyst-config")
    spec = deployment["spec"]["template"]["spec"]
    values = {}
    for entry in spec["containers"][0].get("env") or []:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            data = (await kube.get(SECRETS, namespace=NS, name=ref["name"]))["data"]
            values[entry["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return AgentPod(spec=spec, values_from=values, config=config_map["data"], port=port)


@pytest.fixture
async def agent_pod(kube_client: KubeClient, late_rabbitmq: RabbitBroker) -> AgentPod:
    return await deployed_agent(kube_client, broker=late_rabbitmq)


async def provision(broker: RabbitBroker, pod: AgentPod) -> None:
    """What the operator does once the broker answers: the agent's user, with the password of its Secret."""
    password = URL(pod.values_from["ROCKBOT_AMQP_URL"]).password or ""
    async with provisioned(broker, "/") as vhost:
        await ensure_principal(vhost.admin, ANALYST, password=password, called_by=[OPERATOR])


async def test_live_while_the_broker_is_unreachable_and_ready_once_it_answers(agent_pod, pods, late_rabbitmq):
    process, probes = agent_pod.start(pods)
    await wait_until(probes.live, within=30, what="live", process=process)
    _, reason = await wait_until(waiting_for_the_broker(probes), within=30, what="not ready, waiting for the broker",
                                 process=process)
    assert "cannot reach the broker at amqp://agent.default.analyst:***@127.0.0.1" in reason
    await asyncio.to_thread(late_rabbitmq.start)
    await provision(late_rabbitmq, agent_pod)
    await wait_until(probes.ready, within=30, what="ready once the broker answers", process=process)


async def test_sigterm_stops_the_agent_within_seconds_when_the_broker_is_gone(agent_pod, pods, late_rabbitmq):
    await asyncio.to_thread(late_rabbitmq.start)
    await provision(late_rabbitmq, agent_pod)
    process, probes = agent_pod.start(pods)
    await wait_until(probes.ready, within=30, what="ready", process=process)
    await asyncio.to_thread(late_rabbitmq.stop_server)
    assert process.running, f"the agent ended before its SIGTERM:\n{process.output()[-6000:]}"
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"


async def test_sigterm_stops_the_agent_while_it_waits_for_the_broker(agent_pod, pods):
    process, probes = agent_pod.start(pods)
    await wait_until(waiting_for_the_broker(probes), within=30, what="waiting for the broker", process=process)
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"
