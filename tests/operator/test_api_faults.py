"""The operator when the API server fails requests: on the emulator, since a real server cannot be made to answer
a chosen request 503 or 429 (the real server's refusals, such as a quota's 403, are in test_failing_child_real.py)."""

from __future__ import annotations

from rockbot.kube import AGENTS, DEPLOYMENTS, EVENTS, KubeClient
from rockbot.operator.settings import OperatorSettings
from tests.operator.harness import condition, operator_running
from tests.operator.samples import agent_body
from tests.operator.test_operator_e2e import create_basics
from tests.waiting import eventually

NS = "default"
SETTINGS = OperatorSettings(namespaces=[NS], agent_image="registry.example/rockbot:test", resync_seconds=3600)


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


