"""The gateway as `helm install` runs it (tests/pod_process.py): its own process, user, arguments and environment
from the chart; JSON logs; a signed webhook taken; SIGTERM ending it within seconds, also while it waits for the
broker."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp

from rockbot.bus import GATEWAY, Principal
from rockbot.kube import AGENTS, NAMESPACES, SECRETS, TRIGGERS, KubeClient
from tests.chart.conftest import helm, render
from tests.fixtures.kubeapi import client_for
from tests.fixtures.rabbitmq import Vhost
from tests.gateway.conftest import ISSUE, KEY, sign
from tests.pod_process import (
    KUBECONFIG,
    PodProcess,
    Probes,
    chart_pod_spec,
    free_port,
    kubeconfig_for,
    pods,
    start,
    wait_until,
    waiting_for_the_broker,
)

__all__ = ["helm", "pods", "render"]  # fixtures
NS = "rockbot"  # the release namespace, which the gateway watches with the chart's defaults
STOP_WITHIN = 10.0


def start_gateway(render: Callable[..., list[dict[str, Any]]], kube_api, pods: list[PodProcess], *,
                  amqp_url: str) -> tuple[PodProcess, Probes, int]:  # fmt: skip
    health, webhooks = free_port(), free_port()
    process = start(
        chart_pod_spec(render({}), "gateway"),
        values_from={"ROCKBOT_AMQP_URL": amqp_url},
        extra_env={"KUBECONFIG": KUBECONFIG, "ROCKBOT_HEALTH_PORT": str(health), "ROCKBOT_WEBHOOK_PORT": str(webhooks)},
        files={KUBECONFIG: kubeconfig_for(kube_api, token="gateway")},
    )
    pods.append(process)
    return process, Probes(health), webhooks


async def a_webhook_trigger(kube: KubeClient) -> None:
    await kube.create(NAMESPACES, body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    await kube.create(AGENTS, namespace=NS, body={"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent",
                      "metadata": {"name": "triage"}, "spec": {"model": {"baseUrl": "https://llm/v1", "name": "m"}}})
    await kube.patch(AGENTS, namespace=NS, name="triage", subresource="status", body={"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Up", "lastTransitionTime": "2024-05-01T00:00:00Z"}]}})
    await kube.create(SECRETS, namespace=NS, body={"apiVersion": "v1", "kind": "Secret",
                      "metadata": {"name": "github-webhook"}, "stringData": {"secret": KEY.decode()}})
    await kube.create(TRIGGERS, namespace=NS, body={"apiVersion": "rockbot.dev/v1alpha1", "kind": "Trigger",
                      "metadata": {"name": "issues"}, "spec": {"agentRef": {"name": "triage"}, "prompt": "Triage.",
                      "webhook": {"secretKeyRef": {"name": "github-webhook", "key": "secret"}}}})  # fmt: skip


async def test_the_gateway_as_deployed_takes_a_webhook_logs_json_and_stops_within_seconds(
    kube_api, render, pods, vhost: Vhost
) -> None:
    await vhost.url(Principal.agent(namespace=NS, name="triage"), called_by=[GATEWAY])  # its inbox exists
    async with client_for(kube_api) as kube:
        await a_webhook_trigger(kube)
        process, probes, port = start_gateway(render, kube_api, pods, amqp_url=await vhost.url(GATEWAY))
        await wait_until(probes.ready, within=30, what="ready", process=process)
        body = json.dumps(ISSUE).encode()
        headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign(body),
                   "X-GitHub-Delivery": str(uuid.uuid4())}  # fmt: skip
        url = f"http://127.0.0.1:{port}/hooks/{NS}/issues"
        async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as sent:
            assert sent.status == 202, await sent.text()
        status = (await kube.get(TRIGGERS, namespace=NS, name="issues"))["status"]
        assert status["webhookUrl"] == f"http://rockbot-gateway.{NS}.svc:80/hooks/{NS}/issues"
        assert [run["deliveryId"] for run in status["active"]] == [headers["X-GitHub-Delivery"]]
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"
    messages = [record["message"] for record in process.records()]
    assert any(message.startswith("gateway serving webhooks on port") for message in messages), messages


async def test_sigterm_stops_the_gateway_while_it_waits_for_the_broker(kube_api, render, pods) -> None:
    process, probes, _ = start_gateway(render, kube_api, pods, amqp_url=f"amqp://u:p@127.0.0.1:{free_port()}/")
    await wait_until(waiting_for_the_broker(probes), within=30, what="waiting for the broker", process=process)
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"
