"""The gateway as `helm install` runs it (tests/pod_process.py): its own process, user, arguments and environment
from the chart; JSON logs; a signed webhook taken; SIGTERM ending it within seconds, also while it waits for the
broker. It reaches the real API server and watches the test's namespace as its release namespace."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from rockbot.bus import GATEWAY, Principal
from rockbot.kube import AGENTS, SECRETS, TRIGGERS, KubeClient
from tests.chart.conftest import helm, render
from tests.fixtures.rabbitmq import Vhost
from tests.gateway.conftest import ISSUE, KEY, sign
from tests.pod_process import (
    KUBECONFIG,
    PodProcess,
    Probes,
    chart_pod_spec,
    pods,
    start,
    wait_until,
    waiting_for_the_broker,
)
from tests.ports import free_port

__all__ = ["helm", "pods", "render"]  # fixtures
STOP_WITHIN = 10.0


def start_gateway(render: Callable[..., list[dict[str, Any]]], kubeconfig: Path, namespace: str,
                  pods: list[PodProcess], *, amqp_url: str) -> tuple[PodProcess, Probes, int]:  # fmt: skip
    """The gateway of a release in `namespace` (which it watches, as with the chart's defaults)."""
    health, webhooks = free_port(), free_port()
    process = start(
        chart_pod_spec(render({}, namespace=namespace), "gateway"),
        values_from={"ROCKBOT_AMQP_URL": amqp_url},
        extra_env={"KUBECONFIG": KUBECONFIG, "ROCKBOT_HEALTH_PORT": str(health), "ROCKBOT_WEBHOOK_PORT": str(webhooks)},
        files={KUBECONFIG: kubeconfig.read_text()},
    )
    pods.append(process)
    return process, Probes(health), webhooks


async def a_webhook_trigger(kube: KubeClient, ns: str) -> None:
    await kube.create(AGENTS, namespace=ns, body={"apiVersion": "rockbot.dev/v1alpha1", "kind": "Agent",
                      "metadata": {"name": "triage"}, "spec": {"model": {"baseUrl": "https://llm/v1", "name": "m"}}})
    await kube.patch(AGENTS, namespace=ns, name="triage", subresource="status", body={"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "Up", "lastTransitionTime": "2024-05-01T00:00:00Z"}]}})
    await kube.create(SECRETS, namespace=ns, body={"apiVersion": "v1", "kind": "Secret",
                      "metadata": {"name": "github-webhook"}, "stringData": {"secret": KEY.decode()}})
    await kube.create(TRIGGERS, namespace=ns, body={"apiVersion": "rockbot.dev/v1alpha1", "kind": "Trigger",
                      "metadata": {"name": "issues"}, "spec": {"agentRef": {"name": "triage"}, "prompt": "Triage.",
                      "webhook": {"secretKeyRef": {"name": "github-webhook", "key": "secret"}}}})  # fmt: skip


async def test_the_gateway_as_deployed_takes_a_webhook_logs_json_and_stops_within_seconds(
    real_kube_client: KubeClient, real_kubeconfig: Path, kube_namespace: str, render, pods, vhost: Vhost
) -> None:
    kube, ns = real_kube_client, kube_namespace
    await vhost.url(Principal.agent(namespace=ns, name="triage"), called_by=[GATEWAY])  # its inbox exists
    await a_webhook_trigger(kube, ns)
    process, probes, port = start_gateway(render, real_kubeconfig, ns, pods, amqp_url=await vhost.url(GATEWAY))
    await wait_until(probes.ready, within=30, what="ready", process=process)
    body = json.dumps(ISSUE).encode()
    headers = {"Content-Type": "application/json", "X-Hub-Signature-256": sign(body),
               "X-GitHub-Delivery": str(uuid.uuid4())}  # fmt: skip
    url = f"http://127.0.0.1:{port}/hooks/{ns}/issues"
    async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as sent:
        assert sent.status == 202, await sent.text()
    status = (await kube.get(TRIGGERS, namespace=ns, name="issues"))["status"]
    assert status["webhookUrl"] == f"http://rockbot-gateway.{ns}.svc:80/hooks/{ns}/issues"
    assert [run["deliveryId"] for run in status["active"]] == [headers["X-GitHub-Delivery"]]
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"
    messages = [record["message"] for record in process.records()]
    assert any(message.startswith("gateway serving webhooks on port") for message in messages), messages


async def test_sigterm_stops_the_gateway_while_it_waits_for_the_broker(
    real_kubeconfig: Path, kube_namespace: str, render, pods
) -> None:
    process, probes, _ = start_gateway(render, real_kubeconfig, kube_namespace, pods,
                                       amqp_url=f"amqp://u:p@127.0.0.1:{free_port()}/")
    await wait_until(waiting_for_the_broker(probes), within=30, what="waiting for the broker", process=process)
    process.terminate()
    code = await process.exited(within=STOP_WITHIN)
    assert code == 0, f"still running {STOP_WITHIN} s after SIGTERM (exit {code}):\n{process.output()[-3000:]}"
